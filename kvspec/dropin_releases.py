"""The block-manager API each vLLM release's callers expect, for the drop-in.

kvspec's impl follows a later release's *semantics* through release deltas
(``KVCacheManager(..., deltas=...)``, read once at construction:
:mod:`kvspec.impl.release`).  A release also changed the *calls* its
scheduler makes: a keyword renamed, a third value returned, calls that did
not exist.  This module holds those shapes, release by release, so that
:mod:`kvspec.dropin` can put impl in place of each release's block manager.
Nothing here decides a block: every answer is impl's, built with the
release's deltas.

- **0.25.1**: impl's own API (the base release).
- **0.26.0**: ``KVCacheManager(max_in_flight_tokens=...)`` (was
  ``max_num_batched_tokens``); ``get_computed_blocks`` returns a third value,
  the shared-prefix boundary; ``remove_skipped_blocks(processed_computed_tokens=...)``;
  new calls ``estimate_cached_tokens``, ``get_zeroing_block_ids_in_range``,
  ``record_blocks_for_zeroing``, ``take_kv_cache_block_copies``; hit blocks
  announced as stored for requests that ask for full event reports.  Not
  implemented, and refused when a model would need it: vLLM 0.26's hits that
  end inside a block, copied on write (a hybrid with a Mamba "align" group
  whose block is larger than the hash block).

- **0.27.0** (and 0.27.1, whose ``vllm/v1/core`` and block-manager tests
  are byte for byte 0.27.0's): the connector's own lookup
  ``get_computed_blocks_for_connector`` (on a hybrid of full attention and
  Mamba, full attention's own hit and whether a group's is shorter),
  ``truncate_computed_blocks``, ``prefix_cache_lookup_enabled``,
  ``take_partial_tail_offloads`` (none: only Mamba align's copy on write
  makes them, and it is refused); the prefix-cache stats recorded at
  admission; a pool that, with caching off, frees to the tail (release delta
  free-order-without-caching) -- a pool the callers build themselves too.

- **0.28.0**: ``KVCacheManager(num_prefill_lookahead=...)``: 0 or 1 (no
  drafter, or EAGLE) changes nothing; a multi-token-prediction drafter's
  ``k > 1`` with caching on is refused, as is a sliding window's
  ``extra_retained_tokens`` (vLLM holds ``k - 1`` tokens back from the cache
  and keeps ``k - 1`` more in the window; impl does neither); the free order
  back (release delta free-order-restored); a truncated hit keeps a Mamba
  group's shorter hit whole; ``coordinator.enable_partial_hash_hits`` (always
  false); ``kv_cache_utils.need_extra_keys`` is gone (:data:`GONE`).  A model
  whose sliding-window or chunked-local group has blocks other than the hash
  block is served even with a large Mamba align block: 0.28 turns hits inside
  a block off for it.

- **0.29.0**: the retention interval read from the KV-cache config, not
  the environment, and 0 accepted on any model (release delta
  retention-zero-anywhere); ``take_boundary_state_offloads`` in place of
  ``take_partial_tail_offloads``: every Mamba align state cached, offered to
  a KV connector with its block; ``BlockPool.is_block_writable``; an
  unseeded process's root hash at a fixed seed (delta fixed-root-hash, set
  by :mod:`kvspec.dropin`).  Refused: hits inside a block under decode
  ranks (delta partial-hits-under-dcp), a ``CircularBufferSpec`` group,
  Mamba prefill checkpoint blocks.

- **0.30.0**: replays a drafter moves a scheduler block lower under a
  retention interval (release delta eagle-replay-boundaries); Mamba align
  states retired past null gaps (delta mamba-retire-across-gaps);
  ``session_id`` in Stored events; ``KVCacheManager(enable_mamba_fine_grained_prefix_cache=...)``
  (always off: it needs hits inside a block); ``finalize_partial_tail_offloads``
  (none, for the same reason); ``KVCacheBlocks.get_block_ids(group_ids=...)``;
  the coordinator's ``get_replay_boundaries``.  The connector reaches the
  manager through ``bind_kv_cache_manager``, vLLM's own.

- **0.31.0**: a call with no new tokens that adopts a local hit (release
  delta zero-token-hit-adoption); every image a resumed block holds keyed
  (delta mm-keys-on-resume) and the extra keys tagged by kind (delta
  tagged-extra-keys, events kept bare), both in :mod:`kvspec.hashing`, set
  by :mod:`kvspec.dropin`; ``KVCacheManager(enable_mamba_shared_prefix_checkpoint=...)``
  (0.30's flag renamed, always off); the coordinator's
  ``get_num_blocks_to_allocate(..., prefill_end=...)``.  Refused: a group
  whose ``dcp_sharded`` differs from impl's split under decode ranks (a
  replicated drafter group), bounded replay
  (``SlidingWindowMLASpec(bounded_replay=True)``).

- **0.32.0**: ``allocate_slots(skip_zeroing_group_ids=...)`` (a KV
  connector's loaded groups' external blocks are not zeroed);
  ``get_num_common_prefix_blocks`` answers zeros and
  ``get_zeroing_block_ids_in_range`` is gone; the coordinator's
  ``get_num_cacheable_tokens``; a partial entry at a block boundary (release
  delta partial-entries-at-boundaries); Mamba align's prompt-boundary state
  counted cached again in the step its owner computes past it (delta
  mamba-boundary-remarked, which 0.33 undid); the EAGLE peek in a
  connector's per-group lookup (delta eagle-lookahead-hashes).

- **0.33.0**: ``KVCacheManager(num_hash_lookahead_tokens=...)`` -- with an
  EAGLE drafter, block hashes cover its lookahead tokens (kvspec's hasher,
  which the engine builds with the same count, gives vLLM's hashes), only
  hashed blocks are cached and Stored events carry the lookahead tokens
  (delta lookahead-block-hashes); ``get_computed_blocks(request,
  max_cache_hit_length)`` and the connector's lookup take a bound; a group
  marked as the drafter's drops nothing without ``use_eagle`` (delta
  eagle-drop-needs-use-eagle); under retention an EAGLE group keeps the
  tail a block below a shared-prefix junction (delta eagle-junction-peek,
  outside what the spec judges); Mamba's boundary state is re-marked only
  where its key was evicted while held (delta mamba-boundary-remark-fixed).

- **0.34.0**: a request's hit bounded by its own limit
  (``Request.prefix_cache_hit_limit`` in place of
  ``skip_reading_prefix_cache``: 0 reads no cache, a prompt-logprobs
  request reads up to its first scored position; delta
  prefix-cache-hit-limit, outside what the spec judges), a caller's bound
  that can only tighten it, the probe ``get_num_cached_tokens``,
  ``get_num_common_prefix_blocks`` gone, the pool's
  ``free_blocks(evict_first=...)`` (blocks another tier holds go first)
  and ``BlockHashToBlockMap(blocks)``.

A release the drop-in knows is one with an entry in :data:`API`; a later
one is refused by :func:`kvspec.dropin.check_release`, in one line, until
its calls and semantics (``docs/release-survey.md``) are read.
"""

