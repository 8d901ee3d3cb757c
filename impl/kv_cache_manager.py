"""The scheduler's view of the KV cache: vLLM 0.25.1's ``KVCacheManager``.

The scheduler asks for a request's prefix-cache hit
(``get_computed_blocks``), then for slots for the tokens it schedules
(``allocate_slots``), and frees the request when it finishes or is
preempted.  Blocks are handed back as :class:`KVCacheBlocks`, one list per
KV-cache group.

**A refused allocation changes nothing, except that the request's blocks
that left the attention window are released first** (as
``remove_skipped_blocks`` would), whether or not the allocation then fits.
This is vLLM's order: ``allocate_slots`` calls ``remove_skipped_blocks``
after the ``full_sequence_must_fit`` gate (a refusal there changes nothing)
and *before* its capacity check -- "We can do this even if we cannot
schedule this request due to insufficient free blocks".  The request never
reads those blocks again, so releasing them loses nothing and lets other
requests use them; the capacity check then sees them as free.  Every
result, refusal included, is identical to vLLM's, block ids included.

Three deliberate differences from vLLM, where vLLM breaks a rule (see
``docs/rules.md``).  Two are in the hit (``get_computed_blocks``, through the
coordinator, :mod:`.kv_cache_coordinator`): every group's blocks cover
exactly the hit -- vLLM cuts only the first full-attention spec group to the
final length, so with two full-attention specs and connector tokens it calls
``get_new_blocks(-1)`` -- and a Mamba group is never an EAGLE group (vLLM's
hit can then outrun the full-attention blocks).  The third is about refusing
cleanly:

**No half-done allocation where vLLM's estimate falls short.**  Mamba's
align mode estimates ``1 + num_speculative_blocks`` blocks for a new
request, but for connector (external) tokens the request also takes a block
per slot up to ``total`` (``allocate_external_computed_blocks``), and a
running request's estimate goes negative when rejected drafts left its table
long, offsetting other groups' needs.  vLLM then accepts, and its
``get_new_blocks`` raises ``ValueError`` halfway through, leaving the request
partly allocated.  kvspec keeps vLLM's estimate for every decision
(``get_num_blocks_to_allocate`` returns vLLM's value) and, for Mamba align
groups, also checks the exact count (``blocks_beyond_estimate``): where vLLM
would raise, it returns ``None`` having changed nothing but the
out-of-window release above (which vLLM has also done by then); everywhere
else it behaves as vLLM.

Bad arguments raise :class:`~kvspec.errors.RuleError` /
:class:`~kvspec.errors.RuleTypeError` before anything changes.
"""

from __future__ import annotations

import itertools
import logging
import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

from kvspec.errors import RuleError, RuleTypeError, require_int
from kvspec.hashing import block_hashes_for_size, make_block_hash_with_group_id
from kvspec.impl import kv_events
from kvspec.impl.block_pool import BlockPool
from kvspec.impl.kv_cache_coordinator import RETENTION_FROM_ENV, KVCacheCoordinator, get_kv_cache_coordinator
from kvspec.impl.kv_cache_utils import KVCacheBlock
from kvspec.impl.kv_events import KVCacheEvent
from kvspec.kv_cache_interface import (
    AttentionSpec,
    CrossAttentionSpec,
    KVCacheConfig,
    cdiv,
    event_metadata,
    spec_is,
)
from kvspec.request import RequestStatus

logger = logging.getLogger(__name__)

_ADMISSION_STATUSES = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
_ZERO = 0
_COUNT_NAMES = ("num_new_tokens", "num_new_computed_tokens", "num_lookahead_tokens", "num_external_computed_tokens",
                "num_encoder_tokens", "reserved_blocks")
_FLAG_NAMES = ("delay_cache_blocks", "full_sequence_must_fit", "has_scheduled_reqs")


@dataclass
class PrefixCacheStats:
    """Prefix-cache hit counts since the last ``make_prefix_cache_stats``.

    ``queries``/``hits`` are tokens; preempted requests (recomputing) are
    counted apart.  ``reset``: ``reset_prefix_cache`` succeeded meanwhile."""

    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits


