"""The failing run cut to the steps it needs (kvspec.conformance.gate.minimise):
delta debugging by replay, after Hypothesis's shrinker (issue 27)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvspec.conformance.gate import minimise
from kvspec.conformance.trace import Trace, TraceStep


@dataclass
class Outcome:
    diverged_at: int | None
    rules: list[str]
    message: str
    trace: Trace = field(default_factory=lambda: Trace("pool", "tiny-pool"))

    @property
    def conforms(self) -> bool:
        return self.diverged_at is None


def scripted(fails):
    """A replay whose verdict is ``fails(names)`` on the steps' names: the rules broken ([] and a
    message for a divergence), or None (conforms)."""
    calls = []

    def replay(trace, target, level, seconds=None):
        names = [s.rule for s in trace.steps]
        calls.append(names)
        verdict = fails(names)
        if verdict is None:
            return Outcome(None, [], "conforms over the whole trace")
        rules, message = verdict
        done = Trace(trace.scope, trace.layout, steps=list(trace.steps))
        done.record_failure(rules, message)
        return Outcome(len(names), rules, message, done)

    return replay, calls


def trace_of(names: str) -> Trace:
    trace = Trace("pool", "tiny-pool", steps=[TraceStep(n) for n in names])
    trace.record_failure(["ref-conservation"], "block 1 has ref_cnt 2 but 1 holder(s)")
    return trace


def test_a_long_run_comes_down_to_the_steps_the_failure_needs():
    replay, calls = scripted(lambda names: (["ref-conservation"], "leak") if {"B", "E"} <= set(names) else None)
    cut = minimise(trace_of("ABCDEFGHIJKLMNOP"), "t", "L1", replay=replay)
    assert [s.rule for s in cut.trace.steps] == ["B", "E"]
    assert cut.trace.failure["rules"] == ["ref-conservation"] and cut.replays == len(calls) < 60


def test_it_never_trades_the_failure_for_another():
    """Without E the run still fails -- but another rule: that cut is refused."""
    def fails(names):
        if "B" in names and "E" in names:
            return ["ref-conservation"], "leak"
        if "B" in names:
            return ["hit-soundness"], "another bug"
        return None

    replay, _ = scripted(fails)
    cut = minimise(trace_of("ABCDEFGH"), "t", "L1", replay=replay)
    assert [s.rule for s in cut.trace.steps] == ["B", "E"] and cut.trace.failure["rules"] == ["ref-conservation"]


def test_a_cut_that_leaves_the_recorded_path_is_no_failure():
    def fails(names):
        if "C" not in names:
            return [], "the target left the recorded path: step 2 (admit): ..."  # the cut's fault
        return (["ref-conservation"], "leak") if "F" in names else None

    replay, _ = scripted(fails)
    cut = minimise(trace_of("ABCDEF"), "t", "L1", replay=replay)
    assert [s.rule for s in cut.trace.steps] == ["C", "F"]


def test_a_trace_that_does_not_fail_on_replay_is_left_alone():
    replay, calls = scripted(lambda names: None)
    assert minimise(trace_of("ABC"), "t", "L1", replay=replay) is None and len(calls) == 1


def test_a_real_run_hypothesis_did_not_shrink_is_cut_back_and_still_replays():
    """A broken pool's failing run as found (shrinking off, as when a budget
    stops it): the cut is a few steps and replays to the same rules."""
    from hypothesis import Phase, settings

    from kvspec.conformance.runner import Search, machine_for, replay, run_layout
    from kvspec.conformance.settings import scope_settings

    target = "broken_pools:DoubleDecrement"
    unshrunk = settings(scope_settings("pool", "ci"), phases=[Phase.generate])
    found = run_layout(machine_for("pool", "tiny-pool", target, "L1"), Search(unshrunk, examples=100)).trace
    assert found is not None and found.failure and len(found.steps) > 10, found
    cut = minimise(found, target, "L1")
    assert cut is not None and len(cut.trace.steps) <= 4, cut.trace.readable()
    again = replay(cut.trace, target, "L1")
    assert not again.conforms and sorted(again.rules) == sorted(found.failure["rules"])
