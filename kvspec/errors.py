"""Errors shared by the spec and the implementation.

A refused operation raises one of these *before* changing anything, so the
pool is exactly as it was.  Each names the rule of the catalogue that the
operation would have broken (``error.rule``) and the offending value.
"""

from __future__ import annotations

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
