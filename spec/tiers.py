"""Chapter 11: tiers -- an offloading manager, the block manager's lower tier.

vLLM keeps blocks a GPU evicts in a slower tier (CPU memory) so that a
later request can load them back instead of recomputing them.  The
scheduler side of such a tier is an ``OffloadingManager``: it answers which
keys it holds, hands out tier blocks to store into and to load from, and
evicts what no transfer uses.  This module is that manager as the spec: the
model (:class:`SpecOffloadingManager`, vLLM's API, an LRU or an ARC policy)
and the rules (``TIER_STATE_RULES`` / ``TIER_STEP_RULES``, each a small
predicate whose docstring is the rule; their names are
:data:`kvspec.spec.catalogue.TIER_RULES`).

The rules judge what a caller can know.  The caller keeps a
:class:`Ledger` from the answers alone -- which stores it has prepared and
completed, which loads are in flight, what was evicted -- and every rule is a
predicate over the ledger, the tier's :class:`TierSnapshot` and one step.

Each operation says what it *requires* and *guarantees*; a refused one
raises :class:`~kvspec.errors.RuleError` (a ``ValueError``) naming the value
and the rule, and changes nothing.
"""

from __future__ import annotations

import enum
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from kvspec.errors import RuleError

MEDIUM = "CPU"


class LookupResult(enum.Enum):
    """What :meth:`SpecOffloadingManager.lookup` answers (vLLM's names)."""

    MISS = enum.auto()
    HIT = enum.auto()
    HIT_PENDING = enum.auto()
    RETRY = enum.auto()


@dataclass(frozen=True)
class TierBlocks:
    """Where a store writes or a load reads: tier block ids, one per key."""

    block_ids: tuple[int, ...]

    @staticmethod
    def medium() -> str:
        return MEDIUM


@dataclass(frozen=True)
class PrepareStoreOutput:
    """A prepared store: the keys to write, their blocks, the keys evicted for them."""

    keys_to_store: list[bytes]
    store_spec: TierBlocks
    evicted_keys: list[bytes]


@dataclass(frozen=True)
class OffloadingEvent:
    """Keys stored (``removed`` false) or removed from the tier, in order."""

    keys: list[bytes]
    medium: str
    removed: bool


@dataclass
class ReqContext:
    """Per-request context (vLLM's); the tier reads nothing of it."""

    req_id: str = ""
    kv_transfer_params: dict[str, Any] | None = None


PENDING = -1
"""The reference count of a block whose store has not completed."""


@dataclass(frozen=True)
class TierSnapshot:
    """Everything observable of a tier between two operations.

    ``entries``: key -> (tier block id, ref count; ``PENDING`` while its
    store is in flight).  ``evictable``: the keys the policy may evict.
    ``num_evictable``: the tier's own count of them.  ``policy``: the
    policy's order (LRU: the evictable keys, least recent first; ARC: T1,
    T2, B1, B2 and the target size of T1) -- compared only in lockstep."""

    num_blocks: int
    entries: dict[bytes, tuple[int, int]]
    evictable: frozenset[bytes]
    num_evictable: int
    policy: tuple[Any, ...] = ()


# --- the policies ---------------------------------------------------------------------------


class LRU:
    """Least recently used first.  A use: a store completing, the last load
    of a block completing, a touch.  Only evictable keys are ordered."""

    name = "lru"

    def __init__(self, capacity: int) -> None:
        self.order: OrderedDict[bytes, None] = OrderedDict()

    def inserted(self, key: bytes) -> None:
        """A store was prepared: the key is not evictable yet."""

    def became_evictable(self, key: bytes) -> None:
        self.order[key] = None  # most recent

    def became_busy(self, key: bytes) -> None:
        del self.order[key]

    def removed(self, key: bytes) -> None:
        self.order.pop(key, None)

    def touch(self, keys: list[bytes], is_ready: Callable[[bytes], bool]) -> None:
        """The first key ends most recent: they are walked last to first."""
        for key in reversed(keys):
            if key in self.order:
                self.order.move_to_end(key)

    def victims(self, n: int, protected: set[bytes], evictable: Callable[[bytes], bool]) -> list[bytes] | None:
        chosen = [k for k in self.order if k not in protected][:n]
        return chosen if len(chosen) == n else None

    def evicted(self, keys: list[bytes]) -> None:
        for key in keys:
            del self.order[key]

    def clear(self) -> None:
        self.order.clear()

    def state(self) -> tuple[Any, ...]:
        return (tuple(self.order),)


