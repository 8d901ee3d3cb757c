"""The scheduler-like machine: impl's KVCacheManager and the spec model side
by side over every layout -- every result, block table, pool state and event
equal, every rule kept after every operation."""

import pytest
from hypothesis.stateful import run_state_machine_as_test

from kvspec.conformance.machines.layouts import MANAGER_LAYOUTS
from kvspec.conformance.machines.manager import manager_machine
from kvspec.conformance.settings import load_profile, manager_settings
from kvspec.conformance.targets.manager import ImplManagerTarget
from kvspec.conformance.targets.spec_manager import SpecManagerTarget
from operations import record


@pytest.mark.parametrize("name", MANAGER_LAYOUTS)
def test_impl_matches_spec(name, request):
    machine = manager_machine(ImplManagerTarget, MANAGER_LAYOUTS[name], spec_factory=SpecManagerTarget)
    run_state_machine_as_test(machine, settings=manager_settings())
    record(request, f"manager {name}", machine.steps_run)
    if load_profile().max_examples >= 250:  # the ci and long profiles
        assert machine.steps_run >= 20_000, f"{name}: only {machine.steps_run} operations"
