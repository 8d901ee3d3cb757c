"""Every known finding (docs/findings.md) has a saved trace that replays:
our implementation and the spec conform over it, and -- where vLLM 0.25.1 is
installed -- vLLM still diverges at the recorded step, breaking the recorded
rules.  When vLLM fixes one, the last test fails and the finding is retired."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from standalone import imported_packages

from kvspec.cli import main
from kvspec.conformance.findings import FINDINGS, in_releases, is_avoidable, matching_finding
from kvspec.conformance.runner import layout_names, replay
from kvspec.conformance.trace import Trace
from kvspec.spec.releases import BASE

IDS = [f.id for f in FINDINGS]


def test_findings_have_unique_ids_and_known_inputs():
    assert len(set(IDS)) == len(IDS)
    for finding in FINDINGS:
        assert is_avoidable(finding.avoid, layout_names("pool") + layout_names("manager") + layout_names("offload")), \
            finding


def test_every_finding_is_in_the_findings_page():
    page = (FINDINGS[0].trace_path.parent.parent / "findings.md").read_text()
    for finding in FINDINGS:
        assert f"## {finding.id}:" in page and finding.trace in page, finding.id


@pytest.mark.parametrize("finding", FINDINGS, ids=IDS)
def test_the_trace_records_the_finding(finding):
    trace = Trace.load(finding.trace_path)
    assert trace.target == finding.target and trace.scope == finding.scope
    assert trace.failure is not None
    assert set(trace.failure["rules"]) == set(finding.rules), trace.failure


@pytest.mark.parametrize("target", ["impl", "spec"])
@pytest.mark.parametrize("finding", FINDINGS, ids=IDS)
def test_the_reference_conforms_over_the_trace(finding, target):
    if target == "impl" and finding.releases[0] != BASE:
        pytest.skip(f"impl implements {BASE}, which has no {finding.id} (from {finding.releases[0]})")
    trace = Trace.load(finding.trace_path)
    outcome = replay(trace, target, trace.level)
    assert outcome.conforms, outcome.message


def _vllm_version() -> str:
    import vllm

    return vllm.__version__


def _affected_releases(script: Path) -> tuple[str, str | None]:
    """A script's ``AFFECTS = (first, fixed)``: the releases it shows the bug on (default: from the base on)."""
    for node in ast.parse(script.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["AFFECTS"]:
            return ast.literal_eval(node.value)
    return (BASE, None)


def _vllm_importable() -> bool:
    try:
        import vllm.v1.core.kv_cache_manager  # noqa: F401
    except Exception:
        return False
    return True


@pytest.mark.skipif(not _vllm_importable(), reason="vLLM 0.25.1 is not installed (tools/install_vllm.sh)")
@pytest.mark.parametrize("finding", FINDINGS, ids=IDS)
def test_vllm_still_diverges_where_recorded(finding, capsys):
    if not finding.affects(_vllm_version()):
        pytest.skip(f"vLLM {_vllm_version()} is outside {finding.id}'s releases {finding.releases}")
    trace = Trace.load(finding.trace_path)
    outcome = replay(trace, "vllm", trace.level)
    assert outcome.diverged_at == trace.failure["step"], outcome.message
    assert set(outcome.rules) == set(finding.rules), outcome.message
    assert main(["replay", str(finding.trace_path), "--quiet"]) == 1
    assert f"diverges at step {trace.failure['step']}" in capsys.readouterr().out


REPRODUCTIONS = sorted((Path(__file__).parent.parent / "docs" / "findings" / "repro").glob("*.py"))


@pytest.mark.parametrize("script", REPRODUCTIONS, ids=lambda p: p.stem)
def test_standalone_reproduction_imports_vllm_alone(script):
    """A bug report's script must run where kvspec is not installed."""
    imported = imported_packages(script)
    assert "kvspec" not in imported and "vllm" in imported, imported


@pytest.mark.skipif(not _vllm_importable(), reason="vLLM 0.25.1 is not installed (tools/install_vllm.sh)")
@pytest.mark.parametrize("script", REPRODUCTIONS, ids=lambda p: p.stem)
def test_standalone_reproduction_still_shows_the_bug(script):
    """Run against vLLM alone, each script still prints BUG and exits 1
    (when vLLM fixes it, the script says ok and this fails: retire it).  A
    script for a bug of later releases (its ``AFFECTS``) says why it does
    not apply, with exit status 0, on a release outside them."""
    if not in_releases(_vllm_version(), _affected_releases(script)):
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0 and ("n/a:" in out.stdout or "ok:" in out.stdout), out.stdout + out.stderr
        return
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONHASHSEED": "0"})
    assert out.returncode == 1 and "BUG:" in out.stdout, out.stdout + out.stderr[-2000:]


def test_a_60_second_budget_against_vllm_ends_in_time_with_its_findings_labelled(tmp_path, capsys):
    """The PR-gate command without --known-findings: vLLM fails several
    layouts, each failing layout's shrinking is cut by the budget, and the
    whole run -- loading the target included -- ends within a few seconds
    of 60; the report groups the failures by known finding."""
    pytest.importorskip("vllm")
    import json
    import time

    start = time.perf_counter()
    code = main(["conform", "--target", "vllm", "--budget", "60", "--seed", "1", "--report-dir", str(tmp_path)])
    elapsed = time.perf_counter() - start
    out = capsys.readouterr().out
    assert code == 1
    assert elapsed < 65, f"a 60 s budget took {elapsed:.1f} s"
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["known_findings"], out  # the failures are labelled by finding
    assert "known finding F" in out
    assert (tmp_path / "traces").is_dir() and any((tmp_path / "traces").iterdir())
    markdown = (tmp_path / "report.md").read_text()
    assert "<details>" in markdown and "kvspec conform --target vllm --budget 60" in markdown
    assert "vLLM 0.25.1" in markdown
    assert "<testsuites" in (tmp_path / "junit.xml").read_text()


FORK = '''
"""A fork's patched BlockPool, tested without reinstalling: vLLM's class with one method changed."""
from vllm.v1.core.block_pool import BlockPool


class ForkPool(BlockPool):
    def free_blocks(self, ordered_blocks):
        blocks = list(ordered_blocks)
        for block in blocks:
            if block.ref_cnt == 2:
                block.ref_cnt += 1  # the fork's patch: a shared block keeps a reference
        super().free_blocks(blocks)


def fork(*args):
    return ForkPool(*args)


def upstream(*args):
    return BlockPool(*args)
'''


@pytest.mark.skipif(not _vllm_importable(), reason="vLLM 0.25.1 is not installed (tools/install_vllm.sh)")
def test_a_factory_of_vllms_classes_keeps_vllms_identity(tmp_path, monkeypatch, capsys):
    """module:factory around vLLM's classes -- the way a maintainer tests a
    patch without reinstalling -- is vLLM (issue 27): vLLM's known findings
    are steered around and its constructor's assertions read as refusals, so
    upstream as-is conforms as --target vllm does, and only the patch fails."""
    (tmp_path / "my_fork.py").write_text(FORK)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["conform", "--scope", "pool", "--layout", "two-groups", "--known-findings", "--examples", "60",
            "--no-progress"]
    assert main([argv[0], "--target", "my_fork:upstream", *argv[1:]]) == 0
    out = capsys.readouterr().out
    assert "target my_fork:upstream runs vllm's code: vllm's known findings apply" in out
    assert "steering around known findings F1" in out and "all layouts conform" in out, out
    assert main([argv[0], "--target", "my_fork:fork", *argv[1:]]) == 1
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith("pool     two-groups") and "FAILED" in line]
    assert "looks like known finding" not in row, row
    assert "ref-conservation" in out


