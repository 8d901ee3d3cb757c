"""``kvspec conform --against``: a target run in lockstep with an upstream
that lives in another process (issue 27: "what did my patch change?").

The first tests need no vLLM: the remote protocol is shown with kvspec's own
pool served by a child process -- the same pool on both sides agrees, a
child that dies is the harness's failure (exit 2), never the target's.  The
last ones run a vLLM "fork" (vLLM's classes with one planted change, built
by a ``module:factory``) against vLLM itself, in the vLLM CI stage.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

from kvspec.cli import main
from kvspec.conformance.machines.pool import LAYOUTS, pool_machine
from kvspec.conformance.runner import Search, manager_layout, run_layout
from kvspec.conformance.settings import PROFILES
from kvspec.conformance.targets.pool import ImplPoolTarget
from kvspec.conformance.targets.remote import Child, Interpreter, RemoteFactory
from kvspec.conformance.vllm import installed, upstream
from kvspec.errors import HarnessFault, SetupError
from kvspec.hashing import get_request_block_hasher
from kvspec.request import Request

SERVER = '''
from kvspec.conformance.targets import remote
from kvspec.conformance.targets.pool import ImplPoolTarget
from kvspec.conformance.targets.spec_manager import SpecManagerTarget

CALLS = 0


def build(scope, args, kwargs):
    return (ImplPoolTarget if scope == "pool" else SpecManagerTarget)(*args, **kwargs)


def hello():
    return {"vllm": "none", "served": "kvspec's own targets"}


if __name__ == "__main__":
    remote.serve(build, hello)
'''

DYING = '''
import os
from kvspec.conformance.targets import remote
from kvspec.conformance.targets.pool import ImplPoolTarget

calls = 0


class Dies(ImplPoolTarget):
    def get_new_blocks(self, n):
        global calls
        calls += 1
        if calls == 3:
            os._exit(7)  # the child process dies mid-run
        return super().get_new_blocks(n)


if __name__ == "__main__":
    remote.serve(lambda scope, args, kwargs: Dies(*args, **kwargs), lambda: {"vllm": "none"})
'''


def child_running(tmp_path, name: str, source: str) -> Child:
    (tmp_path / f"{name}.py").write_text(source)
    return Child(Interpreter(sys.executable, name, path=(str(tmp_path),), label=f"the {name} child"))


def test_a_pool_in_a_child_process_answers_as_the_same_pool_here(tmp_path):
    """Lockstep over the protocol: kvspec's pool here and the same pool in a
    child agree on every operation (results, snapshots, events, refusals)."""
    child = child_running(tmp_path, "server", SERVER)
    try:
        machine = pool_machine(ImplPoolTarget, LAYOUTS["two-groups"], spec_factory=RemoteFactory(child, "pool"),
                               partner="upstream")
        result = run_layout(machine, Search(PROFILES["ci"], examples=15, seed=3))
        assert result.conforms, result.details
        assert result.operations > 100
        assert child.hello == {"vllm": "none", "served": "kvspec's own targets"}
    finally:
        child.stop()


def test_requests_keep_one_identity_in_the_child(tmp_path):
    """A request is mirrored once and moved on in place: the child's object
    is the same one from call to call, with the fields of the latest."""
    child = child_running(tmp_path, "server", SERVER)
    try:
        layout = manager_layout("full")
        target = layout.make_target(RemoteFactory(child, "manager"))
        request = Request("r", [1, 2, 3, 4, 5], block_hasher=get_request_block_hasher(layout.hash_block_size))
        assert target.get_computed_blocks(request)[1] == 0
        assert target.allocate_slots(request, 5) is not None
        request.num_computed_tokens = 5
        request.append_output_token_ids(6)
        assert target.allocate_slots(request, 1) is not None
        assert target.get_block_ids("r") == ([1, 2, 3],)
    finally:
        child.stop()


def test_a_child_that_dies_is_the_harness_failing_not_the_target(tmp_path):
    """The other side stops answering mid-run: the run stops as kvspec's own
    failure (a HarnessError: exit 2), with the child's last words -- never a
    "difference from upstream" charged to the target."""
    from kvspec.errors import HarnessError

    child = child_running(tmp_path, "dying", DYING)
    try:
        machine = pool_machine(ImplPoolTarget, LAYOUTS["two-groups"], spec_factory=RemoteFactory(child, "pool"),
                               partner="upstream")
        with pytest.raises((HarnessError, HarnessFault), match="the dying child stopped answering"):
            run_layout(machine, Search(PROFILES["ci"], examples=15, seed=3))
    finally:
        child.stop()


def test_an_upstream_that_is_not_one_is_a_usage_error(tmp_path, capsys):
    """--against names a release (vllm==X) or an interpreter; anything else,
    or an interpreter that does not serve, is one line and exit 2."""
    assert main(["conform", "--scope", "pool", "--against", "vllm-0.25", "--examples", "5", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--against 'vllm-0.25': name the upstream as vllm==X.Y.Z" in err and "Traceback" not in err
    not_python = tmp_path / "not-python"
    not_python.write_text("#!/bin/sh\nexit 0\n")
    not_python.chmod(0o755)
    with pytest.raises(SetupError, match="the upstream did not start"):
        upstream.start(str(not_python))


# --- a vLLM fork against vLLM ------------------------------------------------------------------

FORK = '''
from kvspec.conformance.vllm.targets import VllmManagerTarget
from vllm.v1.core.block_pool import BlockPool


def newest_first(pool):
    """The fork's one change: blocks freed together go back to the free
    queue in the other order (the same blocks, free and cached as before:
    no rule can tell, only which block a later allocation evicts first)."""
    free = pool.free_blocks

    def free_blocks(ordered_blocks):
        free(list(ordered_blocks)[::-1])

    pool.free_blocks = free_blocks
    return pool


def pool(*args):
    return newest_first(BlockPool(*args))


def manager(*args, **kwargs):
    target = VllmManagerTarget(*args, **kwargs)
    newest_first(target.manager.block_pool)
    return target


def same_pool(*args):
    return BlockPool(*args)


def same_manager(*args, **kwargs):
    return VllmManagerTarget(*args, **kwargs)
'''

needs_vllm = pytest.mark.skipif(installed.problem() is not None, reason="vLLM is not installed (tools/install_vllm.sh)")


@needs_vllm
def test_a_fork_against_its_upstream_reports_exactly_its_change(tmp_path, monkeypatch, capsys):
    """The fork's one planted change breaks no rule -- at L1 it conforms --
    but run against its upstream the first operation it changes is reported,
    as the fork's change and never as one of upstream's known findings (on
    full+mamba-all it was labelled F5, a Mamba *align* finding); an unchanged
    copy against the same upstream reports nothing.  The upstream here is this environment's own vLLM, run as a
    second process (--against PYTHON)."""
    (tmp_path / "against_fork.py").write_text(textwrap.dedent(FORK))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "against_fork", raising=False)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    common = ["--level", "L1", "--known-findings", "--examples", "15", "--no-progress", "--seed", "1"]
    layouts = (("pool", "two-groups", "pool"), ("manager", "full", "manager"), ("manager", "full+mamba-all", "manager"))
    for scope, layout, changed in layouts:
        base = ["conform", "--scope", scope, "--layout", layout, *common]
        if scope == "pool":  # (the manager only calls the pool: one scope shows it)
            assert main([*base, "--target", f"against_fork:{changed}"]) == 0, "the change breaks no rule"
            capsys.readouterr()
        assert main([*base, "--target", f"against_fork:{changed}", "--against", sys.executable]) == 1
        out = capsys.readouterr().out
        assert f"in lockstep with the upstream {sys.executable}" in out
        assert "difference from upstream: " in out and "upstream-equivalence" in out, out
        detail = next(line for line in out.splitlines() if "difference from upstream: " in line)
        assert "free_blocks(" in detail if scope == "pool" else "free(" in detail, detail  # where the change acts
        assert "pools differ" in out
        assert "looks like known finding" not in out, out  # the fork's LRU change on full+mamba-all read as F5
        assert main([*base, "--target", f"against_fork:same_{scope}", "--against", sys.executable]) == 0
        out = capsys.readouterr().out
        assert "all layouts conform" in out and "difference from upstream:" not in out, out


def test_against_a_release_says_what_it_downloads_before_it_does(tmp_path, monkeypatch, capsys):
    """--against vllm==X the first time downloads a release: what, how much
    and where is said before the download starts, and nothing is said when
    the release is already there (issue 52)."""
    from pathlib import Path

    said_before: list[str] = []

    def fake_pip(python, *args):
        said_before.append(capsys.readouterr().err)
        package = Path(args[1]) / ("vllm" if args[-1].startswith("vllm==") else "fastapi")
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")

    monkeypatch.setattr(upstream, "CACHE", tmp_path)
    monkeypatch.setattr(upstream, "pip", fake_pip)
    upstream.install("9.9.9")
    told = said_before[0]
    assert "downloading vLLM 9.9.9's wheel" in told and "about 250 MB" in told and str(tmp_path / "9.9.9") in told
    upstream.install("9.9.9")
    assert len(said_before) == 2 and "downloading" not in capsys.readouterr().err  # vLLM and the extras, once
