"""Spec and impl side by side: every observation equal, every rule kept.

As for the manager machine (test_manager_lockstep.py), the depth of this
search lives in ``kvspec conform --target impl`` (the README's main job, run
by CI before the suite, at 250 examples a layout); the ci profile runs a
quarter of it here, the long profile all of it."""

import os

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from kvspec.conformance.machines.pool import LAYOUTS, pool_machine
from kvspec.conformance.settings import load_profile
from kvspec.conformance.targets.pool import ImplPoolTarget, SpecPoolTarget
from operations import record


@pytest.mark.parametrize("name", LAYOUTS)
def test_impl_matches_spec(name, request):
    machine = pool_machine(ImplPoolTarget, LAYOUTS[name])
    ci = os.environ.get("HYPOTHESIS_PROFILE") == "ci"
    full = load_profile()
    run_state_machine_as_test(machine, settings=settings(full, max_examples=full.max_examples // (4 if ci else 1)))
    record(request, f"pool {name}", machine.steps_run)
    if full.max_examples >= 250:  # the ci and long profiles: 20,000 operations over the layouts (ci: a quarter)
        wanted = 20_000 // len(LAYOUTS) // (4 if ci else 1)
        assert machine.steps_run >= wanted, f"{name}: only {machine.steps_run} operations"
    assert machine.steps_run > 0


def test_spec_keeps_its_own_rules():
    machine = pool_machine(SpecPoolTarget, LAYOUTS["two-groups"], lockstep=False)
    run_state_machine_as_test(machine, settings=settings(load_profile(), max_examples=50))


