"""Spec and impl side by side: every observation equal, every rule kept."""

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from kvspec.conformance.pool_machine import LAYOUTS, pool_machine
from kvspec.conformance.settings import load_profile
from kvspec.conformance.targets import ImplPoolTarget, SpecPoolTarget
from operations import OPERATIONS


@pytest.mark.parametrize("name", LAYOUTS)
def test_impl_matches_spec(name):
    machine = pool_machine(ImplPoolTarget, LAYOUTS[name])
    run_state_machine_as_test(machine, settings=settings(load_profile()))
    assert machine.steps_run > 0
    OPERATIONS[f"pool {name}"] = machine.steps_run


def test_spec_keeps_its_own_rules():
    machine = pool_machine(SpecPoolTarget, LAYOUTS["two-groups"], lockstep=False)
    run_state_machine_as_test(machine, settings=settings(load_profile(), max_examples=50))


def test_ci_profile_reaches_20000_operations():
    """Done-when of the pool milestone: at least 20,000 lockstep operations."""
    if load_profile().max_examples < 250:
        pytest.skip("only meaningful under the ci or long profile")
    pool = {k: v for k, v in OPERATIONS.items() if k.startswith("pool ")}
    assert len(pool) == len(LAYOUTS) and sum(pool.values()) >= 20_000, pool