from __future__ import annotations

from typing import Any

from kvspec.impl.block_pool import BlockHashToBlockMap, BlockPool
from kvspec.impl.kv_cache_coordinator import RETENTION_FROM_ENV
from kvspec.impl.kv_cache_manager import KVCacheManager
from kvspec.impl.release import IMPLEMENTED
from kvspec.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    SlidingWindowSpec,
    spec_is,
)
from kvspec.spec import releases

PREFIX_CACHED_NOT = ("CrossAttentionSpec", "EncoderOnlyAttentionSpec")  # groups vLLM never prefix-caches


def impl_deltas(release: releases.Release) -> frozenset[str]:
    """The deltas kvspec's impl is built with to behave as ``release``: its
    modelled ones, and those outside what the spec judges that impl follows
    for the drop-in (the others change no answer vLLM's callers read).  A ``ValueError`` names the ones impl does not
    implement yet, so that a run never judges impl by a release it does not
    follow."""
    wanted = frozenset(d.key for d in release.deltas if d.status == releases.MODELLED
                       or (d.status == releases.OUTSIDE and d.key in IMPLEMENTED))
    if missing := sorted(wanted - IMPLEMENTED):
        raise ValueError(f"kvspec's impl does not follow vLLM {release.version} yet: it lacks release delta(s) "
                         f"{', '.join(missing)} (spec/README.md, chapter Releases)")
    return wanted
class Gone:
    """A name a release removed from its module: the drop-in leaves it absent."""

    def __repr__(self) -> str:
        return "GONE"


GONE = Gone()


def pool_for(release: str) -> type[BlockPool]:
    """impl's pool as ``release``'s callers build it: with that release's
    deltas unless told others (a manager builds its own pool with its own)."""
    deltas = impl_deltas(releases.judged(release))

    class ReleaseBlockPool(BlockPool):
        __doc__ = f"impl's pool with vLLM {release}'s deltas."

        def __init__(self, num_gpu_blocks: int, enable_caching: bool, hash_block_size: int,
                     enable_kv_cache_events: bool = False, metrics_collector: Any = None,
                     num_hash_lookahead_tokens: int = 0, deltas: Any = deltas) -> None:
            super().__init__(num_gpu_blocks, enable_caching, hash_block_size, enable_kv_cache_events,
                             metrics_collector, deltas, num_hash_lookahead_tokens=num_hash_lookahead_tokens)

    if releases.version_key(release) >= (0, 29):
        ReleaseBlockPool.is_block_writable = is_block_writable  # type: ignore[attr-defined]
    ReleaseBlockPool.__name__ = ReleaseBlockPool.__qualname__ = "BlockPool"
    return ReleaseBlockPool


def is_block_writable(self: BlockPool, block: Any) -> bool:
    """Whether ``block``'s one owner may write into it (0.29's pool call):
    not the null block, one reference, and no hash (no other request can
    hit it)."""
    return not block.is_null and block.ref_cnt == 1 and block.block_hash is None


