"""Findings at scheduler scope: minimal traces of vLLM's scheduler over its
block manager, each replayed by :class:`~kvspec.conformance.machines.scheduler.SchedulerHarness`.

Each trace is what the scheduler machine found, shrunk and written out as
calls.  :func:`replay` runs one against whatever vLLM is installed and says
whether it reproduces: a rule broken (the finding's rule) or the scheduler
raising.  docs/findings.md has the write-ups; ``tools/version_matrix.py``
replays every trace against every vLLM release.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvspec.conformance.machines.scheduler import Engine, SchedulerHarness
from kvspec.spec.layout import Layout
from kvspec.testing import full, mamba


@dataclass(frozen=True)
class SchedulerFinding:
    id: str
    title: str
    layout: Layout
    trace: Callable[[SchedulerHarness], list]  # returns the violations of the trace's steps
    upstream: str
    avoid: str  # the scheduler machine's input it needs (kvspec.conformance.machines.scheduler.AVOIDABLE)
    target: str = "vllm"  # found in vLLM's scheduler; every block manager under it inherits it
    engine: Engine = Engine()  # the engine configuration the trace runs under
    scope = "scheduler"
    component = "vllm-scheduler"  # kvspec.conformance.findings.COMPONENTS


def _hybrid(mode: str) -> Layout:
    return Layout((full(16), mamba(16, mode)), num_blocks=16, max_model_len=256)


def _steps(h: SchedulerHarness, n: int) -> list:
    problems = []
    for _ in range(n):
        problems += h.step()
    return problems


def _shallow_state_served_as_deep(h: SchedulerHarness) -> list:
    """Two prompts of 49 tokens fill the pool; the first's Mamba states are
    evicted (they sit ahead of its attention blocks in the free queue)
    except its first, while its attention blocks survive.  The same prompt
    again: attention hits 48 tokens, Mamba 16, and the scheduler (with a
    connector, on a Mamba hybrid) takes the larger as computed -- the state
    after 16 tokens is read as the state after 48."""
    a, b = [137] * 48 + [0], [864] * 48 + [0]
    h.arrive(a, max_tokens=1)
    problems = _steps(h, 1)
    h.arrive(b, max_tokens=2)
    problems += _steps(h, 1)
    h.arrive(b, max_tokens=1)
    h.arrive(a, max_tokens=1)
    return problems + _steps(h, 2)


def _unwritten_boundary_state_served(h: SchedulerHarness) -> list:
    """Mamba align mode keeps only a step's final state: a 66-token prompt
    prefilled as one 64-token chunk leaves no state at 48.  A second prompt
    sharing the first 48 tokens: attention hits 48, Mamba 0, and the
    scheduler takes 48 as computed -- with no state after 48 anywhere."""
    h.arrive([11] * 48 + [12] * 18, max_tokens=4)
    problems = _steps(h, 2)
    h.arrive([11] * 48 + [13] * 22, max_tokens=1)
    return problems + _steps(h, 2)


def _failed_load_served_after_abort(h: SchedulerHarness) -> list:
    """A synchronous load fails; under the recompute policy its blocks stay
    cached for the request to recompute.  The request is aborted before it
    runs again, and the next request with the same prompt hits the blocks
    the load never filled."""
    prompt = [864] * 48 + [0]
    h.arrive(prompt, max_tokens=1, remote_tokens=49, load="sync-fail")
    problems = _steps(h, 1)
    h.arrive(prompt, max_tokens=1)
    h.abort("r0")
    return problems + _steps(h, 1)


def _failed_load_served_after_in_flight_abort(h: SchedulerHarness) -> list:
    """S2 under vLLM's default policy (``fail``): the client's abort arrives
    while the failing step runs, and the engine drains it right before it
    hands the step's output to the scheduler.  The failed load's request is
    gone by then; the scheduler looks for the requests holding the invalid
    blocks among those running, finds none, and evicts nothing.  The next
    request with the same prompt hits the blocks the load never filled."""
    prompt = [864] * 48 + [0]
    h.arrive(prompt, max_tokens=1, remote_tokens=49, load="sync-fail")
    h.abort("r0", in_flight=True)
    problems = _steps(h, 1)
    h.arrive(prompt, max_tokens=1)
    return problems + _steps(h, 1)


def _hybrid_load_failure(h: SchedulerHarness) -> list:
    """A load fails on a hybrid (attention + Mamba) model: the scheduler's
    recovery unpacks one group's block ids."""
    h.arrive([864] * 48 + [0], max_tokens=1, remote_tokens=48, load="sync-fail")
    return _steps(h, 2)


SCHEDULER_FINDINGS: dict[str, SchedulerFinding] = {
    f.id: f for f in (
        SchedulerFinding(
            "S1", "per-group hits of a Mamba hybrid with a connector: the larger hit is taken as computed",
            _hybrid("all"), _shallow_state_served_as_deep,
            "vllm#46453 (the max over per-group hits; reported for Mamba deeper than attention), "
            "fixed for that direction by vllm#48425; the attention-deeper direction noted in review there",
            "scheduler:mamba-connector"),
        SchedulerFinding(
            "S1-align", "S1 in Mamba align mode (the only mode Mamba prefix caching keeps in 0.33): "
            "no state at the attention hit at all",
            _hybrid("align"), _unwritten_boundary_state_served, "as S1", "scheduler:mamba-connector"),
        SchedulerFinding(
            "S2", "a failed load's blocks stay cached; aborting their owner serves them to the next request",
            Layout((full(16),), num_blocks=12, max_model_len=256), _failed_load_served_after_abort,
            "related: vllm#49250 (recompute policy, sharers read before the owner recomputes), "
            "vllm PR #26813 (keeps the blocks cached under recompute by design); the abort path: none found",
            "scheduler:abort-failed-load"),
        SchedulerFinding(
            "S2-fail", "S2 under the default fail policy: an abort drained right before the failing step's "
            "output leaves the failed load's blocks cached",
            Layout((full(16),), num_blocks=12, max_model_len=256), _failed_load_served_after_in_flight_abort,
            "as S2", "scheduler:abort-failed-load", engine=Engine(failure_policy="fail")),
        SchedulerFinding(
            "S3", "a load failure on a hybrid model crashes the scheduler (one group's block ids unpacked)",
            _hybrid("align"), _hybrid_load_failure,
            "vllm#50687; fixed by vllm#50388 / #56855", "scheduler:hybrid-failing-loads"),
    )
}


def replay(finding: SchedulerFinding, *, async_scheduling: bool | None = None) -> tuple[str, str]:
    """Run ``finding``'s trace on the installed vLLM: ``("reproduces",
    first violation)``, ``("raises", error)`` or ``("holds", "")``; a layout
    the release cannot build is ``("n/a", why)``.  ``async_scheduling``
    overrides the finding's scheduler (``AsyncScheduler`` or ``Scheduler``)."""
    engine = finding.engine
    if async_scheduling is not None:
        engine = Engine(engine.failure_policy, async_scheduling)
    try:
        harness = SchedulerHarness(finding.layout, engine=engine)
    except Exception as error:  # the release refuses the layout (a mode it no longer has, ...)
        return "n/a", f"{type(error).__name__}: {error}"
    try:
        problems = finding.trace(harness)
    except Exception as error:
        return "raises", f"{type(error).__name__}: {error}"
    return ("reproduces", str(problems[0])) if problems else ("holds", "")
