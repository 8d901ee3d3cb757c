"""The pool-level rules, each a named predicate.

A rule is a function that returns the list of ways the rule is broken: an
empty list means it holds.  The docstring of each function *is* the rule.

Two kinds:

- **state rules** look at one :class:`~kvspec.spec.interface.PoolSnapshot`
  (and, for ref counts, at who holds what);
- **step rules** look at one operation: the snapshot before, the call, what it
  returned or raised, and the snapshot after.

:func:`check_state` and :func:`check_step` run every rule of a kind and return
:class:`Violation` records that cite the rule's name.  The names are the
catalogue (:mod:`kvspec.spec.catalogue`); reports and exceptions use the same names.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvspec.hashing import (
    block_hash_converter,
    block_hashes_for_size,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
)
from kvspec.spec.interface import NULL_BLOCK_ID, Cleared, Event, PoolSnapshot, Removed, Stored
from kvspec.spec.pool import requeue, stored_event
from kvspec.spec.releases import REFERENCE, Release


@dataclass(frozen=True)
class Violation:
    """Rule ``rule`` is broken, as ``message`` explains."""

    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.message}"


@dataclass(frozen=True)
class Step:
    """One operation as observed from outside the pool."""

    op: str
    args: tuple[Any, ...]
    before: PoolSnapshot
    after: PoolSnapshot
    result: Any = None
    error: BaseException | None = None
    caching: bool = True
    """Whether the pool caches prefixes (where freed blocks go depends on it from 0.27)."""
    release: Release = REFERENCE
    """The release whose rules judge the step (chapter Releases)."""


StateRule = Callable[..., list[str]]
StepRule = Callable[[Step], list[str]]

STATE_RULES: dict[str, StateRule] = {}
STEP_RULES: dict[str, list[StepRule]] = {}


def state_rule(name: str) -> Callable[[StateRule], StateRule]:
    def register(fn: StateRule) -> StateRule:
        STATE_RULES[name] = fn
        fn.rule_name = name  # type: ignore[attr-defined]
        return fn

    return register


def step_rule(name: str) -> Callable[[StepRule], StepRule]:
    def register(fn: StepRule) -> StepRule:
        STEP_RULES.setdefault(name, []).append(fn)
        fn.rule_name = name  # type: ignore[attr-defined]
        return fn

    return register


# --- state rules ----------------------------------------------------------------


@state_rule("ref-conservation")
def ref_conservation(snap: PoolSnapshot, holders: Mapping[int, int] | None = None) -> list[str]:
    """Every non-null block's ref count is never negative and, when the
    holders are known, equals the number of slots that hold it."""
    problems = [
        f"block {b} has ref_cnt {r} < 0"
        for b, r in enumerate(snap.ref)
        if b != NULL_BLOCK_ID and r < 0
    ]
    if holders is not None:
        for b in range(1, snap.num_blocks):
            if snap.ref[b] != holders.get(b, 0):
                problems.append(
                    f"block {b} has ref_cnt {snap.ref[b]} but {holders.get(b, 0)} holder(s)"
                )
    return problems


def repeated(items: Sequence[Any]) -> dict[Any, int]:
    """The items listed more than once, each with how often (in order of
    first listing).  Most lists repeat nothing: then no counting at all."""
    if len(set(items)) == len(items):
        return {}
    return {item: n for item, n in Counter(items).items() if n > 1}


@state_rule("free-queue-consistency")
def free_queue_consistency(snap: PoolSnapshot) -> list[str]:
    """A block is in the free queue exactly when its ref count is 0 and it is
    not the null block, and at most once."""
    problems = [f"block {b} is queued {n} times" for b, n in repeated(snap.free).items()]
    ref = snap.ref
    unheld = {b for b in range(1, snap.num_blocks) if ref[b] == 0}
    queued = set(snap.free) - {NULL_BLOCK_ID}
    problems += [f"block {b} has ref_cnt 0 but is not queued" for b in sorted(unheld - queued)]
    problems += [
        f"block {b} is queued with ref_cnt {snap.ref[b]}"
        for b in sorted(queued - unheld)
        if 0 <= b < snap.num_blocks
    ]
    problems += [f"unknown block {b} is queued" for b in queued if not 0 <= b < snap.num_blocks]
    return problems


@state_rule("null-exclusion")
def null_exclusion(snap: PoolSnapshot) -> list[str]:
    """The null block is never queued, never hashed and never in the table."""
    problems = []
    if NULL_BLOCK_ID in snap.free:
        problems.append("the null block is in the free queue")
    if NULL_BLOCK_ID in snap.key_of:
        problems.append("the null block carries a hash")
    if any(NULL_BLOCK_ID in blocks for blocks in snap.table.values()):
        problems.append("the null block is in the hash table")
    return problems


@state_rule("hash-map-consistency")
def hash_map_consistency(snap: PoolSnapshot) -> list[str]:
    """The table and each block's keys agree: a block with key ``k`` -- its
    own or a partial entry -- is listed under ``k`` (once), and every block
    listed under ``k`` carries ``k``.  No key maps to an empty list, and only
    a block with a key of its own owns partial entries."""
    problems = []
    key_of, partial_of = snap.key_of, snap.partial_of
    for key, blocks in snap.table.items():
        if not blocks:
            problems.append(f"key {key.hex()[:12]} maps to no block")
        problems += [f"block {b} is listed {n} times under one key" for b, n in repeated(blocks).items()]
        for b in dict.fromkeys(blocks):  # each block once, in the order listed
            if key_of.get(b) != key and key not in partial_of.get(b, ()):
                problems.append(f"block {b} is listed under a key it does not carry")
    for b, key in snap.key_of.items():
        if b not in snap.table.get(key, ()):
            problems.append(f"block {b} carries a key the table does not list it under")
    for b, keys in snap.partial_of.items():
        if b not in snap.key_of:
            problems.append(f"block {b} owns partial entries but has no key of its own")
        problems += [f"block {b} owns a partial entry the table does not list it under"
                     for k in keys if b not in snap.table.get(k, ())]
    return problems


def check_state(snap: PoolSnapshot, holders: Mapping[int, int] | None = None,
                leave_out: frozenset[str] = frozenset()) -> list[Violation]:
    """Every state rule, against one snapshot (but those named in
    ``leave_out``: a caller that judges them its own way)."""
    out = []
    for name, fn in STATE_RULES.items():
        if name in leave_out:
            continue
        problems = fn(snap, holders) if name == "ref-conservation" else fn(snap)
        out += [Violation(name, p) for p in problems]
    return out


# --- step rules -------------------------------------------------------------------


def _unchanged(step: Step) -> list[str]:
    before, after = step.before.without_null_ref(), step.after.without_null_ref()
    return [] if before == after else [f"{step.op} was refused but changed the pool"]


@step_rule("allocation-accounting")
def refused_changes_nothing(step: Step) -> list[str]:
    """A refused operation changes no state."""
    return _unchanged(step) if step.error is not None else []


@step_rule("allocation-accounting")
def allocation_takes_the_head(step: Step) -> list[str]:
    """``get_new_blocks(n)`` returns exactly the first ``n`` blocks of the free
    queue, each now held once; it is refused exactly when fewer than ``n``
    blocks are free (or ``n`` is negative)."""
    if step.op != "get_new_blocks":
        return []
    (n,) = step.args
    impossible = type(n) is not int or n < 0 or n > step.before.num_free
    if step.error is not None:
        return [] if impossible else [f"get_new_blocks({n}) refused with {step.before.num_free} free"]
    if impossible:
        return [f"get_new_blocks({n}) succeeded with {step.before.num_free} free"]
    problems = []
    if list(step.result) != list(step.before.free[:n]):
        problems.append(f"got {step.result}, the queue head was {list(step.before.free[:n])}")
    problems += [f"new block {b} has ref_cnt {step.after.ref[b]}" for b in step.result if step.after.ref[b] != 1]
    return problems


@step_rule("hash-map-consistency")
def reused_block_loses_its_hash(step: Step) -> list[str]:
    """A block taken from the free queue for reuse loses every hash before
    reuse: it is no longer a hit for its old content."""
    if step.op != "get_new_blocks" or step.error is not None:
        return []
    after = step.after
    return [f"reused block {b} still carries a hash" for b in step.result if b in after.key_of or b in after.partial_of]


@step_rule("hash-map-consistency")
def lookup_answers_from_the_table(step: Step) -> list[str]:
    """A lookup answers from the table: for each group asked, in order, a
    block cached under the hash for that very group (or nothing at all)."""
    if step.op != "get_cached_block" or step.error is not None or step.result is None:
        return []
    block_hash, group_ids = step.args[0], list(step.args[1])
    if len(step.result) != len(group_ids):
        return [f"a lookup for {len(group_ids)} groups returned {len(step.result)} blocks"]
    problems = []
    for g, b in zip(group_ids, step.result, strict=True):
        if b not in step.before.table.get(make_block_hash_with_group_id(block_hash, g), ()):
            problems.append(f"the lookup for group {g} returned block {b}, which is not cached under "
                            f"that hash for group {g}")
    return problems


@step_rule("null-exclusion")
def null_never_handed_out(step: Step) -> list[str]:
    """``get_new_blocks`` never returns the null block."""
    if step.op == "get_new_blocks" and step.error is None and NULL_BLOCK_ID in step.result:
        return ["get_new_blocks handed out the null block"]
    return []


def expected_free_queue(before: PoolSnapshot, op: str, args: tuple[Any, ...], result: Any,
                        caching: bool = True, release: Release = REFERENCE) -> tuple[int, ...] | None:
    """The free queue the reference order prescribes after ``op`` (``None``
    for operations whose effect on order no rule prescribes)."""
    free = list(before.free)
    if op == "get_new_blocks":
        return tuple(free[len(result):])
    if op == "touch":
        for b in args[0]:
            if b in free:
                free.remove(b)
        return tuple(free)
    if op == "free_blocks":
        ref = list(before.ref)
        plain, cached = [], []
        for b in args[0]:
            if b == NULL_BLOCK_ID:
                continue
            ref[b] -= 1
            if ref[b] == 0:
                (cached if b in before.key_of else plain).append(b)
        return tuple(requeue(free, plain, cached, caching, release))
    if op in ("cache_full_blocks", "evict_blocks", "reset_prefix_cache", "get_cached_block", "take_events"):
        return tuple(free)
    return None


@step_rule("free-order")
def free_order(step: Step) -> list[str]:
    """Freed blocks without a hash go to the head of the queue (they can never
    hit again), freed blocks with a hash to the tail (LRU among cached), each
    in the order given -- callers pass a request's blocks tail-first; from
    0.27 a pool with caching off puts them all at the tail.  Taking
    blocks removes them from the queue without reordering the rest; caching,
    eviction and lookups leave the order alone."""
    if step.error is not None:
        return []
    expected = expected_free_queue(step.before, step.op, step.args, step.result, step.caching, step.release)
    if expected is None or expected == step.after.free:
        return []
    return [f"after {step.op} the free queue is {list(step.after.free)}, expected {list(expected)}"]


@step_rule("reset")
def reset_only_when_idle(step: Step) -> list[str]:
    """``reset_prefix_cache`` succeeds exactly when only the null block is in
    use, and then leaves no hash anywhere; when it refuses nothing changes."""
    if step.op != "reset_prefix_cache" or step.error is not None:
        return []
    idle = not step.before.held()
    if step.result != idle:
        return [f"reset returned {step.result} with blocks {sorted(step.before.held())} in use"]
    if step.result and (step.after.key_of or step.after.table or step.after.partial_of):
        return ["reset succeeded but hashes remain"]
    if not step.result:
        return _unchanged(step)
    return []


def describes(event: Stored, request: Any, hash_block_size: int, release: Release = REFERENCE) -> bool:
    """Whether ``event`` is the one caching some of ``request``'s blocks
    would emit (its group's annotation aside): blocks of ``event.block_size``
    tokens -- a partial entry's event is one hash block --, the parent the
    hash of the block before the first (none from the request's first), the
    range's tokens, the request's LoRA adapter and each block's extra keys
    (:func:`~kvspec.spec.pool.stored_event`)."""
    size = event.block_size
    if not event.token_ids or size <= 0 or len(event.token_ids) % size or size % hash_block_size:
        return False
    hashes = block_hashes_for_size(request.block_hashes, hash_block_size, size)
    convert = block_hash_converter()
    names = [convert(h) for h in hashes]
    first = 0
    if event.parent_block_hash is not None:
        if event.parent_block_hash not in names:
            return False
        first = names.index(event.parent_block_hash) + 1
    end = first + len(event.token_ids) // size
    if end > len(names):
        return False
    stored = set(event.block_hashes)
    chosen = [i for i in range(first, end) if names[i] in stored]
    expected = stored_event(request, hashes, list(range(first, end)), chosen, size, event.group, release)
    return replace(expected, spec_kind=event.spec_kind, sliding_window=event.sliding_window) == event


def stored_events_describe_requests(events: list[Event], requests: Mapping[int, list[Any]],
                                    hash_block_size: int, release: Release = REFERENCE) -> list[str]:
    """(part of hash-map-consistency) Each ``Stored`` event a pool emits
    describes blocks of one request of its group, as that request filled
    them (:func:`describes`) -- parent, tokens, LoRA adapter, every block's
    extra keys -- and names no kind: a pool knows none.  ``requests``: the
    requests holding blocks, by group."""
    problems = []
    for event in events:
        if not isinstance(event, Stored):
            continue
        if event.spec_kind is not None or event.sliding_window is not None:
            problems.append(f"a pool's Stored event names a kind ({event.spec_kind}, window {event.sliding_window})")
        elif not any(describes(event, r, hash_block_size, release) for r in requests.get(event.group, ())):
            problems.append(f"a Stored event of group {event.group} ({len(event.block_hashes)} hashes, parent "
                            f"{event.parent_block_hash!r}, tokens {list(event.token_ids)}, extra keys "
                            f"{event.extra_keys}) describes no request's blocks as the request filled them")
    return problems


def check_step(step: Step) -> list[Violation]:
    """Every step rule, against one operation."""
    return [Violation(name, p) for name, fns in STEP_RULES.items() for fn in fns for p in fn(step)]


# --- events ---------------------------------------------------------------------------


class EventMirror:
    """What a consumer of KV events believes is cached: replaying every event
    since the pool was created must reproduce the table (per group and hash,
    how many blocks carry it)."""

    def __init__(self) -> None:
        self.published: Counter[tuple[int, Any]] = Counter()

    def apply(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, Stored):
                for h in event.block_hashes:
                    self.published[(event.group, h)] += 1
            elif isinstance(event, Removed):
                self.published[(event.group, event.block_hash)] -= 1
            elif isinstance(event, Cleared):
                self.published.clear()
        self.published = +self.published  # drop zero counts

    @staticmethod
    def table_view(snap: PoolSnapshot) -> Counter[tuple[int, Any]]:
        view: Counter[tuple[int, Any]] = Counter()
        convert = block_hash_converter()
        for key, blocks in snap.table.items():
            view[(get_group_id(key), convert(get_block_hash(key)))] += len(blocks)
        return view


def events_mirror_table(snap: PoolSnapshot, mirror: EventMirror | None = None) -> list[str]:
    """(part of hash-map-consistency) Replaying the KV events reproduces the
    hash table: a hit appears in a ``Stored`` event before it can be served
    and disappears in a ``Removed`` (or ``Cleared``) event when it is lost."""
    if mirror is None:
        return []
    table = EventMirror.table_view(snap)
    if table == mirror.published:
        return []
    extra = table - mirror.published
    missing = mirror.published - table
    return [f"events disagree with the table: unpublished {dict(extra)}, stale {dict(missing)}"]


def check_events(snap: PoolSnapshot, mirror: EventMirror) -> list[Violation]:
    """The event rule, against one snapshot and the events seen so far."""
    return [Violation("hash-map-consistency", p) for p in events_mirror_table(snap, mirror)]
