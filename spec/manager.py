"""The KV-cache manager, as a model that runs.

The scheduler of an LLM server talks to one object about KV-cache memory:
the *manager*.  For every request it asks

1. :meth:`~SpecKVCacheManager.get_computed_blocks` -- how many leading
   tokens are already cached (the **hit**) and in which blocks;
2. :meth:`~SpecKVCacheManager.allocate_slots` -- to take those blocks and
   enough new ones for the tokens to compute this step (or ``None``: not
   enough memory, try later);
3. :meth:`~SpecKVCacheManager.free` -- to release everything when the request
   ends or is preempted;

plus a few housekeeping calls (caching blocks explicitly, dropping blocks that
left an attention window, evicting by id, resetting the cache, events).

The manager holds one :class:`~kvspec.spec.pool.SpecBlockPool` (by its public
operations only), one group manager per KV-cache group
(:mod:`kvspec.spec.kinds`) and a coordinator
(:mod:`kvspec.spec.coordinator`).  It speaks in block ids and implements
:class:`kvspec.spec.interface.ManagerTarget`, so it is compared operation by
operation with any other manager (same ids, hits, refusals, free order and
events as vLLM 0.25.1, except where vLLM breaks a rule: those differences are
listed in ``docs/rules.md``).

Every operation is atomic: it either completes, or raises
:class:`~kvspec.errors.RuleError` / :class:`~kvspec.errors.RuleTypeError`
naming the rule its input would break, and leaves the state as it was.

**A refused allocate_slots changes nothing, except that the request's blocks
that left the attention window are released first** (as
``remove_skipped_blocks`` would), whether or not the allocation then fits --
as in vLLM 0.25.1, which releases them before its capacity check ("We can do
this even if we cannot schedule this request due to insufficient free
blocks").  The request never reads those blocks again, so releasing them
loses nothing and lets other requests use them.
"""

from __future__ import annotations

import copy
import math
import pickle
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from kvspec.errors import RuleError, RuleTypeError, require_int
from kvspec.hashing import block_hashes_for_size, make_block_hash_with_group_id
from kvspec.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    MambaSpec,
    SlidingWindowSpec,
    eagle_group_ids,
    has_drafter,
    spec_is,
)
from kvspec.request import RequestStatus
from kvspec.spec import releases
from kvspec.spec.content import blocks_to_save
from kvspec.spec.coordinator import (
    Coordinator,
    HybridCoordinator,
    NoPrefixCacheCoordinator,
    Tables,
    UnitaryCoordinator,
    caches_unrounded,
)
from kvspec.spec.interface import Event, ManagerSnapshot, annotated
from kvspec.spec.kinds import NULL, CrossAttention, Mamba, OutOfBlocks, group_class
from kvspec.spec.layout import block_ranks, managed_spec
from kvspec.spec.pool import SpecBlockPool, TrialPool


def _require_int(value: Any, what: str, rule: str = "allocation-accounting") -> int:
    return require_int(rule, what, value)


def _require_bool(value: Any, what: str) -> bool:
    if type(value) is not bool:
        raise RuleTypeError("allocation-accounting", f"{what} must be a bool, got {value!r}")
    return value


