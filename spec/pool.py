"""The block pool, as a model that runs.

An LLM server keeps the attention keys and values (the *KV cache*) of every
running request in GPU memory, cut into fixed-size **blocks** of
``block_size`` tokens.  All requests draw blocks from one shared **pool** of
``num_blocks`` physical blocks, numbered ``0 .. num_blocks - 1``.

State
-----
Each block has

- a **reference count** -- how many (request, KV-cache group) slots hold it;
- optionally a **hash key** -- the name of the exact token prefix the block
  holds (see :mod:`kvspec.hashing`), present once the block is full and
  *cached*;
- optionally **partial entries** -- further keys naming shorter prefixes that
  end *inside* the block, at a ``hash_block_size`` boundary (a block of 4
  hash blocks holding a 3-hash-block prefix can serve that prefix).  A block
  owns its partial entries: they leave the table with its own key.

The pool keeps

- the **free queue**: every block nobody holds, in the order they will be
  reused (head first).  A free block may still carry a hash key: it is then a
  *cached* block, which a later request with the same prefix can take back
  (a *cache hit*) instead of recomputing it.
- the **hash table**: key -> the blocks carrying that key, oldest first.
  Two requests that computed the same prefix independently may both cache it,
  so a key can name several blocks; the pool never merges them, because a
  request's block table must only ever grow at the end.

Block 0 is the **null block**, a placeholder that block tables use for
positions with no real data (tokens that left a sliding window, say).  It is
never handed out, never queued, never cached, and its reference count is not
maintained.

Order
-----
Allocation takes blocks from the head of the free queue.  Freeing puts blocks
back so that the least useful are reused first:

- blocks *without* a hash can never be hit again: they go to the **head**;
- blocks *with* a hash go to the **tail**, so cached blocks are evicted least
  recently used first;
- callers free a request's blocks in reverse (tail block first), so that the
  last block of a prefix chain -- the least likely to be shared -- goes first.

This module states each operation as *requires* (checked; a refusal raises
:class:`~kvspec.errors.RuleError` or :class:`~kvspec.errors.RuleTypeError`
and changes nothing) and *guarantees* (checked by the rules in
:mod:`kvspec.spec.rules` after every step).  It favours lists and dicts over
speed: it is the yardstick, not the product.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kvspec.errors import RuleError, RuleTypeError
from kvspec.hashing import (
    MAX_GROUP_ID,
    block_hashes_for_size,
    event_extra_keys,
    generate_block_hash_extra_keys,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
)
from kvspec.spec import releases
from kvspec.spec.interface import (
    NULL_BLOCK_ID,
    Cleared,
    Event,
    PoolSnapshot,
    Removed,
    Stored,
)


@dataclass
class PoolState:
    """The whole state of a pool (see the module docstring)."""

    num_blocks: int
    enable_caching: bool
    hash_block_size: int
    events_enabled: bool
    ref: list[int]
    free: list[int]
    key_of: dict[int, bytes] = field(default_factory=dict)
    tokens_of: dict[int, int] = field(default_factory=dict)  # the prefix length each own key names
    partial_of: dict[int, list[bytes]] = field(default_factory=dict)  # further keys a block owns
    table: dict[bytes, list[int]] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)


# --- argument checks (each names the rule a bad value would break) -----------


def require_count(n: Any, what: str = "block count") -> int:
    """A count is a non-negative ``int`` (``bool`` is not a count)."""
    if not isinstance(n, int) or isinstance(n, bool):
        raise RuleTypeError(
            "allocation-accounting", f"{what} must be an int, got {n!r}"
        )
    if n < 0:
        raise RuleError("allocation-accounting", f"{what} must be >= 0, got {n}")
    return n


def require_block_id(state: PoolState, block_id: Any) -> int:
    """A block id is an ``int`` in ``0 .. num_blocks - 1``."""
    if not isinstance(block_id, int) or isinstance(block_id, bool):
        raise RuleTypeError(
            "allocation-accounting", f"block id must be an int, got {block_id!r}"
        )
    if not 0 <= block_id < state.num_blocks:
        raise RuleError(
            "allocation-accounting",
            f"block id {block_id} is outside the pool (0..{state.num_blocks - 1})",
        )
    return block_id


def require_hash(block_hash: Any) -> bytes:
    """A block hash is ``bytes`` (the pool never hashes anything itself)."""
    if not isinstance(block_hash, bytes):
        raise RuleTypeError(
            "hash-map-consistency",
            f"block hash must be bytes, got {type(block_hash).__name__} {block_hash!r}",
        )
    return block_hash


def require_group_id(group_id: Any) -> int:
    """A group id fits the 4-byte suffix of a hash key."""
    if not isinstance(group_id, int) or isinstance(group_id, bool):
        raise RuleTypeError(
            "hash-map-consistency", f"group id must be an int, got {group_id!r}"
        )
    if not 0 <= group_id <= MAX_GROUP_ID:
        raise RuleError(
            "hash-map-consistency", f"group id {group_id} does not fit in 4 bytes"
        )
    return group_id


# --- the pool -----------------------------------------------------------------


def requeue(free: list[int], plain: list[int], cached: list[int], caching: bool = True,
            release: releases.Release = releases.REFERENCE) -> list[int]:
    """The free queue ``free`` once the blocks ``plain`` (no hash) and
    ``cached`` (a hash) reach 0 references, each list in the order freed.

    ``plain`` go to the head: no request can hit them again, so they are
    reused first.  ``cached`` go to the tail: the least recently used cached
    block is evicted first.  From vLLM 0.27 (release delta
    free-order-without-caching), a pool with caching off puts every freed
    block at the tail instead, in order, so that the block freed longest ago
    is reused first; 0.28 undid it (delta free-order-restored).
    ``release``: the release judged (default: the reference release).
    """
    if not caching and release.has("free-order-without-caching") and not release.has("free-order-restored"):
        return [*free, *plain, *cached]
    return [*plain, *free, *cached]


class SpecBlockPool:
    """The reference pool.  Every method is one atomic operation."""

    def __init__(
        self,
        num_blocks: int,
        enable_caching: bool = True,
        hash_block_size: int = 16,
        enable_kv_cache_events: bool = False,
        release: releases.Release | str | None = None,
    ):
        """Requires ``num_blocks >= 1`` and ``hash_block_size >= 1``.
        ``release``: the vLLM release whose rules the pool follows (a
        :class:`~kvspec.spec.releases.Release` or a version; default the
        reference release, 0.25.1); the group managers a manager builds on
        the pool read it from here.

        Guarantees: every block but the null block is free, in id order, with
        no hash; the table and the event log are empty.
        """
        for value, what, rule in ((num_blocks, "num_blocks", "null-exclusion"),
                                  (hash_block_size, "hash_block_size", "block-size-coherence")):
            if not isinstance(value, int) or isinstance(value, bool):
                raise RuleTypeError(rule, f"{what} must be an int, got {value!r}")
        if num_blocks < 1:
            raise RuleError("null-exclusion", f"a pool needs at least the null block: num_blocks {num_blocks} < 1")
        if hash_block_size < 1:
            raise RuleError("block-size-coherence", f"hash_block_size must be >= 1, got {hash_block_size}")
        self.num_blocks = num_blocks
        self.hash_block_size = hash_block_size
        self.release = releases.as_release(release)
        self.state = PoolState(
            num_blocks=num_blocks,
            enable_caching=enable_caching,
            hash_block_size=hash_block_size,
            events_enabled=enable_kv_cache_events,
            ref=[0] * num_blocks,
            free=list(range(1, num_blocks)),
        )

    # -- queries --------------------------------------------------------------

    def get_num_free_blocks(self) -> int:
        """The length of the free queue (cached free blocks included)."""
        return len(self.state.free)

    def get_usage(self) -> float:
        """The fraction of non-null blocks in use, in ``[0, 1]``."""
        usable = self.num_blocks - 1
        return 0.0 if usable == 0 else 1.0 - len(self.state.free) / usable

    def get_cached_block(self, block_hash: bytes, group_ids: list[int]) -> list[int] | None:
        """A cache hit: for each group, the oldest block cached under
        ``(block_hash, group)``; ``None`` if any group misses.

        Requires bytes and valid group ids.  Guarantees: no state changes (a
        lookup does not take the blocks -- :meth:`touch` does).
        """
        require_hash(block_hash)
        hits = []
        for group_id in group_ids:
            blocks = self.state.table.get(
                make_block_hash_with_group_id(block_hash, require_group_id(group_id))
            )
            if not blocks:
                return None
            hits.append(blocks[0])
        return hits

    # -- taking blocks --------------------------------------------------------

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` blocks from the head of the free queue.

        Requires ``0 <= num_blocks <= free count``.  Guarantees: the returned
        blocks are the first ``num_blocks`` of the queue, each now has ref
        count 1 and no hash (a cached block being reused is *evicted*: its
        key leaves the table and a ``Removed`` event is emitted).
        """
        require_count(num_blocks)
        s = self.state
        if num_blocks > len(s.free):
            raise RuleError(
                "allocation-accounting",
                f"cannot get {num_blocks} free blocks: only {len(s.free)} are free",
            )
        taken, s.free = s.free[:num_blocks], s.free[num_blocks:]
        for block_id in taken:
            self._evict(block_id)
            s.ref[block_id] = 1
        return taken

    def touch(self, block_ids: list[int]) -> None:
        """Take a hit: add one reference to each block.

        A block that was free (ref count 0) leaves the free queue.  The null
        block is skipped.  Requires valid block ids.
        """
        ids = [require_block_id(self.state, b) for b in block_ids]
        s = self.state
        for block_id in ids:
            if block_id == NULL_BLOCK_ID:
                continue
            if s.ref[block_id] == 0:
                s.free.remove(block_id)
            s.ref[block_id] += 1

    # -- giving blocks back ---------------------------------------------------

    def free_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop one reference from each block, in the given order.

        Blocks that reach 0 references rejoin the free queue: those without a
        hash at the head (in the given order), those with a hash at the tail
        (in the given order) -- :func:`requeue`, which also says where a
        pool with caching off puts them from 0.27.  The null block is skipped.

        Requires valid block ids, and that no block is freed more times than
        it is held (its ref count would go negative).
        """
        ids = [require_block_id(self.state, b) for b in block_ids]
        s = self.state
        drops: dict[int, int] = {}
        for block_id in ids:
            if block_id != NULL_BLOCK_ID:
                drops[block_id] = drops.get(block_id, 0) + 1
        for block_id, n in drops.items():
            if n > s.ref[block_id]:
                raise RuleError(
                    "ref-conservation",
                    f"block {block_id} freed {n} time(s) but held {s.ref[block_id]} time(s)",
                )
        released_plain, released_cached = [], []
        for block_id in ids:
            if block_id == NULL_BLOCK_ID:
                continue
            s.ref[block_id] -= 1
            if s.ref[block_id] == 0:
                if block_id in s.key_of:
                    released_cached.append(block_id)
                else:
                    released_plain.append(block_id)
        s.free = requeue(s.free, released_plain, released_cached, s.enable_caching, self.release)

    # -- caching --------------------------------------------------------------

    def cache_full_blocks(
        self,
        request: Any,
        block_ids: list[int],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        group_id: int,
        block_mask: list[bool] | None = None,
    ) -> None:
        """Make ``block_ids[num_cached_blocks:num_full_blocks]`` cache hits.

        Block ``i`` of the request gets the key (request hash ``i`` at
        ``block_size`` granularity, ``group_id``).  Null blocks and blocks
        whose ``block_mask`` entry is False are skipped.  A ``Stored`` event
        covers the whole range.

        Requires: ``block_size`` a multiple of ``hash_block_size``;
        ``0 <= num_cached_blocks <= num_full_blocks <= len(block_ids)``; the
        pool caches at all; the request has at least ``num_full_blocks``
        hashes at that size; the mask,
        if given, has one entry per new block; every block to cache is held
        and carries no hash yet -- unless its own key is a partial entry of
        this very block (a prefix ending inside it), which the full block's
        key now replaces: every key of the block is dropped first, each with
        a ``Removed`` event, before the call's ``Stored`` event.
        """
        s = self.state
        if not s.enable_caching:
            raise RuleError("hash-map-consistency", "prefix caching is disabled on this pool")
        require_group_id(group_id)
        require_count(block_size, "block_size")
        if block_size == 0 or block_size % s.hash_block_size:
            raise RuleError(
                "block-size-coherence",
                f"block_size {block_size} is not a positive multiple of "
                f"hash_block_size {s.hash_block_size}",
            )
        require_count(num_cached_blocks, "num_cached_blocks")
        require_count(num_full_blocks, "num_full_blocks")
        if num_cached_blocks >= num_full_blocks:
            return
        if num_full_blocks > len(block_ids):
            raise RuleError(
                "hash-map-consistency",
                f"num_full_blocks {num_full_blocks} exceeds the {len(block_ids)} blocks given",
            )
        hashes = block_hashes_for_size(request.block_hashes, s.hash_block_size, block_size)
        if len(hashes) < num_full_blocks:
            raise RuleError(
                "hash-map-consistency",
                f"request has {len(hashes)} hashes of size {block_size}, "
                f"{num_full_blocks} blocks to cache",
            )
        new = list(range(num_cached_blocks, num_full_blocks))
        if block_mask is not None and len(block_mask) != len(new):
            raise RuleError(
                "hash-map-consistency",
                f"block_mask has {len(block_mask)} entries for {len(new)} new full blocks",
            )
        chosen = [
            i
            for j, i in enumerate(new)
            if require_block_id(s, block_ids[i]) != NULL_BLOCK_ID
            and (block_mask is None or block_mask[j])
        ]
        for i in chosen:
            b = block_ids[i]
            if s.ref[b] <= 0:
                raise RuleError(
                    "content-soundness", f"block {b} is cached but nobody holds it"
                )
            if b in s.key_of and not self._is_partial_of(b, i, block_size):
                raise RuleError(
                    "hash-map-consistency", f"block {b} already carries a hash"
                )
        if len({block_ids[i] for i in chosen}) != len(chosen):
            raise RuleError("no-aliasing", "the same block appears twice among new full blocks")
        keys = [make_block_hash_with_group_id(require_hash(hashes[i]), group_id) for i in chosen]

        for i, key in zip(chosen, keys, strict=True):
            self._evict(block_ids[i])  # a partial entry promoted: its keys go first
            self._insert(block_ids[i], key, (i + 1) * block_size)
        if s.events_enabled:
            s.events.append(
                stored_event(request, hashes, new, chosen, block_size, group_id, self.release)
            )

    def cache_partial_block(
        self, request: Any, block_id: int, num_tokens: int, group_id: int, block_size: int
    ) -> bytes | None:
        """Make block ``block_id`` a hit for the request's first ``num_tokens``
        tokens, a prefix that ends inside the block: a *partial entry*.

        Requires: the pool caches at all; ``block_size`` a multiple of
        ``hash_block_size`` larger than it; ``num_tokens`` a positive
        multiple of ``hash_block_size`` that is not a multiple of
        ``block_size`` (from 0.32, release delta partial-entries-at-boundaries:
        any ``block_size`` that is a multiple of ``hash_block_size``, and any
        positive multiple of it -- a block boundary included); the request has
        ``num_tokens // hash_block_size`` hashes; the block is held.

        Guarantees: the key is (the request's hash at that boundary,
        ``group_id``).  If the block is already listed under it, nothing
        changes.  Otherwise, if the block's own key names a shorter prefix,
        every key of the block is dropped (a ``Removed`` event each) and the
        new key becomes its own; if the block has no key, the new key becomes
        its own; else the new key is a further partial entry the block owns.
        A ``Stored`` event names the one new hash, its parent, and the tokens
        of the last hash block of the prefix.  Returns the key; ``None`` --
        and nothing changes -- for the null block.
        """
        s = self.state
        if require_block_id(s, block_id) == NULL_BLOCK_ID:
            return None
        require_group_id(group_id)
        require_count(block_size, "block_size")
        require_count(num_tokens, "num_tokens")
        if not s.enable_caching:
            raise RuleError("hash-map-consistency", "prefix caching is disabled on this pool")
        hbs = s.hash_block_size
        at_boundaries = self.release.has("partial-entries-at-boundaries")
        if block_size % hbs or (block_size <= hbs and not at_boundaries):
            raise RuleError("block-size-coherence",
                            f"partial entries need a block_size that is a larger multiple of {hbs}, got {block_size}")
        if num_tokens == 0 or num_tokens % hbs or (num_tokens % block_size == 0 and not at_boundaries):
            raise RuleError("hash-map-consistency", f"{num_tokens} tokens is not a partial block boundary "
                            f"(a multiple of {hbs} inside a block of {block_size})")
        n = num_tokens // hbs
        if n > len(request.block_hashes):
            raise RuleError("hash-map-consistency",
                            f"the request has {len(request.block_hashes)} block hashes, {n} needed")
        if s.ref[block_id] <= 0:
            raise RuleError("content-soundness", f"block {block_id} is cached but nobody holds it")
        key = make_block_hash_with_group_id(require_hash(request.block_hashes[n - 1]), group_id)
        if block_id in s.table.get(key, ()):
            return key
        if s.tokens_of.get(block_id, num_tokens) < num_tokens:
            self._evict(block_id)  # a longer prefix of the same block replaces the shorter one
        self._insert(block_id, key, num_tokens)
        if s.events_enabled:
            s.events.append(partial_stored_event(request, n, hbs, group_id, self.release))
        return key

    def _is_partial_of(self, block_id: int, i: int, block_size: int) -> bool:
        """Whether ``block_id``'s own key is a partial entry of position
        ``i`` at ``block_size``: a prefix ending strictly inside that block."""
        tokens = self.state.tokens_of[block_id]
        return i * block_size < tokens < (i + 1) * block_size

    def _insert(self, block_id: int, key: bytes, num_tokens: int) -> None:
        """List ``block_id`` under ``key``: as its own key if it has none
        (naming a prefix of ``num_tokens`` tokens), else as a partial entry."""
        s = self.state
        if block_id in s.key_of:
            s.partial_of.setdefault(block_id, []).append(key)
        else:
            s.key_of[block_id] = key
            s.tokens_of[block_id] = num_tokens
        s.table.setdefault(key, []).append(block_id)

    # -- eviction and reset ---------------------------------------------------

    def _evict(self, block_id: int) -> None:
        """Drop every key of ``block_id`` from the table -- its own, then its
        partial entries -- emitting ``Removed`` for each.  The block keeps its
        place and its references."""
        s = self.state
        key = s.key_of.pop(block_id, None)
        if key is None:
            return
        del s.tokens_of[block_id]
        for k in [key, *s.partial_of.pop(block_id, [])]:
            s.table[k].remove(block_id)
            if not s.table[k]:
                del s.table[k]
            if s.events_enabled:
                s.events.append(
                    Removed(group=get_group_id(k), block_hash=maybe_convert_block_hash(get_block_hash(k)))
                )

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Forget the cached content of these blocks (an external cache
        reported it stale).  Held blocks stay held; free blocks stay where they
        are in the queue, now without a hash.  Requires valid block ids."""
        ids = [require_block_id(self.state, b) for b in block_ids]
        for block_id in ids:
            self._evict(block_id)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block -- only when no block but the null block
        is in use.  Returns whether it reset; a refusal changes nothing."""
        s = self.state
        if len(s.free) != self.num_blocks - 1:
            return False
        s.key_of.clear()
        s.tokens_of.clear()
        s.partial_of.clear()
        s.table.clear()
        if s.events_enabled:
            s.events.append(Cleared())
        return True

    def take_events(self) -> list[Event]:
        """The events since the last call, oldest first; the log is emptied."""
        events, self.state.events = self.state.events, []
        return events

    # -- observation -----------------------------------------------------------

    def snapshot(self) -> PoolSnapshot:
        s = self.state
        return PoolSnapshot(
            num_blocks=self.num_blocks,
            ref=tuple(s.ref),
            free=tuple(s.free),
            key_of=dict(s.key_of),
            table={k: tuple(v) for k, v in s.table.items()},
            partial_of={b: frozenset(keys) for b, keys in s.partial_of.items()},
        )


class TrialPool:
    """A stand-in for the pool in a trial allocation (the manager's
    ``get_num_blocks_to_allocate``): it never runs short, changes nothing
    real, and counts the blocks an allocation takes from the free queue --
    new blocks, and hits touched while their reference count was 0."""

    def __init__(self, pool: SpecBlockPool):
        self.ref = list(pool.snapshot().ref)
        self.num_blocks = pool.num_blocks
        self.taken = 0

    def get_num_free_blocks(self) -> int:
        return len(self.ref) + self.num_blocks  # more than any allocation asks for

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        require_count(num_blocks)
        new = list(range(len(self.ref), len(self.ref) + num_blocks))  # ids past the pool's: never confused
        self.ref += [1] * num_blocks
        self.taken += num_blocks
        return new

    def touch(self, block_ids: list[int]) -> None:
        for block_id in block_ids:
            if block_id != NULL_BLOCK_ID:
                self.taken += self.ref[block_id] == 0
                self.ref[block_id] += 1


def stored_event(request: Any, hashes: Any, new: list[int], chosen: list[int], block_size: int,
                 group_id: int, release: releases.Release = releases.REFERENCE) -> Stored:
    """The ``Stored`` event for one caching call: ``request``'s blocks
    ``new`` (consecutive) of group ``group_id`` became cache hits, those at
    ``chosen`` with a hash (null or masked blocks have none).  It names the
    hash of the block before the first (the parent; ``None`` from the
    request's first block), the tokens of the whole range, the LoRA adapter
    and each hashed block's extra keys -- what a consumer of the events needs
    to rebuild the prefix tree.  ``release``: whose extra-key format."""
    first, end = new[0], new[-1] + 1
    extra_keys = []
    mm_idx = 0
    for i in new:
        if i not in chosen:
            continue
        keys, mm_idx = generate_block_hash_extra_keys(request, i * block_size, (i + 1) * block_size, mm_idx,
                                                      release=release)
        extra_keys.append(event_extra_keys(keys, release=release))
    lora = getattr(request, "lora_request", None)
    return Stored(
        group=group_id,
        block_hashes=tuple(maybe_convert_block_hash(hashes[i]) for i in chosen),
        parent_block_hash=None if first == 0 else maybe_convert_block_hash(hashes[first - 1]),
        token_ids=tuple(request.all_token_ids[first * block_size : end * block_size]),
        block_size=block_size,
        lora_id=getattr(lora, "adapter_id", None) if lora else None,
        lora_name=getattr(lora, "name", None) if lora else None,
        extra_keys=tuple(extra_keys) if extra_keys else None,
    )


def partial_stored_event(request: Any, num_hashes: int, hash_block_size: int, group_id: int,
                         release: releases.Release = releases.REFERENCE) -> Stored:
    """The ``Stored`` event of a partial entry at the request's hash number
    ``num_hashes`` (1-based): the event caching that one hash block would
    emit -- its hash, its parent's (the hash before it; ``None`` for the
    first), its tokens and its extra keys, every image overlapping it
    included.  (vLLM 0.25.1 looks for images from the request's last one on
    and leaves out an earlier one: finding F11.)"""
    i = num_hashes - 1
    return stored_event(request, request.block_hashes, [i], [i], hash_block_size, group_id, release)
