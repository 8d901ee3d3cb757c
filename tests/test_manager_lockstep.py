"""The scheduler-like machine: impl's KVCacheManager and the spec model side
by side over every layout -- every result, block table, pool state and event
equal, every rule kept after every operation.

The depth of this search lives in the conformance gate: ``kvspec conform
--target impl`` (the README's main job, which CI runs before the suite) is
this lockstep at 200 examples a layout.  Here, in the ci profile, an eighth
of that -- a test a developer runs often, not the same search twice in CI
(the clean-clone CI measured 49-55 minutes against its 45); the long
profile keeps its full depth."""

import os

import pytest
from hypothesis import settings
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
    ci = os.environ.get("HYPOTHESIS_PROFILE") == "ci"
    full = manager_settings()
    run_state_machine_as_test(machine, settings=settings(full, max_examples=full.max_examples // (8 if ci else 1)))
    record(request, f"manager {name}", machine.steps_run)
    if load_profile().max_examples >= 250:  # the ci and long profiles
        assert machine.steps_run >= (2_500 if ci else 20_000), f"{name}: only {machine.steps_run} operations"