def test_a_label_is_given_only_to_a_failure_that_breaks_the_findings_rules():
    """A run failing on a finding's input is labelled with the finding only
    when it breaks what the finding breaks: a fork's leak met while sending
    F1's negative count is the fork's failure, not F1 (issue 27)."""
    f1 = next(f for f in FINDINGS if f.id == "F1")
    trace = Trace.load(f1.trace_path)
    assert matching_finding("vllm", "pool", trace.layout, trace) == f1
    trace.failure = {**trace.failure, "rules": ["ref-conservation"]}
    assert matching_finding("vllm", "pool", trace.layout, trace) is None
    trace.failure = {**trace.failure, "rules": []}  # a divergence names no rule: the input decides
    assert matching_finding("vllm", "pool", trace.layout, trace) == f1


def test_a_finding_labels_only_a_failure_on_a_layout_that_can_show_it():
    """F5 is Mamba *align* mode with external tokens: the same kind of
    failure on an ``all``-mode layout is not F5 -- a fork's LRU change on
    full+mamba-all was labelled F5 (issue 52) -- nor on a layout with no
    Mamba group; on an align-mode layout it is."""
    f5 = next(f for f in FINDINGS if f.id == "F5")
    trace = Trace.load(f5.trace_path)
    assert "align" in trace.layout
    assert matching_finding("vllm", "manager", trace.layout, trace) == f5
    for other in ("full+mamba-all", "full+mamba-all-drafts", "full", "full+swa"):
        assert not f5.shows_on("manager", other), other
        assert matching_finding("vllm", "manager", other, trace) is None, other
    trace.failure = {**trace.failure, "rules": []}  # a bare divergence on the right layout and input: still F5
    assert matching_finding("vllm", "manager", trace.layout, trace) == f5
    assert matching_finding("vllm", "manager", "full+mamba-all", trace) is None


