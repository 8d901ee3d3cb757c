"""The engines of other designs at cache scope (spec chapter 10), each
driven through its own classes: it conforms at L1 (and L2) on every
cache-scope layout, and every fault planted in its code is caught by the
rule it breaks.  Skipped where the engine is not installed
(tools/install_engine.sh ENGINE; CI installs each in its own venv)."""

import importlib.util
import time

import pytest
from hypothesis import settings

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
