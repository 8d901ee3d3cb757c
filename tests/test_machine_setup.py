"""The machines are module-level classes: made with a frozen setup and the
log of the search they belong to (issue 53), never configured or read
through class attributes."""

from __future__ import annotations  # the signature's annotation as the machines' modules write it

from hypothesis import settings
from hypothesis.internal.reflection import function_digest
from hypothesis.stateful import run_state_machine_as_test

from kvspec.conformance.machines.layouts import MANAGER_LAYOUTS
from kvspec.conformance.machines.machinery import SearchLog
from kvspec.conformance.machines.manager import ManagerMachine, ManagerSetup
from kvspec.conformance.machines.pool import LAYOUTS, PoolMachine, PoolSetup, pool_machine
from kvspec.conformance.runner import Search, run_layout
from kvspec.conformance.settings import load_profile
from kvspec.conformance.targets.manager import ImplManagerTarget
from kvspec.conformance.targets.pool import ImplPoolTarget
from kvspec.conformance.targets.spec_manager import SpecManagerTarget

FEW = settings(load_profile(), max_examples=5, stateful_step_count=10, database=None)


def test_a_third_party_runs_a_machine_from_its_setup_and_reads_its_log():
    setup = PoolSetup(target_factory=ImplPoolTarget, layout=LAYOUTS["tiny-pool"], layout_name="tiny-pool")
    log = SearchLog()
    run_state_machine_as_test(lambda: PoolMachine(setup, log), settings=FEW)
    assert log.examples_run >= 5 and log.steps_run > 0 and log.states_reached() > 0
    assert log.last_trace is not None and log.last_trace.layout == "tiny-pool"
    assert log.best_failure is None and log.first_failure_at is None

    manager = ManagerSetup(target_factory=ImplManagerTarget, layout=MANAGER_LAYOUTS["full"],
                           spec_factory=SpecManagerTarget)
    manager_log = SearchLog()
    run_state_machine_as_test(lambda: ManagerMachine(manager, manager_log), settings=FEW)
    assert manager_log.steps_run > 0


def test_two_searches_of_one_layout_share_nothing():
    """Each factory has its own log: what one search did is not the other's."""
    first, second = pool_machine(ImplPoolTarget, LAYOUTS["two-groups"]), pool_machine(ImplPoolTarget,
                                                                                       LAYOUTS["two-groups"])
    run_state_machine_as_test(first, settings=FEW)
    assert first.steps_run > 0 and second.steps_run == 0 and second.states_reached() == 0


def test_a_budgeted_swarm_search_runs_on_a_factory():
    """Under a budget the runner tells the log each batch's swarm (the
    inputs it leaves out, from the factory's options) and the deadlines."""
    factory = pool_machine(ImplPoolTarget, LAYOUTS["tiny-pool"], layout_name="tiny-pool")
    result = run_layout(factory, Search(FEW, seconds=1.0, seed=1, swarm=True, batch=2))
    assert result.conforms, result.details
    assert factory.log.examples_run > 2 and factory.log.steering and factory.log.search_deadline is None


def test_a_factory_is_digested_by_its_name_and_signature_not_the_machines_source():
    """Hypothesis seeds a derandomized run of a factory from its digest: the
    per-layout classes' name and signature (the renamed classes' source was
    never found), so editing a machine does not change what such a run draws."""
    factory = pool_machine(ImplPoolTarget, LAYOUTS["two-groups"])
    assert factory.__name__ == "PoolMachine_ImplPoolTarget"

    class Named:
        __name__ = "PoolMachine_ImplPoolTarget"

        def __call__(self) -> None:
            pass

    assert function_digest(factory) == function_digest(Named())
