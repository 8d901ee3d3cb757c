"""What the conformance machines share: how a failure is reported, how a
refusal travels, how a call is made without letting its error escape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis.stateful import RuleBasedStateMachine

from kvspec.request import Request
from kvspec.spec.rules import Violation


class ConformanceError(AssertionError):  # noqa: N818 (it is an assertion failure)
    """The target broke a rule or diverged from the spec."""

    def __init__(self, violations: list[Violation] | None = None, divergence: str | None = None):
        self.violations = violations or []
        self.divergence = divergence
        lines = [str(v) for v in self.violations]
        if divergence:
            lines.append(f"divergence from the spec: {divergence}")
        super().__init__("\n".join(lines))


class Refused(Exception):  # noqa: N818 (a refusal is an outcome, not an error)
    """The target refused an operation (with ``ValueError``/``TypeError``)."""

    def __init__(self, error: BaseException):
        super().__init__(repr(error))
        self.error = error


def call(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any] | None = None
) -> tuple[Any, Exception | None]:
    """``(result, None)`` or ``(None, error)``: the caller judges the error
    (only a ``ValueError``/``TypeError`` refusal is acceptable)."""
    try:
        return fn(*args, **(kwargs or {})), None
    except Exception as error:
        return None, error


def describe_call(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """``op(arg, ...)`` for a report: requests by id, keyword arguments only
    when set."""
    parts = [a.request_id if isinstance(a, Request) else repr(a) for a in args]
    parts += [f"{k}={v!r}" for k, v in kwargs.items() if v]
    return f"{op}({', '.join(parts)})"


class CheckingMachine(RuleBasedStateMachine):
    """A state machine that reports rule violations and divergences.

    ``ignore_rules`` are the rules the run's conformance level does not ask
    for; once a failure is raised, ``failed`` keeps teardown from masking it.
    """

    ignore_rules: frozenset[str] = frozenset()

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def fail(self, violations: list[Violation] | None = None, divergence: str | None = None) -> None:
        violations = [v for v in violations or [] if v.rule not in self.ignore_rules]
        if not violations and divergence is None:
            return
        self.failed = True
        raise ConformanceError(violations, divergence)
