"""What a block pool must offer to be checked: operations and observations.

Every implementation -- the spec's model, ``kvspec.impl``, vLLM itself, or
anyone's port -- is driven through this interface, by block *id*, so that the
same state machine and the same rule predicates run against all of them.

Observations are plain, comparable values:

- :class:`PoolSnapshot` -- ref counts, free order, each block's hash key, and
  the hash table, taken between operations;
- events -- :class:`Stored`, :class:`Removed`, :class:`Cleared` in the order
  the pool emitted them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from kvspec.kv_cache_interface import event_metadata

NULL_BLOCK_ID = 0
"""Block 0 is the null block: a placeholder in block tables, never real data."""


# --- events ------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """Full blocks of ``group`` became cache hits (one event per caching call).

    ``block_hashes`` are the new hashes in block order (skipped null or masked
    blocks have none); ``token_ids`` cover the whole cached range.
    ``spec_kind`` and ``sliding_window`` are what a *manager* says of the
    group (:func:`kvspec.kv_cache_interface.event_metadata`); a pool, which
    knows no kinds, leaves them ``None``.
    """

    group: int
    block_hashes: tuple[Any, ...]
    parent_block_hash: Any
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    lora_name: str | None = None
    extra_keys: tuple[Any, ...] | None = None
    spec_kind: str | None = None
    sliding_window: int | None = None


@dataclass(frozen=True)
class Removed:
    """The hash ``block_hash`` of ``group`` stopped being a cache hit."""

    group: int
    block_hash: Any


@dataclass(frozen=True)
class Cleared:
    """The whole prefix cache was reset."""


Event = Stored | Removed | Cleared


def comparable(events: list[Any], key: Any = repr) -> list[Any]:
    """Events as the contract orders them: ``Stored`` and ``Cleared`` where
    they are, each run of consecutive ``Removed`` events as a multiset
    (sorted by ``key``).  Which keys one operation drops is observable, the
    order it drops them in is not: ``evict_blocks`` takes a set, and a block's
    partial entries are a set too.  (A consumer of the events loses nothing:
    removals that follow each other commute.)  ``key`` also sorts events in
    a vector's JSON form."""
    out: list[Any] = []
    run: list[Any] = []
    for event in [*events, None]:
        if event is not None and _is_removed(event):
            run.append(event)
            continue
        out += sorted(run, key=key)
        run = []
        if event is not None:
            out.append(event)
    return out


def _is_removed(event: Any) -> bool:
    return isinstance(event, Removed) or (isinstance(event, dict) and event.get("event") == "removed")


def annotated(events: list[Event], kv_cache_config: Any) -> list[Event]:
    """A manager's events: the pool's, each ``Stored`` event naming its
    group's kind and sliding window (the pool emits structure; the manager
    knows what each group is)."""
    groups = kv_cache_config.kv_cache_groups
    out: list[Event] = []
    for e in events:
        if isinstance(e, Stored):
            kind, window = event_metadata(groups[e.group].kv_cache_spec)
            e = replace(e, spec_kind=kind, sliding_window=window)
        out.append(e)
    return out


# --- state -------------------------------------------------------------------


@dataclass(frozen=True)
class PoolSnapshot:
    """Everything observable about a pool between two operations.

    ``ref[b]`` is block ``b``'s reference count (the null block's entry is
    whatever the pool keeps; rules ignore it).  ``free`` is the free queue,
    next-to-reuse first.  ``key_of`` maps each block that carries a hash key
    to that key.  ``table`` maps each key to the blocks it names, oldest
    first.  ``partial_of`` maps each block that owns partial entries to
    their keys (see :meth:`kvspec.spec.pool.SpecBlockPool.cache_partial_block`).
    """

    num_blocks: int
    ref: tuple[int, ...]
    free: tuple[int, ...]
    key_of: dict[int, bytes] = field(hash=False)
    table: dict[bytes, tuple[int, ...]] = field(hash=False)
    partial_of: dict[int, frozenset[bytes]] = field(default_factory=dict, hash=False)

    @property
    def num_free(self) -> int:
        return len(self.free)

    def held(self) -> set[int]:
        """Blocks in use: every non-null block not in the free queue."""
        return set(range(1, self.num_blocks)) - set(self.free)

    def without_null_ref(self) -> PoolSnapshot:
        """The same snapshot with the null block's ref count set to 0
        (vLLM lets it drift; it is not part of any rule)."""
        ref = (0,) + self.ref[1:]
        return PoolSnapshot(self.num_blocks, ref, self.free, self.key_of, self.table, self.partial_of)


