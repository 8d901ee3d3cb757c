"""Observing a manager: one operation between two snapshots.

The request-level rules judge a :class:`~kvspec.spec.request_rules.ManagerStep`
-- the call with its arguments by name, the snapshots around it, the result
or the refusal.  :func:`observe` makes one by calling a target; the
machines, the kernel stage and the proofs all observe through it.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from kvspec.spec.interface import ManagerTarget
from kvspec.spec.request_rules import ManagerStep, impossible_allocation


def observe(target: ManagerTarget, op: str, *args: Any, expected_pulled: int | None = None,
            **kwargs: Any) -> ManagerStep:
    """Call ``target.op(*args, **kwargs)`` between two snapshots.  A refusal
    (``ValueError``/``TypeError``) is recorded in the step, not raised."""
    method = getattr(target, op)
    try:
        if hasattr(type(target), op):
            named = _bind(type(target), op, args, kwargs)
        else:
            bound = inspect.signature(method).bind(*args, **kwargs)
            bound.apply_defaults()
            named = dict(bound.arguments)
    except TypeError:
        named = {"args": args, **kwargs}
    if op == "allocate_slots" and expected_pulled is None:
        expected_pulled = _estimate(target, named)
    before = target.snapshot()
    computed = getattr(named.get("request"), "num_computed_tokens", None)
    result, error = None, None
    try:
        result = method(*args, **kwargs)
    except (ValueError, TypeError) as e:
        error = e
    return ManagerStep(op, named, before, target.snapshot(), result, error, expected_pulled,
                       computed if type(computed) is int else None)


class MetricsLog:
    """A metrics collector with vLLM's ``KVCacheMetricsCollector`` interface
    that records what it hears, blocks by id; rule allocation-accounting
    (``metrics_follow_the_blocks``) judges each operation's calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int | None]] = []

    def on_block_allocated(self, block: Any) -> None:
        self.calls.append(("allocated", block.block_id))

    def on_block_accessed(self, block: Any) -> None:
        self.calls.append(("accessed", block.block_id))

    def on_block_evicted(self, block: Any) -> None:
        self.calls.append(("evicted", block.block_id))

    def reset(self) -> None:
        self.calls.append(("reset", None))

    def drain_events(self) -> list[Any]:
        return []  # residency metrics are not modelled: only which blocks the collector hears of

    def take(self) -> tuple[tuple[str, int | None], ...]:
        """The calls heard since the previous ``take``."""
        calls, self.calls = tuple(self.calls), []
        return calls


_ESTIMATED = ("num_new_tokens", "num_new_computed_tokens", "new_computed_blocks", "num_lookahead_tokens",
              "num_external_computed_tokens", "num_encoder_tokens")


def _estimate(target: ManagerTarget, named: dict[str, Any]) -> int | None:
    """The target's own estimate of the blocks ``allocate_slots(**named)``
    takes (``get_num_blocks_to_allocate``, optional in a target), asked just
    before the call; ``None`` where the target has none or the arguments are
    ones the allocation must refuse (rule allocation-accounting judges those)."""
    estimator = getattr(target, "get_num_blocks_to_allocate", None)
    if estimator is None or "request" not in named or impossible_allocation(named):
        return None
    try:
        return estimator(named["request"], **{name: named[name] for name in _ESTIMATED if name in named})
    except (ValueError, TypeError):  # hits the request may not take: the allocation refuses them
        return None


def _bind(cls: type, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``cls.op``'s arguments by name, defaults filled in, in the order of
    its parameters -- what ``signature.bind(*args, **kwargs)`` followed by
    ``apply_defaults()`` gives (``TypeError`` where it raises).  A method of
    plain parameters (no ``*args``, ``**kwargs`` or keyword-only ones) is
    bound here directly; ``Signature.bind`` was 2-3 % of an operation's
    checking, and the machines call ``observe`` for every operation."""
    plain = _plain_parameters(cls, op)
    if plain is None or len(args) > len(plain) or not kwargs.keys() <= plain.keys() - set(list(plain)[:len(args)]):
        bound = _signature(cls, op).bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)
    named = {}
    for i, (name, default) in enumerate(plain.items()):
        if i < len(args):
            named[name] = args[i]
        elif name in kwargs:
            named[name] = kwargs[name]
        elif default is inspect.Parameter.empty:
            raise TypeError(f"missing a required argument: {name!r}")
        else:
            named[name] = default
    return named


@functools.cache
def _plain_parameters(cls: type, op: str) -> dict[str, Any] | None:
    """``cls.op``'s parameters (but ``self``) and their defaults, when every
    one is positional-or-keyword (``None`` otherwise: :func:`_bind` leaves
    such a method to ``Signature.bind``)."""
    parameters = _signature(cls, op).parameters.values()
    if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters):
        return None
    return {p.name: p.default for p in parameters}


@functools.cache
def _signature(cls: type, op: str) -> inspect.Signature:
    """The signature of ``cls.op`` as a bound method has it (asked once per
    class and operation: ``inspect.signature`` is slow enough to show in a
    profile of the machines)."""
    signature = inspect.signature(getattr(cls, op))
    parameters = list(signature.parameters.values())
    return signature.replace(parameters=parameters[1:]) if parameters and parameters[0].name == "self" else signature