class ARC:
    """Adaptive replacement: T1 holds keys used once, T2 keys used again;
    B1 and B2 remember keys evicted from each (ghosts, at most ``capacity``
    each); ``target`` -- how big T1 should be -- grows on a touch of a B1
    ghost and shrinks on a touch of a B2 ghost.  Eviction takes T1's oldest
    evictable key while T1 is at least ``int(target)``, else T2's -- and
    T1's when T2 has none: a store never gives up while an evictable key
    is left (tier-eviction; vLLM 0.25.1 gave up there, finding F18, and
    added this fallback in vllm#55461)."""

    name = "arc"

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.target = 0.0
        self.t1: OrderedDict[bytes, None] = OrderedDict()
        self.t2: OrderedDict[bytes, None] = OrderedDict()
        self.b1: OrderedDict[bytes, None] = OrderedDict()
        self.b2: OrderedDict[bytes, None] = OrderedDict()

    def inserted(self, key: bytes) -> None:
        self.t1[key] = None
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def became_evictable(self, key: bytes) -> None:
        """ARC orders by use, not by transfers: nothing moves."""

    def became_busy(self, key: bytes) -> None:
        """Nothing moves."""

    def removed(self, key: bytes) -> None:
        self.t1.pop(key, None)
        self.t2.pop(key, None)

    def touch(self, keys: list[bytes], is_ready: Callable[[bytes], bool]) -> None:
        """Walked last to first: a ready T1 key moves to T2 (a pending one
        stays in T1, most recent); a T2 key becomes most recent; a ghost
        adapts the target and becomes the most recent ghost."""
        for key in reversed(keys):
            if key in self.t1:
                del self.t1[key]
                (self.t2 if is_ready(key) else self.t1)[key] = None
            elif key in self.t2:
                self.t2.move_to_end(key)
            elif key in self.b1:
                self.target = min(self.target + max(1, len(self.b2) / len(self.b1)), self.capacity)
                self.b1.move_to_end(key)
            elif key in self.b2:
                self.target = max(self.target - max(1, len(self.b1) / len(self.b2)), 0)
                self.b2.move_to_end(key)

    def victims(self, n: int, protected: set[bytes], evictable: Callable[[bytes], bool]) -> list[bytes] | None:
        chosen: list[bytes] = []
        t1_size = len(self.t1)
        for _ in range(n):
            pick = None
            if t1_size >= int(self.target):
                pick = next((k for k in self.t1 if evictable(k) and k not in protected and k not in chosen), None)
                if pick is not None:
                    t1_size -= 1
            if pick is None:
                pick = next((k for k in self.t2 if evictable(k) and k not in protected and k not in chosen), None)
            if pick is None:
                pick = next((k for k in self.t1 if evictable(k) and k not in protected and k not in chosen), None)
                if pick is None:
                    return None
                t1_size -= 1
            chosen.append(pick)
        return chosen

    def evicted(self, keys: list[bytes]) -> None:
        for key in keys:
            if key in self.t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
        for ghosts in (self.b1, self.b2):
            while len(ghosts) > self.capacity:
                ghosts.popitem(last=False)

    def clear(self) -> None:
        self.__init__(self.capacity)  # type: ignore[misc]

    def state(self) -> tuple[Any, ...]:
        return (tuple(self.t1), tuple(self.t2), tuple(self.b1), tuple(self.b2), self.target)


