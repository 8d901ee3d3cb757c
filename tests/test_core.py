"""The one-page core (spec/core.py) is the whole manager on a one-group
full-attention layout: the manager machine runs them in lockstep -- every
result, table, pool state and event equal, every rule kept -- over the
valid operations (the core leaves argument checks to the whole manager)."""

import os

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from kvspec.conformance.machines.layouts import MANAGER_LAYOUTS
from kvspec.conformance.machines.manager import manager_machine
from kvspec.conformance.settings import manager_settings
from kvspec.conformance.targets.spec_manager import SpecManagerTarget
from kvspec.spec.core import CoreManager
from operations import record

VALID_ONLY = frozenset({"bad-input:negative", "bad-input:no_tokens", "bad-input:trusted_args", "bad-config:any"})


@pytest.mark.parametrize("name", ["full", "mla"])
def test_the_core_is_the_whole_manager_on_one_full_attention_group(name, request):
    machine = manager_machine(CoreManager, MANAGER_LAYOUTS[name], spec_factory=SpecManagerTarget, avoid=VALID_ONLY)
    full = manager_settings()  # in ci a quarter of the manager machine's examples: 50 runs, ~9 s a layout
    ci = os.environ.get("HYPOTHESIS_PROFILE") == "ci"
    run_state_machine_as_test(machine, settings=settings(full, max_examples=full.max_examples // (4 if ci else 1)))
    record(request, f"core {name}", machine.steps_run)
    assert machine.steps_run > 0
