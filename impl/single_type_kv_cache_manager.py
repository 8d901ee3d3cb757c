"""One manager per KV-cache group: which blocks a request holds in that group.

Every kind of attention keeps a request's block table differently, and this
is where the kinds differ (vLLM 0.25.1's ``single_type_kv_cache_manager``):

- how many blocks a step needs (``get_num_blocks_to_allocate``);
- which leading tokens no future query reads (``get_num_skipped_tokens``):
  their blocks go back to the pool and the table slot keeps the null block;
- which cached blocks make a prefix hit (``find_longest_cache_hit``) and which
  full blocks are worth caching (``reachable_block_mask``).

The coordinator (:mod:`.kv_cache_coordinator`) calls these per group; the
scheduler never does.  So that ``KVCacheManager.allocate_slots`` can decide
before changing anything (see :mod:`.kv_cache_manager`), two things are also
offered as pure queries: which blocks a removal would release
(``skipped_block_runs``, carried out by ``release_blocks``) and exactly how
many free blocks an allocation takes (``num_blocks_taken``; it differs from
vLLM's ``get_num_blocks_to_allocate`` only in Mamba's align mode).

Not offered: vLLM's attention-sink, TurboQuant and hidden-state specs
(not in :mod:`kvspec.kv_cache_interface`).  Decode/prefill context
parallelism (``dcp_world_size * pcp_world_size`` ranks > 1) spreads each
block's tokens over the ranks: a full-attention (MLA, R-SWA) or
cross-attention block then holds ``block_size`` tokens a rank; sliding
windows, chunks and Mamba states refuse it with a ``RuleError``.
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Iterable, Sequence
from math import gcd
from typing import Any

from kvspec.errors import RuleError, RuleTypeError, require_int
from kvspec.hashing import BlockHashWithGroupId
from kvspec.impl.block_pool import BlockPool
from kvspec.impl.kv_cache_utils import KVCacheBlock
from kvspec.impl.release import require_deltas
from kvspec.kv_cache_interface import (
    KIND_SPEC_CLASSES,
    AttentionKind,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    RSWASpec,
    SlidingWindowSpec,
    cdiv,
    managed_kind,
    spec_is,
)

MAMBA_CACHE_MODES = ("none", "all", "align")
_NEVER = math.inf


def context_parallel_ranks(dcp_world_size: int, pcp_world_size: int, deltas: frozenset[str] = frozenset()) -> int:
    """The ranks a block's tokens are spread over (decode times prefill
    context parallelism; from 0.26, release delta ``pcp-outside-the-block``,
    decode alone); each holds ``block_size`` of them."""
    for name, size in (("dcp_world_size", dcp_world_size), ("pcp_world_size", pcp_world_size)):
        require_int("block-size-coherence", name, size, 1)
    return dcp_world_size * (1 if "pcp-outside-the-block" in deltas else pcp_world_size)


def require_no_context_parallel(dcp_world_size: int, pcp_world_size: int, what: str) -> None:
    """Refuse context parallelism for ``what`` (a window, a chunk or a
    Mamba state is not split over ranks)."""
    if context_parallel_ranks(dcp_world_size, pcp_world_size) > 1:
        raise RuleError(
            "block-size-coherence",
            f"context parallelism (dcp_world_size={dcp_world_size}, pcp_world_size={pcp_world_size}) does not "
            f"split {what} over ranks",
        )


def aligned_block_count(num_blocks: int, block_size: int, alignment_tokens: int) -> int:
    """The largest ``m <= num_blocks`` whose ``m * block_size`` tokens are a
    multiple of ``alignment_tokens``."""
    step = alignment_tokens // gcd(block_size, alignment_tokens)
    return num_blocks - num_blocks % step


def _count_evictable(blocks: Sequence[KVCacheBlock]) -> int:
    """Hit blocks that sit in the free queue: touching them takes a free block."""
    return len([block for block in blocks if block.ref_cnt == 0 and not block.is_null])


def reachable_boundaries(
    num_prompt_tokens: int | None, shared_prefix_boundary: int = 0, replay_boundaries: Sequence[int] | None = None,
    junction_peek: int = 0,
) -> tuple[int, ...]:
    """The positions a later request is known to hit, whose tail sparse
    retention keeps: where a replay of the prompt resumes
    (``replay_boundaries``, the coordinator's; by default where an exact
    replay stops, ``num_prompt_tokens - 1``), and where a prefix other
    requests share ends that this request's sparse groups had not cached
    (the boundary ``get_computed_blocks`` answers from 0.26, which the
    scheduler stores on the request; 0: none).  ``junction_peek`` (from
    0.33, release delta eagle-junction-peek: an EAGLE group's block size):
    a sibling diverging right after the junction cannot peek at the block
    past it, so its hit ends that much lower, which is kept too."""
    if replay_boundaries is not None:
        positions = tuple(replay_boundaries)
    else:
        positions = () if num_prompt_tokens is None else (num_prompt_tokens - 1,)
    if not shared_prefix_boundary:
        return positions
    if junction_peek:
        return (*positions, shared_prefix_boundary, shared_prefix_boundary - junction_peek)
    return (*positions, shared_prefix_boundary)


def replay_boundaries(num_prompt_tokens: int, scheduler_block_size: int, with_drafter: bool) -> tuple[int, ...]:
    """Where a later request replaying this prompt resumes: an exact resend
    stops at ``num_prompt_tokens - 1``.  From 0.30 (release delta
    ``eagle-replay-boundaries``), in a model a drafter reads, a hit drops
    back a scheduler block from where it matched, so both a resend (matched
    to the last aligned boundary before the last token) and a longer
    sibling (matched to the prompt's last aligned boundary) resume one
    scheduler block lower; the two differ on a block-aligned prompt."""
    if not with_drafter:
        return (num_prompt_tokens - 1,)
    block = scheduler_block_size
    resend = (num_prompt_tokens - 1) // block * block
    sibling = num_prompt_tokens // block * block
    return tuple(sorted({max(resend - block, 0), max(sibling - block, 0)}))


class SingleTypeKVCacheManager(ABC):
    """The block tables of one KV-cache group.

    Args:
        kv_cache_spec: the group's spec.
        block_pool: the pool every group shares.
        enable_caching: whether full blocks are cached and hits are taken.
        kv_cache_group_id: this group's index (part of every cache key).
        scheduler_block_size: the scheduling granularity, a multiple of this
            group's block size; cache hits are multiples of it.
        max_admission_blocks_per_request: the most blocks one request can
            hold at once (sliding window, chunked local); caps the
            full-sequence admission estimate.  ``None``: no cap.
    """

    # Whether context parallelism may spread this kind's blocks over ranks.
    splits_over_ranks = False
    # Groups whose fresh blocks the worker must zero (``take_new_block_ids``).
    _ZEROED_SPEC_TYPES: frozenset[str] = frozenset({FullAttentionSpec.__name__, MLAAttentionSpec.__name__})

    def __init__(
        self,
        kv_cache_spec: KVCacheSpec,
        block_pool: BlockPool,
        enable_caching: bool,
        kv_cache_group_id: int,
        scheduler_block_size: int,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        max_admission_blocks_per_request: int | None = None,
        *,
        deltas: Iterable[str] | None = None,
        records_new_blocks: bool | None = None,
    ) -> None:
        """``deltas``: the later releases' changes this manager follows
        (:mod:`kvspec.impl.release`; ``None``: the process's default; the
        coordinator hands it the ranks a block is counted over under them);
        ``records_new_blocks``: whether ``take_new_block_ids`` names the
        blocks it takes (default: full attention's, as in vLLM 0.25.1)."""
        self.deltas = require_deltas(deltas)
        if not self.splits_over_ranks:
            require_no_context_parallel(dcp_world_size, pcp_world_size, f"a {type(kv_cache_spec).__name__} group")
        self.kv_cache_spec = kv_cache_spec
        self.block_size = kv_cache_spec.block_size * context_parallel_ranks(dcp_world_size, pcp_world_size)
        self.scheduler_block_size = scheduler_block_size
        self.dcp_world_size = dcp_world_size
        self.pcp_world_size = pcp_world_size
        self.block_pool = block_pool
        self.enable_caching = enable_caching
        self.kv_cache_group_id = kv_cache_group_id
        self._max_admission_blocks_per_request = max_admission_blocks_per_request
        self._null_block = block_pool.null_block
        self._records_new_blocks = type(kv_cache_spec).__name__ in self._ZEROED_SPEC_TYPES \
            if records_new_blocks is None else records_new_blocks
        self._releases = self.releases_skipped_blocks
        # From 0.33 (release delta lookahead-block-hashes) a block is cached only once the request has its hash.
        self._hashed_blocks_only = "lookahead-block-hashes" in self.deltas
        # From 0.33 (delta eagle-junction-peek) an EAGLE group keeps the tail a block below a shared-prefix junction.
        self._junction_peek = "eagle-junction-peek" in self.deltas
        # No mask to compute: every full block is worth caching (see reachable_block_mask).
        base_mask = SingleTypeKVCacheManager.reachable_block_mask.__func__  # type: ignore[attr-defined]
        self._caches_every_block = type(self).reachable_block_mask.__func__ is base_mask  # type: ignore[attr-defined]
        self.new_block_ids: list[int] = []
        # request id -> its blocks, in token order (null blocks where skipped).
        self.req_to_blocks: defaultdict[str, list[KVCacheBlock]] = defaultdict(list)
        # request id -> how many leading blocks are already cached (running requests).
        self.num_cached_block: dict[str, int] = {}
        # Whether hits in this group drop the EAGLE lookahead block (set by the coordinator).
        self.use_eagle = False

    # --- how many blocks a step needs ----------------------------------------------

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
    ) -> int:
        """Free blocks that giving the request ``num_tokens`` slots takes,
        counting hit blocks that are currently free (touching them takes them
        out of the free queue)."""
        num_required = -(-num_tokens // self.block_size)
        if apply_admission_cap and self._max_admission_blocks_per_request is not None:
            num_required = min(num_required, self._max_admission_blocks_per_request)
        num_held = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:
            # A running request: no new hits; drafts may have left it over-allocated.
            return max(num_required - num_held, 0)
        num_skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        num_new = max(num_required - max(num_skipped, num_held + len(new_computed_blocks)), 0)
        # Skipped hit blocks are never touched, so only the rest can take free blocks.
        kept_hits = new_computed_blocks[max(0, num_skipped - num_held) :]
        return num_new + _count_evictable(kept_hits)

    # --- adding blocks ------------------------------------------------------------------

    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        """Give a new request its prefix-cache hit: touch the hit blocks that
        are still read and put null blocks where the window has moved on."""
        req_blocks = self.req_to_blocks[request_id]
        num_skipped, kept = self._split_hits(
            new_computed_blocks, num_local_computed_tokens + num_external_computed_tokens
        )
        if self.enable_caching:
            self.block_pool.touch(kept)
        elif any(kept):
            raise RuleError("hit-soundness", "prefix-cache hits given while prefix caching is disabled")
        if num_skipped > 0:
            req_blocks.extend([self._null_block] * num_skipped)
        req_blocks.extend(kept)
        # The hit (nulls included) is already cached; cache_blocks starts after it.
        self.num_cached_block[request_id] = len(req_blocks)

    def _split_hits(
        self, new_computed_blocks: Sequence[KVCacheBlock], total_computed_tokens: int
    ) -> tuple[int, Sequence[KVCacheBlock]]:
        """How many leading hit slots fall out of the window (they get the
        null block, their blocks are not touched) and the hit blocks kept."""
        num_skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        return num_skipped, new_computed_blocks[num_skipped:] if num_skipped > 0 else new_computed_blocks

    def allocate_external_computed_blocks(
        self,
        request_id: str,
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        """Blocks for the tokens a KV connector holds (runs after every
        group's hits are touched, so this cannot evict another group's hit)."""
        total = num_local_computed_tokens + num_external_computed_tokens
        num_blocks = self._num_external_blocks(
            len(self.req_to_blocks.get(request_id, ())), total, num_external_computed_tokens
        )
        if num_blocks is not None:
            self._extend(self.req_to_blocks[request_id], num_blocks)

    def _num_external_blocks(self, num_held: int, total_computed_tokens: int, num_external: int) -> int | None:
        """Blocks taken for external tokens that are still in the window:
        every slot up to ``total_computed_tokens``; ``None`` when none are."""
        num_skipped_tokens = self.get_num_skipped_tokens(total_computed_tokens)
        if num_skipped_tokens > 0:
            num_external = min(total_computed_tokens - num_skipped_tokens, num_external)
        if num_external <= 0:
            return None
        return cdiv(total_computed_tokens, self.block_size) - num_held

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> list[KVCacheBlock]:
        """Grow the request's table to ``num_tokens`` slots; returns the new blocks."""
        req_blocks = self.req_to_blocks[request_id]
        num_new = self._num_new_blocks(request_id, len(req_blocks), num_tokens, num_tokens_main_model)
        if num_new <= 0:
            return []
        return self._extend(req_blocks, num_new)

    def _num_new_blocks(self, request_id: str, num_held: int, num_tokens: int, num_tokens_main_model: int) -> int:
        """Blocks ``allocate_new_blocks`` takes when the table has ``num_held`` slots."""
        return -(-num_tokens // self.block_size) - num_held

    def num_blocks_taken(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
        num_tokens: int,
        num_tokens_main_model: int,
        adds_computed_blocks: bool,
    ) -> int:
        """Exactly how many free blocks the allocation takes in this group:
        hit blocks touched out of the free queue plus new blocks, for the
        steps the coordinator will run (``adds_computed_blocks``: the hit and
        external phase too).  Pure."""
        num_held = len(self.req_to_blocks.get(request_id, ()))
        taken = 0
        if adds_computed_blocks:
            total = num_local_computed_tokens + num_external_computed_tokens
            num_skipped, kept = self._split_hits(new_computed_blocks, total)
            if self.enable_caching:
                taken += _count_evictable(kept)
            num_held += max(num_skipped, 0) + len(kept)
            if num_external_computed_tokens > 0:
                external = self._num_external_blocks(num_held, total, num_external_computed_tokens) or 0
                taken += external
                num_held += external
        return taken + max(self._num_new_blocks(request_id, num_held, num_tokens, num_tokens_main_model), 0)

    def _extend(self, req_blocks: list[KVCacheBlock], num_blocks: int) -> list[KVCacheBlock]:
        new_blocks = self.block_pool.get_new_blocks(num_blocks)
        req_blocks.extend(new_blocks)
        if self._records_new_blocks:
            self.new_block_ids.extend([block.block_id for block in new_blocks])
        return new_blocks

    @property
    def records_new_block_ids(self) -> bool:
        """Whether this group's fresh blocks are named for zeroing."""
        return self._records_new_blocks

    def take_new_block_ids(self) -> list[int]:
        """Ids of the blocks allocated since the last call (for zeroing)."""
        ids, self.new_block_ids = self.new_block_ids, []
        return ids

    # --- caching --------------------------------------------------------------------------

    def cache_blocks(
        self, request: Any, num_tokens: int, retention_interval: int | None = None,
        replay_boundaries: Sequence[int] | None = None,
    ) -> None:
        """Cache the request's blocks that became full within ``num_tokens``.

        ``retention_interval``: ``None`` caches every block a hit can use;
        otherwise sparse checkpoints (see ``reachable_block_mask``), kept
        at ``replay_boundaries`` too (the coordinator's; default: where an
        exact replay of the prompt stops)."""
        request_id = request.request_id
        num_cached = self.num_cached_block.get(request_id, 0)
        if self._hashed_blocks_only:  # 0.33: a block waits for its hash (which covers lookahead tokens)
            num_tokens = min(num_tokens, len(request.block_hashes) * self.block_pool.hash_block_size)
        num_full = num_tokens // self.block_size
        if num_cached >= num_full:
            return
        mask = None if self._caches_every_block else self.reachable_block_mask(
            start_block=num_cached,
            end_block=num_full,
            alignment_tokens=self.scheduler_block_size,
            kv_cache_spec=self.kv_cache_spec,
            use_eagle=self.use_eagle,
            retention_interval=retention_interval,
            num_prompt_tokens=request.num_prompt_tokens,
            # From 0.26 the scheduler stores where a prefix other requests share ends (0: none).
            shared_prefix_boundary=getattr(request, "shared_prefix_boundary", 0),
            replay_boundaries=replay_boundaries,
            junction_peek=self.block_size if self._junction_peek and self.use_eagle else 0,
        )
        self.block_pool.cache_full_blocks(
            request=request,
            blocks=self.req_to_blocks[request_id],
            num_cached_blocks=num_cached,
            num_full_blocks=num_full,
            block_size=self.block_size,
            kv_cache_group_id=self.kv_cache_group_id,
            block_mask=mask,
        )
        self.num_cached_block[request_id] = num_full

    @classmethod
    def reachable_block_mask(
        cls,
        start_block: int,
        end_block: int,
        alignment_tokens: int | None,
        kv_cache_spec: KVCacheSpec,
        use_eagle: bool,
        retention_interval: int | None = None,
        num_prompt_tokens: int | None = None,
        shared_prefix_boundary: int = 0,
        replay_boundaries: Sequence[int] | None = None,
        junction_peek: int = 0,
    ) -> list[bool] | None:
        """Which of blocks ``[start_block, end_block)`` any future hit can
        use; ``None``: all of them (every kind of attention but sliding
        window and Mamba)."""
        return None

    # --- steady state (KVCacheManager's decode fast path) ------------------------------

    def steady_limits(
        self, request_id: str, total_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> tuple[float, float, float]:
        """For a running request whose step just ended at ``total_computed_tokens``:
        ``(slots, full, skip)`` such that a later ``allocate_slots`` without
        hits, external or encoder tokens changes nothing in this group while
        it needs at most ``slots`` slots, commits fewer than ``full`` tokens
        (the next block to cache fills at ``full``) and has computed fewer
        than ``skip`` tokens (the next block to leave the window leaves at
        ``skip``).  Pure; ``math.inf`` where a limit never comes."""
        num_held = len(self.req_to_blocks.get(request_id, ()))
        full = (self.num_cached_block.get(request_id, 0) + 1) * self.block_size if self.enable_caching else _NEVER
        return num_held * self.block_size, full, self._next_skip(total_computed_tokens, num_prompt_tokens)

    def _next_skip(self, total_computed_tokens: int, num_prompt_tokens: int | None = None) -> float:
        """The least computed-token count past ``total_computed_tokens`` at
        which ``remove_skipped_blocks`` can release another block: once one
        more whole block is skipped (blocks before it are null by then)."""
        if not self._releases:
            return _NEVER
        skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        return self.first_computed_skipping((skipped_blocks + 1) * self.block_size)

    def first_computed_skipping(self, num_skipped_tokens: int) -> float:
        """The least computed-token count at which ``num_skipped_tokens``
        leading tokens are skipped (inverts ``get_num_skipped_tokens``)."""
        return _NEVER

    # --- freeing ------------------------------------------------------------------------

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        """Forget the request and return its blocks in token order; the
        caller frees them tail first."""
        self.num_cached_block.pop(request_id, None)
        return self.req_to_blocks.pop(request_id, [])

    def free(self, request_id: str) -> None:
        """Return the request's blocks, tail first so the tail is evicted first."""
        blocks = self.pop_blocks_for_free(request_id)
        if blocks:
            # A copy: callers may still hold the table (``get_blocks``).
            self.block_pool.free_blocks(blocks[::-1])

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading tokens that no query after ``num_computed_tokens`` reads."""
        return 0

    @property
    def releases_skipped_blocks(self) -> bool:
        """Whether any leading token ever stops being read (sliding window,
        chunked local, Mamba); if not, ``remove_skipped_blocks`` never acts."""
        return type(self).get_num_skipped_tokens is not SingleTypeKVCacheManager.get_num_skipped_tokens

    def skipped_block_runs(
        self, request_id: str, total_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> list[list[int]]:
        """Indices of the blocks ``remove_skipped_blocks`` would release, one
        list per ``free_blocks`` call in call order, each in free order.
        ``num_prompt_tokens`` matters to R-SWA only.  Pure: changes nothing."""
        num_skipped_tokens = self.get_num_skipped_tokens(total_computed_tokens)
        blocks = self.req_to_blocks.get(request_id)
        if num_skipped_tokens < self.block_size or not blocks:
            return []
        last = min(num_skipped_tokens // self.block_size, len(blocks))
        if blocks[last - 1] is self._null_block:
            return []  # released by an earlier step (the usual case while decoding)
        return [self._tail_first_run(blocks, 0, last)]

    def _tail_first_run(self, blocks: list[KVCacheBlock], first: int, last: int) -> list[int]:
        """Indices ``last-1, last-2, ... >= first`` up to the first null block:
        everything before an earlier removal's nulls is already released."""
        run = []
        null = self._null_block
        for i in range(min(last, len(blocks)) - 1, first - 1, -1):
            if blocks[i] is null:
                break
            run.append(i)
        return run

    def release_blocks(self, request_id: str, runs: list[list[int]]) -> None:
        """Free the blocks at ``runs`` (from ``skipped_block_runs``), one
        ``free_blocks`` call per run; their slots keep the null block."""
        blocks = self.req_to_blocks[request_id]
        null = self._null_block
        for run in runs:
            freed = [blocks[i] for i in run]
            for i in run:
                blocks[i] = null
            self.block_pool.free_blocks(freed)

    def _remove_blocks_in_range(self, request_id: str, first_block: int, last_block: int) -> None:
        """Release blocks ``[first_block, last_block)`` tail first, stopping at
        a null block; their slots keep the null block."""
        blocks = self.req_to_blocks.get(request_id)
        if not blocks or first_block >= last_block:
            return
        run = self._tail_first_run(blocks, first_block, last_block)
        if run:
            self.release_blocks(request_id, [run])

    def remove_skipped_blocks(
        self, request_id: str, total_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Release the blocks no future query reads; their slots keep the null block."""
        runs = self.skipped_block_runs(request_id, total_computed_tokens, num_prompt_tokens)
        if runs:
            self.release_blocks(request_id, runs)

    # --- hits ------------------------------------------------------------------------------

    @abstractmethod
    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        """Leading blocks every request with blocks in this group shares (cascade attention)."""

    @classmethod
    @abstractmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[bytes],
        max_length: int,
        kv_cache_group_ids: list[int],
        block_pool: BlockPool,
        kv_cache_spec: KVCacheSpec,
        drop_eagle_block: bool,
        alignment_tokens: int,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
    ) -> tuple[list[KVCacheBlock], ...]:
        """The longest hit of at most ``max_length`` tokens, a multiple of
        ``alignment_tokens``, that every group in ``kv_cache_group_ids`` can
        serve: one block list per group (null where no block is needed).
        ``drop_eagle_block``: the hit must extend one block further, which is
        then dropped (EAGLE recomputes it for its hidden states)."""

    def new_step_starts(self) -> None:  # noqa: B027 (a hook; most kinds keep no per-step state)
        """A scheduler step begins."""


class FullAttentionManager(SingleTypeKVCacheManager):
    """Full attention (and MLA): every block is kept until the request ends;
    a hit is the longest run of cached blocks from the start.

    From 0.26 (release delta ``partial-tail-entries``), where a block holds
    several hash blocks, caching also registers the prompt's last hash
    boundary inside a block as a partial entry of that block."""

    splits_over_ranks = True

    def __init__(self, kv_cache_spec: KVCacheSpec, block_pool: BlockPool, **kwargs: Any) -> None:
        super().__init__(kv_cache_spec, block_pool, **kwargs)
        self._partial_tails = "partial-tail-entries" in self.deltas and self.block_size > block_pool.hash_block_size
        self._tail_spares_last_token = "partial-tail-resend-boundary" in self.deltas

    def cache_blocks(
        self, request: Any, num_tokens: int, retention_interval: int | None = None,
        replay_boundaries: Sequence[int] | None = None,
    ) -> None:
        super().cache_blocks(request, num_tokens, retention_interval, replay_boundaries)
        if not self._partial_tails:
            return
        boundary = self.partial_tail(request)
        blocks = self.req_to_blocks.get(request.request_id, ())
        if 0 < boundary <= num_tokens and boundary % self.block_size and boundary // self.block_size < len(blocks):
            self.block_pool.cache_partial_block(request, blocks[boundary // self.block_size], boundary,
                                                self.kv_cache_group_id, self.block_size)

    def partial_tail(self, request: Any) -> int:
        """The prompt boundary (in tokens) a partial entry is registered at,
        or 0 for none: the last multiple of the hash block size within the
        prompt (from 0.32, ``partial-tail-resend-boundary``: within the
        prompt less its last token, which a resend of the prompt can hit --
        except in an EAGLE group, whose search reads the whole prompt)."""
        if not self._partial_tails:
            return 0
        hash_block_size = self.block_pool.hash_block_size
        limit = request.num_prompt_tokens - (self._tail_spares_last_token and not self.use_eagle)
        return min(limit // hash_block_size, len(request.block_hashes)) * hash_block_size

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[bytes],
        max_length: int,
        kv_cache_group_ids: list[int],
        block_pool: BlockPool,
        kv_cache_spec: KVCacheSpec,
        drop_eagle_block: bool,
        alignment_tokens: int,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
    ) -> tuple[list[KVCacheBlock], ...]:
        block_size = kv_cache_spec.block_size * context_parallel_ranks(dcp_world_size, pcp_world_size)
        # The hashes chain, so the first miss ends the hit.
        if len(kv_cache_group_ids) == 1:
            hits: tuple[list[KVCacheBlock], ...] = (
                block_pool.cached_prefix(block_hashes, max_length // block_size, kv_cache_group_ids[0]),
            )
        else:
            hits = tuple([] for _ in kv_cache_group_ids)
            for block_hash in itertools.islice(block_hashes, max_length // block_size):
                cached = block_pool.get_cached_block(block_hash, kv_cache_group_ids)
                if cached is None:
                    break
                for group_hits, block in zip(hits, cached, strict=True):
                    group_hits.append(block)
        num_hit = len(hits[0]) if hits else 0
        if drop_eagle_block and num_hit:
            num_hit -= 1
        num_hit = aligned_block_count(num_hit, block_size, alignment_tokens)
        for group_hits in hits:
            del group_hits[num_hit:]
        return hits

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        num_requests = len(self.req_to_blocks)
        num_common = 0
        for block in self.req_to_blocks.get(running_request_id, ()):
            if block.ref_cnt != num_requests:
                break
            num_common += 1
        return num_common


class RSWAManager(FullAttentionManager):
    """Reference sliding-window attention (R-SWA): allocated and hit as full
    attention, but once decoding has moved ``rswa_window`` tokens past the
    prompt, the blocks between the prompt and the window -- the gap -- are
    released (their slots keep the null block), so a request holds
    O(prompt + window) blocks however long it decodes.  The gap needs the
    prompt length: without ``num_prompt_tokens`` nothing is released."""

    def __init__(self, kv_cache_spec: RSWASpec, **kwargs: Any) -> None:
        super().__init__(kv_cache_spec, **kwargs)
        self.rswa_window = kv_cache_spec.rswa_window

    @property
    def releases_skipped_blocks(self) -> bool:
        return True

    def gap_blocks(self, total_computed_tokens: int, num_prompt_tokens: int) -> range:
        """Table positions wholly between the prompt and the window: from the
        first block after the prompt's last to the block the window starts in."""
        window_start = max(num_prompt_tokens, total_computed_tokens - self.rswa_window)
        return range(cdiv(num_prompt_tokens, self.block_size), window_start // self.block_size)

    def skipped_block_runs(
        self, request_id: str, total_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> list[list[int]]:
        blocks = self.req_to_blocks.get(request_id)
        if num_prompt_tokens is None or not blocks:
            return []
        gap = self.gap_blocks(total_computed_tokens, num_prompt_tokens)
        run = self._tail_first_run(blocks, gap.start, gap.stop) if gap.start < gap.stop else []
        return [run] if run else []

    def _next_skip(self, total_computed_tokens: int, num_prompt_tokens: int | None = None) -> float:
        if num_prompt_tokens is None:
            return _NEVER
        # The gap gains a block once the window starts a whole block later.
        end = max(self.gap_blocks(total_computed_tokens, num_prompt_tokens).stop,
                  cdiv(num_prompt_tokens, self.block_size))
        return (end + 1) * self.block_size + self.rswa_window


class SlidingWindowManager(SingleTypeKVCacheManager):
    """Sliding-window attention: a query reads the last ``sliding_window``
    tokens, so earlier blocks are released; a hit needs only the blocks of the
    window before its end (cached, contiguous), the rest are null."""

    def __init__(self, kv_cache_spec: SlidingWindowSpec, **kwargs: Any) -> None:
        super().__init__(kv_cache_spec, **kwargs)
        self.sliding_window = kv_cache_spec.sliding_window

    @classmethod
    def _contiguous_blocks_for_hit(cls, window_size: int, block_size: int, use_eagle: bool) -> int:
        """Cached blocks a hit must end with: those covering the last
        ``window - 1`` tokens, plus the EAGLE block that is then dropped."""
        return cdiv(window_size - 1, block_size) + (1 if use_eagle else 0)

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[bytes],
        max_length: int,
        kv_cache_group_ids: list[int],
        block_pool: BlockPool,
        kv_cache_spec: KVCacheSpec,
        drop_eagle_block: bool,
        alignment_tokens: int,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
    ) -> tuple[list[KVCacheBlock], ...]:
        require_no_context_parallel(dcp_world_size, pcp_world_size, "a sliding window")
        block_size = kv_cache_spec.block_size
        needed = cls._contiguous_blocks_for_hit(kv_cache_spec.sliding_window, block_size, drop_eagle_block)
        start, run = cls._rightmost_window_run(
            block_hashes, max_length // block_size, kv_cache_group_ids, block_pool,
            needed, block_size, alignment_tokens, drop_eagle_block,
        )
        null = block_pool.null_block
        hits = tuple([null] * start + [cached[g] for cached in reversed(run)] for g in range(len(kv_cache_group_ids)))
        num_hit = start + len(run)
        if len(run) < needed:
            # No full window anywhere: only a run starting at block 0 is a hit.
            num_hit = aligned_block_count(num_hit, block_size, alignment_tokens)
        if drop_eagle_block and num_hit:
            num_hit = aligned_block_count(num_hit - 1, block_size, alignment_tokens)
        for group_hits in hits:
            del group_hits[num_hit:]
        return hits

    @staticmethod
    def _rightmost_window_run(
        block_hashes: Sequence[bytes],
        num_blocks: int,
        group_ids: list[int],
        block_pool: BlockPool,
        needed: int,
        block_size: int,
        alignment_tokens: int,
        drop_eagle_block: bool,
    ) -> tuple[int, list[list[KVCacheBlock]]]:
        """Scan right to left for ``needed`` contiguous cached blocks whose
        right end (after the EAGLE drop) is aligned.  Returns the run's first
        index and its blocks right to left; without a full run, the run that
        reaches block 0 (possibly empty)."""
        lookup = block_pool.get_cached_block
        check_alignment = block_size != alignment_tokens
        run: list[list[KVCacheBlock]] = []
        for i in range(num_blocks - 1, -1, -1):
            cached = lookup(block_hashes[i], group_ids)
            if cached is None:
                run = []
                continue
            if not run and check_alignment:
                end = i if drop_eagle_block else i + 1
                if end * block_size % alignment_tokens:
                    continue
            run.append(cached)
            if len(run) >= needed:
                return i, run
        return 0, run

    @classmethod
    def reachable_block_mask(
        cls,
        start_block: int,
        end_block: int,
        alignment_tokens: int | None,
        kv_cache_spec: KVCacheSpec,
        use_eagle: bool,
        retention_interval: int | None = None,
        num_prompt_tokens: int | None = None,
        shared_prefix_boundary: int = 0,
        replay_boundaries: Sequence[int] | None = None,
        junction_peek: int = 0,
    ) -> list[bool] | None:
        """A hit ends on an aligned boundary and reads only the window's
        blocks before it, so only those blocks are worth caching: the tail of
        every segment (``alignment_tokens``, or ``retention_interval`` when
        set; 0 keeps none) and, with a retention interval, the tail before
        each boundary a later request is known to hit (:func:`reachable_boundaries`)."""
        if alignment_tokens is None:
            return None
        block_size = kv_cache_spec.block_size
        needed = cls._contiguous_blocks_for_hit(kv_cache_spec.sliding_window, block_size, use_eagle)
        # With EAGLE the run ends one block past the boundary.
        shift = 1 if use_eagle else 0
        mask = [False] * (end_block - start_block)
        segment_tokens = alignment_tokens if retention_interval is None else retention_interval
        if segment_tokens:
            per_segment = segment_tokens // block_size
            if needed >= per_segment:
                return None
            first_tail = per_segment - needed
            for i in range(max(start_block, shift), end_block):
                if (i - shift) % per_segment >= first_tail:
                    mask[i - start_block] = True
        if retention_interval is not None:
            for position in reachable_boundaries(num_prompt_tokens, shared_prefix_boundary, replay_boundaries,
                                                 junction_peek):
                boundary = position // alignment_tokens * alignment_tokens
                tail_end = boundary // block_size + shift
                for i in range(max(start_block, tail_end - needed), min(end_block, tail_end)):
                    mask[i - start_block] = True
        return mask

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        # The next query (position num_computed_tokens) reads the window ending at it.
        return max(0, num_computed_tokens - self.sliding_window + 1)

    def first_computed_skipping(self, num_skipped_tokens: int) -> float:
        return num_skipped_tokens + self.sliding_window - 1

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        # The prefix slots hold null blocks; cascade attention is not offered.
        return 0


class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    """Chunked local attention: a query reads its own ``attention_chunk_size``
    chunk; earlier chunks are released and count as computed in a hit."""

    def __init__(self, kv_cache_spec: ChunkedLocalAttentionSpec, **kwargs: Any) -> None:
        super().__init__(kv_cache_spec, **kwargs)
        self.attention_chunk_size = kv_cache_spec.attention_chunk_size

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[bytes],
        max_length: int,
        kv_cache_group_ids: list[int],
        block_pool: BlockPool,
        kv_cache_spec: KVCacheSpec,
        drop_eagle_block: bool,
        alignment_tokens: int,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
    ) -> tuple[list[KVCacheBlock], ...]:
        require_no_context_parallel(dcp_world_size, pcp_world_size, "a chunk")
        if drop_eagle_block:
            raise RuleError("hit-soundness", "EAGLE is not supported with chunked local attention")
        block_size = kv_cache_spec.block_size
        if block_size != alignment_tokens:
            raise RuleError(
                "block-size-coherence",
                f"chunked local attention needs block_size == alignment ({block_size} != {alignment_tokens})",
            )
        chunk = kv_cache_spec.attention_chunk_size
        # Chunks before the one holding position max_length are never read again.
        first_block = max_length // chunk * chunk // block_size
        hits = tuple([block_pool.null_block] * first_block for _ in kv_cache_group_ids)
        lookup = block_pool.get_cached_block
        for i in range(first_block, max_length // block_size):
            cached = lookup(block_hashes[i], kv_cache_group_ids)
            if cached is None:
                break
            for group_hits, block in zip(hits, cached, strict=True):
                group_hits.append(block)
        return hits

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return num_computed_tokens // self.attention_chunk_size * self.attention_chunk_size

    def first_computed_skipping(self, num_skipped_tokens: int) -> float:
        return cdiv(num_skipped_tokens, self.attention_chunk_size) * self.attention_chunk_size

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        return 0


class MambaManager(SingleTypeKVCacheManager):
    """A state-space layer: one recurrent state per request, stored in the
    block of the last computed token; earlier states are released.

    ``mamba_cache_mode``: ``"none"``/``"all"`` keep one block per
    ``block_size`` tokens (with prefix caching, every full block's state is
    cached); ``"align"`` keeps only the running state plus the previous step's
    (copied forward), with null blocks before them, and caches states where a
    prefill chunk ends on a block boundary.  ``num_speculative_blocks`` extra
    blocks hold draft-token states.
    """

    def __init__(self, kv_cache_spec: MambaSpec, block_pool: BlockPool, **kwargs: Any) -> None:
        mode = kv_cache_spec.mamba_cache_mode
        if mode not in MAMBA_CACHE_MODES:
            raise RuleError(
                "block-size-coherence", f"mamba_cache_mode must be one of {MAMBA_CACHE_MODES}, got {mode!r}"
            )
        super().__init__(kv_cache_spec, block_pool, **kwargs)
        self.mamba_cache_mode = mode
        self.num_speculative_blocks: int = kv_cache_spec.num_speculative_blocks
        # Tokens held back before states leave the window: the previous step's drafts may all be rejected
        # (vLLM subtracts the speculative *block* count from a token count); from 0.26 (release delta
        # processed-token-windows) the scheduler passes processed tokens and nothing is held back.
        self.window_hold_back = 0 if "processed-token-windows" in self.deltas else self.num_speculative_blocks
        # Hashes cached this step: a hit on them must wait for the next step.
        self.cached_blocks_this_step: set[BlockHashWithGroupId] = set()
        # Align mode: the block holding the state two steps back, freed next time.
        self.last_state_block_idx: dict[str, int] = {}
        # Align mode: requests that already got their running-state blocks.
        self._allocated_block_reqs: set[str] = set()
        # Align mode from 0.30 (release delta mamba-retire-across-gaps): every state before the window goes,
        # null gaps or not; request id -> how many leading table slots are known to be null (a null slot
        # never holds a block again, so the scan for states to retire starts there).
        self._retires_across_gaps = mode == "align" and "mamba-retire-across-gaps" in self.deltas
        # From 0.32: the prompt's boundary state is keyed and counted cached this step on every call that
        # reaches it; from 0.33 only where its block does not hold that boundary's key (evicted while held).
        self._remarks_prompt_boundary = mode == "align" and "mamba-boundary-remarked" in self.deltas
        self._remarks_unkeyed_only = "mamba-boundary-remark-fixed" in self.deltas
        self.use_eagle_checkpoint = False  # set by the coordinator: the manager runs an EAGLE drafter
        self._null_prefix: dict[str, int] = {}

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[bytes],
        max_length: int,
        kv_cache_group_ids: list[int],
        block_pool: BlockPool,
        kv_cache_spec: KVCacheSpec,
        drop_eagle_block: bool,
        alignment_tokens: int,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
    ) -> tuple[list[KVCacheBlock], ...]:
        require_no_context_parallel(dcp_world_size, pcp_world_size, "a Mamba state")
        block_size = kv_cache_spec.block_size
        check_alignment = block_size != alignment_tokens
        lookup = block_pool.get_cached_block
        # One cached state suffices: the rightmost one on an aligned boundary.
        for i in range(max_length // block_size - 1, -1, -1):
            cached = lookup(block_hashes[i], kv_cache_group_ids)
            if cached is None or (check_alignment and (i + 1) * block_size % alignment_tokens):
                continue
            null = block_pool.null_block
            return tuple([null] * i + [block] for block in cached)
        return tuple([] for _ in kv_cache_group_ids)

    @classmethod
    def reachable_block_mask(
        cls,
        start_block: int,
        end_block: int,
        alignment_tokens: int | None,
        kv_cache_spec: KVCacheSpec,
        use_eagle: bool,
        retention_interval: int | None = None,
        num_prompt_tokens: int | None = None,
        shared_prefix_boundary: int = 0,
        replay_boundaries: Sequence[int] | None = None,
        junction_peek: int = 0,
    ) -> list[bool] | None:
        """With a retention interval, cache one state per interval (the last
        block of each) and the state at each boundary a later request is
        known to hit (:func:`reachable_boundaries`); 0 keeps only the latter.
        Without one, every state."""
        if retention_interval is None or alignment_tokens is None:
            return None
        block_size = kv_cache_spec.block_size
        mask = [False] * (end_block - start_block)
        if retention_interval:
            per_segment = retention_interval // block_size
            if per_segment <= 1:
                return None
            first = (start_block // per_segment + 1) * per_segment - 1
            for i in range(first - start_block, len(mask), per_segment):
                mask[i] = True
        for position in reachable_boundaries(num_prompt_tokens, shared_prefix_boundary, replay_boundaries,
                                                 junction_peek):
            boundary = position // alignment_tokens * alignment_tokens
            state_block = boundary // block_size - 1
            if start_block <= state_block < end_block:
                mask[state_block - start_block] = True
        return mask

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        # Only the state after the last computed token is read.
        return num_computed_tokens - 1

    def first_computed_skipping(self, num_skipped_tokens: int) -> float:
        return num_skipped_tokens + 1

    def steady_limits(
        self, request_id: str, total_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> tuple[float, float, float]:
        if self.mamba_cache_mode == "align":
            return self._align_steady_limits(request_id, total_computed_tokens, num_prompt_tokens)
        slots, full, _ = super().steady_limits(request_id, total_computed_tokens)
        # Draft states take the table's last blocks; the release lags by the
        # hold-back (see skipped_block_runs).
        hold = self.window_hold_back
        skip = self._next_skip(max(0, total_computed_tokens - hold)) + hold
        return slots - self.num_speculative_blocks * self.block_size, full, skip

    def _align_steady_limits(
        self, request_id: str, total_computed_tokens: int, num_prompt_tokens: int | None
    ) -> tuple[float, float, float]:
        """Align mode: the running state stays in its block until the
        committed tokens cross into the next one (a new block: ``slots``,
        the table less its draft-state blocks), a state is cached at a block
        boundary (``full``), and the state left behind is released one step
        after it is copied forward, or once it falls out of the window
        (``skip``: the least computed count at which either comes)."""
        if self._remarks_prompt_boundary:
            return 0, 0, 0  # 0.32: a caching call may re-mark the prompt's state at any count
        blocks = self.req_to_blocks.get(request_id, ())
        slots = (len(blocks) - self.num_speculative_blocks) * self.block_size
        full = (self.num_cached_block.get(request_id, 0) + 1) * self.block_size if self.enable_caching else _NEVER
        hold = self.window_hold_back
        if not self._retires_across_gaps:
            skip = self._next_skip(max(0, total_computed_tokens - hold)) + hold
        else:  # the first state still held leaves once a whole block lies past it (see _states_to_retire)
            null = self._null_block
            start = self._null_prefix.get(request_id, 0)  # slots known null stay null (see _states_to_retire)
            first = next((i for i in range(start, len(blocks)) if blocks[i] is not null), None)
            skip = _NEVER if first is None else (first + 1) * self.block_size + 1 + hold
        stale = self.last_state_block_idx.get(request_id)
        if stale is not None and stale < len(blocks) and blocks[stale] is not self._null_block:
            skip = min(skip, (stale + 1) * self.block_size + 1 + hold)  # see _stale_state_block
        return slots, full, skip

    def skipped_block_runs(
        self, request_id: str, total_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> list[list[int]]:
        num_computed = max(0, total_computed_tokens - self.window_hold_back)
        if self._retires_across_gaps:
            runs = self._states_to_retire(request_id, num_computed)
        else:
            runs = super().skipped_block_runs(request_id, num_computed)
        stale = self._stale_state_block(request_id, num_computed, runs)
        if stale is not None:
            runs.append([stale])
        return runs

    def _states_to_retire(self, request_id: str, num_computed: int) -> list[list[int]]:
        """From 0.30: every state block before the window, tail first, as one
        free call -- past the null gaps prefill leaves between states, where
        the base stops at the first null."""
        blocks = self.req_to_blocks.get(request_id)
        last = min(self.get_num_skipped_tokens(num_computed) // self.block_size, len(blocks or ()))
        if last <= 0:
            return []
        null = self._null_block
        first = self._null_prefix.get(request_id, 0)
        while first < last and blocks[first] is null:
            first += 1
        self._null_prefix[request_id] = first  # a fact about the table, not a change to it
        run = [i for i in range(last - 1, first - 1, -1) if blocks[i] is not null]
        return [run] if run else []

    def _stale_state_block(self, request_id: str, num_computed: int, runs: list[list[int]]) -> int | None:
        """Align mode: the state block of two steps back, once the previous
        step's state has been copied forward, unless already released."""
        idx = self.last_state_block_idx.get(request_id)
        if idx is None or idx >= -(-num_computed // self.block_size) - 1:
            return None
        blocks = self.req_to_blocks.get(request_id)
        if not blocks or blocks[idx] is self._null_block or (runs and idx in runs[0]):
            return None
        return idx

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        return 0

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
    ) -> int:
        if new_computed_blocks and new_computed_blocks[-1].block_hash in self.cached_blocks_this_step:
            # The state was written by another request this step and is not
            # readable yet: ask for more than the pool has, so the request waits.
            return self.block_pool.num_gpu_blocks + 1
        if self.mamba_cache_mode != "align":
            return super().get_num_blocks_to_allocate(
                request_id,
                num_tokens + self.block_size * self.num_speculative_blocks,
                new_computed_blocks,
                total_computed_tokens,
                num_tokens_main_model,
                apply_admission_cap=apply_admission_cap,
            )
        # Lookahead tokens get no state (draft models have no Mamba layers).
        num_required = -(-num_tokens_main_model // self.block_size) + self.num_speculative_blocks
        num_new = num_required - len(new_computed_blocks) - len(self.req_to_blocks.get(request_id, ()))
        if num_new > 0:
            # A running request reuses last step's draft blocks: one more at most.
            num_new = 1 if request_id in self._allocated_block_reqs else 1 + self.num_speculative_blocks
        # vLLM's estimate, kept for identical decisions: it goes negative when
        # rejected drafts left the table longer than needed (offsetting other
        # groups), and ignores connector blocks.  allocate_slots also checks
        # the exact count (blocks_beyond_estimate).
        return num_new + _count_evictable(new_computed_blocks)

    def blocks_beyond_estimate(
        self,
        estimate: int,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
        num_tokens: int,
        num_tokens_main_model: int,
        adds_computed_blocks: bool,
    ) -> int:
        """Free blocks the allocation takes beyond ``estimate`` (this
        group's ``get_num_blocks_to_allocate``).  Pure."""
        if not adds_computed_blocks and request_id in self._allocated_block_reqs:
            # A running request takes one block when the estimate says so, else none.
            return -estimate if estimate < 0 else 0
        taken = self.num_blocks_taken(
            request_id, new_computed_blocks, num_local_computed_tokens, num_external_computed_tokens,
            num_tokens, num_tokens_main_model, adds_computed_blocks,
        )
        return taken - estimate

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> list[KVCacheBlock]:
        if self.mamba_cache_mode != "align":
            return super().allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)
        req_blocks = self.req_to_blocks[request_id]
        num_held = len(req_blocks)
        if cdiv(num_tokens_main_model, self.block_size) + self.num_speculative_blocks <= num_held:
            return []
        num_new = self._num_new_blocks(request_id, num_held, num_tokens, num_tokens_main_model)
        running = request_id in self._allocated_block_reqs
        self._remember_state_block(request_id, num_held, running)
        # Table layout: nulls, then the running state, then the draft-state blocks.
        state_idx = self._state_block_index(num_tokens_main_model)
        if num_held < state_idx:
            req_blocks.extend([self._null_block] * (state_idx - num_held))
        if running:
            self._move_draft_blocks_to_tail(req_blocks, num_held, state_idx)
        req_blocks.extend(self.block_pool.get_new_blocks(num_new))
        self._allocated_block_reqs.add(request_id)
        return req_blocks[num_held:]

    def _state_block_index(self, num_tokens_main_model: int) -> int:
        """Align mode: the slot of the running state (draft states follow it)."""
        return cdiv(num_tokens_main_model, self.block_size) - 1

    def _num_new_blocks(self, request_id: str, num_held: int, num_tokens: int, num_tokens_main_model: int) -> int:
        if self.mamba_cache_mode != "align":
            return super()._num_new_blocks(
                request_id, num_held, num_tokens + self.block_size * self.num_speculative_blocks, num_tokens_main_model
            )
        num_required = cdiv(num_tokens_main_model, self.block_size) + self.num_speculative_blocks
        if num_required <= num_held:
            return 0
        state_idx = self._state_block_index(num_tokens_main_model)
        num_moved = 0
        if request_id in self._allocated_block_reqs:
            num_moved = max(0, min(num_held, state_idx) - (num_held - self.num_speculative_blocks))
        return num_required - max(num_held, state_idx) - num_moved

    def _remember_state_block(self, request_id: str, num_held: int, running: bool) -> None:
        if running:
            self.last_state_block_idx[request_id] = num_held - 1 - self.num_speculative_blocks
        elif num_held:
            # A new request's last hit block holds the hit state.
            self.last_state_block_idx[request_id] = num_held - 1

    def _move_draft_blocks_to_tail(self, req_blocks: list[KVCacheBlock], num_held: int, state_idx: int) -> None:
        """Reuse last step's draft-state blocks that the new state index has
        passed: move them to the tail, leaving null behind."""
        for i in range(num_held - self.num_speculative_blocks, min(num_held, state_idx)):
            req_blocks.append(req_blocks[i])
            req_blocks[i] = self._null_block

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        self._allocated_block_reqs.discard(request_id)
        self.last_state_block_idx.pop(request_id, None)
        self._null_prefix.pop(request_id, None)
        return super().pop_blocks_for_free(request_id)

    def cache_blocks(
        self, request: Any, num_tokens: int, retention_interval: int | None = None,
        replay_boundaries: Sequence[int] | None = None,
    ) -> None:
        request_id = request.request_id
        before = self.num_cached_block.get(request_id, 0)
        if before < num_tokens // self.block_size:
            super().cache_blocks(request, num_tokens, retention_interval, replay_boundaries)
            after = self.num_cached_block.get(request_id, 0)
            for block in self.req_to_blocks[request_id][before:after]:
                if block.block_hash is not None:
                    self.cached_blocks_this_step.add(block.block_hash)
        if self._remarks_prompt_boundary:
            self._remark_prompt_boundary(request, num_tokens)

    def _remark_prompt_boundary(self, request: Any, num_tokens: int) -> None:
        """From vLLM 0.32 (release delta mamba-boundary-remarked): at the
        prompt's last reusable state boundary, key the state block there and
        count it cached this step, again on every call that reaches it; from
        0.33 (delta mamba-boundary-remark-fixed) only where the block's own
        key does not name that boundary (its key was evicted while held)."""
        hbs = self.block_pool.hash_block_size
        prompt = request.num_prompt_tokens
        boundary = prompt // hbs * hbs - hbs if self.use_eagle_checkpoint else (prompt - 1) // hbs * hbs
        if num_tokens <= 0 or num_tokens % hbs or num_tokens != max(boundary, 0):
            return
        blocks = self.req_to_blocks.get(request.request_id, ())
        index = -(-num_tokens // self.block_size) - 1
        if index >= len(blocks) or blocks[index].is_null:
            return
        if self._remarks_unkeyed_only and blocks[index].block_hash_num_tokens == num_tokens:
            return
        key = self.block_pool.cache_partial_block(request, blocks[index], num_tokens, self.kv_cache_group_id,
                                                  self.block_size)
        self.cached_blocks_this_step.add(key)

    def new_step_starts(self) -> None:
        self.cached_blocks_this_step.clear()


class CrossAttentionManager(SingleTypeKVCacheManager):
    """Cross attention (encoder-decoder): the encoder output, allocated once
    per request from ``num_encoder_tokens``; never cached or shared."""

    splits_over_ranks = True

    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        if new_computed_blocks:
            raise RuleError("hit-soundness", "cross-attention blocks are never prefix-cache hits")

    def allocate_external_computed_blocks(
        self, request_id: str, num_local_computed_tokens: int, num_external_computed_tokens: int
    ) -> None:
        return

    def _split_hits(
        self, new_computed_blocks: Sequence[KVCacheBlock], total_computed_tokens: int
    ) -> tuple[int, Sequence[KVCacheBlock]]:
        return 0, ()

    def _num_external_blocks(self, num_held: int, total_computed_tokens: int, num_external: int) -> int | None:
        return None

    def cache_blocks(
        self, request: Any, num_tokens: int, retention_interval: int | None = None,
        replay_boundaries: Sequence[int] | None = None,
    ) -> None:
        raise RuleError("hash-map-consistency", "cross-attention blocks are never cached (prefix caching must be off)")

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        return 0

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[bytes],
        max_length: int,
        kv_cache_group_ids: list[int],
        block_pool: BlockPool,
        kv_cache_spec: KVCacheSpec,
        drop_eagle_block: bool,
        alignment_tokens: int,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
    ) -> tuple[list[KVCacheBlock], ...]:
        raise RuleError("hit-soundness", "cross-attention blocks are never prefix-cache hits")

    def steady_limits(
        self, request_id: str, total_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> tuple[float, float, float]:
        # Sized by encoder tokens once; decoder steps never change it.
        return _NEVER, _NEVER, _NEVER


# By spec class name, most specific first along the spec's MRO (MLA is a
# FullAttentionSpec): vLLM's own spec classes, of the same names, map alike.
MANAGER_FOR_KIND: dict[AttentionKind, type[SingleTypeKVCacheManager]] = {
    AttentionKind.FULL_ATTENTION: FullAttentionManager,  # MLA's too: managed_kind folds it in
    AttentionKind.RSWA: RSWAManager,
    AttentionKind.SLIDING_WINDOW: SlidingWindowManager,
    AttentionKind.CHUNKED_LOCAL_ATTENTION: ChunkedLocalAttentionManager,
    AttentionKind.MAMBA: MambaManager,
    AttentionKind.CROSS_ATTENTION: CrossAttentionManager,
}


def manager_class_for_spec(kv_cache_spec: KVCacheSpec) -> type[SingleTypeKVCacheManager]:
    kind = managed_kind(kv_cache_spec)
    if kind is None:
        raise RuleTypeError(
            "block-size-coherence",
            f"no KV-cache manager for {type(kv_cache_spec).__name__}; "
            f"use one of {sorted(KIND_SPEC_CLASSES)} from kvspec.kv_cache_interface",
        )
    return MANAGER_FOR_KIND[kind]


def get_manager_for_kv_cache_spec(
    kv_cache_spec: KVCacheSpec,
    max_num_batched_tokens: int,
    max_model_len: int,
    **kwargs: Any,
) -> SingleTypeKVCacheManager:
    """The manager for one group's spec.  Sliding-window and chunked-local
    groups release blocks as they go, so their full-sequence admission is
    capped at what one request can hold at once."""
    manager_cls = manager_class_for_spec(kv_cache_spec)
    if spec_is(kv_cache_spec, SlidingWindowSpec, ChunkedLocalAttentionSpec):
        # positional: vLLM's spec classes renamed the first argument in 0.26 (max_in_flight_tokens)
        kwargs["max_admission_blocks_per_request"] = kv_cache_spec.max_admission_blocks_per_request(
            max_num_batched_tokens, max_model_len
        )
    return manager_cls(kv_cache_spec, **kwargs)
