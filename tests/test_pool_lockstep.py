"""Spec and impl side by side: every observation equal, every rule kept."""

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
    run_state_machine_as_test(machine, settings=settings(load_profile()))
    record(request, f"pool {name}", machine.steps_run)
    if load_profile().max_examples >= 250:  # the ci and long profiles: 20,000 operations over the layouts
        assert machine.steps_run >= 20_000 // len(LAYOUTS), f"{name}: only {machine.steps_run} operations"
    assert machine.steps_run > 0


def test_spec_keeps_its_own_rules():
    machine = pool_machine(SpecPoolTarget, LAYOUTS["two-groups"], lockstep=False)
    run_state_machine_as_test(machine, settings=settings(load_profile(), max_examples=50))