@dataclass
class KVCacheBlocks:
    """Blocks handed to the scheduler: ``blocks[g]`` are group ``g``'s, in
    token order (an empty tuple for a group without any)."""

    blocks: tuple[Sequence[KVCacheBlock], ...]

    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks:
        return KVCacheBlocks(
            tuple(list(itertools.chain(mine, theirs)) for mine, theirs in zip(self.blocks, other.blocks, strict=True))
        )

    @overload
    def get_block_ids(
        self, allow_none: Literal[False] = False, *, group_ids: Sequence[int] | None = None
    ) -> tuple[list[int], ...]: ...

    @overload
    def get_block_ids(
        self, allow_none: Literal[True] = True, *, group_ids: Sequence[int] | None = None
    ) -> tuple[list[int], ...] | None: ...

    def get_block_ids(
        self, allow_none: bool = False, *, group_ids: Sequence[int] | None = None
    ) -> tuple[list[int], ...] | None:
        """Block ids per group -- of ``group_ids`` only, in that order, when
        given (vLLM's call from 0.30); with ``allow_none``, ``None`` when
        those groups have none."""
        groups = self.blocks if group_ids is None else tuple(self.blocks[g] for g in group_ids)
        if allow_none and not any(groups):
            return None
        return tuple([block.block_id for block in group] for group in groups)

    def get_unhashed_block_ids(self) -> list[int]:
        """Ids of the (single) group's blocks that are not cached."""
        if len(self.blocks) != 1:
            raise RuleError("block-size-coherence", f"get_unhashed_block_ids needs one group, got {len(self.blocks)}")
        return [block.block_id for block in self.blocks[0] if block.block_hash is None]

    def get_unhashed_block_ids_all_groups(self) -> list[list[int]]:
        """Per group, ids of blocks that are not cached (null blocks skipped)."""
        return [
            [block.block_id for block in group if block.block_hash is None and not block.is_null]
            for group in self.blocks
        ]

    def new_empty(self) -> KVCacheBlocks:
        return KVCacheBlocks(tuple(() for _ in self.blocks))


def _counts_ok(a: Any, b: Any, c: Any, d: Any, e: Any, f: Any) -> bool:
    """All plain ints >= 0 (the fast path; ``_require_count`` explains
    failures, so both test the type the same way)."""
    return type(a) is type(b) is type(c) is type(d) is type(e) is type(f) is int and min(a, b, c, d, e, f) >= 0


def _all_pool_blocks(blocks: Sequence[Any], pool_blocks: list[KVCacheBlock]) -> bool:
    """Whether every one of ``blocks`` is the pool's block of its id (the
    whole list at C speed: a hit can be hundreds of blocks)."""
    try:
        ids = [block.block_id for block in blocks]
        return not ids or (min(ids) >= 0 and all(map(operator.is_, map(pool_blocks.__getitem__, ids), blocks)))
    except (AttributeError, IndexError, TypeError):
        return False


def _require_count(name: str, value: Any) -> None:
    require_int("allocation-accounting", name, value)


def _require_flag(name: str, value: Any) -> None:
    if type(value) is not bool:
        raise RuleTypeError("allocation-accounting", f"{name} must be a bool, got {value!r}")


