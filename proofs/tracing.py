"""Where a proof harness stops being symbolic.

CrossHair executes the code under proof with symbolic inputs and intercepts
every operation of every function it calls -- which makes a harness's own
checking (snapshots, rule predicates, the spec run in lockstep) the bulk of
the cost.  The checker is the oracle, not the subject: a harness calls the
production code traced, then turns what it returned into plain values
(:func:`concrete`) and checks them :func:`untraced`.  Outside a CrossHair run
(a plain call, a test) both are no-ops.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TypeVar

from crosshair import deep_realize
from crosshair.tracers import NoTracing, is_tracing

T = TypeVar("T")


def concrete(value: T) -> T:
    """``value`` with every symbolic part replaced by one concrete value
    (CrossHair branches over the others, so no case is lost)."""
    return deep_realize(value) if is_tracing() else value


def untraced() -> AbstractContextManager[object]:
    """Run the block at native speed: CrossHair neither intercepts nor
    branches inside it, so it must see concrete values only."""
    return NoTracing() if is_tracing() else nullcontext()
