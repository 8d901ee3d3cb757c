"""The failing run, cut to the steps it needs: delta debugging over a saved
trace, after Hypothesis's shrinker.

Hypothesis shrinks the *draws* of a failing run, and a budget often stops
it early: a bug that three operations reproduce can come out as a run of a
hundred steps ("shrinking stopped at the budget").  A trace, though, can be
replayed with any of its steps left out (:func:`kvspec.conformance.runner.replay`
feeds each step's recorded decisions to a fresh machine), so the steps
themselves can be cut: :func:`minimise` removes chunks of steps, halving
the chunks when no removal keeps the failure (Zeller's ddmin, complements
only), and keeps a cut only where the replay still fails **the same way**
-- the same rules broken, or, for a failure that names none (a divergence
from the spec, an exception out of the target), again one that names none
and is no step the trace cannot give (a recorded decision that no longer
fits: that is the cut's fault, not the target's).  It never trades the
failure it started from for another.

It runs in a time limit (replays against a slow target add up), and what
it returns is always a failing trace: the input itself when nothing could
be cut in time.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from kvspec.conformance.trace import Trace

MINIMISE_SECONDS = 10.0
"""The longest a layout's failing run is minimised after the search (less
when the run's budget ends sooner)."""

LEFT_THE_PATH = ("the target left the recorded path", "conforms up to the end of the trace")
"""How a replay reads that ends because the cut trace does not fit (a
decision with nothing to decide, a rule that cannot run): no failure."""


@dataclasses.dataclass
class Minimised:
    trace: Trace  # the shortest failing trace found, its failure recorded as the replay saw it
    message: str  # the replay's account of that failure
    replays: int  # how many replays the search ran


def minimise(trace: Trace, target: str | Callable[..., Any], level: str, *, seconds: float = MINIMISE_SECONDS,
             replay: Callable[..., Any] | None = None) -> Minimised | None:
    """``trace`` (a failing run) with every step it can do without, within
    ``seconds``; ``None`` when the trace does not fail on replay in the
    first place (then there is nothing to keep)."""
    if replay is None:
        from kvspec.conformance.runner import replay
    if "the target hangs" in (trace.failure or {}).get("message", "") or any(
            "did not return" in op for step in trace.steps for op in step.operations):
        return None  # each replay would wait out its time in the call that never returns
    deadline = time.perf_counter() + seconds
    wanted = sorted((trace.failure or {}).get("rules") or [])
    replays = 0

    def attempt(steps: list[Any]) -> Any | None:
        """The replay's outcome when ``steps`` fail as ``trace`` did, else None."""
        nonlocal replays
        left = deadline - time.perf_counter()
        if left <= 0:
            return None
        replays += 1
        candidate = dataclasses.replace(trace, steps=steps, failure=None)
        outcome = replay(candidate, target, level, seconds=left)
        if outcome.conforms or sorted(outcome.rules) != wanted or outcome.message.startswith(LEFT_THE_PATH):
            return None
        if "did not return within" in outcome.message or "did not finish within" in outcome.message:
            return None  # the time ran out inside the replay: no verdict
        return outcome

    steps = [s for s in trace.steps if s.rule != "teardown"]
    best = attempt(steps)
    if best is None:
        return None
    steps = steps[:best.diverged_at] if best.diverged_at <= len(steps) else steps  # nothing after the failure
    chunks = 2
    while len(steps) >= 2 and time.perf_counter() < deadline:
        size = -(-len(steps) // chunks)
        for start in range(0, len(steps), size):
            if steps[start].rule == "init":  # the machine's own opening, not a decision
                continue
            cut = steps[:start] + steps[start + size:]
            if cut and (outcome := attempt(cut)) is not None:
                steps, best = cut[:outcome.diverged_at] if outcome.diverged_at <= len(cut) else cut, outcome
                chunks = max(chunks - 1, 2)
                break
        else:
            if chunks >= len(steps):
                break
            chunks = min(len(steps), 2 * chunks)
    found = best.trace
    found = dataclasses.replace(trace, steps=list(found.steps), failure=found.failure)
    if found.failure is None:
        found.record_failure(wanted, best.message)
    return Minimised(found, best.message, replays)