class KVCacheManager:
    """Blocks for every request over all KV-cache groups (vLLM's API).

    ``retention_interval`` (keyword-only, kvspec's addition): sparse
    checkpoint interval for sliding-window and Mamba groups; default: read
    ``$VLLM_PREFIX_CACHE_RETENTION_INTERVAL`` like vLLM.
    ``num_hash_lookahead_tokens`` (keyword-only; vLLM 0.33's argument,
    release delta ``lookahead-block-hashes``): the tokens past each block
    its hash covers -- only blocks the request has hashes for are cached,
    and Stored events carry those tokens.
    """

    trusts_scheduler: bool = False
    """Whether this manager and its pool take the caller's word for what a
    block holds (:attr:`kvspec.impl.block_pool.BlockPool.trusts_scheduler`)."""

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        max_num_batched_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: Any = None,
        watermark: float = 0.0,
        *,
        retention_interval: int | None = RETENTION_FROM_ENV,
        deltas: Iterable[str] | None = None,
        num_hash_lookahead_tokens: int = 0,
    ) -> None:
        require_int("block-size-coherence", "max_model_len", max_model_len, 1)
        for name, flag in (("enable_caching", enable_caching), ("use_eagle", use_eagle),
                           ("enable_kv_cache_events", enable_kv_cache_events)):
            _require_flag(name, flag)
        if max_num_batched_tokens is None:
            # Without it the admission cap is no tighter than max_model_len.
            max_num_batched_tokens = max_model_len
        require_int("block-size-coherence", "max_num_batched_tokens", max_num_batched_tokens)
        if not isinstance(watermark, (int, float)) or isinstance(watermark, bool) or not 0.0 <= watermark < math.inf:
            raise RuleError("allocation-accounting", f"watermark must be a finite number >= 0, got {watermark!r}")
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.use_eagle = use_eagle
        self.log_stats = log_stats
        self.metrics_collector = metrics_collector
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.coordinator: KVCacheCoordinator = get_kv_cache_coordinator(
            kv_cache_config=kv_cache_config,
            max_model_len=max_model_len,
            max_num_batched_tokens=max_num_batched_tokens,
            use_eagle=use_eagle,
            enable_caching=enable_caching,
            enable_kv_cache_events=enable_kv_cache_events,
            dcp_world_size=dcp_world_size,
            pcp_world_size=pcp_world_size,
            scheduler_block_size=scheduler_block_size,
            hash_block_size=hash_block_size,
            metrics_collector=metrics_collector,
            retention_interval=retention_interval,
            deltas=deltas,
            num_hash_lookahead_tokens=num_hash_lookahead_tokens,
        )
        self.deltas = self.coordinator.deltas
        # From 0.27 (release delta stats-at-admission) a lookup counts nothing: the scheduler records an admission.
        self._stats_at_admission = "stats-at-admission" in self.deltas
        # From 0.26 (release delta processed-token-windows) blocks leave the window on the processed-token basis:
        # a step still in the forward pass (async scheduling) reads blocks below its request's computed tokens.
        self._windows_exclude_in_flight = "processed-token-windows" in self.deltas
        # From 0.31 (release delta zero-token-hit-adoption) a call with no new or external tokens may adopt a hit.
        self._adopts_zero_token_hits = "zero-token-hit-adoption" in self.deltas
        # From 0.33 (release delta lookahead-block-hashes) a block is cached once the request has its hash.
        self._caches_hashed_blocks_only = "lookahead-block-hashes" in self.deltas
        self.kv_cache_config = kv_cache_config
        self.num_kv_cache_groups = len(kv_cache_config.kv_cache_groups)
        self.block_pool: BlockPool = self.coordinator.block_pool
        if self.trusts_scheduler:  # the pool built for it trusts as it does
            self.block_pool.trusts_scheduler = True
        # Blocks kept free when admitting waiting/preempted requests, against thrashing.
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
        self.kv_cache_event_metadata = tuple(event_metadata(g.kv_cache_spec) for g in kv_cache_config.kv_cache_groups)
        # Shared and immutable: "no blocks" without allocating.
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple(() for _ in range(self.num_kv_cache_groups)))
        # request id -> the coordinator's steady_limits after its last allocation
        # (running requests only): the decode fast path in allocate_slots.
        self._steady: dict[str, tuple[float, float, float]] = {}

    @property
    def usage(self) -> float:
        """Fraction of the pool (null block excluded) in use."""
        return self.block_pool.get_usage()

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """The stats since the last call (then reset); ``None`` without ``log_stats``."""
        if not self.log_stats:
            return None
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    # --- hits ----------------------------------------------------------------------------

    def get_computed_blocks(self, request: Any) -> tuple[KVCacheBlocks, int]:
        """The request's longest prefix-cache hit: blocks and length in tokens.

        At most ``num_tokens - 1`` tokens: the last token is always
        recomputed for its logits (which may cost a whole block)."""
        return self._computed_blocks(request)

    def _computed_blocks(self, request: Any, max_cache_hit_length: int | None = None) -> tuple[KVCacheBlocks, int]:
        """:meth:`get_computed_blocks` with the hit bounded by
        ``max_cache_hit_length`` tokens (default ``num_tokens - 1``; vLLM
        0.33's callers may bound it lower: the drop-in presents that argument)."""
        if not self._reads_prefix_cache(request):
            return self.empty_kv_cache_blocks, 0
        if max_cache_hit_length is None:
            max_cache_hit_length = request.num_tokens - 1
        blocks, num_hit = self.coordinator.find_longest_cache_hit(request.block_hashes, max_cache_hit_length)
        if self.prefix_cache_stats is not None and not self._stats_at_admission:
            self.prefix_cache_stats.record(
                num_tokens=request.num_tokens, num_hits=num_hit, preempted=request.num_preemptions > 0
            )
        return self.create_kv_cache_blocks(blocks), num_hit

    def _reads_prefix_cache(self, request: Any) -> bool:
        """Whether a lookup for ``request`` reads the prefix cache: caching
        is on and the request does not skip it (the drop-in for vLLM 0.34
        asks the request's hit limit instead)."""
        return self.enable_caching and not request.skip_reading_prefix_cache

    def record_prefix_cache_stats(self, request: Any, num_hits: int) -> None:
        """Count an admitted request's lookup: its tokens as queries,
        ``num_hits`` as hits (what the scheduler calls once it admits a
        request, from 0.27: release delta ``stats-at-admission``).  Nothing
        without stats, with caching off, or for a request that skips reading
        the cache.  A manager of an earlier release has no such call."""
        if not self._stats_at_admission:
            raise TypeError("record_prefix_cache_stats is the scheduler's call from vLLM 0.27 (release delta "
                            "stats-at-admission), which this manager was not built to follow")
        _require_count("num_hits", num_hits)
        if self.prefix_cache_stats is None or not self._reads_prefix_cache(request):
            return
        self.prefix_cache_stats.record(
            num_tokens=request.num_tokens, num_hits=num_hits, preempted=request.num_preemptions > 0
        )

    # --- allocation --------------------------------------------------------------------------

    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
    ) -> KVCacheBlocks | None:
        """Slots for ``num_new_tokens`` more tokens (plus lookahead), after
        taking the new prefix hit and the connector's external tokens.

        Token layout: ``| computed | new hit | external | new | lookahead |``.
        Returns the newly allocated blocks, or ``None`` when the pool cannot
        supply them while keeping ``reserved_blocks`` (and, for a waiting or
        preempted request while others are scheduled, the watermark) free.
        With ``full_sequence_must_fit`` the whole request must fit first
        (refused there: nothing changes).  Past that gate, the request's
        out-of-window blocks are released before the capacity check, so a
        refusal leaves them released and nothing else changed.  Full blocks
        are cached unless ``delay_cache_blocks`` (a connector is still
        loading them); draft tokens never are."""
        # The decode fast path.  Most calls are a running request's next
        # token(s) with room left in every group's last block, no block
        # filling up to be cached and none leaving the window: nothing changes
        # and no blocks are new.  The limits (coordinator.steady_limits) say
        # when that stops.  `plain` also stands for the argument checks below;
        # its `is _ZERO` tests admit exactly the int 0 those checks accept
        # (CPython shares small ints), so a False or 0.0 still goes there.
        plain = (
            new_computed_blocks is None
            and num_new_computed_tokens is _ZERO
            and num_external_computed_tokens is _ZERO
            and num_encoder_tokens is _ZERO
            and reserved_blocks is _ZERO
            and full_sequence_must_fit is False
            and delay_cache_blocks.__class__ is bool
            and has_scheduled_reqs.__class__ is bool
            and num_new_tokens.__class__ is int
            and num_lookahead_tokens.__class__ is int
            and num_new_tokens > 0
            and num_lookahead_tokens >= 0
        )
        steady = self._steady.get(request.request_id)
        if plain and steady is not None:
            computed = request.num_computed_tokens
            committed = computed + num_new_tokens
            if (
                committed + num_lookahead_tokens <= steady[0]
                and (committed < steady[1] or request.num_tokens < steady[1])
                and computed < steady[2]
                and (not self.watermark_blocks or not has_scheduled_reqs
                     or request.status not in _ADMISSION_STATUSES)
            ):
                return self.empty_kv_cache_blocks
        if steady is not None:
            del self._steady[request.request_id]  # recomputed once this call is done
        no_hits = self.empty_kv_cache_blocks.blocks
        hits = no_hits if new_computed_blocks is None else new_computed_blocks.blocks
        if not plain and not (
            _counts_ok(num_new_tokens, num_new_computed_tokens, num_lookahead_tokens, num_external_computed_tokens,
                       num_encoder_tokens, reserved_blocks)
            and type(delay_cache_blocks) is type(full_sequence_must_fit) is type(has_scheduled_reqs) is bool
            and (num_new_tokens or num_external_computed_tokens
                 or (self._adopts_zero_token_hits and num_new_computed_tokens))
            and (hits is no_hits or len(hits) == self.num_kv_cache_groups)
        ):
            self._explain_refusal(request, num_new_tokens, num_new_computed_tokens, num_lookahead_tokens,
                                  num_external_computed_tokens, num_encoder_tokens, reserved_blocks,
                                  (delay_cache_blocks, full_sequence_must_fit, has_scheduled_reqs), hits)
        if hits is not no_hits and any(hits):
            self._check_hits(request, hits)
        coordinator = self.coordinator
        request_id = request.request_id
        num_local_computed, total_computed, num_tokens_main_model, num_tokens_need_slot = self._token_counts(
            request, num_new_tokens, num_new_computed_tokens, num_lookahead_tokens, num_external_computed_tokens
        )
        if num_local_computed + num_external_computed_tokens + num_new_tokens > self.max_model_len:
            raise RuleError("allocation-accounting", f"request {request_id} would compute "
                            f"{num_local_computed + num_external_computed_tokens + num_new_tokens} tokens, past "
                            f"max_model_len {self.max_model_len}")
        watermark = self.watermark_blocks if has_scheduled_reqs and request.status in _ADMISSION_STATUSES else 0
        num_free = self.block_pool.get_num_free_blocks()
        if full_sequence_must_fit and not self._full_sequence_fits(
            request, hits, num_encoder_tokens, total_computed, num_free - watermark
        ):
            return None
        # As vLLM: release the out-of-window blocks before the capacity check,
        # even if it refuses (the request never reads them again).
        num_prompt_tokens = request.num_prompt_tokens  # R-SWA's gap ends after the prompt
        processed = self._processed_tokens(request, total_computed)
        skipped = (
            coordinator.skipped_block_plan(request_id, processed, num_prompt_tokens)
            if coordinator.releasing_managers else ()
        )
        if skipped:
            coordinator.release_skipped_blocks(request_id, skipped)
            num_free = self.block_pool.get_num_free_blocks()
        adds_computed = hits is not no_hits or num_external_computed_tokens > 0
        needed, beyond = self._blocks_needed(
            request_id, hits, adds_computed, num_local_computed, num_external_computed_tokens, num_encoder_tokens,
            num_tokens_need_slot, num_tokens_main_model,
        )
        if needed + watermark > num_free - reserved_blocks:
            return None
        if num_free < needed + beyond:
            # vLLM's estimate fell short (Mamba align); vLLM would fail half-allocated.
            return None
        if adds_computed:
            coordinator.allocate_new_computed_blocks(
                request_id, hits, num_local_computed, num_external_computed_tokens
            )
        new_blocks = coordinator.allocate_new_blocks(
            request_id, num_tokens_need_slot, num_tokens_main_model, num_encoder_tokens
        )
        if self.enable_caching and not delay_cache_blocks:
            # Only committed tokens: drafts beyond num_tokens may be rejected.
            coordinator.cache_blocks(request, min(total_computed + num_new_tokens, request.num_tokens))
        # Limits from the processed tokens: a release they hold back comes before the next computed one.
        slots, full, skip = coordinator.steady_limits(request_id, processed, num_prompt_tokens)
        # Never past max_model_len on the fast path either (a block may hold slots beyond it).
        self._steady[request_id] = (min(slots, self.max_model_len), full, skip)
        return self.create_kv_cache_blocks(new_blocks)

    def _processed_tokens(self, request: Any, total_computed: int) -> int:
        """The computed tokens whose step has come back from the forward pass
        (from 0.26; before, all of them): what leaving a window is counted
        on.  A request of vLLM's says how many are in flight."""
        if not self._windows_exclude_in_flight:
            return total_computed
        return max(0, total_computed - getattr(request, "num_in_flight_tokens", 0))

    def _token_counts(
        self, request: Any, num_new_tokens: int, num_new_computed_tokens: int, num_lookahead_tokens: int,
        num_external_computed_tokens: int,
    ) -> tuple[int, int, int, int]:
        """The token counts an allocation works with: the locally computed
        tokens (with the new hit), all computed tokens (with the connector's),
        the main model's tokens after this step, and the tokens that need a
        slot (with lookahead) -- the last three capped at ``max_model_len``
        as vLLM caps them."""
        num_local_computed = request.num_computed_tokens + num_new_computed_tokens
        total_computed = min(num_local_computed + num_external_computed_tokens, self.max_model_len)
        num_tokens_main_model = total_computed + num_new_tokens
        num_tokens_need_slot = min(num_tokens_main_model + num_lookahead_tokens, self.max_model_len)
        return num_local_computed, total_computed, num_tokens_main_model, num_tokens_need_slot

    def _blocks_needed(
        self, request_id: str, hits: tuple[Sequence[KVCacheBlock], ...], adds_computed: bool,
        num_local_computed: int, num_external_computed_tokens: int, num_encoder_tokens: int,
        num_tokens_need_slot: int, num_tokens_main_model: int,
    ) -> tuple[int, int]:
        """The capacity check's numbers: vLLM's estimate of the free blocks the
        allocation takes (what the check compares, as vLLM does) and the blocks
        it really takes beyond that (Mamba align only; 0 elsewhere)."""
        coordinator = self.coordinator
        estimates = coordinator.blocks_to_allocate_per_group(
            request_id, num_tokens_need_slot, hits, num_encoder_tokens,
            num_local_computed + num_external_computed_tokens, num_tokens_main_model,
        )
        beyond = coordinator.blocks_beyond_estimate(
            estimates, request_id, hits, num_local_computed, num_external_computed_tokens, num_tokens_need_slot,
            num_tokens_main_model, adds_computed,
        ) if coordinator.inexact_group_ids else 0
        return sum(estimates), beyond

    def get_num_blocks_to_allocate(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        num_encoder_tokens: int = 0,
    ) -> int:
        """(A query; the spec's ``get_num_blocks_to_allocate``.)  The free
        blocks ``allocate_slots`` with these arguments takes, exactly -- where
        the coordinator's method of that name is vLLM's estimate, which falls
        short in Mamba align mode with connector tokens (F5).  Asked before the
        call; the out-of-window release the call makes first does not change it."""
        no_hits = self.empty_kv_cache_blocks.blocks
        hits = no_hits if new_computed_blocks is None else new_computed_blocks.blocks
        num_local_computed, _, num_tokens_main_model, num_tokens_need_slot = self._token_counts(
            request, num_new_tokens, num_new_computed_tokens, num_lookahead_tokens, num_external_computed_tokens
        )
        needed, beyond = self._blocks_needed(
            request.request_id, hits, hits is not no_hits or num_external_computed_tokens > 0,
            num_local_computed, num_external_computed_tokens, num_encoder_tokens,
            num_tokens_need_slot, num_tokens_main_model,
        )
        return needed + beyond

    def _full_sequence_fits(
        self, request: Any, hits: tuple, num_encoder_tokens: int, total_computed: int, num_free: int
    ) -> bool:
        """The admission gate: could the pool hold the whole request (out-of-window
        blocks excluded, as they are released along the way)?  Checked before
        anything changes: a refusal here releases nothing."""
        full_num_tokens = min(request.num_tokens, self.max_model_len)
        needed = self.coordinator.get_num_blocks_to_allocate(
            request.request_id, full_num_tokens, hits, num_encoder_tokens, total_computed, full_num_tokens,
            apply_admission_cap=True,
        )
        return needed <= num_free

    def _explain_refusal(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int,
        num_lookahead_tokens: int,
        num_external_computed_tokens: int,
        num_encoder_tokens: int,
        reserved_blocks: int,
        flags: tuple[Any, Any, Any],
        hits: tuple[Sequence[KVCacheBlock], ...],
    ) -> None:
        """Raise the error for arguments the fast check in ``allocate_slots`` rejected."""
        counts = (num_new_tokens, num_new_computed_tokens, num_lookahead_tokens, num_external_computed_tokens,
                  num_encoder_tokens, reserved_blocks)
        for name, value in zip(_COUNT_NAMES, counts, strict=True):
            _require_count(name, value)
        for name, value in zip(_FLAG_NAMES, flags, strict=True):
            _require_flag(name, value)
        if num_new_tokens == 0 and num_external_computed_tokens == 0 and not (
                self._adopts_zero_token_hits and num_new_computed_tokens):
            raise RuleError(
                "allocation-accounting",
                f"request {request.request_id!r}: num_new_tokens must be > 0 when there are no external tokens"
                + (" and no hit to adopt" if self._adopts_zero_token_hits else ""),
            )
        raise RuleError(
            "hit-soundness",
            f"new_computed_blocks has {len(hits)} groups, the model has {self.num_kv_cache_groups}",
        )

    def _check_hits(self, request: Any, hits: tuple[Sequence[KVCacheBlock], ...]) -> None:
        """Hits are this pool's blocks, for a request that holds nothing yet,
        with caching on, never for cross attention, and each still cached
        under the request's hash for its position and group (unless the
        manager :attr:`trusts_scheduler`)."""
        request_id = request.request_id
        managers = self.coordinator.single_type_managers
        if self.coordinator.is_running(request_id) or any(m.req_to_blocks.get(request_id) for m in managers):
            raise RuleError("hit-soundness", f"request {request_id!r} already holds blocks; it takes no new hits")
        pool_blocks = self.block_pool.blocks
        for i, (group, blocks) in enumerate(zip(self.kv_cache_config.kv_cache_groups, hits, strict=True)):
            if blocks and spec_is(group.kv_cache_spec, CrossAttentionSpec):
                raise RuleError("hit-soundness", f"group {i} is cross attention: it has no prefix-cache hits")
            if _all_pool_blocks(blocks, pool_blocks):
                continue
            for block in blocks:  # name the first stranger
                block_id = getattr(block, "block_id", None)
                ours = type(block_id) is int and 0 <= block_id < len(pool_blocks) and pool_blocks[block_id] is block
                if not ours:
                    raise RuleTypeError("hit-soundness", f"group {i}: {block!r} is not a block of this pool")
        if not self.enable_caching:
            raise RuleError("hit-soundness", "prefix caching is off: there are no hits")
        if not self.trusts_scheduler:
            self._check_hits_cached(request, hits)

    def _check_hits_cached(self, request: Any, hits: tuple[Sequence[KVCacheBlock], ...]) -> None:
        """Every hit block is still cached under the request's hash for its
        position and group (rule content-soundness): otherwise the request
        would read another prefix's KV as its own."""
        request_id = request.request_id
        pool = self.block_pool
        for i, (manager, blocks) in enumerate(zip(self.coordinator.single_type_managers, hits, strict=True)):
            hashes = block_hashes_for_size(request.block_hashes, pool.hash_block_size, manager.block_size)
            for position, block in enumerate(blocks):
                if block.is_null:
                    continue
                if position >= len(hashes) or block._block_hash != make_block_hash_with_group_id(hashes[position], i):
                    raise RuleError("content-soundness", f"hit block {block.block_id} at position {position} of "
                                                         f"group {i} is no longer cached for request {request_id!r}")

    # --- freeing -------------------------------------------------------------------------------

    def free(self, request: Any) -> None:
        """Return the request's blocks, tail first (so tails are evicted first)."""
        self._steady.pop(request.request_id, None)
        self.coordinator.free(request.request_id)

    def remove_skipped_blocks(
        self, request_id: str, total_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Release blocks no future query of the request reads (out of the
        window); their table slots keep the null block."""
        _require_count("total_computed_tokens", total_computed_tokens)
        if num_prompt_tokens is not None:
            _require_count("num_prompt_tokens", num_prompt_tokens)
        self._steady.pop(request_id, None)
        self.coordinator.remove_skipped_blocks(request_id, total_computed_tokens, num_prompt_tokens)

    def pop_blocks_for_free(self, request: Any) -> list[KVCacheBlock]:
        """Forget the request and return its blocks in token order, without
        freeing them: the caller passes them, reversed, to
        ``block_pool.free_blocks`` once no step can still write them."""
        self._steady.pop(request.request_id, None)
        return self.coordinator.pop_blocks_for_free(request.request_id)

    def evict_blocks(self, block_ids: set[int]) -> None:
        """Forget the cached content of these blocks (reported stale).  A
        held block's key may come back at the next caching call (Mamba's
        prompt boundary from 0.33), so no request's decode fast path holds."""
        self._steady.clear()
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; only when nothing but the null block
        is in use.  Returns whether it did."""
        if not self.block_pool.reset_prefix_cache():
            return False
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return True

    # --- queries -------------------------------------------------------------------------------------

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        """Per group, the leading blocks that every request holding blocks
        shares (for cascade attention)."""
        return self.coordinator.get_num_common_prefix_blocks(running_request_id)

    def take_events(self) -> list[KVCacheEvent]:
        """The KV events since the last call; ``BlockStored`` events name
        their group's kind of attention (and sliding window)."""
        events = self.block_pool.take_events()
        metadata = self.kv_cache_event_metadata
        for event in events:
            if not isinstance(event, kv_events.EVENTS.stored) or event.group_idx is None:
                continue
            if not 0 <= event.group_idx < len(metadata):
                logger.warning("Group index `%s` not in KV cache metadata", event.group_idx)
                continue
            event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window = metadata[event.group_idx]
        return events

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return self.create_kv_cache_blocks(self.coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.get_blocks(request_id).get_block_ids()

    def get_block_ids_for_computed_tokens(self, request_id: str, num_computed_tokens: int) -> tuple[list[int], ...]:
        """Block ids covering the first ``num_computed_tokens`` tokens of each
        attention group (cross attention and Mamba: all of them)."""
        _require_count("num_computed_tokens", num_computed_tokens)
        clipped = []
        for manager, ids in zip(self.coordinator.single_type_managers, self.get_block_ids(request_id), strict=True):
            spec = manager.kv_cache_spec
            if spec_is(spec, AttentionSpec) and not spec_is(spec, CrossAttentionSpec):
                ids = ids[: cdiv(num_computed_tokens, manager.block_size)]  # a block over every rank
            clipped.append(ids)
        return tuple(clipped)

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        """Cache the request's full blocks within ``num_computed_tokens``
        (when caching is on), e.g. once a connector's load completes."""
        _require_count("num_computed_tokens", num_computed_tokens)
        if self.enable_caching:
            self._check_cacheable(request, num_computed_tokens)
            self._steady.pop(request.request_id, None)
            self.coordinator.cache_blocks(request, num_computed_tokens)

    def _check_cacheable(self, request: Any, num_tokens: int) -> None:
        """Every group must hold the blocks and have the hashes to cache
        (from 0.33, release delta lookahead-block-hashes, blocks without
        hashes yet are not cached: the hashes need not reach)."""
        hashed_tokens = len(request.block_hashes) * self.block_pool.hash_block_size
        if self._caches_hashed_blocks_only:
            hashed_tokens = num_tokens
        for i, manager in enumerate(self.coordinator.single_type_managers):
            num_full = num_tokens // manager.block_size
            held = len(manager.req_to_blocks.get(request.request_id, ()))
            if num_full > held or num_full > hashed_tokens // manager.block_size:
                raise RuleError(
                    "hash-map-consistency",
                    f"request {request.request_id!r}: cannot cache {num_tokens} tokens in group {i} "
                    f"({held} blocks held, {hashed_tokens} tokens hashed)",
                )

    def create_kv_cache_blocks(self, blocks: tuple[list[KVCacheBlock], ...]) -> KVCacheBlocks:
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks

    def take_new_block_ids(self) -> list[int]:
        """Ids of attention blocks allocated since the last call (to zero)."""
        ids: list[int] = []
        for manager in self.coordinator.single_type_managers:
            ids.extend(manager.take_new_block_ids())
        return ids

    def new_step_starts(self) -> None:
        self.coordinator.new_step_starts()