def refuse_partial_hash_hits(kv_cache_config: Any, hash_block_size: int, dcp_world_size: int, release: str) -> None:
    """vLLM 0.26 takes hits that end inside a block, copying the block on
    write, for a hybrid model with a Mamba "align" group whose block is larger
    than the hash block (and no decode context parallelism).  impl's hits end
    on block boundaries: such a model is refused, not served differently.
    From 0.28 vLLM itself turns those hits off when a group whose manager
    looks up whole blocks only (sliding window, chunked local, cross
    attention) has blocks other than the hash block; such a model is served.
    From 0.29 (release delta partial-hits-under-dcp) decode context
    parallelism turns them on too, for a Mamba align block at least the hash
    block: then a full-attention block spans block_size x dcp tokens, and the
    model is refused where that is more than the hash block (where it is not,
    every hash boundary is a block boundary and nothing changes)."""
    groups = kv_cache_config.kv_cache_groups
    if len(groups) < 2:
        return
    if dcp_world_size == 1:
        turned_on, relation = (lambda size: size > hash_block_size), ">"
    elif releases.version_key(release) >= (0, 29):
        turned_on, relation = (lambda size: size >= hash_block_size), ">="
    else:
        return
    if releases.version_key(release) >= (0, 28) and any(
            spec_is(g.kv_cache_spec, SlidingWindowSpec, ChunkedLocalAttentionSpec, CrossAttentionSpec)
            and g.kv_cache_spec.block_size != hash_block_size for g in groups):
        return
    widest = max(g.kv_cache_spec.block_size * (dcp_world_size if spec_is(g.kv_cache_spec, FullAttentionSpec) else 1)
                 for g in groups)
    for i, group in enumerate(groups):
        spec = group.kv_cache_spec
        if spec_is(spec, MambaSpec) and getattr(spec, "mamba_cache_mode", None) == "align" \
                and turned_on(spec.block_size) and widest > hash_block_size:
            raise NotImplementedError(
                f"kvspec's drop-in for vLLM {release} does not implement hits that end inside a block (copied on "
                f"write), which vLLM takes for group {i}: Mamba 'align' with block size {spec.block_size} "
                f"{relation} hash block size {hash_block_size}"
                + (f" under {dcp_world_size} decode ranks, with blocks of {widest} tokens" if dcp_world_size > 1
                   else ""))


