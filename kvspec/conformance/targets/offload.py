"""An offloading tier as the offload machine drives it (spec chapter 11):
any manager with vLLM's ``OffloadingManager`` API -- the spec's, impl's,
vLLM's ``CPUOffloadingManager`` or a ``module:factory``'s -- seen in plain
form: lookups by name, block ids as lists, a prepared store as
``(keys_to_store, block_ids, evicted_keys)``, events as ``(removed, keys)``,
and its state as a :class:`~kvspec.spec.tiers.TierSnapshot`.

The state is read through the manager's ``snapshot()`` (the spec's),
``tier_state()`` (impl's, and any target that offers it) or, for vLLM's
class, the seam's reader (:mod:`kvspec.conformance.vllm.offload`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvspec.errors import SetupError
from kvspec.spec.tiers import ReqContext, TierSnapshot

CONTEXT = ReqContext("offload-machine")


def _snapshot_from_state(state: tuple[int, dict[bytes, tuple[int, int]], int, tuple[Any, ...]],
                         evictable: frozenset[bytes] | None = None) -> TierSnapshot:
    num_blocks, entries, num_evictable, order = state
    if evictable is None:
        evictable = frozenset(k for k, (_, ref) in entries.items() if ref == 0)
    return TierSnapshot(num_blocks, dict(entries), evictable, num_evictable, tuple(order))


class TierTarget:
    """A manager with vLLM's ``OffloadingManager`` API, in plain form."""

    def __init__(self, manager: Any, reader: Callable[[Any], TierSnapshot] | None = None) -> None:
        self.manager = manager
        if reader is None:
            if callable(getattr(manager, "snapshot", None)):
                reader = lambda m: m.snapshot()  # noqa: E731
            elif callable(getattr(manager, "tier_state", None)):
                reader = lambda m: _snapshot_from_state(m.tier_state())  # noqa: E731
            else:
                raise SetupError(f"{type(manager).__name__} cannot be read: give it snapshot() or tier_state() "
                                 "(spec chapter 11)")
        self.reader = reader

    def lookup(self, key: bytes) -> str:
        return self.manager.lookup(key, CONTEXT).name

    def prepare_load(self, keys: list[bytes]) -> list[int]:
        return [int(b) for b in self.manager.prepare_load(list(keys), CONTEXT).block_ids]

    def touch(self, keys: list[bytes]) -> None:
        self.manager.touch(list(keys), CONTEXT)

    def complete_load(self, keys: list[bytes]) -> None:
        self.manager.complete_load(list(keys), CONTEXT)

    def prepare_store(self, keys: list[bytes]) -> tuple[list[bytes], list[int], list[bytes]] | None:
        out = self.manager.prepare_store(list(keys), CONTEXT)
        if out is None:
            return None
        return list(out.keys_to_store), [int(b) for b in out.store_spec.block_ids], list(out.evicted_keys)

    def complete_store(self, keys: list[bytes], success: bool) -> None:
        self.manager.complete_store(list(keys), CONTEXT, success=success)

    def reset_cache(self) -> None:
        self.manager.reset_cache()

    def take_events(self) -> list[tuple[bool, tuple[bytes, ...]]]:
        return [(bool(e.removed), tuple(e.keys)) for e in self.manager.take_events()]

    def snapshot(self) -> TierSnapshot:
        return self.reader(self.manager)


def spec_tier(**options: Any) -> TierTarget:
    from kvspec.spec.tiers import SpecOffloadingManager

    return TierTarget(SpecOffloadingManager(**options))


def impl_tier(**options: Any) -> TierTarget:
    from kvspec.impl.offload import CPUOffloadingManager

    return TierTarget(CPUOffloadingManager(**options))


def vllm_tier(**options: Any) -> TierTarget:
    from kvspec.conformance.vllm import offload

    return wrap(offload.vllm_offloading_manager(**options))


def wrap(manager: Any) -> TierTarget:
    """Any built manager as a target: vLLM's class read through the seam."""
    if isinstance(manager, TierTarget):
        return manager
    from kvspec.conformance.vllm import offload

    if offload.is_vllm_manager(manager):
        return AssertingTierTarget(manager,
                                   lambda m: _snapshot_from_state(offload.tier_state(m), offload.lru_evictable(m)))
    return TierTarget(manager)


class AssertingTierTarget(TierTarget):
    """vLLM's manager, which refuses a call outside its contract (a load of
    a key not stored, a completion with no load in flight) by ``assert``:
    read as the refusal it is, a ``ValueError`` caused by the assertion --
    as vLLM's constructors' assertions are read (the conformance machines
    send no such call; the vectors do)."""

    def _refusing(self, op: str, *args: Any) -> Any:
        try:
            return getattr(TierTarget, op)(self, *args)
        except AssertionError as error:
            raise ValueError(f"vLLM refused {op} by assertion: {error}") from error

    def lookup(self, key: bytes) -> str:
        return self._refusing("lookup", key)

    def prepare_load(self, keys: list[bytes]) -> list[int]:
        return self._refusing("prepare_load", keys)

    def touch(self, keys: list[bytes]) -> None:
        self._refusing("touch", keys)

    def complete_load(self, keys: list[bytes]) -> None:
        self._refusing("complete_load", keys)

    def prepare_store(self, keys: list[bytes]) -> tuple[list[bytes], list[int], list[bytes]] | None:
        return self._refusing("prepare_store", keys)

    def complete_store(self, keys: list[bytes], success: bool) -> None:
        self._refusing("complete_store", keys, success)
