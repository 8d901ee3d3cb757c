"""The engines of other designs at cache scope (spec chapter 10), each
driven through its own classes: it conforms at L1 (and L2) on every
cache-scope layout, and every fault planted in its code is caught by the
rule it breaks.  Skipped where the engine is not installed
(tools/install_engine.sh ENGINE; CI installs each in its own venv)."""

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import settings
from standalone import imported_packages

from kvspec.conformance import engines
from kvspec.conformance.engines import faults
from kvspec.conformance.machines.cache import CACHE_LAYOUTS
from kvspec.conformance.runner import Search, machine_for, run_layout

ENGINES = [e for e in faults.FAULTS if importlib.util.find_spec(e) is not None]
SEARCH = settings(max_examples=100, stateful_step_count=40, deadline=None, derandomize=True, database=None,
                  report_multiple_bugs=False)
SHRINK_SECONDS = 15  # a fault is caught at its first failing check; the shrinking after it is only for the report

pytestmark = pytest.mark.skipif(not ENGINES, reason="no engine of another design is installed here")


def search(engine, layout, level="L1", examples=100):
    deadline = time.perf_counter() + SHRINK_SECONDS + 60
    return run_layout(machine_for("cache", layout, engine, level), Search(SEARCH, examples=examples, deadline=deadline))


@pytest.mark.parametrize("layout", list(CACHE_LAYOUTS))
@pytest.mark.parametrize("engine", ENGINES)
def test_the_engine_conforms(engine, layout):
    if (why := engines.unsupported(engine, CACHE_LAYOUTS[layout])) is not None:
        pytest.skip(why)
    result = search(engine, layout, level="L2")
    assert result.conforms, result.details


PLANTED = [(e, f) for e in ENGINES for f in faults.FAULTS[e]]


@pytest.mark.parametrize("fault", PLANTED, ids=[f"{e}-{f.name}" for e, f in PLANTED])
def test_a_fault_planted_in_the_engine_is_caught(fault):
    engine, planted = fault
    with planted.planted():
        result = search(engine, planted.layout, examples=200)
    assert not result.conforms, f"{planted.name} ({planted.what}) was not caught"
    assert set(result.rules) & planted.rules, result.details
    assert search(engine, planted.layout, examples=20).conforms  # and the engine is itself again


@pytest.mark.parametrize("engine", ENGINES)
def test_every_fault_still_applies_to_the_installed_release(engine):
    for planted in faults.FAULTS[engine]:
        with planted.planted():
            pass
    assert len(faults.FAULTS[engine]) >= 5


SGLANG = pytest.mark.skipif("sglang" not in ENGINES, reason="SGLang is not installed (tools/install_engine.sh sglang)")
SG1_SCRIPT = Path(__file__).parent.parent / "docs" / "findings" / "repro" / "sglang" / \
    "SG1_all_swa_tree_keeps_window_freed_slots.py"


@SGLANG
def test_the_window_slides_in_sglangs_all_swa_cache_and_the_tree_keeps_the_prompt_only():
    """The window layout runs SGLang's own all-SWA path: decode steps free
    the slots behind the window (the view shows them released), and at the
    end the tree keys the prompt whole -- a prefill-aware model's floor."""
    from kvspec.conformance.engines import sglang

    target = sglang.target(CACHE_LAYOUTS["window-1"])
    assert target.admit("r0", [0, 1, 2, 0, 1, 2], None) == 0
    for _ in range(6):
        assert target.append("r0", [1, 2])
    view = target.view()
    released = [i for i, block in enumerate(view.tables["r0"]) if block is None]
    assert released and released[0] == 6  # the prompt (positions 0-5) stays; the window freed what followed it
    assert not set(view.tables["r0"]) & view.free
    target.finish("r0")
    view = target.view()
    assert {tokens for _, tokens in view.cached.values()} == {(0, 1, 2, 0, 1, 2)[:n] for n in range(1, 7)}
    assert not set(view.cached) & view.free


@SGLANG
def test_the_machine_finds_sg1_where_the_all_swa_model_is_not_prefill_aware():
    """SG1 from scratch: an all-SWA model that does not keep its prompt
    whole -- every one but UnlimitedOCR in SGLang 0.5.23 -- and the tree keys
    slots the window already freed."""
    from kvspec.conformance.engines.sglang import SglangCacheTarget
    from kvspec.conformance.machines.cache import cache_machine

    machine = cache_machine(lambda layout: SglangCacheTarget(layout, prefill_aware=False), CACHE_LAYOUTS["window-1"])
    result = run_layout(machine, Search(SEARCH, examples=200, deadline=time.perf_counter() + 90))
    assert not result.conforms
    # Shrunk to: a request outgrows the window by a token, finishes (the tree keys the freed slot), and the
    # tree is evicted -- the slot is freed twice, and SGLang's allocator asserts it has more free than it has.
    last = result.trace.steps[-1].operations[-1]
    assert last.startswith("evict(") and "AssertionError" in last, result.trace.readable()


@SGLANG
def test_sg1_standalone_reproduction_imports_sglang_alone_and_still_shows_the_bug():
    """The report's script runs where kvspec is not installed, and on the
    installed SGLang it still prints BUG and exits 1 (fixed: it says ok)."""
    imported = imported_packages(SG1_SCRIPT)
    assert "kvspec" not in imported and "sglang" in imported, imported
    out = subprocess.run([sys.executable, str(SG1_SCRIPT)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and out.stdout.count("BUG:") == 3, out.stdout + out.stderr[-2000:]


@SGLANG
def test_the_hybrid_model_runs_sglangs_unified_radix_cache_as_two_groups():
    """full+swa is SGLang's UnifiedRadixCache with components FULL and SWA:
    the window frees a decoding request's SWA slots (its swa row released
    there, its full row whole), the finished request leaves an SWA tombstone
    where the window had passed, and a later request's hit reaches past it
    -- its window's SWA pages served, nothing in swa before them."""
    from kvspec.conformance.engines import sglang
    from kvspec.spec.engines import GroupedView

    target = sglang.target(CACHE_LAYOUTS["full+swa"])
    assert type(target.tree).__name__ == "UnifiedRadixCache"
    prompt = [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
    assert target.admit("r0", prompt, None) == 0
    for _ in range(6):
        assert target.append("r0", [1])
    view = target.view()
    assert isinstance(view, GroupedView) and set(view.groups) == {"full", "swa"}
    assert None not in view.groups["full"].tables["r0"]
    assert view.groups["swa"].tables["r0"][0] is None  # behind the window: released
    target.finish("r0")
    view = target.view()
    assert len(view.groups["full"].cached) == 4 and len(view.groups["swa"].cached) == 3  # block 0's SWA: a tombstone
    assert target.admit("r1", prompt + [1, 1, 1, 1, 2], None) == 12
    view = target.view()
    assert view.groups["swa"].tables["r1"][0] is None and None not in view.groups["swa"].tables["r1"][1:]
    assert all(view.groups["full"].holds[b] == 1 for b in view.groups["full"].tables["r1"])