class KVCacheManager026(KVCacheManager):
    """impl's manager with vLLM 0.26.0's API and deltas."""

    release = "0.26.0"

    def __init__(
        self,
        kv_cache_config: Any,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        max_in_flight_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: Any = None,
        watermark: float = 0.0,
        *,
        num_hash_lookahead_tokens: int = 0,
    ) -> None:
        self.refuse_model(kv_cache_config, hash_block_size, dcp_world_size)
        super().__init__(
            kv_cache_config, max_model_len, scheduler_block_size, hash_block_size, max_in_flight_tokens,
            enable_caching, use_eagle, log_stats, enable_kv_cache_events, dcp_world_size, pcp_world_size,
            metrics_collector, watermark, retention_interval=self.retention_interval_of(kv_cache_config),
            deltas=impl_deltas(releases.judged(self.release)), num_hash_lookahead_tokens=num_hash_lookahead_tokens,
        )
        self.enable_kv_cache_events = enable_kv_cache_events

    def refuse_model(self, kv_cache_config: Any, hash_block_size: int, dcp_world_size: int) -> None:
        """Refuse, before anything is built, a model whose release semantics
        impl does not implement (each later release adds its own)."""
        refuse_partial_hash_hits(kv_cache_config, hash_block_size, dcp_world_size, self.release)

    @staticmethod
    def retention_interval_of(kv_cache_config: Any) -> Any:
        """Where the release reads the prefix-cache retention interval:
        until 0.29, ``$VLLM_PREFIX_CACHE_RETENTION_INTERVAL``."""
        return RETENTION_FROM_ENV

    def get_computed_blocks(self, request: Any) -> tuple[Any, int, int]:  # type: ignore[override]
        """The hit, its length, and the shared-prefix boundary: where the
        longest single group's hit ends when a group that keeps few blocks
        (Mamba, sliding window) has not cached the prefix all others share,
        else 0.  The scheduler pins that position against retention."""
        return self._bounded_computed_blocks(request)

    def _bounded_computed_blocks(self, request: Any, max_cache_hit_length: int | None = None) -> tuple[Any, int, int]:
        """:meth:`get_computed_blocks` with the hit at most ``max_cache_hit_length`` tokens (default: all
        but the last)."""
        blocks, num_hit = self._computed_blocks(request, max_cache_hit_length)
        if not self._reads_prefix_cache(request):
            return blocks, num_hit, 0
        uncached = getattr(self.coordinator, "num_uncached_common_prefix_tokens", 0)
        if num_hit and self.enable_kv_cache_events and getattr(request, "kv_cache_report_mode", None) == "full":
            for group_id, (group, hit) in enumerate(zip(self.kv_cache_config.kv_cache_groups, blocks.blocks,
                                                        strict=True)):
                self.block_pool.emit_cached_block_events(request, len(hit), group.kv_cache_spec.block_size,
                                                         group_id)
        return blocks, num_hit, num_hit + uncached if uncached else 0

    def remove_skipped_blocks(  # type: ignore[override]
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Release the blocks out of every window, counting only processed
        tokens (0.26 renamed the argument with release delta
        processed-token-windows)."""
        super().remove_skipped_blocks(request_id, processed_computed_tokens, num_prompt_tokens)

    def estimate_cached_tokens(self, request: Any) -> int:
        """How many of the request's tokens its blocks are cached for: over
        the prefix-cached groups, the least of each group's longest cached
        block's token count."""
        least = None
        for group, blocks in zip(self.kv_cache_config.kv_cache_groups, self.get_blocks(request.request_id).blocks,
                                 strict=True):
            if {c.__name__ for c in type(group.kv_cache_spec).__mro__} & set(PREFIX_CACHED_NOT):
                continue
            longest = max((block.block_hash_num_tokens or 0 for block in blocks), default=0)
            least = longest if least is None else min(least, longest)
        return least or 0

    def get_zeroing_block_ids_in_range(self, request_id: str, start_token: int, end_token: int) -> list[int]:
        """The request's blocks covering tokens ``[start_token, end_token)``
        in the groups whose new blocks are zeroed."""
        ids: list[int] = []
        for manager in self.coordinator.single_type_managers:
            if manager.records_new_block_ids:
                start, end = start_token // manager.block_size, -(-end_token // manager.block_size)
                ids.extend(block.block_id for block in manager.req_to_blocks[request_id][start:end])
        return ids

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """Name the request's blocks from ``start_token`` on for zeroing
        again (a failed load left them unwritten); ``start_token`` is on a
        block boundary of every such group."""
        for manager in self.coordinator.single_type_managers:
            if manager.records_new_block_ids:
                if start_token % manager.block_size:
                    raise ValueError(f"start_token {start_token} is inside a block of {manager.block_size} tokens: "
                                     "zeroing it would wipe its valid prefix")
                start = start_token // manager.block_size
                manager.new_block_ids.extend(block.block_id for block in manager.req_to_blocks[request_id][start:])

    def take_kv_cache_block_copies(self) -> tuple[list[Any], list[Any]]:
        """Blocks to copy on write, and the blocks held for the copies:
        none, since impl's hits end on block boundaries (the layouts where
        vLLM copies are refused at construction)."""
        return [], []


class KVCacheManager027(KVCacheManager026):
    """impl's manager with vLLM 0.27.0's API and deltas: the connector's
    own lookup, admission-time stats, and truncated lookups."""

    release = "0.27.0"

    def prefix_cache_lookup_enabled(self, request: Any) -> bool:
        """Whether the request may look its prefix up in the cache."""
        return self._reads_prefix_cache(request)

    def get_computed_blocks_for_connector(self, request: Any) -> tuple[Any, int, int, bool]:
        """The lookup a scheduler with a KV connector makes: the four
        values ``(blocks, hit, boundary, diverged)``.  On a hybrid of full
        attention and Mamba, full attention's own hit is the local prefix
        (the connector sends the rest and the Mamba state), and ``diverged``
        says that a group's own hit is shorter; when a group's own hit is
        longer than full attention's, or on any other model, the ordinary
        lookup with ``diverged`` False."""
        return self._bounded_connector_lookup(request)

    def _bounded_connector_lookup(self, request: Any, limit: int | None = None) -> tuple[Any, int, int, bool]:
        """:meth:`get_computed_blocks_for_connector` with every hit at most ``limit`` tokens (default: all
        but the last)."""
        coordinator = self.coordinator
        first = getattr(coordinator, "attention_groups", [None])[0]  # full attention first, where a hybrid has it
        full_id = first.group_ids[0] if first is not None and spec_is(first.spec, FullAttentionSpec) else None
        has_mamba = any(spec_is(g.kv_cache_spec, MambaSpec) for g in self.kv_cache_config.kv_cache_groups)
        if not has_mamba or full_id is None:
            return *self._bounded_computed_blocks(request, limit), False
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0, False
        if limit is None:
            limit = request.num_tokens - 1
        blocks, hits = coordinator.find_longest_cache_hit_per_group(request.block_hashes, limit)
        if max(hits) > hits[full_id]:
            return *self._bounded_computed_blocks(request, limit), False
        return self.create_kv_cache_blocks(blocks), hits[full_id], 0, min(hits) < hits[full_id]

    mamba_hit_may_end_early = False  # from 0.28

    def truncate_computed_blocks(self, blocks: Any, num_computed_tokens: int) -> Any:
        """``blocks`` cut to the first ``num_computed_tokens`` tokens, which
        must end on every group's block boundary and within its hit (from
        0.28 a Mamba group's shorter hit is kept whole); reference counts
        and ``blocks`` itself unchanged."""
        out = []
        for group_blocks, manager, group in zip(blocks.blocks, self.coordinator.single_type_managers,
                                                self.kv_cache_config.kv_cache_groups, strict=True):
            keep, rest = divmod(num_computed_tokens, manager.block_size)
            if self.mamba_hit_may_end_early and spec_is(group.kv_cache_spec, MambaSpec):
                keep = min(keep, len(group_blocks))
            if rest or keep > len(group_blocks):
                raise ValueError(f"cannot truncate a hit of {len(group_blocks)} block(s) of {manager.block_size} "
                                 f"tokens to {num_computed_tokens} tokens (rule block-size-coherence)")
            out.append(list(group_blocks[:keep]))
        return self.create_kv_cache_blocks(tuple(out))

    def take_partial_tail_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        """Partial-tail states handed to a KV connector: none, since only a
        Mamba align group copying on write has them (refused at
        construction)."""
        return {}


def refuse_prefill_lookahead(kv_cache_config: Any, num_prefill_lookahead: Any, enable_caching: bool,
                             release: str) -> None:
    """vLLM 0.28's multi-token-prediction drafters read ``k`` tokens past
    a prefill chunk: with caching on vLLM then holds the last ``k - 1``
    computed tokens back from the cache, and its sliding windows keep
    ``k - 1`` tokens more.  impl does neither; the drop-in refuses such a
    model (``k`` of 0 or 1 -- no drafter, or an EAGLE one -- changes
    nothing).  A ``k`` that is no count is refused by name."""
    if type(num_prefill_lookahead) is not int or num_prefill_lookahead < 0:
        raise TypeError(f"num_prefill_lookahead must be an int >= 0, got {num_prefill_lookahead!r}")
    if num_prefill_lookahead > 1 and enable_caching:
        raise NotImplementedError(
            f"kvspec's drop-in for vLLM {release} does not hold back the last {num_prefill_lookahead - 1} computed "
            f"token(s) of a multi-token-prediction drafter (num_prefill_lookahead={num_prefill_lookahead}) from "
            "the prefix cache, which vLLM does; run without prefix caching or with an EAGLE drafter")
    for i, group in enumerate(kv_cache_config.kv_cache_groups):
        if getattr(group.kv_cache_spec, "extra_retained_tokens", 0):
            raise NotImplementedError(
                f"kvspec's drop-in for vLLM {release} does not keep a sliding window's extra_retained_tokens "
                f"({group.kv_cache_spec.extra_retained_tokens}, group {i}), which vLLM keeps for a "
                "multi-token-prediction drafter")


class KVCacheManager028(KVCacheManager027):
    """impl's manager with vLLM 0.28.0's API and deltas: the prefill
    lookahead argument (refused where it would change an answer), the free
    order back (delta free-order-restored), and truncation that spares a
    Mamba group's short hit."""

    release = "0.28.0"

    def __init__(
        self,
        kv_cache_config: Any,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        max_in_flight_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        num_prefill_lookahead: int = 0,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: Any = None,
        watermark: float = 0.0,
        *,
        num_hash_lookahead_tokens: int = 0,
    ) -> None:
        refuse_prefill_lookahead(kv_cache_config, num_prefill_lookahead, enable_caching, self.release)
        super().__init__(
            kv_cache_config, max_model_len, scheduler_block_size, hash_block_size, max_in_flight_tokens,
            enable_caching, use_eagle, log_stats, enable_kv_cache_events, dcp_world_size, pcp_world_size,
            metrics_collector, watermark, num_hash_lookahead_tokens=num_hash_lookahead_tokens,
        )

    # An external hit may supply a Mamba group's final state: its own hit may end before the truncation point.
    mamba_hit_may_end_early = True


def refuse_new_state_029(kv_cache_config: Any, release: str) -> None:
    """Two kinds of state vLLM 0.29 introduced that impl does not keep: a
    group outside prefix caching whose one block per request is a ring
    (``CircularBufferSpec``, a compressor's state), and a Mamba group's
    internal checkpoint blocks for prefill (``num_prefill_checkpoint_blocks``).
    Such a model is refused, not served without them."""
    for i, group in enumerate(kv_cache_config.kv_cache_groups):
        spec = group.kv_cache_spec
        if getattr(spec, "bounded_replay", False):
            raise NotImplementedError(
                f"kvspec's drop-in for vLLM {release} does not implement group {i}'s bounded replay "
                f"({type(spec).__name__}(bounded_replay=True)): vLLM keeps such a group out of the prefix cache and "
                "recomputes a hit's last window")
        if not getattr(spec, "prefix_cacheable", True):
            raise NotImplementedError(
                f"kvspec's drop-in for vLLM {release} does not implement group {i}'s {type(spec).__name__}, a "
                "group outside prefix caching that vLLM serves with a block of its own per request")
        if spec_is(spec, MambaSpec) and getattr(spec, "num_prefill_checkpoint_blocks", 0):
            raise NotImplementedError(
                f"kvspec's drop-in for vLLM {release} does not implement Mamba prefill checkpoint blocks "
                f"(group {i}: num_prefill_checkpoint_blocks={spec.num_prefill_checkpoint_blocks})")


class KVCacheManager029(KVCacheManager028):
    """impl's manager with vLLM 0.29.0's API and deltas: the retention
    interval read from the KV-cache config (0 accepted on any model: delta
    retention-zero-anywhere), and boundary-state offloads -- every Mamba
    align state cached, with its block, for a KV connector -- in place of
    partial-tail ones."""

    release = "0.29.0"

    def __init__(self, kv_cache_config: Any, *args: Any, **kwargs: Any) -> None:
        refuse_new_state_029(kv_cache_config, self.release)
        super().__init__(kv_cache_config, *args, **kwargs)
        self._boundary_offers: dict[int, list[tuple[str, int, Any, int]]] = {}
        for group_id, manager in enumerate(self.coordinator.single_type_managers):
            if getattr(manager, "mamba_cache_mode", None) == "align":
                self._boundary_offers[group_id] = []
                manager.cache_blocks = self._offering_boundaries(manager, group_id, manager.cache_blocks)

    def _offering_boundaries(self, manager: Any, group_id: int, cache_blocks: Any) -> Any:
        """``manager.cache_blocks`` that also offers each Mamba state it
        newly caches (a hashed block; a null slot is no state) to a KV
        connector, with the token boundary the state ends at."""
        offers = self._boundary_offers[group_id]

        def cache_and_offer(request: Any, num_tokens: int, *args: Any, **kwargs: Any) -> None:
            before = manager.num_cached_block.get(request.request_id, 0)
            cache_blocks(request, num_tokens, *args, **kwargs)
            blocks = manager.req_to_blocks.get(request.request_id, ())
            for index in range(before, manager.num_cached_block.get(request.request_id, 0)):
                block = blocks[index]
                if not block.is_null and block.block_hash is not None:
                    offers.append((request.request_id, group_id, block, (index + 1) * manager.block_size))

        return cache_and_offer

    def _withdraw_offers(self, request_id: str) -> None:
        """A request's blocks go back to the pool: its offers not yet taken
        would name blocks another request may be handed next."""
        for offers in self._boundary_offers.values():
            offers[:] = [offer for offer in offers if offer[0] != request_id]

    def free(self, request: Any) -> None:
        self._withdraw_offers(request.request_id)
        super().free(request)

    def pop_blocks_for_free(self, request: Any) -> list[Any]:
        self._withdraw_offers(request.request_id)
        return super().pop_blocks_for_free(request)

    @staticmethod
    def retention_interval_of(kv_cache_config: Any) -> Any:
        """From 0.29 the KV-cache config carries the retention interval."""
        return getattr(kv_cache_config, "prefix_cache_retention_interval", None)

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        """The Mamba align states cached since the last call, for a KV
        connector to save: ``{request_id: [(group_id, block_id,
        boundary_tokens), ...]}``, group by group in the order cached (the
        scheduler drains it every step).  vLLM also offers the copy a hit
        inside a block makes; impl takes none (such models are refused)."""
        out: dict[str, list[tuple[int, int, int]]] = {}
        for offers in self._boundary_offers.values():
            for request_id, group_id, block, boundary in offers:
                out.setdefault(request_id, []).append((group_id, block.block_id, boundary))
            offers.clear()
        return out


class KVCacheManager030(KVCacheManager029):
    """impl's manager with vLLM 0.30.0's API and deltas: replays that a
    drafter moves a scheduler block lower (delta eagle-replay-boundaries),
    Mamba align states retired past null gaps (delta
    mamba-retire-across-gaps), ``session_id`` in Stored events (vLLM's
    event class has the field: :mod:`kvspec.impl.kv_events`), the Mamba
    fine-grained prefix cache flag, and the partial tails finalized for a
    KV producer at finish."""

    release = "0.30.0"

    def __init__(self, kv_cache_config: Any, *args: Any,
                 enable_mamba_fine_grained_prefix_cache: bool = False, **kwargs: Any) -> None:
        if not isinstance(enable_mamba_fine_grained_prefix_cache, bool):
            raise TypeError("enable_mamba_fine_grained_prefix_cache must be a bool, got "
                            f"{enable_mamba_fine_grained_prefix_cache!r}")
        super().__init__(kv_cache_config, *args, **kwargs)
        # vLLM's flag takes effect only with hits inside a block, which the drop-in refuses: it is always off.
        self.mamba_fine_grained_prefix_cache = False

    def finalize_partial_tail_offloads(self, request: Any) -> list[tuple[int, int, int]]:
        """The partial-tail states a KV producer saves when ``request``
        finishes, ``[(group_id, block_id, boundary_tokens)]``: none, since
        only hits inside a block make them (refused at construction)."""
        return []


def refuse_replicated_groups_under_dcp(kv_cache_config: Any, dcp_world_size: Any, release: str) -> None:
    """From 0.31 vLLM splits a group over the decode ranks when its spec
    says so (``KVCacheSpec.dcp_sharded``: every attention spec unless
    marked replicated, as a drafter's group may be), where impl splits full
    attention and keeps every other kind whole.  A model under decode ranks
    with a full-attention group marked replicated, or another kind marked
    sharded, would get other block sizes from impl: refused."""
    if type(dcp_world_size) is not int or dcp_world_size <= 1:
        return
    for i, group in enumerate(kv_cache_config.kv_cache_groups):
        spec = group.kv_cache_spec
        sharded = getattr(spec, "dcp_sharded", None)
        if sharded is not None and sharded != spec_is(spec, FullAttentionSpec):
            raise NotImplementedError(
                f"kvspec's drop-in for vLLM {release} splits only full attention over decode ranks; group {i}'s "
                f"{type(spec).__name__} has dcp_sharded={sharded} under {dcp_world_size} decode ranks")


class KVCacheManager031(KVCacheManager030):
    """impl's manager with vLLM 0.31.0's API and deltas: a call with no
    new tokens that adopts a hit (delta zero-token-hit-adoption), every
    image of a resumed block keyed (delta mm-keys-on-resume, in the
    hasher), the tagged extra keys (delta tagged-extra-keys, events kept
    bare), the Mamba flag renamed ``enable_mamba_shared_prefix_checkpoint``,
    and the coordinator's ``prefill_end``."""

    release = "0.31.0"

    def __init__(self, kv_cache_config: Any, *args: Any,
                 enable_mamba_shared_prefix_checkpoint: bool = False, **kwargs: Any) -> None:
        if "enable_mamba_fine_grained_prefix_cache" in kwargs:
            raise TypeError("enable_mamba_fine_grained_prefix_cache is vLLM 0.30's name; vLLM 0.31 calls it "
                            "enable_mamba_shared_prefix_checkpoint")
        if not isinstance(enable_mamba_shared_prefix_checkpoint, bool):
            raise TypeError("enable_mamba_shared_prefix_checkpoint must be a bool, got "
                            f"{enable_mamba_shared_prefix_checkpoint!r}")
        super().__init__(kv_cache_config, *args, **kwargs)
        del self.mamba_fine_grained_prefix_cache  # 0.30's name
        # Like 0.30's flag, it takes effect only with Mamba prefill checkpoint blocks (refused): always off.
        self.mamba_shared_prefix_checkpoint = False

    def refuse_model(self, kv_cache_config: Any, hash_block_size: int, dcp_world_size: int) -> None:
        super().refuse_model(kv_cache_config, hash_block_size, dcp_world_size)
        refuse_replicated_groups_under_dcp(kv_cache_config, dcp_world_size, self.release)


class Removed:
    """A method a release removed from a class: the drop-in's class lacks it
    too (``hasattr`` answers False, a call is vLLM's ``AttributeError``)."""

    def __init__(self, since: str) -> None:
        self.since = since

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        raise AttributeError(f"{self.name} is gone from vLLM's KVCacheManager since {self.since}")


class KVCacheManager032(KVCacheManager031):
    """impl's manager with vLLM 0.32.0's API and deltas: a connector's
    loaded groups' external blocks left out of zeroing
    (``allocate_slots(skip_zeroing_group_ids=...)``), no common-prefix
    question (zeros), the coordinator's cacheable-token count."""

    release = "0.32.0"
    get_zeroing_block_ids_in_range = Removed("0.32")

    def __init__(self, kv_cache_config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(kv_cache_config, *args, **kwargs)
        # vLLM 0.32's name for what a group caches of a request's computed tokens (a CPU-offload connector asks).
        self.coordinator.get_num_cacheable_tokens = self.coordinator.num_cacheable_tokens

    def allocate_slots(self, request: Any, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: Any = None, num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0, delay_cache_blocks: bool = False,
                       num_encoder_tokens: int = 0, full_sequence_must_fit: bool = False, reserved_blocks: int = 0,
                       has_scheduled_reqs: bool = True, skip_zeroing_group_ids: Any = ()) -> Any:
        """As impl's, and the blocks taken for the connector's external
        tokens in ``skip_zeroing_group_ids`` (the groups it loads) are not
        named for zeroing: their KV arrives whole."""
        if skip_zeroing_group_ids.__class__ is tuple and not skip_zeroing_group_ids:  # the default (a decode step)
            return super().allocate_slots(request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
                                          num_lookahead_tokens, num_external_computed_tokens, delay_cache_blocks,
                                          num_encoder_tokens, full_sequence_must_fit, reserved_blocks,
                                          has_scheduled_reqs)
        if not isinstance(skip_zeroing_group_ids, tuple | list) or any(
                type(g) is not int or not 0 <= g < self.num_kv_cache_groups for g in skip_zeroing_group_ids):
            raise TypeError(f"skip_zeroing_group_ids must be a tuple of group ids below {self.num_kv_cache_groups}, "
                            f"got {skip_zeroing_group_ids!r}")
        managers = self.coordinator.single_type_managers
        skipped = [g for g in skip_zeroing_group_ids if managers[g].records_new_block_ids] \
            if num_external_computed_tokens and not self.coordinator.is_running(request.request_id) else []
        recorded = {g: len(managers[g].new_block_ids) for g in skipped}
        new = super().allocate_slots(request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
                                     num_lookahead_tokens, num_external_computed_tokens, delay_cache_blocks,
                                     num_encoder_tokens, full_sequence_must_fit, reserved_blocks, has_scheduled_reqs)
        if new is not None:
            local = request.num_computed_tokens + num_new_computed_tokens
            for g in skipped:
                manager = managers[g]
                table = manager.req_to_blocks.get(request.request_id, [])
                first = len(new_computed_blocks.blocks[g]) if new_computed_blocks is not None else 0
                end = -(-(local + num_external_computed_tokens) // manager.block_size)
                external = {block.block_id for block in table[first:end]}
                ids = manager.new_block_ids
                ids[recorded[g]:] = [i for i in ids[recorded[g]:] if i not in external]
        return new

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        """Cascade attention's question, which 0.32's scheduler no longer
        asks: zeros, for any request."""
        return [0] * self.num_kv_cache_groups


class KVCacheManager033(KVCacheManager032):
    """impl's manager with vLLM 0.33.0's API and deltas: hashes that cover
    the drafter's lookahead tokens (``num_hash_lookahead_tokens``, delta
    lookahead-block-hashes: only hashed blocks cached, Stored events with
    the lookahead tokens), a bound on the hit (``max_cache_hit_length``),
    marked drafter groups dropping nothing without ``use_eagle`` (delta
    eagle-drop-needs-use-eagle), the junction's peek under retention
    (delta eagle-junction-peek), and Mamba's boundary state re-marked only
    where its key was evicted while held (delta mamba-boundary-remark-fixed)."""

    release = "0.33.0"

    def __init__(
        self,
        kv_cache_config: Any,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        max_in_flight_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        num_hash_lookahead_tokens: int = 0,
        num_prefill_lookahead: int = 0,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: Any = None,
        watermark: float = 0.0,
        enable_mamba_shared_prefix_checkpoint: bool = False,
    ) -> None:
        super().__init__(
            kv_cache_config, max_model_len, scheduler_block_size, hash_block_size,
            max_in_flight_tokens=max_in_flight_tokens, enable_caching=enable_caching, use_eagle=use_eagle,
            num_prefill_lookahead=num_prefill_lookahead, log_stats=log_stats,
            enable_kv_cache_events=enable_kv_cache_events, dcp_world_size=dcp_world_size,
            pcp_world_size=pcp_world_size, metrics_collector=metrics_collector, watermark=watermark,
            enable_mamba_shared_prefix_checkpoint=enable_mamba_shared_prefix_checkpoint,
            num_hash_lookahead_tokens=num_hash_lookahead_tokens,
        )

    def get_computed_blocks(self, request: Any, max_cache_hit_length: int | None = None) -> tuple[Any, int, int]:
        """The hit, at most ``max_cache_hit_length`` tokens (default: all
        but the last token, which is computed for its logits)."""
        return self._bounded_computed_blocks(request, self._hit_bound(request, max_cache_hit_length))

    def get_computed_blocks_for_connector(self, request: Any,
                                          max_cache_hit_length: int | None = None) -> tuple[Any, int, int, bool]:
        """The connector's lookup, its hits at most ``max_cache_hit_length`` tokens."""
        return self._bounded_connector_lookup(request, self._hit_bound(request, max_cache_hit_length))

    def _hit_bound(self, request: Any, max_cache_hit_length: Any) -> int:
        """The bound a lookup takes: ``num_tokens - 1`` unless a lower one is given."""
        most = request.num_tokens - 1
        if max_cache_hit_length is None:
            return most
        if type(max_cache_hit_length) is not int or not 0 <= max_cache_hit_length <= most:
            raise ValueError(f"max_cache_hit_length must be an int in [0, {most}] (the request's tokens less the "
                             f"one computed for its logits), got {max_cache_hit_length!r} (rule hit-soundness)")
        return max_cache_hit_length


class KVCacheManager034(KVCacheManager033):
    """impl's manager with vLLM 0.34.0's API: a request's hit bounded by its
    own limit (``Request.prefix_cache_hit_limit``, which replaced
    ``skip_reading_prefix_cache``: 0 reads no cache, a prompt-logprobs
    request reads up to its first scored position), the probe
    ``get_num_cached_tokens``, cascade attention's question gone (delta
    common-prefix-blocks-removed); the pool's ``free_blocks(evict_first=...)``
    and its hash map built over the pool's blocks (:func:`pool_for`)."""

    release = "0.34.0"
    get_num_common_prefix_blocks = Removed("0.34")

    def _reads_prefix_cache(self, request: Any) -> bool:
        """A limit of 0 reads nothing (0.34's request says ``skip`` so)."""
        return self.enable_caching and request.prefix_cache_hit_limit != 0

    def _hit_bound(self, request: Any, max_cache_hit_length: Any) -> int:
        """The bound a lookup takes: the request's own (``num_tokens - 1``,
        and its hit limit), tightened by the one given -- which from 0.34
        can only tighten it: a larger one is no error."""
        if max_cache_hit_length is not None and (type(max_cache_hit_length) is not int or max_cache_hit_length < 0):
            raise ValueError(f"max_cache_hit_length must be an int >= 0, got {max_cache_hit_length!r} "
                             "(rule hit-soundness)")
        return request.get_max_cache_hit_length(max_cache_hit_length)

    def get_num_cached_tokens(self, request: Any) -> int:
        """How many of the request's tokens the prefix cache holds (all but
        its last at most): a probe that takes no reference, allocates nothing
        and announces nothing -- the scheduler asks it of requests it may
        not admit.  0 when the request reads no cache."""
        if not self._reads_prefix_cache(request):
            return 0
        return self.coordinator.find_longest_cache_hit(request.block_hashes, request.num_tokens - 1)[1]


class BlockHashToBlockMap034(BlockHashToBlockMap):
    """impl's hash map as 0.34 builds it: over the pool's blocks (impl's
    map holds the blocks themselves, so it needs no list of them)."""

    __slots__ = ()

    def __init__(self, blocks: Any = None) -> None:
        super().__init__()


def shapes_from_028(manager: type[KVCacheManager], release: str) -> dict[str, dict[str, Any]]:
    """The names a release from 0.28 on presents differently: its manager,
    its pool (from 0.34 its hash map too), and ``need_extra_keys`` gone
    (dead code, removed in 0.28)."""
    pool = {"BlockPool": pool_for(release)}
    if releases.version_key(release) >= (0, 34):
        pool["BlockHashToBlockMap"] = BlockHashToBlockMap034
    return {"vllm.v1.core.kv_cache_manager": {"KVCacheManager": manager},
            "vllm.v1.core.block_pool": pool,
            "vllm.v1.core.kv_cache_utils": {"need_extra_keys": GONE}}


API: dict[str, dict[str, dict[str, Any]]] = {
    "0.25.1": {},
    "0.26.0": {"vllm.v1.core.kv_cache_manager": {"KVCacheManager": KVCacheManager026}},
    "0.27.0": {"vllm.v1.core.kv_cache_manager": {"KVCacheManager": KVCacheManager027},
               "vllm.v1.core.block_pool": {"BlockPool": pool_for("0.27.0")}},
    "0.27.1": {},  # below: a patch release whose vllm/v1/core and tests/v1/core are 0.27.0's, byte for byte
    **{manager.release: shapes_from_028(manager, manager.release)
       for manager in (KVCacheManager028, KVCacheManager029, KVCacheManager030, KVCacheManager031, KVCacheManager032,
                       KVCacheManager033, KVCacheManager034)},
}
"""release -> vLLM module -> the names whose release shape differs from impl's
(:data:`GONE`: a name the release removed)."""
API["0.27.1"] = API["0.27.0"]
