"""The production block pool: vLLM 0.25.1's ``BlockPool`` API and semantics.

Every behaviour here is a rule of :mod:`kvspec.spec.pool`; the lockstep
state machine compares the two after every operation.  Differences from vLLM
that no caller can observe through the API:

- the free queue's links are followed inline in the hot paths (see
  :mod:`.kv_cache_utils`);
- bad input raises ``RuleError`` / ``RuleTypeError`` (``ValueError`` /
  ``TypeError`` subclasses) *before* anything changes, where vLLM asserts or
  corrupts its state;
- the null block's ref count stays 0 instead of drifting (vLLM does not
  maintain it either way; the null block is skipped by ``touch`` and
  ``free_blocks``).

Partial-block prefix entries (``cache_partial_block``) are vLLM 0.25.1's pool
primitive that neither its manager nor its scheduler calls; the pool machine
calls it.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from kvspec.errors import RuleError, RuleTypeError, require_int
from kvspec.hashing import (
    MAX_GROUP_ID,
    BlockHash,
    BlockHashWithGroupId,
    block_hashes_for_size,
    event_extra_keys,
    generate_block_hash_extra_keys,
    generate_lookahead_block_hash_extra_keys,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
)
from kvspec.impl import kv_events
from kvspec.impl.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock
from kvspec.impl.kv_events import MEDIUM_GPU, BlockStored, KVCacheEvent
from kvspec.impl.release import require_deltas, require_lookahead

logger = logging.getLogger(__name__)

_SUFFIXES = [g.to_bytes(4, "big") for g in range(64)]


def _group_suffix(group_id: int) -> bytes:
    if type(group_id) is int and 0 <= group_id < 64:
        return _SUFFIXES[group_id]
    if not isinstance(group_id, int) or isinstance(group_id, bool):
        raise RuleTypeError("hash-map-consistency", f"group id must be an int, got {group_id!r}")
    if not 0 <= group_id <= MAX_GROUP_ID:
        raise RuleError("hash-map-consistency", f"group id {group_id} does not fit in 4 bytes")
    return group_id.to_bytes(4, "big")


def _oldest(entry: dict[int, KVCacheBlock]) -> KVCacheBlock:
    """The block a hit takes from a key that names several: the first cached."""
    return next(iter(entry.values()))


def _hash_type_error(block_hash: Any) -> RuleTypeError:
    return RuleTypeError(
        "hash-map-consistency",
        f"block hash must be bytes, got {type(block_hash).__name__} {block_hash!r}",
    )


class BlockHashToBlockMap:
    """Key (hash + group id) -> the blocks cached under it, oldest first.

    Almost every key names one block, so the value is the block itself; only
    when two blocks share a key does it become a ``{block_id: block}`` dict
    (insertion-ordered, so "first" is "oldest").  Blocks are never merged:
    a request's block table only grows at the end.
    """

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[bytes, KVCacheBlock | dict[int, KVCacheBlock]] = {}

    def get_one_block(self, key: BlockHashWithGroupId) -> KVCacheBlock | None:
        blocks = self._cache.get(key)
        if blocks is None or blocks.__class__ is KVCacheBlock:
            return blocks  # type: ignore[return-value]
        return _oldest(blocks)  # type: ignore[arg-type]

    def contain(self, key: BlockHashWithGroupId, block_id: int) -> bool:
        blocks = self._cache.get(key)
        if blocks is None:
            return False
        if blocks.__class__ is KVCacheBlock:
            return blocks.block_id == block_id  # type: ignore[union-attr]
        return block_id in blocks  # type: ignore[operator]

    def insert(self, key: BlockHashWithGroupId, block: KVCacheBlock) -> None:
        blocks = self._cache.get(key)
        if blocks is None:
            self._cache[key] = block
        elif blocks.__class__ is KVCacheBlock:
            self._cache[key] = {blocks.block_id: blocks, block.block_id: block}  # type: ignore[union-attr]
        else:
            blocks[block.block_id] = block  # type: ignore[index]

    def pop(self, key: BlockHashWithGroupId, block_id: int) -> KVCacheBlock | None:
        blocks = self._cache.get(key)
        if blocks is None:
            return None
        if blocks.__class__ is KVCacheBlock:
            if blocks.block_id != block_id:  # type: ignore[union-attr]
                return None
            del self._cache[key]
            return blocks  # type: ignore[return-value]
        block = blocks.pop(block_id, None)  # type: ignore[union-attr]
        if not blocks:
            del self._cache[key]
        return block

    def items(self) -> Iterator[tuple[bytes, list[KVCacheBlock]]]:
        """Every key with its blocks, oldest first (for inspection)."""
        for key, blocks in self._cache.items():
            yield key, [blocks] if blocks.__class__ is KVCacheBlock else list(blocks.values())  # type: ignore[union-attr]

    def clear(self) -> None:
        self._cache.clear()

    def __len__(self) -> int:
        return len(self._cache)


def _promotes_partial(block: KVCacheBlock, num_tokens: int, block_size: int) -> bool:
    """Whether caching ``block`` as the full block ending at ``num_tokens``
    replaces a partial entry of the same block (a shorter prefix ending
    inside it) -- the one case where a block to cache may already have a hash."""
    partial = block._block_hash_num_tokens
    return partial is not None and partial % block_size != 0 and num_tokens - block_size < partial < num_tokens


class BlockPool:
    """All KV-cache blocks, the free queue and the prefix-cache table.

    Args:
        num_gpu_blocks: blocks in the pool, the null block (id 0) included.
        enable_caching: whether full blocks may be cached and hit.
        hash_block_size: the token granularity of request block hashes;
            every group's block size is a multiple of it.
        enable_kv_cache_events: whether to record events for ``take_events``.
        metrics_collector: told of each block's residency (vLLM's
            ``KVCacheMetricsCollector`` interface): ``on_block_allocated``
            for every block handed out -- with caching on after
            ``on_block_evicted`` for its previous residency --,
            ``on_block_accessed`` for every hit block taken,
            ``on_block_evicted`` for every id ``evict_blocks`` names, and
            ``reset`` on a successful reset.
        deltas: the release deltas in force (:mod:`kvspec.impl.release`);
            the pool reads free-order-without-caching.
    """

    trusts_scheduler: bool = False
    """Whether the pool and the manager over it take the caller's word for
    what a block holds (rule content-soundness): caching a block nobody
    holds, and taking as a hit a block not cached under the request's hash.
    kvspec's own targets refuse both (``False``): their caller may send
    anything.  The drop-in (:mod:`kvspec.dropin`) sets it: there the caller
    is vLLM's scheduler, which caches only blocks a request holds and hands
    ``allocate_slots`` the hit it has just looked up, so only states built
    by hand reach these checks, and vLLM takes them (docs/rules.md, "What
    the drop-in trusts")."""

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool,
        hash_block_size: int,
        enable_kv_cache_events: bool = False,
        metrics_collector: Any = None,
        deltas: Iterable[str] | None = None,
        *,
        num_hash_lookahead_tokens: int = 0,
    ):
        require_int("null-exclusion", "num_gpu_blocks", num_gpu_blocks, 1, " (block 0 is the null block)")
        require_int("block-size-coherence", "hash_block_size", hash_block_size, 1)
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.blocks: list[KVCacheBlock] = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        # Partial entries: keys besides a block's own hash that name it (see cache_partial_block).
        self.cached_block_hashes_by_block: dict[int, set[BlockHashWithGroupId]] = {}
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.enable_kv_cache_events = enable_kv_cache_events
        self.kv_event_queue: list[KVCacheEvent] = []
        self.metrics_collector = metrics_collector
        # In 0.27 (not before, not after), a pool that caches nothing returns every freed block to the tail.
        keys = require_deltas(deltas)
        self._freed_to_tail = not enable_caching and "free-order-without-caching" in keys \
            and "free-order-restored" not in keys
        # From 0.32 a partial entry may sit at a block boundary, or in a block of one hash block.
        self._entries_at_boundaries = "partial-entries-at-boundaries" in keys
        self.num_hash_lookahead_tokens = require_lookahead(num_hash_lookahead_tokens, keys)

    # --- lookup ---------------------------------------------------------------

    def get_cached_block(
        self, block_hash: BlockHash, kv_cache_group_ids: list[int]
    ) -> list[KVCacheBlock] | None:
        """For each group, the oldest block cached under ``block_hash``; None
        if any group misses.  Does not take the blocks (see ``touch``)."""
        if block_hash.__class__ is not bytes and not isinstance(block_hash, bytes):
            raise _hash_type_error(block_hash)
        cache = self.cached_block_hash_to_block._cache
        hits = []
        for group_id in kv_cache_group_ids:
            blocks = cache.get(block_hash + _group_suffix(group_id))
            if blocks is None:
                return None
            if blocks.__class__ is not KVCacheBlock:
                blocks = _oldest(blocks)
            hits.append(blocks)
        return hits

    def cached_prefix(self, block_hashes: Sequence[BlockHash], max_blocks: int, group_id: int) -> list[KVCacheBlock]:
        """The blocks of one group cached under the leading hashes, up to the
        first miss and at most ``max_blocks``: ``get_cached_block`` hash by
        hash with the group's key suffix built once (a full-attention hit
        walks dozens of blocks).  Does not take the blocks."""
        suffix = _group_suffix(group_id)
        cache = self.cached_block_hash_to_block._cache
        hits: list[KVCacheBlock] = []
        block_hash = None
        try:
            for block_hash in itertools.islice(block_hashes, max(max_blocks, 0)):
                block = cache.get(block_hash + suffix)  # TypeError unless bytes
                if block is None:
                    break
                if block.__class__ is not KVCacheBlock:
                    block = _oldest(block)
                hits.append(block)
        except TypeError:
            raise _hash_type_error(block_hash) from None
        if block_hash is not None and block_hash.__class__ is not bytes and not isinstance(block_hash, bytes):
            raise _hash_type_error(block_hash)  # a bytes-like key that happened to work
        return hits

    # --- taking and returning blocks -----------------------------------------

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take ``num_blocks`` blocks from the head of the free queue; cached
        ones lose their hash first.  Each returned block has ref count 1."""
        queue = self.free_block_queue
        if type(num_blocks) is not int:
            raise RuleTypeError("allocation-accounting", f"block count must be an int, got {num_blocks!r}")
        if not 0 <= num_blocks <= queue.num_free_blocks:
            raise RuleError(
                "allocation-accounting",
                f"Cannot get {num_blocks} free blocks from the pool ({queue.num_free_blocks} free)",
            )
        cache = self.cached_block_hash_to_block._cache
        quiet = not self.enable_kv_cache_events and not self.cached_block_hashes_by_block
        ret = []
        block = queue.head.next_free_block
        for _ in range(num_blocks):
            key = block._block_hash
            if key is not None:
                if quiet and cache.get(key) is block:  # the common case: sole holder of its key
                    del cache[key]
                    block._block_hash = block._block_hash_num_tokens = None
                else:
                    self._evict_hash(block)
            block.ref_cnt = 1
            ret.append(block)
            nxt = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = nxt
        queue.head.next_free_block = block
        block.prev_free_block = queue.head
        queue.num_free_blocks -= num_blocks
        if self.metrics_collector is not None:
            self._announce_allocated(ret)
        return ret

    def _announce_allocated(self, blocks: list[KVCacheBlock]) -> None:
        collector = self.metrics_collector
        for block in blocks:
            if self.enable_caching:  # the block's previous residency ends as it is reused
                collector.on_block_evicted(block)
            collector.on_block_allocated(block)

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Add one reference to each block (a cache hit); free blocks leave
        the free queue.  The null block is skipped."""
        for block in blocks:
            if block.__class__ is not KVCacheBlock:
                raise RuleTypeError("ref-conservation", f"touch() takes KVCacheBlocks, got {block!r}")
        taken = 0
        for block in blocks:
            if block.ref_cnt == 0:
                if block.is_null:
                    continue
                prev, nxt = block.prev_free_block, block.next_free_block
                prev.next_free_block = nxt
                nxt.prev_free_block = prev
                block.prev_free_block = block.next_free_block = None
                taken += 1
            block.ref_cnt += 1
        self.free_block_queue.num_free_blocks -= taken
        if self.metrics_collector is not None:
            for block in blocks:
                if not block.is_null:
                    self.metrics_collector.on_block_accessed(block)

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock], evict_first: bool = False) -> None:
        """Drop one reference from each block, first-to-evict first.  Blocks
        reaching 0 rejoin the queue: unhashed at the head, cached at the tail
        (in 0.27 with caching off: all at the tail); with ``evict_first``
        (vLLM 0.34's argument, for blocks another tier already holds) cached
        ones at the head too, in the order given.  The null block is
        skipped.  Refused (nothing changes) if a block would go below 0
        references."""
        plain: list[KVCacheBlock] = []
        cached: list[KVCacheBlock] = []
        held: list[KVCacheBlock] = []
        block = None
        try:
            for block in ordered_blocks:
                ref = block.ref_cnt
                if ref == 1:
                    block.ref_cnt = 0
                    (plain if block._block_hash is None or evict_first else cached).append(block)
                elif ref > 1:
                    block.ref_cnt = ref - 1
                    held.append(block)
                elif not block.is_null:
                    raise RuleError(
                        "ref-conservation", f"block {block.block_id} freed while its ref_cnt is {ref}"
                    )
        except (RuleError, AttributeError) as error:
            for undo in (*plain, *cached, *held):
                undo.ref_cnt += 1
            if isinstance(error, AttributeError):
                raise RuleTypeError("ref-conservation", f"free_blocks() takes KVCacheBlocks, got {block!r}") from None
            raise
        if self._freed_to_tail:  # caching off: no block has a hash, all go to the tail in order
            plain, cached = [], plain
        queue = self.free_block_queue
        if plain:
            prev = queue.head
            first = prev.next_free_block
            for block in plain:
                prev.next_free_block = block
                block.prev_free_block = prev
                prev = block
            prev.next_free_block = first
            first.prev_free_block = prev
        if cached:
            last = queue.tail.prev_free_block
            for block in cached:
                last.next_free_block = block
                block.prev_free_block = last
                last = block
            last.next_free_block = queue.tail
            queue.tail.prev_free_block = last
        queue.num_free_blocks += len(plain) + len(cached)

    # --- caching -------------------------------------------------------------------

    def cache_full_blocks(
        self,
        request: Any,
        blocks: list[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        block_mask: list[bool] | None = None,
    ) -> None:
        """Cache ``blocks[num_cached_blocks:num_full_blocks]`` under the
        request's hashes at ``block_size`` granularity, skipping null and
        masked-out blocks.  See :meth:`kvspec.spec.pool.SpecBlockPool.cache_full_blocks`
        for what is required."""
        if num_cached_blocks >= num_full_blocks:
            self._check_cache_args(block_size, kv_cache_group_id, num_cached_blocks, num_full_blocks)
            return
        suffix = self._check_cache_args(block_size, kv_cache_group_id, num_cached_blocks, num_full_blocks)
        hashes = block_hashes_for_size(request.block_hashes, self.hash_block_size, block_size)
        chosen = self._blocks_to_cache(blocks, hashes, num_cached_blocks, num_full_blocks, block_size, block_mask)
        insert = self.cached_block_hash_to_block.insert
        cache = self.cached_block_hash_to_block._cache
        for i in chosen:
            block = blocks[i]
            if block._block_hash is not None:  # a partial entry promoted to the full block's hash
                self._evict_hash(block)
            key = hashes[i] + suffix
            block._block_hash = key
            block._block_hash_num_tokens = (i + 1) * block_size
            if key in cache:
                insert(key, block)  # a second block under this key
            else:
                cache[key] = block
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(
                self._stored_event(
                    request, hashes, num_cached_blocks, num_full_blocks, chosen, block_size, kv_cache_group_id
                )
            )

    def emit_cached_block_events(
        self, request: Any, num_cached_blocks: int, block_size: int, kv_cache_group_id: int
    ) -> None:
        """Announce the first ``num_cached_blocks`` blocks of a prefix-cache
        hit as stored (one ``BlockStored``, as if cached now), for consumers
        that track every request's blocks; the pool itself does not change.
        vLLM's call from 0.26, made for requests that ask for full reports."""
        if not self.enable_kv_cache_events or num_cached_blocks == 0:
            return
        self._check_cache_args(block_size, kv_cache_group_id, 0, num_cached_blocks)
        hashes = block_hashes_for_size(request.block_hashes, self.hash_block_size, block_size)
        if len(hashes) < num_cached_blocks:
            raise RuleError("hash-map-consistency",
                            f"request has {len(hashes)} hashes of this block size, {num_cached_blocks} blocks hit")
        self.kv_event_queue.append(self._stored_event(
            request, hashes, 0, num_cached_blocks, range(num_cached_blocks), block_size, kv_cache_group_id
        ))

    def _check_cache_args(self, block_size: int, group_id: int, num_cached: int, num_full: int) -> bytes:
        if (
            self.enable_caching
            and block_size.__class__ is num_cached.__class__ is num_full.__class__ is int
            and min(num_cached, num_full) >= 0
            and block_size > 0
            and not block_size % self.hash_block_size
        ):  # the usual case, checked at once (the checks below explain the rest)
            return _group_suffix(group_id)
        if not self.enable_caching:
            raise RuleError("hash-map-consistency", "prefix caching is disabled on this pool")
        for name, n in (("block_size", block_size), ("num_cached_blocks", num_cached), ("num_full_blocks", num_full)):
            if type(n) is not int:
                raise RuleTypeError("allocation-accounting", f"{name} must be an int, got {n!r}")
            if n < 0:
                raise RuleError("allocation-accounting", f"{name} must be >= 0, got {n}")
        if block_size == 0 or block_size % self.hash_block_size:
            raise RuleError(
                "block-size-coherence",
                f"block_size {block_size} is not a positive multiple of hash_block_size {self.hash_block_size}",
            )
        return _group_suffix(group_id)

    def _blocks_to_cache(self, blocks, hashes, num_cached, num_full, block_size, block_mask) -> list[int]:
        """Indices of the blocks to cache, after checking every precondition."""
        if num_full > len(blocks):
            raise RuleError(
                "hash-map-consistency", f"num_full_blocks {num_full} exceeds the {len(blocks)} blocks given"
            )
        if len(hashes) < num_full:
            raise RuleError(
                "hash-map-consistency",
                f"request has {len(hashes)} hashes of this block size, {num_full} blocks to cache",
            )
        if block_mask is not None and len(block_mask) != num_full - num_cached:
            raise RuleError(
                "hash-map-consistency",
                f"block_mask has {len(block_mask)} entries for {num_full - num_cached} new full blocks",
            )
        chosen = []
        for i in range(num_cached, num_full):
            block = blocks[i]
            if block.__class__ is not KVCacheBlock:
                raise RuleTypeError("hash-map-consistency", f"blocks[{i}] is not a KVCacheBlock: {block!r}")
            if block.is_null or (block_mask is not None and not block_mask[i - num_cached]):
                continue
            if block.ref_cnt <= 0 and not self.trusts_scheduler:
                raise RuleError("content-soundness", f"block {block.block_id} is cached but nobody holds it")
            if block._block_hash is not None and not _promotes_partial(block, (i + 1) * block_size, block_size):
                raise RuleError("hash-map-consistency", f"block {block.block_id} already carries a hash")
            h = hashes[i]
            if not isinstance(h, bytes):
                raise _hash_type_error(h)
            chosen.append(i)
        if len(chosen) > 1 and len({id(blocks[i]) for i in chosen}) != len(chosen):
            raise RuleError("no-aliasing", "the same block appears twice among new full blocks")
        return chosen

    def _stored_event(self, request, hashes, num_cached, num_full, chosen, block_size, group_id) -> BlockStored:
        extra_keys: list[Any] = []
        mm_idx = 0
        chosen_set = set(chosen)
        lookahead = self.num_hash_lookahead_tokens
        tokens = request.all_token_ids
        lookahead_tokens: list[list[int]] = []
        for i in range(num_cached, num_full):
            if i in chosen_set:
                start, end = i * block_size, (i + 1) * block_size
                if lookahead:  # the keys of the window the hash covers, and the tokens past the block
                    keys, mm_idx = generate_lookahead_block_hash_extra_keys(request, start, end, end + lookahead,
                                                                            mm_idx)
                    lookahead_tokens.append(list(tokens[end:end + lookahead]))
                else:
                    keys, mm_idx = generate_block_hash_extra_keys(request, start, end, mm_idx)
                extra_keys.append(event_extra_keys(keys))
        lora = getattr(request, "lora_request", None)
        events = kv_events.EVENTS
        session = {"session_id": getattr(request, "session_id", None)} if events.stored_session else {}
        if lookahead:
            session["lookahead_token_ids"] = lookahead_tokens
        return events.stored(
            **session,
            block_hashes=[maybe_convert_block_hash(hashes[i]) for i in chosen],
            parent_block_hash=None if num_cached == 0 else maybe_convert_block_hash(hashes[num_cached - 1]),
            token_ids=list(request.all_token_ids[num_cached * block_size : num_full * block_size]),
            block_size=block_size,
            lora_id=getattr(lora, "adapter_id", None) if lora else None,
            medium=MEDIUM_GPU,
            lora_name=getattr(lora, "name", None) if lora else None,
            extra_keys=extra_keys or None,
            group_idx=group_id,
        )

    def cache_partial_block(
        self, request: Any, block: KVCacheBlock, num_tokens: int, kv_cache_group_id: int, block_size: int
    ) -> BlockHashWithGroupId | None:
        """Make ``block`` a hit for the prefix of ``num_tokens`` tokens, a
        ``hash_block_size`` boundary inside the block (vLLM 0.25.1's
        partial-block prefix caching; from 0.32, release delta
        partial-entries-at-boundaries, at its end too): the key is the request's hash at that
        boundary.  A block without a hash takes it as its own; one with a
        shorter prefix's hash gives that up first; otherwise the key is an
        extra entry the block owns (dropped with it on eviction, reset or
        promotion to a full block).  Returns the key; ``None`` for the null block."""
        if block.is_null:
            return None
        if not self.enable_caching:
            raise RuleError("hash-map-consistency", "prefix caching is disabled on this pool")
        hbs = self.hash_block_size
        if block_size % hbs or (block_size <= hbs and not self._entries_at_boundaries):
            raise RuleError("block-size-coherence",
                            f"partial entries need a block_size that is a larger multiple of {hbs}, got {block_size}")
        if num_tokens <= 0 or num_tokens % hbs or (num_tokens % block_size == 0 and not self._entries_at_boundaries):
            raise RuleError("hash-map-consistency", f"{num_tokens} tokens is not a partial block boundary "
                            f"(a multiple of {hbs} inside a block of {block_size})")
        num_hashes = num_tokens // hbs
        if num_hashes > len(request.block_hashes):
            raise RuleError("hash-map-consistency",
                            f"the request has {len(request.block_hashes)} block hashes, {num_hashes} needed")
        if block.ref_cnt <= 0 and not self.trusts_scheduler:
            raise RuleError("content-soundness", f"block {block.block_id} is cached but nobody holds it")
        block_hash = request.block_hashes[num_hashes - 1]
        key = make_block_hash_with_group_id(block_hash, kv_cache_group_id)
        cached = block._block_hash == key or self.cached_block_hash_to_block.contain(key, block.block_id)
        if cached:
            return key
        if block._block_hash is not None and (block._block_hash_num_tokens or 0) < num_tokens:
            self._evict_hash(block)
        if block._block_hash is None:
            block.set_block_hash(key, num_tokens)
        else:
            self.cached_block_hashes_by_block.setdefault(block.block_id, set()).add(key)
        self.cached_block_hash_to_block.insert(key, block)
        if self.enable_kv_cache_events:  # the event caching that one hash block emits (every image in it: F11)
            i = num_hashes - 1
            self.kv_event_queue.append(
                self._stored_event(request, request.block_hashes, i, num_hashes, [i], hbs, kv_cache_group_id))
        return key

    # --- eviction and reset ---------------------------------------------------------

    def _evict_hash(self, block: KVCacheBlock) -> None:
        """Drop every key that names ``block``: its own, then its partial entries."""
        keys = [block._block_hash, *self.cached_block_hashes_by_block.pop(block.block_id, ())]
        block._block_hash = None
        block._block_hash_num_tokens = None
        for key in keys:
            if self.cached_block_hash_to_block.pop(key, block.block_id) is None:  # type: ignore[arg-type]
                continue
            if self.enable_kv_cache_events:
                self.kv_event_queue.append(
                    kv_events.EVENTS.removed(
                        block_hashes=[maybe_convert_block_hash(get_block_hash(key))],  # type: ignore[arg-type]
                        medium=MEDIUM_GPU,
                        group_idx=get_group_id(key),  # type: ignore[arg-type]
                    )
                )

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        """Drop ``block``'s hash from the cache if it has one (vLLM's name);
        whether it had one."""
        if block._block_hash is None:
            return False
        self._evict_hash(block)
        return True

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Forget the cached content of these blocks (e.g. reported stale by a
        KV connector).  Held blocks stay held, free blocks keep their place."""
        ids = list(block_ids)
        n = self.num_gpu_blocks
        for block_id in ids:
            if type(block_id) is not int:
                raise RuleTypeError("allocation-accounting", f"block id must be an int, got {block_id!r}")
            if not 0 <= block_id < n:
                raise RuleError("allocation-accounting", f"block id {block_id} is outside the pool (0..{n - 1})")
        for block_id in ids:
            block = self.blocks[block_id]
            if self.metrics_collector is not None and not block.is_null:
                self.metrics_collector.on_block_evicted(block)
            if block._block_hash is not None:
                self._evict_hash(block)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block, only when no block but the null block
        is in use; returns whether it did."""
        in_use = self.num_gpu_blocks - 1 - self.free_block_queue.num_free_blocks
        if in_use:
            logger.info("Failed to reset prefix cache because some blocks (%d) are not freed yet", in_use)
            return False
        self.cached_block_hash_to_block.clear()
        self.cached_block_hashes_by_block.clear()
        for block in self.blocks:
            block.reset_hash()
        if self.metrics_collector is not None:
            self.metrics_collector.reset()
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(kv_events.EVENTS.cleared())
        return True

    # --- queries ------------------------------------------------------------------------

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        usable = self.num_gpu_blocks - 1
        return 0.0 if not usable else 1.0 - self.free_block_queue.num_free_blocks / usable

    def take_events(self) -> list[KVCacheEvent]:
        if not self.enable_kv_cache_events:
            return []
        events, self.kv_event_queue = self.kv_event_queue, []
        return events
