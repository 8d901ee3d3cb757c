"""The core: a KV-cache manager for one full-attention group, in one page.

This is chapter 2 of ``spec/README.md`` as code -- the smallest manager that
keeps every rule, for a model whose layers all use full attention with one
block size.  It is not a toy: on such a layout it answers every operation
exactly as the whole manager (:mod:`kvspec.spec.manager`) does, and the
tests hold it to that in lockstep (``tests/test_core.py``).  Everything the
whole manager adds -- sliding windows, Mamba, several groups, EAGLE, the
argument checks -- is a delta on this page.

State: the pool (:mod:`kvspec.spec.pool`), and per request its **table**
(block ids, position ``i`` holding tokens ``[i*B, (i+1)*B)``) and how many of
its leading blocks are **cached** (carry their hash).

The scheduler's calls, in the order a request meets them:

1. :meth:`CoreManager.get_computed_blocks` -- the hit: the longest run of the
   request's leading blocks that the pool has cached, never the whole request
   (the last token is always recomputed, for its logits);
2. :meth:`CoreManager.allocate_slots` -- take the hit, blocks for tokens a KV
   connector holds (*external* tokens), and new blocks for this step; then
   cache the blocks that became full.  ``None`` when the pool is short: then
   nothing changed;
3. :meth:`CoreManager.free` -- give every block back, tail first.
"""

from __future__ import annotations

from typing import Any

from kvspec.kv_cache_interface import KVCacheConfig, cdiv
from kvspec.spec.interface import ManagerSnapshot, annotated
from kvspec.spec.pool import SpecBlockPool


class CoreManager:
    """One full-attention group of block size ``B`` over one pool."""

    def __init__(self, kv_cache_config: KVCacheConfig, max_model_len: int, scheduler_block_size: int,
                 hash_block_size: int, enable_caching: bool = True, use_eagle: bool = False,
                 enable_kv_cache_events: bool = False):
        """Requires one group (full attention) whose block size is the hash
        block size, and no EAGLE."""
        (group,) = kv_cache_config.kv_cache_groups
        assert group.kv_cache_spec.block_size == hash_block_size and not use_eagle, "not a core layout"
        self.block_size = hash_block_size
        self.max_model_len = max_model_len
        self.kv_cache_config = kv_cache_config
        self.caching = enable_caching
        self.pool = SpecBlockPool(kv_cache_config.num_blocks, enable_caching, hash_block_size, enable_kv_cache_events)
        self.tables: dict[str, list[int]] = {}
        self.num_cached: dict[str, int] = {}

    # -- 1. the hit --------------------------------------------------------------------------------

    def get_computed_blocks(self, request: Any) -> tuple[tuple[list[int]], int]:
        """The cached blocks of the request's longest cached prefix, at most
        ``num_tokens - 1`` tokens long; nothing changes (a lookup takes no block)."""
        if not self.caching or request.skip_reading_prefix_cache:
            return ([],), 0
        hit: list[int] = []
        for block_hash in request.block_hashes[: (request.num_tokens - 1) // self.block_size]:
            found = self.pool.get_cached_block(block_hash, [0])
            if found is None:
                break
            hit += found
        return (hit,), len(hit) * self.block_size

    # -- 2. allocation -----------------------------------------------------------------------------

    def allocate_slots(self, request: Any, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: tuple[list[int], ...] | None = None, num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0, delay_cache_blocks: bool = False,
                       num_encoder_tokens: int = 0, full_sequence_must_fit: bool = False, reserved_blocks: int = 0,
                       has_scheduled_reqs: bool = True) -> tuple[list[int]] | None:
        """Slots for ``num_new_tokens`` after the computed ones (and a hit of
        ``num_new_computed_tokens`` in ``new_computed_blocks``, and external
        tokens).  ``None``, changing nothing, when the free queue cannot give
        what it needs -- new blocks, plus hit blocks that are free right now
        (taking one takes it out of the queue).  Returns the new blocks."""
        rid = request.request_id
        hits = list(new_computed_blocks[0]) if new_computed_blocks else []
        held = self.tables.get(rid, [])
        computed = request.num_computed_tokens + num_new_computed_tokens + num_external_computed_tokens
        computed = min(computed, self.max_model_len)
        if full_sequence_must_fit:
            whole = cdiv(min(request.num_tokens, self.max_model_len), self.block_size)
            if self._pulls(whole, held, hits) > self.pool.get_num_free_blocks():
                return None
        slots = min(computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        if self._pulls(cdiv(slots, self.block_size), held, hits) > self.pool.get_num_free_blocks() - reserved_blocks:
            return None
        table = self.tables.setdefault(rid, held)
        if hits or num_external_computed_tokens:  # a new request: hits first, then the connector's tokens
            self.pool.touch(hits)
            table += hits
            self.num_cached[rid] = len(hits)
            table += self.pool.get_new_blocks(max(cdiv(computed, self.block_size) - len(table), 0))
        new = self.pool.get_new_blocks(max(cdiv(slots, self.block_size) - len(table), 0))
        table += new
        if self.caching and not delay_cache_blocks:
            self.cache_blocks(request, min(computed + num_new_tokens, request.num_tokens))
        return (new,)

    def _pulls(self, required: int, held: list[int], hits: list[int]) -> int:
        """Blocks the free queue gives for a table of ``required`` blocks."""
        if held:
            return max(required - len(held), 0)
        free_hits = sum(1 for b in hits if self.pool.snapshot().ref[b] == 0)
        return max(required - len(hits), 0) + free_hits

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        """Make the request's blocks that ``num_computed_tokens`` filled cache hits."""
        rid = request.request_id
        start, end = self.num_cached.get(rid, 0), num_computed_tokens // self.block_size
        if end > start:
            self.pool.cache_full_blocks(request, self.tables[rid], start, end, self.block_size, 0)
            self.num_cached[rid] = end

    # -- 3. release --------------------------------------------------------------------------------

    def free(self, request: Any) -> None:
        """Give the request's blocks back, tail first: its last blocks -- the
        least likely to be shared -- are evicted first."""
        table = self.tables.pop(request.request_id, [])
        self.num_cached.pop(request.request_id, None)
        self.pool.free_blocks(table[::-1])

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        """Full attention reads every token again: nothing leaves a window."""

    # -- housekeeping and observation ----------------------------------------------------------------

    def evict_blocks(self, block_ids: set[int]) -> None:
        self.pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

    def new_step_starts(self) -> None:
        """Nothing to do: only Mamba groups remember what a step cached."""

    def get_block_ids(self, request_id: str) -> tuple[list[int]]:
        return (list(self.tables.get(request_id, [])),)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        """How many leading blocks of this request every running request holds."""
        ref, running = self.pool.snapshot().ref, sum(1 for t in self.tables.values() if t)
        common = 0
        for b in self.tables.get(running_request_id, []):
            if ref[b] != running:
                break
            common += 1
        return [common]

    def take_events(self) -> list[Any]:
        """The pool's events, each ``Stored`` one naming the group's kind."""
        return annotated(self.pool.take_events(), self.kv_cache_config)

    def snapshot(self) -> ManagerSnapshot:
        tables = {rid: (tuple(t),) for rid, t in self.tables.items() if t}
        return ManagerSnapshot(self.pool.snapshot(), tables)