class SpecKVCacheManager:
    """The reference KV-cache manager (vLLM's ``KVCacheManager``, by block id)."""

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        enable_caching: bool = True,
        use_eagle: bool = False,
        enable_kv_cache_events: bool = False,
        watermark: float = 0.0,
        max_num_batched_tokens: int | None = None,
        retention_interval: int | None = None,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        num_hash_lookahead_tokens: int = 0,
        release: releases.Release | str | None = None,
    ):
        """Build the pool, one group manager per group, and the coordinator.

        ``release``: the vLLM release whose rules the manager follows (a
        :class:`~kvspec.spec.releases.Release` or a version; default the
        reference release, 0.25.1).  It is read here and handed to the pool,
        whose group managers and coordinator read it from there: two managers
        of two releases live side by side in one process.

        With context parallelism (``dcp_world_size * pcp_world_size`` ranks
        > 1) each rank holds ``block_size`` of a block's tokens, so the
        manager counts ``block_size`` times the ranks in every block of the
        group (:func:`kvspec.spec.layout.managed_spec`); the scheduler and
        hash block sizes are given in those tokens.

        Requires (else :class:`RuleError`, rule in brackets):

        - [block-size-coherence] positive ints; the scheduler block size a
          multiple of the hash block size and of every group's block size;
          in a hybrid model every block size a multiple of the hash block
          size, in a one-group model with caching the block size equal to
          it; chunked local attention in a hybrid model only with its block
          size equal to the scheduler block size;
        - [hit-soundness] a hybrid model has at least two distinct specs;
          chunked local attention is not an EAGLE group (with caching on);
        - [hash-map-consistency] cross attention only with caching off;
        - [allocation-accounting] ``watermark`` a finite number ``>= 0``;
        - [block-size-coherence] ``retention_interval`` ``None`` or a
          multiple of the scheduler block size ``>= 0``, and only for models
          with a sliding-window or Mamba group (from 0.29.0, release delta
          ``retention-zero-anywhere``, 0 for any model);
        - [block-size-coherence] ``dcp_world_size`` and ``pcp_world_size``
          positive ints; more than one rank only for a model of one group
          that keeps every block of its requests (full attention, MLA,
          R-SWA, cross attention): a window, a chunk or a Mamba state is not
          split over ranks (vLLM's engine refuses more than one group; its
          manager, only with prefix caching on).  From 0.26.0 (release
          delta ``dcp-on-hybrid-models``) a hybrid model of full-attention
          and Mamba groups also takes decode context parallelism (no
          prefill ranks): attention blocks are split over the ranks, Mamba
          states replicated on each.
        - [content-soundness] ``num_hash_lookahead_tokens`` (L) an int
          ``>= 0``, and 0 unless release delta ``lookahead-block-hashes``
          (vLLM 0.33) is in force: then each block hash also covers the L
          tokens after its block (the request block hasher's, in
          :mod:`kvspec.hashing`), so a request's hashes lag its tokens by L
          and only hashed blocks are cached.

        Guarantees: every block but the null block is free; no request.
        """
        if not isinstance(kv_cache_config, KVCacheConfig):
            raise RuleTypeError("block-size-coherence",
                                f"kv_cache_config must be a KVCacheConfig, got {kv_cache_config!r}")
        for name, value in (("max_model_len", max_model_len), ("scheduler_block_size", scheduler_block_size),
                            ("hash_block_size", hash_block_size), ("dcp_world_size", dcp_world_size),
                            ("pcp_world_size", pcp_world_size)):
            require_int("block-size-coherence", name, value, 1)
        for name, value in (("enable_caching", enable_caching), ("use_eagle", use_eagle),
                            ("enable_kv_cache_events", enable_kv_cache_events)):
            _require_bool(value, name)
        if isinstance(watermark, bool) or not isinstance(watermark, int | float) or not 0 <= watermark < math.inf:
            raise RuleError("allocation-accounting", f"watermark must be a finite number >= 0, got {watermark!r}")
        if max_num_batched_tokens is None:
            max_num_batched_tokens = max_model_len
        _require_int(max_num_batched_tokens, "max_num_batched_tokens", "block-size-coherence")
        self.release = release = releases.as_release(release)

        specs = self._managed_specs(kv_cache_config, dcp_world_size, pcp_world_size, release)
        if scheduler_block_size % hash_block_size or any(scheduler_block_size % s.block_size for s in specs):
            raise RuleError(
                "block-size-coherence",
                f"scheduler block size {scheduler_block_size} must be a multiple of the hash block size "
                f"{hash_block_size} and of every group's block size {[s.block_size for s in specs]}",
            )
        if retention_interval is not None:
            _require_int(retention_interval, "retention_interval", "block-size-coherence")
            if not any(isinstance(s, SlidingWindowSpec | MambaSpec) for s in specs) and not (
                    retention_interval == 0 and release.has("retention-zero-anywhere")):
                raise RuleError("block-size-coherence", "retention_interval needs a sliding-window or Mamba group")
            if retention_interval % scheduler_block_size:
                raise RuleError("block-size-coherence",
                                f"retention_interval {retention_interval} is not a multiple of {scheduler_block_size}")

        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.scheduler_block_size = scheduler_block_size
        self.hash_block_size = hash_block_size
        self.enable_caching = enable_caching
        self.use_eagle = use_eagle
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
        self.num_hash_lookahead_tokens = self._require_lookahead(num_hash_lookahead_tokens, release)

        eagle = eagle_group_ids(kv_cache_config, use_eagle,
                                drop_needs_use_eagle=release.has("eagle-drop-needs-use-eagle"))
        if enable_caching:
            self._check_caching_layout(specs, eagle, scheduler_block_size, hash_block_size, release)

        pool = SpecBlockPool(kv_cache_config.num_blocks, enable_caching, hash_block_size, enable_kv_cache_events,
                             release)
        groups = []
        for g, spec in enumerate(specs):
            cap = None
            if isinstance(spec, SlidingWindowSpec | ChunkedLocalAttentionSpec):
                cap = spec.max_admission_blocks_per_request(max_num_batched_tokens, max_model_len)
            groups.append(group_class(spec)(spec, g, pool, enable_caching, scheduler_block_size, cap))
        if not enable_caching:
            kind = NoPrefixCacheCoordinator
        elif len(groups) == 1:
            kind = UnitaryCoordinator
        else:
            kind = HybridCoordinator
        self.coordinator: Coordinator = kind(
            pool, groups, scheduler_block_size, hash_block_size, eagle, retention_interval,
            has_drafter(kv_cache_config, use_eagle),
        )
        self.coordinator.rounds_caching = not caches_unrounded(specs, dcp_world_size, hash_block_size, release)
        for group in groups:
            if isinstance(group, Mamba):
                group.use_eagle_checkpoint = use_eagle

    @staticmethod
    def _managed_specs(kv_cache_config: KVCacheConfig, dcp_world_size: int, pcp_world_size: int,
                       release: releases.Release) -> list:
        """The groups' specs as the manager counts their blocks under the
        release judged; refuses context parallelism where a block cannot be
        split over ranks."""
        specs = [g.kv_cache_spec for g in kv_cache_config.kv_cache_groups]
        if dcp_world_size * pcp_world_size == 1:
            return specs
        ranks = block_ranks(dcp_world_size, pcp_world_size, release)
        parallelism = f"context parallelism (dcp_world_size={dcp_world_size}, pcp_world_size={pcp_world_size})"
        if len(specs) == 1:
            if not spec_is(specs[0], FullAttentionSpec, CrossAttentionSpec):
                raise RuleError("block-size-coherence",
                                f"context parallelism does not split a {type(specs[0]).__name__} group's blocks "
                                f"over ranks")
            return [managed_spec(specs[0], ranks)]
        if not release.has("dcp-on-hybrid-models"):
            raise RuleError("block-size-coherence", f"{parallelism} needs a model of one KV-cache group, "
                                                    f"got {len(specs)}")
        if pcp_world_size != 1:
            raise RuleError("block-size-coherence", f"{parallelism}: a hybrid model of {len(specs)} groups takes "
                                                    f"decode context parallelism only")
        if others := [type(s).__name__ for s in specs if not spec_is(s, FullAttentionSpec, MambaSpec)]:
            raise RuleError("block-size-coherence", f"{parallelism}: a hybrid model takes it with full-attention "
                                                    f"and Mamba groups only, got {', '.join(others)}")
        return [managed_spec(s, ranks) for s in specs]

    @staticmethod
    def _check_caching_layout(specs, eagle, scheduler_block_size, hash_block_size, release) -> None:
        if any(isinstance(s, CrossAttentionSpec) for s in specs):
            raise RuleError("hash-map-consistency", "cross-attention blocks are never cached: disable prefix caching")
        for g, s in enumerate(specs):
            if isinstance(s, ChunkedLocalAttentionSpec) and g in eagle:
                raise RuleError("hit-soundness", "EAGLE is not supported with chunked local attention")
        if len(specs) == 1 and specs[0].block_size != hash_block_size:
            raise RuleError("block-size-coherence",
                            f"one group with caching needs block size {specs[0].block_size} == hash block size")
        if len(specs) > 1:
            if any(s.block_size % hash_block_size for s in specs):
                raise RuleError("block-size-coherence", f"block sizes must be multiples of {hash_block_size}")
            distinct = []
            for s in specs:
                if s not in distinct:
                    distinct.append(s)
            if len(distinct) < 2 and not release.has("hybrid-one-spec-group"):
                raise RuleError("hit-soundness", "a hybrid model needs at least two distinct KV-cache specs")
            if any(isinstance(s, ChunkedLocalAttentionSpec) and s.block_size != scheduler_block_size for s in specs):
                raise RuleError("block-size-coherence",
                                "chunked local attention needs its block size equal to the scheduler block size")

    # -- state ------------------------------------------------------------------------------------------

    @property
    def pool(self) -> SpecBlockPool:
        return self.coordinator.pool

    @property
    def groups(self):
        return self.coordinator.groups

    @property
    def usage(self) -> float:
        return self.get_usage()

    def get_usage(self) -> float:
        """The share of usable blocks not free (chapter 2): ``1 - free / (num_blocks - 1)``."""
        return self.pool.get_usage()

    @contextmanager
    def _all_or_nothing(self) -> Iterator[None]:
        """Run a multi-step change atomically: if any step is refused (the
        pool raises), restore the state from before the first step.  The
        saved state is a deep copy made by pickling: the coordinator is plain
        data, and pickling copies it about 2.5 times as fast as
        ``copy.deepcopy`` (this runs before every allocation of a checked run)."""
        saved = pickle.loads(pickle.dumps(self.coordinator, pickle.HIGHEST_PROTOCOL))
        try:
            yield
        except Exception:
            self.coordinator = saved
            raise

    # -- argument checks --------------------------------------------------------------------------------

    def _require_request(self, request: Any) -> str:
        rid = getattr(request, "request_id", None)
        if not isinstance(rid, str):
            raise RuleTypeError("allocation-accounting", f"expected a request with a str request_id, got {request!r}")
        _require_int(request.num_computed_tokens, "request.num_computed_tokens")
        return rid

    def _require_request_id(self, request_id: Any) -> str:
        if not isinstance(request_id, str):
            raise RuleTypeError("allocation-accounting", f"request id must be a str, got {request_id!r}")
        return request_id

    @staticmethod
    def _require_lookahead(lookahead: Any, release: releases.Release) -> int:
        _require_int(lookahead, "num_hash_lookahead_tokens", "content-soundness")
        if lookahead and not release.has("lookahead-block-hashes"):
            raise RuleError("content-soundness",
                            f"num_hash_lookahead_tokens={lookahead}: hashes covering tokens past their block are "
                            f"release delta lookahead-block-hashes (0.33.0), not in vLLM {release.version}")
        return lookahead

    def _require_hashes(self, request: Any, num_tokens: int) -> None:
        """A request's hashes must cover its full hash blocks: they name its
        content.  Under lookahead hashes a block is hashed only once the L
        tokens past it exist, so the last L tokens' blocks may lack theirs."""
        num_tokens = max(0, num_tokens - self.num_hash_lookahead_tokens)
        have, need = len(request.block_hashes), num_tokens // self.hash_block_size
        if have < need:
            raise RuleError("block-size-coherence",
                            f"request {request.request_id} has {have} block hashes; {num_tokens} tokens need {need}")

    def _require_hits(self, new_computed_blocks: Any) -> Tables:
        groups = len(self.groups)
        if new_computed_blocks is None:
            return tuple([] for _ in range(groups))
        if not isinstance(new_computed_blocks, tuple | list):
            raise RuleTypeError("hit-soundness", f"new_computed_blocks must be a list of block lists, got "
                                f"{new_computed_blocks!r}")
        if len(new_computed_blocks) != groups:
            raise RuleError("hit-soundness", f"new_computed_blocks must hold one block list per group ({groups}), "
                            f"got {len(new_computed_blocks)}")
        hits = []
        for column in new_computed_blocks:
            if not isinstance(column, tuple | list):
                raise RuleTypeError("hit-soundness", f"a group's hit must be a list of block ids, got {column!r}")
            for b in column:
                if type(b) is not int:
                    raise RuleTypeError("hit-soundness", f"block id must be an int, got {b!r}")
                if not 0 <= b < self.pool.num_blocks:
                    raise RuleError("hit-soundness", f"block id {b} is outside the pool")
            hits.append(list(column))
        return tuple(hits)

    def _require_hits_allowed(self, request: Any, hits: Tables, num_external: int) -> None:
        """Hits (and external tokens) are for a request that holds nothing
        yet, and every hit block must still hold what its position names."""
        rid = request.request_id
        if not any(hits) and num_external == 0:
            return
        if self.coordinator.is_running(rid):
            if any(hits):
                raise RuleError("hit-soundness", f"request {rid} is running: it cannot take new hits")
            return
        for group in self.groups:
            if not isinstance(group, CrossAttention) and group.table(rid):
                raise RuleError("hit-soundness",
                                f"request {rid} already holds blocks: hits and external tokens only start a request")
        if not any(hits):
            return
        if not self.enable_caching:
            raise RuleError("hit-soundness", "prefix caching is off: there are no hits")
        keys = self.pool.snapshot().key_of
        for g, (group, column) in enumerate(zip(self.groups, hits, strict=True)):
            if isinstance(group, CrossAttention) and column:
                raise RuleError("hit-soundness", "cross attention has no hits")
            hashes = block_hashes_for_size(request.block_hashes, self.hash_block_size, group.block_size)
            for i, b in enumerate(column):
                if b == NULL:
                    continue
                if i >= len(hashes) or keys.get(b) != make_block_hash_with_group_id(hashes[i], g):
                    raise RuleError("content-soundness",
                                    f"hit block {b} at position {i} of group {g} is no longer cached for this request")

    # -- 1. the hit -------------------------------------------------------------------------------------

    def get_computed_blocks(self, request: Any) -> tuple[Tables, int]:
        """The longest cached prefix of the request, and its blocks per group.

        Requires a request whose hashes cover its tokens (when caching).
        Guarantees: no state changes; ``(empty tables, 0)`` when caching is
        off or the request skips reading the cache; otherwise the
        coordinator's hit with maximum ``num_tokens - 1`` -- the last token is
        always recomputed, to get its logits -- with ``hit / B`` blocks for
        every group (none for cross attention), so that a table started from
        it covers exactly the hit (rule hit-soundness).
        """
        rid = self._require_request(request)
        groups = len(self.groups)
        if not self.enable_caching or getattr(request, "skip_reading_prefix_cache", False):
            return tuple([] for _ in range(groups)), 0
        num_tokens = request.num_tokens
        if num_tokens < 1:
            raise RuleError("hit-soundness", f"request {rid} has no tokens")
        self._require_hashes(request, num_tokens)
        tables, hit = self.coordinator.find_longest_cache_hit(request.block_hashes, num_tokens - 1)
        return tuple(list(t) for t in tables), hit

    def get_num_blocks_to_allocate(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Tables | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        num_encoder_tokens: int = 0,
    ) -> int:
        """(A query.) How many blocks :meth:`allocate_slots` with these
        arguments takes from the free queue in its steps 4-5 -- by definition:
        run those steps on a copy of the state whose pool never runs short,
        and count the blocks taken (new ones, and hits that were free).  Step
        2's release does not change the number.  Used by rule
        allocation-accounting, which holds every target's allocation to its
        own number.

        vLLM's capacity check (step 3) compares its own estimate instead
        (:meth:`~kvspec.spec.coordinator.Coordinator.blocks_to_allocate`),
        which is this number everywhere but in Mamba align mode with
        connector tokens, where it falls short (finding F5)."""
        hits = self._require_hits(new_computed_blocks)
        local = request.num_computed_tokens + num_new_computed_tokens
        total = min(local + num_external_computed_tokens, self.max_model_len)
        main = total + num_new_tokens
        counter = TrialPool(self.pool)
        trial = copy.deepcopy(self.coordinator, {id(self.pool): counter})
        self._take_and_allocate(trial, request.request_id, hits, local, num_external_computed_tokens,
                                min(main + num_lookahead_tokens, self.max_model_len), main, num_encoder_tokens)
        return counter.taken

    @staticmethod
    def _take_and_allocate(coordinator: Coordinator, rid: str, hits: Tables, local: int, external: int,
                           need_slot: int, main: int, num_encoder_tokens: int) -> Tables:
        """Steps 4-5 of :meth:`allocate_slots`: a new request's hits and its
        connector tokens' blocks, then the new blocks."""
        if any(hits) or external > 0:
            coordinator.take_hits(rid, hits, local, external)
        return coordinator.allocate(rid, need_slot, main, num_encoder_tokens)

    # -- 2. allocation ------------------------------------------------------------------------------------

    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Tables | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
    ) -> Tables | None:
        """Take the request's hits and enough blocks for its next tokens.

        The request's token layout::

            | computed | new hits | external | new (to compute) | lookahead |
            |<----- total computed --------->|

        where *computed* is ``request.num_computed_tokens``, *new hits* the
        ``num_new_computed_tokens`` found by :meth:`get_computed_blocks`
        (blocks ``new_computed_blocks``), *external* tokens an external KV
        connector supplies, *new* the tokens computed this step (unverified
        draft tokens included) and *lookahead* the speculative slots.

        Requires (else the named rule, nothing changes):

        - [allocation-accounting] non-negative int counts, bool flags, and
          ``num_new_tokens > 0`` unless there are external tokens;
        - [hit-soundness] hits (one list per group) only for a request that
          holds no blocks yet (a running request's external tokens are
          ignored; other requests holding blocks take none); no hits with
          caching off;
        - [content-soundness] every non-null hit block still cached under the
          request's hash for its position and group.

        Steps (each over all groups, in group order):

        1. *total computed* = computed + new hits + external, at most
           ``max_model_len``.  With ``full_sequence_must_fit``, refuse unless
           the free blocks hold the whole request (sliding-window and chunked
           groups counted at their per-request maximum) plus the watermark.
           This refusal changes nothing.
        2. Free the request's blocks that left the attention window at
           *total computed* (tail-first), their entries becoming the null
           block -- exactly :meth:`remove_skipped_blocks`, and done even if
           step 3 then refuses: the request never reads them again.
        3. Refuse unless the blocks to take (:meth:`get_num_blocks_to_allocate`)
           plus the watermark fit into the free blocks (those step 2 released
           included) minus ``reserved_blocks``.  The watermark
           (``watermark * num_blocks``) applies to waiting or preempted
           requests while others are scheduled (``has_scheduled_reqs``).
        4. A new request takes its hits, then (all groups having taken
           theirs) blocks for its external tokens.
        5. Each group gets new blocks to cover
           ``min(total computed + new + lookahead, max_model_len)`` tokens
           (cross attention: the encoder tokens).
        6. Unless caching is off or ``delay_cache_blocks``, cache the full
           blocks of ``min(total computed + new, request.num_tokens)`` tokens
           (never unverified draft tokens).

        Requires (else a ``RuleError``, nothing changed): counts that are
        ints, ``num_new_tokens`` or external tokens (from 0.31, release delta
        ``zero-token-hit-adoption``, or a local hit to adopt), hits the request may take,
        and no token computed past ``max_model_len`` (computed + external +
        new; lookahead slots are capped instead).

        Guarantees: the new blocks, or ``None`` (refused) with nothing
        changed but step 2's release.  (vLLM compatibility, a departure: vLLM's estimate misses the blocks a
        Mamba align group takes for external tokens; should the pool run out
        during steps 4-5, steps 4-5 are undone and the allocation is refused
        like a step-3 refusal -- step 2's release stays done, as it does in
        vLLM, which fails half-way there.)

        Returns the new blocks per group (Mamba align mode: the table's new
        entries, null and moved blocks included).
        """
        rid = self._require_request(request)
        for name, value in (("num_new_tokens", num_new_tokens), ("num_new_computed_tokens", num_new_computed_tokens),
                            ("num_lookahead_tokens", num_lookahead_tokens),
                            ("num_external_computed_tokens", num_external_computed_tokens),
                            ("num_encoder_tokens", num_encoder_tokens), ("reserved_blocks", reserved_blocks)):
            _require_int(value, name)
        for name, value in (("delay_cache_blocks", delay_cache_blocks),
                            ("full_sequence_must_fit", full_sequence_must_fit),
                            ("has_scheduled_reqs", has_scheduled_reqs)):
            _require_bool(value, name)
        adopts_hits = self.release.has("zero-token-hit-adoption")
        if num_new_tokens == num_external_computed_tokens == 0 and not (num_new_computed_tokens > 0 and adopts_hits):
            raise RuleError("allocation-accounting", "num_new_tokens must be > 0 when there are no external tokens"
                            + (" and no hit to adopt" if adopts_hits else ""))
        hits = self._require_hits(new_computed_blocks)
        self._require_hits_allowed(request, hits, num_external_computed_tokens)

        coordinator = self.coordinator
        local = request.num_computed_tokens + num_new_computed_tokens
        if local + num_external_computed_tokens + num_new_tokens > self.max_model_len:
            raise RuleError("allocation-accounting", f"request {rid} would compute "
                            f"{local + num_external_computed_tokens + num_new_tokens} tokens, past max_model_len "
                            f"{self.max_model_len}")
        total = min(local + num_external_computed_tokens, self.max_model_len)
        watermark = 0
        if has_scheduled_reqs and request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            watermark = self.watermark_blocks
        free = self.pool.get_num_free_blocks()

        # 1. the whole request must fit (refused before anything changes, as in vLLM)
        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            need = coordinator.blocks_to_allocate(rid, full, hits, num_encoder_tokens, total, full, admission_cap=True)
            if need + watermark > free:
                return None

        # 2. release what left the window -- even if step 3 refuses; from 0.26 (release delta
        # processed-token-windows) counting only the processed tokens: those of steps still in the
        # forward pass (``num_in_flight_tokens``, async scheduling) are read there
        processed = total
        if self.release.has("processed-token-windows"):
            processed = max(0, total - getattr(request, "num_in_flight_tokens", 0))
        removal = coordinator.removal_plan(rid, processed, request.num_prompt_tokens)
        if removal:
            with self._all_or_nothing():
                self.coordinator.remove(rid, removal)

        # 3. this step must fit
        coordinator = self.coordinator
        main = total + num_new_tokens
        need_slot = min(main + num_lookahead_tokens, self.max_model_len)
        need = coordinator.blocks_to_allocate(
            rid, need_slot, hits, num_encoder_tokens, local + num_external_computed_tokens, main
        )
        if need + watermark > self.pool.get_num_free_blocks() - reserved_blocks:
            return None

        try:
            with self._all_or_nothing():
                coordinator = self.coordinator
                new = self._take_and_allocate(  # 4. and 5.
                    coordinator, rid, hits, local, num_external_computed_tokens, need_slot, main, num_encoder_tokens
                )
                if self.enable_caching and not delay_cache_blocks:  # 6.
                    coordinator.cache(request, self._hashed(request, min(total + num_new_tokens, request.num_tokens)))
        except OutOfBlocks:
            return None  # the estimate fell short (Mamba align + external tokens): refused after step 2
        return tuple(list(blocks) for blocks in new)

    # -- 3. the end, and housekeeping ---------------------------------------------------------------------

    def free(self, request: Any) -> None:
        """Release all the request's blocks: group by group, each table
        tail-first (so its last block is evicted first).  Unknown requests
        hold nothing, so freeing them does nothing."""
        rid = self._require_request_id(getattr(request, "request_id", None))
        with self._all_or_nothing():
            self.coordinator.free(rid)

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        """Cache the full blocks of the first ``num_computed_tokens`` tokens
        (when caching is on; hybrid models align down to the scheduler block
        size).  Requires the request's tables to hold those blocks and its
        hashes to name them [hash-map-consistency]."""
        self._require_request(request)
        _require_int(num_computed_tokens, "num_computed_tokens")
        if not self.enable_caching:
            return
        if num_computed_tokens > request.num_tokens:
            raise RuleError("content-soundness",
                            f"cannot cache {num_computed_tokens} tokens of a request with {request.num_tokens}")
        with self._all_or_nothing():
            self.coordinator.cache(request, self._hashed(request, num_computed_tokens))

    def _hashed(self, request: Any, num_tokens: int) -> int:
        """Of a request's first ``num_tokens`` tokens, those whose blocks are
        cached: all of them (the base requires their hashes); from release
        delta lookahead-block-hashes, those its hashes name -- a block whose
        lookahead tokens do not exist yet has no hash and waits -- but all of
        them where only the last, partial hash block has no hash (the count
        a Mamba group compares with the prompt's boundary, where caching is
        not rounded: delta unrounded-caching-under-dcp)."""
        if not self.release.has("lookahead-block-hashes"):
            return num_tokens  # the base requires the hashes (hash-map-consistency)
        if num_tokens // self.hash_block_size <= len(request.block_hashes):
            return num_tokens
        return len(request.block_hashes) * self.hash_block_size

    def remove_skipped_blocks(
        self, request_id: str, total_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Free the blocks no future token attends to once
        ``total_computed_tokens`` are computed (tail-first within each group;
        their entries become the null block).  R-SWA also needs the prompt
        length ``num_prompt_tokens`` (without it, it releases nothing)."""
        rid = self._require_request_id(request_id)
        _require_int(total_computed_tokens, "total_computed_tokens")
        if num_prompt_tokens is not None:
            _require_int(num_prompt_tokens, "num_prompt_tokens")
        with self._all_or_nothing():
            self.coordinator.remove(rid, self.coordinator.removal_plan(rid, total_computed_tokens, num_prompt_tokens))

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Forget the cached content of these blocks (an external cache said
        it is stale); held blocks stay held.  Requires valid ids."""
        self.pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block -- only when no request holds a block."""
        return self.pool.reset_prefix_cache()

    def new_step_starts(self) -> None:
        """A scheduler step begins: states Mamba cached last step become hits."""
        self.coordinator.new_step_starts()

    def take_events(self) -> list[Event]:
        """The KV events since the last call (when events are enabled), each
        ``Stored`` event naming its group's kind and sliding window."""
        return annotated(self.pool.take_events(), self.kv_cache_config)

    # -- observation ------------------------------------------------------------------------------------------

    def get_block_ids(self, request_id: str) -> Tables:
        rid = self._require_request_id(request_id)
        return tuple(list(group.table(rid)) for group in self.groups)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        """Per group, how many leading blocks of this running request every
        request holding a table in the group shares (full attention only; 0
        elsewhere, and 0 for a request holding nothing -- vLLM compatibility, a
        departure: vLLM also leaves an empty table behind for such a request, which later counts as a
        request; the model does not)."""
        rid = self._require_request_id(running_request_id)
        return self.coordinator.common_prefix_blocks(rid)

    def get_block_ids_for_computed_tokens(self, request_id: str, num_computed_tokens: int) -> Tables:
        """What a KV connector saves of a request that computed
        ``num_computed_tokens`` tokens: per group, the blocks of those tokens
        for an attention kind, the whole table for cross attention and Mamba
        (:func:`~kvspec.spec.content.blocks_to_save`; rule content-soundness).
        Requires an id and a count >= 0; changes nothing."""
        rid = self._require_request_id(request_id)
        n = _require_int(num_computed_tokens, "num_computed_tokens")
        return tuple(blocks_to_save(group.table(rid), group.kind, group.block_size, n) for group in self.groups)

    def find_longest_cache_hit_per_group(self, request: Any) -> tuple[Tables, tuple[int, ...]] | None:
        """Each group's own longest hit within the request's first
        ``num_tokens - 1`` tokens, and its length, for a hybrid model's KV
        connector (chapter 7; rule hit-soundness): ``None`` unless the
        manager has several groups and caching is on -- only the hybrid
        coordinator answers.  Requires hashes that cover the request's
        tokens; changes nothing."""
        self._require_request(request)
        if not isinstance(self.coordinator, HybridCoordinator):
            return None
        self._require_hashes(request, request.num_tokens)
        tables, lengths = self.coordinator.find_longest_cache_hit_per_group(request.block_hashes,
                                                                            request.num_tokens - 1)
        return tuple(list(t) for t in tables), lengths

    def snapshot(self) -> ManagerSnapshot:
        """The pool's snapshot and, for every request holding a non-empty
        table in some group, its tables (one tuple of ids per group)."""
        rids = sorted({rid for group in self.groups for rid, table in group.tables.items() if table})
        return ManagerSnapshot(
            pool=self.pool.snapshot(),
            tables={rid: tuple(tuple(group.table(rid)) for group in self.groups) for rid in rids},
        )

