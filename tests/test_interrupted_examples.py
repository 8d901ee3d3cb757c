"""An example cut short in the middle of a step -- by the budget, or by
Hypothesis stopping an example whose draws ran past its size limit -- leaves
the machine's model of the target half-updated.  Hypothesis still runs the
teardown; it must judge nothing then, or the gate turns red on a failure of
its own making.

The trace here is a real one: a budgeted search against impl was stopped
while the machine's step drew how many of a request's drafts were accepted,
after ``allocate_slots`` had already run.  Its teardown then freed the request
and "found" a cached block holding a rejected draft token -- announced as the
first failing check of a correct target."""

from pathlib import Path

import pytest

from kvspec.conformance.runner import _replay_step, machine_for
from kvspec.conformance.trace import ReplayData, Trace

TRACE = Path(__file__).parent / "traces" / "interrupted-eagle-step.json"


class Interrupt(BaseException):
    """What Hypothesis raises to end an example (StopTest is a BaseException too)."""


class InterruptedData(ReplayData):
    def draw(self, strategy, label=None):
        if self.used == len(self.draws):
            raise Interrupt
        return super().draw(strategy, label)


def test_a_step_cut_short_is_not_judged_by_the_teardown():
    trace = Trace.load(TRACE)
    steps = [s for s in trace.steps if s.rule != "teardown"]
    machine = machine_for(trace.scope, trace.layout, "impl", "L3", frozenset(trace.avoid))()
    for i, step in enumerate(steps[:-1], 1):
        _replay_step(machine, i, step, failed_here=False)
    last = steps[-1]
    with pytest.raises(Interrupt):
        machine.schedule(data=InterruptedData(last.draws, "the interrupted step"))
    assert machine.interrupted and not machine.failed
    machine.teardown()  # judges nothing: no ConformanceError
    assert machine.log.first_failure_at is None