def test_a_divergence_from_an_upstream_run_in_lockstep_is_never_a_finding():
    """Under ``--against`` the upstream runs the same code the target
    inherited, findings and all: a difference from it is the target's
    change, whatever input it met (issue 52: a fork's LRU regression read
    as F5)."""
    f5 = next(f for f in FINDINGS if f.id == "F5")
    trace = Trace.load(f5.trace_path)
    trace.failure = {**trace.failure, "rules": []}
    trace.against = "vllm==0.25.1"
    assert matching_finding("vllm", "manager", trace.layout, trace) is None
    trace.failure = {**trace.failure, "rules": list(f5.rules)}  # a rule broken there is still the finding's
    assert matching_finding("vllm", "manager", trace.layout, trace) == f5


def test_every_finding_says_its_component_and_shows_on_some_layout():
    from kvspec.conformance.findings import COMPONENTS
    from kvspec.conformance.machines.layouts import LATER_LAYOUTS

    for finding in FINDINGS:
        assert finding.component in COMPONENTS, finding.id
        names = layout_names(finding.scope) + list(LATER_LAYOUTS)
        assert any(finding.shows_on(finding.scope, name) for name in names), finding.id


S2_BY_PREEMPTION = Path(__file__).parent / "traces" / "S2-by-preemption.json"


def test_s2_reached_by_preempting_the_failed_loads_owner_is_labelled_s2():
    """S2's other way in (docs/findings.md: "aborted, or finished, or
    preempted"): a failed load's owner preempted before it recomputes, its
    blocks left cached; on resuming it hits them.  The gate met it under
    --known-findings (which can steer around the abort, not around vLLM's
    own preemption): it is labelled S2, not read as a new failure."""
    trace = Trace.load(S2_BY_PREEMPTION)
    assert not any(step.rule == "abort" and step.draws for step in trace.steps)  # no abort of the owner
    assert matching_finding("vllm", "scheduler", trace.layout, trace).id == "S2"


@pytest.mark.skipif(not _vllm_importable(), reason="vLLM 0.25.1 is not installed (tools/install_vllm.sh)")
def test_s2_by_preemption_is_vllms_own_scheduler_reading_a_failed_load():
    """The trace replays on vLLM's own scheduler and fails where it was
    recorded, on content-soundness: the resumed owner reads blocks nothing
    wrote.  (Recorded on the base release, whose scheduler made the
    decisions the trace holds; the version matrix replays S2's own trace on
    every release.)"""
    trace = Trace.load(S2_BY_PREEMPTION)
    if _vllm_version() != BASE:
        pytest.skip(f"recorded under vLLM {BASE}'s scheduler; this is {_vllm_version()}")
    outcome = replay(trace, "vllm", trace.level)
    assert outcome.rules == ["content-soundness"] and outcome.diverged_at == trace.failure["step"], outcome.message