POLICIES: dict[str, type[LRU] | type[ARC]] = {"lru": LRU, "arc": ARC}


# --- the manager ----------------------------------------------------------------------------


class SpecOffloadingManager:
    """A tier of ``num_blocks`` blocks, vLLM's ``OffloadingManager`` API.

    ``store_threshold`` (at least 2 to apply): a key is stored only once
    :meth:`lookup` has been asked for it that many times (the counts kept
    for the ``max_tracker_size`` keys asked most recently)."""

    def __init__(self, num_blocks: int, cache_policy: str = "lru", enable_events: bool = False,
                 store_threshold: int = 1, max_tracker_size: int = 64_000) -> None:
        if cache_policy not in POLICIES:
            raise RuleError("tier-policy", f"unknown cache policy {cache_policy!r}: use one of {sorted(POLICIES)}")
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise RuleError("tier-eviction", f"num_blocks must be a positive int, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.policy = POLICIES[cache_policy](num_blocks)
        self.blocks: dict[bytes, list[int]] = {}  # key -> [block id, ref count]
        self.fresh = 0  # blocks 0 .. fresh-1 have been handed out once
        self.free: list[int] = []  # returned blocks; the last returned is reused first
        self.events: list[OffloadingEvent] | None = [] if enable_events else None
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
        self.counts: OrderedDict[bytes, int] | None = OrderedDict() if store_threshold >= 2 else None

    # helpers

    def _ready(self, key: bytes) -> bool:
        return self.blocks[key][1] != PENDING

    def _evictable(self, key: bytes) -> bool:
        return self.blocks[key][1] == 0

    def _num_evictable(self) -> int:
        return sum(1 for _, ref in self.blocks.values() if ref == 0)

    def _num_free(self) -> int:
        return self.num_blocks - self.fresh + len(self.free)

    def _take_block(self) -> int:
        if self.fresh < self.num_blocks:
            self.fresh += 1
            return self.fresh - 1
        return self.free.pop()

    def _emit(self, keys: list[bytes], removed: bool) -> None:
        if keys and self.events is not None:
            self.events.append(OffloadingEvent(list(keys), MEDIUM, removed))

    # operations

    def on_new_request(self, req_context: ReqContext | None = None) -> None:
        """Nothing to do."""

    def on_request_finished(self, req_context: ReqContext | None = None) -> None:
        """Nothing to do."""

    def lookup(self, key: bytes, req_context: ReqContext | None = None) -> LookupResult:
        """Requires nothing.  Guarantees: HIT exactly when ``key``'s store
        completed successfully and it was not evicted since; HIT_PENDING when
        its store is in flight; MISS otherwise.  Counts the ask (store
        threshold)."""
        if self.counts is not None:
            if key in self.counts:
                self.counts.move_to_end(key)
                self.counts[key] += 1
            else:
                if len(self.counts) >= self.max_tracker_size:
                    self.counts.popitem(last=False)
                self.counts[key] = 1
        if key not in self.blocks:
            return LookupResult.MISS
        return LookupResult.HIT if self._ready(key) else LookupResult.HIT_PENDING

    def prepare_load(self, keys: Collection[bytes], req_context: ReqContext | None = None) -> TierBlocks:
        """Requires every key stored (HIT).  Guarantees: each key's ref count
        grows by one (it cannot be evicted until the load completes); returns
        the blocks the keys were stored in, in the keys' order."""
        keys = list(keys)
        for key in keys:
            if key not in self.blocks or not self._ready(key):
                state = "pending" if key in self.blocks else "absent"
                raise RuleError("tier-content-soundness", f"prepare_load of key {key!r}, which is {state}: "
                                "only a stored key can be loaded")
        for key in keys:
            if self.blocks[key][1] == 0:
                self.policy.became_busy(key)
            self.blocks[key][1] += 1
        return TierBlocks(tuple(self.blocks[k][0] for k in keys))

    def touch(self, keys: Collection[bytes], req_context: ReqContext | None = None) -> None:
        """Requires nothing.  Guarantees: the keys are used now (the policy's
        order), the first most recently; unknown keys are ignored."""
        self.policy.touch(list(keys), lambda k: self._ready(k))

    def complete_load(self, keys: Collection[bytes], req_context: ReqContext | None = None) -> None:
        """Requires a load in flight on every key.  Guarantees: each key's
        ref count drops by one; at 0 it is evictable again."""
        keys = list(keys)
        need = Counter(keys)
        for key, n in need.items():
            if key not in self.blocks or self.blocks[key][1] < n:
                raise RuleError("tier-ref-conservation", f"complete_load of key {key!r} with no load in flight on it")
        for key in keys:
            self.blocks[key][1] -= 1
            if self.blocks[key][1] == 0:
                self.policy.became_evictable(key)

    def prepare_store(self, keys: Collection[bytes], req_context: ReqContext | None = None
                      ) -> PrepareStoreOutput | None:
        """Requires distinct keys.  Guarantees: the keys to store are those
        asked (at or past the store threshold) that the tier does not hold,
        in order, each given a free block and pending; if the free blocks do
        not suffice, the policy evicts the difference among evictable keys
        not asked for here.  Returns ``None`` -- changing nothing -- when
        that many cannot be evicted."""
        keys = list(keys)
        if len(set(keys)) != len(keys):
            raise RuleError("tier-content-soundness", f"prepare_store of repeated keys {keys!r}")
        asked = keys
        if self.counts is not None:
            keys = [k for k in keys if self.counts.get(k, 0) >= self.store_threshold]
        new = [k for k in keys if k not in self.blocks]
        if not new:
            return PrepareStoreOutput([], TierBlocks(()), [])
        lacking = len(new) - self._num_free()
        evicted: list[bytes] = []
        if lacking > 0:
            if lacking > self._num_evictable():
                return None
            victims = self.policy.victims(lacking, set(asked), self._evictable)
            if victims is None:
                return None
            self.policy.evicted(victims)
            for key in victims:
                self.free.append(self.blocks.pop(key)[0])
            evicted = victims
            self._emit(evicted, removed=True)
        ids = []
        for key in new:
            ids.append(self._take_block())
            self.blocks[key] = [ids[-1], PENDING]
            self.policy.inserted(key)
        return PrepareStoreOutput(new, TierBlocks(tuple(ids)), evicted)

    def complete_store(self, keys: Collection[bytes], req_context: ReqContext | None = None,
                       success: bool = True) -> None:
        """Requires nothing.  Guarantees: each key whose store is pending is
        stored (success: ready, evictable, one stored event for them in
        order) or dropped and its block freed (failure).  A key not pending
        is left as it is."""
        pending = [k for k in dict.fromkeys(keys) if k in self.blocks and not self._ready(k)]
        for key in pending:
            if success:
                self.blocks[key][1] = 0
                self.policy.became_evictable(key)
            else:
                self.policy.removed(key)
                self.free.append(self.blocks.pop(key)[0])
        if success:
            self._emit(pending, removed=False)

    def reset_cache(self) -> None:
        """Requires no transfer still to complete (the scheduler's promise:
        completions of earlier jobs never arrive).  Guarantees: the tier is
        empty, every block free, the policy's memory gone."""
        self.blocks.clear()
        self.policy.clear()
        self.fresh = 0
        self.free.clear()

    def take_events(self) -> Iterable[OffloadingEvent]:
        """The events since the last call, oldest first."""
        events, self.events = (self.events or []), ([] if self.events is not None else None)
        return list(events)

    def snapshot(self) -> TierSnapshot:
        entries = {k: (b, r) for k, (b, r) in self.blocks.items()}
        evictable = frozenset(k for k, (_, r) in entries.items() if r == 0)
        return TierSnapshot(self.num_blocks, entries, evictable, len(evictable), self.policy.state())


# --- what the caller knows ------------------------------------------------------------------


@dataclass
class Ledger:
    """The caller's record, kept from the tier's answers alone: the block
    of each key whose store is pending or completed (and not evicted), the
    loads in flight, and the events the tier owes since they were last taken."""

    pending: dict[bytes, int] = field(default_factory=dict)
    stored: dict[bytes, int] = field(default_factory=dict)
    loads: Counter[bytes] = field(default_factory=Counter)
    owed: list[tuple[bool, tuple[bytes, ...]]] = field(default_factory=list)

    def held(self) -> dict[bytes, int]:
        return {**self.pending, **self.stored}


@dataclass(frozen=True)
class TierStep:
    """One operation: its name and arguments, the ledger and snapshot before
    it, what it returned (``None`` for a refused ``prepare_store``) or raised,
    and the snapshot after."""

    op: str
    args: tuple[Any, ...]
    ledger: Ledger
    before: TierSnapshot
    after: TierSnapshot
    result: Any = None
    error: BaseException | None = None


TierStateRule = Callable[[TierSnapshot, Ledger], list[str]]
TierStepRule = Callable[[TierStep], list[str]]
TIER_STATE_RULES: dict[str, list[TierStateRule]] = {}
TIER_STEP_RULES: dict[str, list[TierStepRule]] = {}


def _register(table: dict[str, list[Any]], name: str) -> Callable[[Any], Any]:
    def register(fn: Any) -> Any:
        table.setdefault(name, []).append(fn)
        fn.rule_name = name
        return fn

    return register


def tier_state_rule(name: str) -> Callable[[TierStateRule], TierStateRule]:
    return _register(TIER_STATE_RULES, name)


def tier_step_rule(name: str) -> Callable[[TierStepRule], TierStepRule]:
    return _register(TIER_STEP_RULES, name)


def short(key: bytes) -> str:
    return "#" + key[:4].hex() if isinstance(key, bytes) else repr(key)


# tier-content-soundness


@tier_state_rule("tier-content-soundness")
def tier_holds_the_ledger(snap: TierSnapshot, ledger: Ledger) -> list[str]:
    """The tier holds exactly the keys whose store is pending or completed
    and not evicted, each in the block its store was given; no two keys
    share a block, and every block id is one of the tier's."""
    held = ledger.held()
    problems = [f"key {short(k)} is in the tier, but no store of it is pending or completed"
                for k in snap.entries if k not in held]
    problems += [f"key {short(k)} was stored and not evicted, but the tier no longer holds it"
                 for k in held if k not in snap.entries]
    problems += [f"key {short(k)} is in block {snap.entries[k][0]}, its store wrote block {b}"
                 for k, b in held.items() if k in snap.entries and snap.entries[k][0] != b]
    owners = Counter(b for b, _ in snap.entries.values())
    problems += [f"block {b} holds {n} keys" for b, n in owners.items() if n > 1]
    problems += [f"block {b} is not a block of the tier (0 .. {snap.num_blocks - 1})"
                 for b in owners if not 0 <= b < snap.num_blocks]
    return problems


@tier_step_rule("tier-content-soundness")
def lookup_answers_from_completed_stores(step: TierStep) -> list[str]:
    """A lookup answers HIT only for a key whose store completed
    successfully (and was not evicted), HIT_PENDING only while its store is
    in flight, MISS otherwise: a failed or pending store is never served."""
    if step.op != "lookup" or step.error is not None:
        return []
    key, answer = step.args[0], step.result
    due = "HIT" if key in step.ledger.stored else "HIT_PENDING" if key in step.ledger.pending else "MISS"
    return [] if answer == due else [f"lookup({short(key)}) answered {answer}; the tier's stores say {due}"]


@tier_step_rule("tier-content-soundness")
def loads_read_what_was_stored(step: TierStep) -> list[str]:
    """A load reads each key from the block its store wrote."""
    if step.op != "prepare_load" or step.error is not None:
        return []
    keys, ids = list(step.args[0]), list(step.result)
    due = [step.ledger.stored.get(k) for k in keys]
    return [] if ids == due else [f"prepare_load({[short(k) for k in keys]}) reads blocks {ids}; they were "
                                  f"stored in {due}"]


@tier_step_rule("tier-content-soundness")
def stores_write_free_blocks(step: TierStep) -> list[str]:
    """A store writes only keys asked for and not held, once each, into
    blocks no other held key occupies (those its own evictions freed aside)."""
    if step.op != "prepare_store" or step.error is not None or step.result is None:
        return []
    to_store, ids, evicted = step.result
    problems = []
    asked, held = list(step.args[0]), step.ledger.held()
    problems += [f"prepare_store stores key {short(k)}, which was not asked for" for k in to_store if k not in asked]
    problems += [f"prepare_store stores key {short(k)} again: it is held already" for k in to_store if k in held]
    if len(set(to_store)) != len(to_store) or len(ids) != len(to_store):
        problems.append(f"prepare_store gives {len(ids)} blocks to keys {[short(k) for k in to_store]}")
    occupied = {b: k for k, b in held.items() if k not in evicted}
    problems += [f"prepare_store writes block {b}, which holds key {short(occupied[b])}" for b in ids if b in occupied]
    if len(set(ids)) != len(ids):
        problems.append(f"prepare_store writes blocks {list(ids)}: one block for two keys")
    return problems


# tier-ref-conservation


@tier_state_rule("tier-ref-conservation")
def refs_count_loads_in_flight(snap: TierSnapshot, ledger: Ledger) -> list[str]:
    """A stored key's ref count is the number of its loads in flight; a key
    whose store is in flight is marked pending (not readable)."""
    problems = []
    for key, (_, ref) in snap.entries.items():
        if key in ledger.pending and ref != PENDING:
            problems.append(f"key {short(key)} has ref count {ref}; its store is still in flight")
        elif key in ledger.stored and ref != ledger.loads[key]:
            problems.append(f"key {short(key)} has ref count {ref} with {ledger.loads[key]} load(s) in flight")
    return problems


# tier-eviction


@tier_state_rule("tier-eviction")
def evictable_exactly_when_idle(snap: TierSnapshot, ledger: Ledger) -> list[str]:
    """A key is evictable exactly when its store completed and no load is
    in flight on it; the tier's own count of such keys is right."""
    idle = {k for k in snap.entries if k in ledger.stored and ledger.loads[k] == 0}
    problems = [f"key {short(k)} is evictable but {'pending' if k in ledger.pending else 'being loaded'}"
                for k in snap.evictable - idle]
    problems += [f"key {short(k)} is idle but not evictable" for k in idle - snap.evictable]
    if snap.num_evictable != len(idle):
        problems.append(f"the tier counts {snap.num_evictable} evictable blocks; {len(idle)} are")
    return problems


@tier_step_rule("tier-eviction")
def evicts_only_idle_unprotected(step: TierStep) -> list[str]:
    """A store evicts only keys evictable before it and not among the keys
    it was asked to store, and only as many as it lacks free blocks for;
    it gives up (``None``, changing nothing) only when the evictable keys
    not asked for are too few."""
    if step.op != "prepare_store" or step.error is not None:
        return []
    asked, before = list(step.args[0]), step.before
    free = before.num_blocks - len(before.entries)
    if step.result is None:
        absent = [k for k in asked if k not in before.entries]
        available = len(before.evictable - set(asked))
        problems = []
        if len(absent) - free <= available:
            problems.append(f"prepare_store of {len(absent)} new key(s) gave up with {free} free and {available} "
                            "evictable blocks not asked for")
        if step.after.entries != before.entries:
            problems.append("prepare_store gave up and changed the tier")
        return problems
    to_store, _, evicted = step.result
    problems = [f"prepare_store evicted key {short(k)}, which was asked for" for k in evicted if k in asked]
    problems += [f"prepare_store evicted key {short(k)}, which was not evictable" for k in evicted
                 if k not in before.evictable]
    if len(evicted) > max(0, len(to_store) - free):
        problems.append(f"prepare_store evicted {len(evicted)} keys to store {len(to_store)} with {free} free blocks")
    if len(step.after.entries) > step.after.num_blocks:
        problems.append(f"the tier holds {len(step.after.entries)} keys in {step.after.num_blocks} blocks")
    return problems


# tier-events


@tier_step_rule("tier-events")
def events_describe_the_tier(step: TierStep) -> list[str]:
    """The events taken are, in order, one stored event per completed store
    naming the keys it made readable, and one removed event per eviction
    naming the keys evicted -- exactly what happened since the last take."""
    if step.op != "take_events" or step.error is not None:
        return []
    taken = [(bool(removed), tuple(keys)) for removed, keys in step.result]
    due = [e for e in step.ledger.owed if e[1]]
    if taken == due:
        return []

    def show(events: list[tuple[bool, tuple[bytes, ...]]]) -> str:
        return "[" + ", ".join(f"{'removed' if r else 'stored'} {[short(k) for k in ks]}" for r, ks in events) + "]"

    return [f"take_events gave {show(taken)}; the tier's changes were {show(due)}"]


# tier-policy (L2): the evictions are the policy's -- judged against the spec model in lockstep


@tier_step_rule("tier-policy")
def evicts_by_the_policy(step: TierStep, due: list[bytes] | None = None) -> list[str]:
    """The keys a store evicts are the ones the policy (LRU or ARC) picks,
    as the spec model running beside the target picks them."""
    if step.op != "prepare_store" or step.error is not None or due is None or step.result is None:
        return []
    evicted = list(step.result[2])
    return [] if evicted == due else [f"prepare_store evicted {[short(k) for k in evicted]}; the "
                                      f"policy evicts {[short(k) for k in due]}"]


def check_tier_state(snap: TierSnapshot, ledger: Ledger) -> list[tuple[str, str]]:
    """Every tier state rule: ``(rule, problem)`` pairs."""
    return [(name, p) for name, fns in TIER_STATE_RULES.items() for fn in fns for p in fn(snap, ledger)]


def check_tier_step(step: TierStep, due_evictions: list[bytes] | None = None) -> list[tuple[str, str]]:
    """Every tier step rule (the policy rule only given what the policy evicts)."""
    found = []
    for name, fns in TIER_STEP_RULES.items():
        for fn in fns:
            problems = fn(step, due_evictions) if name == "tier-policy" else fn(step)
            found += [(name, p) for p in problems]
    return found


def settle(ledger: Ledger, op: str, args: tuple[Any, ...], result: Any) -> None:
    """The caller's record after an accepted operation, from its answer:
    ``result`` in the plain form (lookups by name, block ids as a list, a
    store as ``(keys_to_store, block_ids, evicted)``, events as ``(removed,
    keys)``)."""
    if op == "prepare_load":
        ledger.loads.update(args[0])
    elif op == "complete_load":
        ledger.loads.subtract(args[0])
        ledger.loads = +ledger.loads
    elif op == "prepare_store" and result is not None:
        to_store, ids, evicted = result
        for key in evicted:
            ledger.stored.pop(key, None)
        if evicted:
            ledger.owed.append((True, tuple(evicted)))
        ledger.pending.update(zip(to_store, ids, strict=False))
    elif op == "complete_store":
        keys, success = args
        done = [k for k in dict.fromkeys(keys) if k in ledger.pending]
        for key in done:
            block = ledger.pending.pop(key)
            if success:
                ledger.stored[key] = block
        if success and done:
            ledger.owed.append((False, tuple(done)))
    elif op == "reset_cache":
        ledger.pending.clear()
        ledger.stored.clear()
        ledger.loads.clear()
    elif op == "take_events":
        ledger.owed.clear()
