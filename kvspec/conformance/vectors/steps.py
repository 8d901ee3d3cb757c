"""What every kind of vector shares, below ``codec``, ``corpus`` and
``offload`` (which import it, never each other's privates): a vector's steps
walked with the state before and after each, and a scripted case's demand
that the spec refuse a call."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


def states(vector: Any) -> Iterator[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """(state before, step, state after) for each of ``vector``'s steps: a
    step records only what it changed, so each after is the before with it."""
    state = dict(vector.initial_state)
    for step in vector.steps:
        after = {**state, **step.get("state", {})}
        yield state, step, after
        state = after


def refused(fn: Callable[..., Any], *args: Any) -> None:
    """Call ``fn(*args)`` on a recording spec and require a refusal
    (ValueError or TypeError): a case that expects one and gets an answer is
    a wrong case, said at generation."""
    try:
        fn(*args)
    except (ValueError, TypeError):
        return
    raise AssertionError(f"the spec accepted {fn.__name__}{args}: the case expects a refusal")