# --- the target interface ------------------------------------------------------


@runtime_checkable
class PoolTarget(Protocol):
    """A block pool under test, driven by block id.

    ``request`` arguments are request-like objects offering ``block_hashes``,
    ``all_token_ids`` and optionally ``lora_request``, ``cache_salt``,
    ``mm_features`` (see :mod:`kvspec.hashing`).  A refused operation raises
    ``ValueError`` or ``TypeError`` and must leave the pool unchanged.
    """

    num_blocks: int
    hash_block_size: int

    def get_new_blocks(self, num_blocks: int) -> list[int]: ...

    def touch(self, block_ids: list[int]) -> None: ...

    def free_blocks(self, block_ids: list[int]) -> None: ...

    def get_cached_block(self, block_hash: bytes, group_ids: list[int]) -> list[int] | None: ...

    def cache_full_blocks(
        self,
        request: Any,
        block_ids: list[int],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        group_id: int,
        block_mask: list[bool] | None = None,
    ) -> None: ...

    def evict_blocks(self, block_ids: set[int]) -> None: ...

    def reset_prefix_cache(self) -> bool: ...

    def get_num_free_blocks(self) -> int: ...

    def cache_partial_block(
        self, request: Any, block_id: int, num_tokens: int, group_id: int, block_size: int
    ) -> bytes | None:
        """Optional: called where a target has it (a pool that predates
        partial-block entries is judged without them)."""
        ...

    def get_usage(self) -> float: ...

    def take_events(self) -> list[Event]: ...

    def snapshot(self) -> PoolSnapshot: ...


# --- the request-level target interface ----------------------------------------


@dataclass(frozen=True)
class ManagerSnapshot:
    """Everything observable about a KV-cache manager between two operations:
    the pool's snapshot and, per request, its block ids in each group."""

    pool: PoolSnapshot
    tables: dict[str, tuple[tuple[int, ...], ...]] = field(hash=False)


@runtime_checkable
class ManagerTarget(Protocol):
    """A KV-cache manager under test (vLLM's ``KVCacheManager`` API), by id.

    Built from ``(kv_cache_config, max_model_len, scheduler_block_size,
    hash_block_size, enable_caching, use_eagle, enable_kv_cache_events)``.
    ``request`` arguments are :class:`kvspec.request.Request` objects whose
    ``num_computed_tokens`` the caller (the scheduler) keeps current.
    Block tables are tuples with one list of block ids per KV-cache group.

    Optional, observed where a target has them: ``get_usage()`` (rule
    allocation-accounting: the share of usable blocks not free) and
    ``get_num_blocks_to_allocate(request, num_new_tokens,
    num_new_computed_tokens, new_computed_blocks, num_lookahead_tokens,
    num_external_computed_tokens, num_encoder_tokens)`` -- the free blocks
    the target says ``allocate_slots`` with those arguments takes, asked just
    before the call (rule allocation-accounting holds an accepted allocation
    to it); ``make_prefix_cache_stats()`` -- a dict of ``reset``, ``requests``,
    ``queries``, ``hits`` and their ``preempted_`` forms since the previous
    call, or ``None`` (rule allocation-accounting: they count the lookups).
    """

    def get_computed_blocks(self, request: Any) -> tuple[tuple[list[int], ...], int]: ...

    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: tuple[list[int], ...] | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
    ) -> tuple[list[int], ...] | None: ...

    def free(self, request: Any) -> None: ...

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None: ...

    def remove_skipped_blocks(
        self, request_id: str, total_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None: ...

    def evict_blocks(self, block_ids: set[int]) -> None: ...

    def reset_prefix_cache(self) -> bool: ...

    def new_step_starts(self) -> None: ...

    def take_events(self) -> list[Event]: ...

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]: ...

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]: ...

    def snapshot(self) -> ManagerSnapshot: ...


class ManagerQueries(Protocol):
    """The manager's optional queries, observed (and recorded into vectors)
    where a target has them; their signatures name their arguments in a
    vector.  Each changes nothing."""

    def get_usage(self) -> float:
        """The share of usable blocks (all but the null block) not free."""
        ...

    def get_block_ids_for_computed_tokens(self, request_id: str, num_computed_tokens: int) -> tuple[list[int], ...]:
        """What a KV connector saves of a request (spec chapter 7)."""
        ...

    def find_longest_cache_hit_per_group(self, request: Any) -> tuple[tuple[list[int], ...], tuple[int, ...]] | None:
        """Each group's own longest hit, for a hybrid's KV connector (spec chapter 7)."""
        ...

