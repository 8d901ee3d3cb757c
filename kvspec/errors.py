"""Errors shared by the spec and the implementation, and by the rooms of
conformance.

A refused operation raises a :class:`RuleError` or :class:`RuleTypeError`
*before* changing anything, so the pool is exactly as it was.  Each names
the rule of the catalogue that the operation would have broken
(``error.rule``) and the offending value.

A conformance run that cannot start raises a :class:`SetupError` (exit 2);
one whose target does not import, a :class:`TargetImportError` (exit 1);
kvspec's own harness failing inside a run raises :class:`HarnessFault`,
which the runner turns into a :class:`HarnessError`.  They live here, below
every room of ``kvspec/conformance/``, because targets, machines, engines,
the vLLM seam and the runner all raise them (``tests/test_layers.py``).
"""

from __future__ import annotations

import traceback
from typing import Any


class RuleError(ValueError):
    """An operation was refused because applying it would break ``rule``."""

    def __init__(self, rule: str, message: str):
        super().__init__(f"[{rule}] {message}")
        self.rule = rule


class RuleTypeError(TypeError):
    """An argument has the wrong type for the operation; ``rule`` says why it matters."""

    def __init__(self, rule: str, message: str):
        super().__init__(f"[{rule}] {message}")
        self.rule = rule


def require_int(rule: str, name: str, value: Any, minimum: int = 0, why: str = "") -> int:
    """``value`` when it is an ``int`` (not a ``bool``) ``>= minimum``;
    otherwise a ``RuleTypeError`` for its type or a ``RuleError`` for its
    value, naming ``name`` (and ``why`` the minimum, if given)."""
    if type(value) is not int:
        raise RuleTypeError(rule, f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise RuleError(rule, f"{name} must be >= {minimum}{why}, got {value}")
    return value


class SetupError(Exception):
    """The run cannot start: a target, layout or file that is not usable."""


class TargetImportError(Exception):
    """The target is installed but its code does not import (a syntax
    error, a name a change removed): the target's failure -- a pull request
    that breaks vLLM's import is red, exit 1 -- not the environment's, as a
    target that is not installed is (:class:`SetupError`, exit 2)."""

    def __init__(self, target: str, error: BaseException):
        self.target, self.error, self.where = target, error, failing_line(error)
        text = " ".join(str(error).split())
        super().__init__(f"target {target} is installed but does not import: {type(error).__name__}: {text}"
                         + (f" (at {self.where})" if self.where else ""))


def failing_line(error: BaseException) -> str | None:
    """``file:line`` where ``error`` was raised: a syntax error's own, else
    the innermost frame of its traceback outside Python's import machinery."""
    if isinstance(error, SyntaxError) and error.filename:
        return f"{error.filename}:{error.lineno}"
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith("<frozen")]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else None


class HarnessError(SetupError):
    """kvspec's own harness failed (its code raised, not the target's): a
    usage or environment error, never the target's failure."""


class HarnessFault(KeyboardInterrupt):  # noqa: N818 (raised as an interrupt is: see BudgetSpent)
    """Inside a run: the harness raised.  An interrupt, so that Hypothesis
    neither shrinks it nor calls it the target's failure; the runner turns
    it into a :class:`HarnessError`."""
