"""Faults planted in vLLM's offloading tier (its ``CPUOffloadingManager`` and
the LRU and ARC policies), in memory, one line of vLLM's source each, must
be caught by ``kvspec conform --target vllm --scope offload --known-findings``
(spec chapter 11).  Unplanted, vLLM 0.25.1 conforms at L3 on every layout
but ``threshold-small-tracker``, where it has finding F17 (a store can evict
a key it was asked for; docs/findings.md): ``--known-findings`` steers
around that layout, and without it a run may fail there alone.

Run under tools/install_vllm.sh's environment:
``.venv-vllm/bin/python -m pytest tests/test_offload_vllm_faults.py``.
"""

from __future__ import annotations

import inspect
import sys
import textwrap
import time

import pytest

pytest.importorskip("vllm.v1.kv_offload.cpu.manager")

# Each search shrinks what it finds on every layout it fails: a fault takes 30 s to 4 minutes here (2 cores), the
# first failing check within seconds of the search's start (the "caught" times the tests print).
pytestmark = pytest.mark.slow

from kvspec.cli import main  # noqa: E402

MANAGER = "vllm.v1.kv_offload.cpu.manager:CPUOffloadingManager"
LRU = "vllm.v1.kv_offload.cpu.policies.lru:LRUCachePolicy"
ARC = "vllm.v1.kv_offload.cpu.policies.arc:ARCCachePolicy"

# name: (class, method, vLLM's text, the fault's text, the rules a run may report for it)
FAULTS = {
    "failed-store-served": (MANAGER, "complete_store", "if success:", "if True:",
                            {"tier-content-soundness", "tier-events"}),
    "load-not-counted": (MANAGER, "prepare_load", "block.ref_cnt += 1", "block.ref_cnt += 0",
                         {"tier-ref-conservation", "tier-eviction"}),
    "evictable-miscounted": (MANAGER, "complete_store", "self._num_evictable_cache_blocks += 1",
                             "self._num_evictable_cache_blocks += 2", {"tier-eviction"}),
    "removed-event-dropped": (MANAGER, "prepare_store", "if to_evict and self.events is not None:",
                              "if False:", {"tier-events"}),
    "lru-evicts-protected": (LRU, "evict", "if key in protected:", "if False:",
                             {"tier-eviction", "tier-content-soundness"}),
    "arc-never-promotes": (ARC, "touch", "self.t2[key] = block", "self.t1[key] = block",
                           {"tier-policy", "spec-equivalence"}),
}


def _owner(path: str) -> type:
    module, _, name = path.partition(":")
    __import__(module)
    return getattr(sys.modules[module], name)


def plant(monkeypatch, owner: type, name: str, old: str, new: str) -> None:
    """vLLM's ``owner.name`` recompiled from its own source with ``old`` made ``new``."""
    function = inspect.unwrap(getattr(owner, name))
    source = textwrap.dedent(inspect.getsource(function))
    assert source.count(old) == 1, f"{name}: the planted line is not in vLLM's source"
    scope: dict = {}
    exec(compile(source.replace(old, new), inspect.getsourcefile(function), "exec"),  # noqa: S102
         vars(sys.modules[function.__module__]), scope)
    monkeypatch.setattr(owner, name, scope[name])


def broken(out: str) -> dict[str, set[str]]:
    """The run's rule table: each rule and the layouts it broke in."""
    table = out.split("\nrule ", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    found = {}
    for line in table:
        rule, _, layouts = line.split(None, 2) if len(line.split(None, 2)) == 3 else (line.split()[0], "", "-")
        found[rule] = set() if layouts.strip() == "-" else {x.strip() for x in layouts.split(",")}
    return found


def conform(capsys, *flags: str) -> tuple[int, str, float]:
    start = time.perf_counter()
    code = main(["conform", "--target", "vllm", "--scope", "offload", *flags])
    return code, capsys.readouterr().out, time.perf_counter() - start


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_planted_fault_is_caught(fault, monkeypatch, capsys):
    owner, method, old, new, rules = FAULTS[fault]
    plant(monkeypatch, _owner(owner), method, old, new)
    # --fail-fast ends the run at the first failing layout: the search is the plain command's, and the
    # other layouts' shrinking (most of the 544 s the six faults took without it) is not the question here.
    code, out, seconds = conform(capsys, "--known-findings", "--fail-fast")
    assert code != 0, out
    caught = {rule for rule, layouts in broken(out).items() if layouts}  # the findings' layouts are skipped
    assert caught & rules, f"{fault} was not caught by {sorted(rules)}:\n{out}"
    print(f"{fault}: caught in {seconds:.1f} s")


def test_vllm_unplanted_conforms_with_its_finding_steered_around(capsys):
    code, out, _ = conform(capsys, "--known-findings")
    assert code == 0, out
    assert "threshold-small-tracker" in out and "F17" in out, out  # steered around, and said so
