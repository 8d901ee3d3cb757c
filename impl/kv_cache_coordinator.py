"""The coordinator: spreads each request-level operation over the KV-cache
groups (vLLM 0.25.1's ``kv_cache_coordinator``).

- ``KVCacheCoordinatorNoPrefixCache``: prefix caching off; any number of
  groups, zero included; no hits.
- ``UnitaryKVCacheCoordinator``: one group; hits at its block size.
- ``HybridKVCacheCoordinator``: several kinds of attention.  A hit must be
  servable by every group at once, so the candidate length shrinks until all
  agree (a fixed point), in multiples of the scheduler block size.  Two
  differences from vLLM, where vLLM breaks rule hit-soundness: every
  full-attention spec group is cut to the final hit (vLLM cuts the first
  only), and a Mamba group is never an EAGLE group (:func:`eagle_group_ids`).

Allocation is two-phase: every group's hit blocks are touched before any
group takes blocks for connector-held (external) tokens, so no group's
``get_new_blocks`` can evict another group's hit.

The configuration is checked up front (``RuleError``, a ``ValueError``),
where vLLM asserts or fails later: block sizes must nest (every group's block
size divides ``scheduler_block_size``; with caching, ``hash_block_size``
divides every group's block size; ``hash_block_size`` divides
``scheduler_block_size``), and the prefix-cache retention interval must make
sense for the groups (see :func:`validate_retention_interval`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from kvspec.errors import RuleError, RuleTypeError, require_int
from kvspec.hashing import block_hashes_for_size
from kvspec.impl.block_pool import BlockPool
from kvspec.impl.kv_cache_utils import KVCacheBlock
from kvspec.impl.release import require_deltas
from kvspec.impl.single_type_kv_cache_manager import (
    CrossAttentionManager,
    MambaManager,
    SingleTypeKVCacheManager,
    context_parallel_ranks,
    get_manager_for_kv_cache_spec,
    replay_boundaries,
)
from kvspec.kv_cache_interface import (
    AttentionKind,
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
    eagle_group_ids,
    has_drafter,
    managed_kind,
    spec_is,
)

RETENTION_ENV = "VLLM_PREFIX_CACHE_RETENTION_INTERVAL"

SkipPlan = list[tuple[SingleTypeKVCacheManager, list[list[int]]]]


class _FromEnv:
    def __repr__(self) -> str:
        return f"<${RETENTION_ENV}>"


RETENTION_FROM_ENV: Any = _FromEnv()
"""Default of ``retention_interval``: read ``$VLLM_PREFIX_CACHE_RETENTION_INTERVAL``
(unset: ``None``, dense caching), as vLLM does."""


def retention_interval_from_env() -> int | None:
    value = os.environ.get(RETENTION_ENV)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise RuleError("block-size-coherence", f"{RETENTION_ENV} must be an integer, got {value!r}") from None


def validate_retention_interval(
    retention_interval: int | None, scheduler_block_size: int, kv_cache_config: KVCacheConfig,
    deltas: frozenset[str] = frozenset(),
) -> None:
    """A retention interval thins the cached checkpoints of sliding-window
    and Mamba groups: it must be ``None``, 0 (keep only the prompt-replay
    boundary) or a positive multiple of ``scheduler_block_size``, and there
    must be such a group for it to act on (from 0.29, delta
    retention-zero-anywhere, 0 needs none)."""
    if retention_interval is None:
        return
    if type(retention_interval) is not int:
        raise RuleTypeError(
            "block-size-coherence", f"retention_interval must be an int or None, got {retention_interval!r}"
        )
    if retention_interval == 0 and "retention-zero-anywhere" in deltas:
        return
    if not any(spec_is(g.kv_cache_spec, SlidingWindowSpec, MambaSpec) for g in kv_cache_config.kv_cache_groups):
        raise RuleError(
            "block-size-coherence",
            f"retention_interval={retention_interval} is set but the model has no sliding-window or Mamba "
            f"KV-cache group, so it has no effect; unset it (${RETENTION_ENV})",
        )
    if retention_interval < 0 or retention_interval % scheduler_block_size:
        raise RuleError(
            "block-size-coherence",
            f"retention_interval={retention_interval} must be non-negative and a multiple of "
            f"scheduler_block_size={scheduler_block_size}",
        )


def _positive_int(name: str, value: Any) -> None:
    require_int("block-size-coherence", name, value, 1)


def _require_config(kv_cache_config: Any) -> None:
    """A ``KVCacheConfig`` -- kvspec's, or anything shaped like it (vLLM's):
    ``num_blocks`` and groups with a ``kv_cache_spec`` each."""
    groups = getattr(kv_cache_config, "kv_cache_groups", None)
    if not hasattr(kv_cache_config, "num_blocks") or not isinstance(groups, list | tuple) or not all(
            hasattr(g, "kv_cache_spec") for g in groups):
        raise RuleTypeError("block-size-coherence", f"kv_cache_config must be a KVCacheConfig, got {kv_cache_config!r}")


def blocks_over_ranks(kv_cache_config: KVCacheConfig, ranks: int) -> KVCacheConfig:
    """``kv_cache_config`` as the block manager counts it when decode ranks
    split a hybrid model (release delta ``dcp-on-hybrid-models``): an
    attention block holds ``block_size`` tokens on each of ``ranks`` ranks,
    a Mamba state is replicated on every rank and keeps its size."""
    groups = [
        group if spec_is(group.kv_cache_spec, MambaSpec) else dataclasses.replace(
            group, kv_cache_spec=group.kv_cache_spec.copy_with_new_block_size(group.kv_cache_spec.block_size * ranks))
        for group in kv_cache_config.kv_cache_groups
    ]
    return dataclasses.replace(kv_cache_config, kv_cache_groups=groups)


def zeroes_new_blocks(spec: KVCacheSpec, kv_cache_config: KVCacheConfig, deltas: frozenset[str]) -> bool:
    """Whether the worker zeroes a group's new blocks before the step reads
    them, so that ``take_new_block_ids`` names them: full attention's (MLA's
    included); from 0.26 (release delta ``zeroing-with-mamba-only``) only in
    a model with a Mamba group; from 0.28 (``zeroing-every-attention-group``)
    there every group's but Mamba's."""
    if "zeroing-with-mamba-only" in deltas and not any(
            spec_is(g.kv_cache_spec, MambaSpec) for g in kv_cache_config.kv_cache_groups):
        return False
    kind = managed_kind(spec)
    if "zeroing-every-attention-group" in deltas:
        return kind is not AttentionKind.MAMBA
    return kind is AttentionKind.FULL_ATTENTION


def validate_block_sizes(
    kv_cache_config: KVCacheConfig, scheduler_block_size: int, hash_block_size: int, enable_caching: bool,
    ranks: int = 1,
    mamba_replicated: bool = False,
) -> None:
    """Block sizes nest: hash | group | scheduler, a group's block counted
    over its context-parallel ``ranks`` (``mamba_replicated``: a hybrid's
    Mamba state is replicated on every rank, not split, and keeps its size).  Without caching no hash is read, so
    a group's block size need not be a multiple of the hash block size (vLLM
    gives a Mamba-only model one block of ``max_model_len``)."""
    _positive_int("scheduler_block_size", scheduler_block_size)
    _positive_int("hash_block_size", hash_block_size)
    if scheduler_block_size % hash_block_size:
        raise RuleError(
            "block-size-coherence",
            f"scheduler_block_size={scheduler_block_size} is not a multiple of hash_block_size={hash_block_size}",
        )
    for i, group in enumerate(kv_cache_config.kv_cache_groups):
        per_rank = group.kv_cache_spec.block_size
        _positive_int(f"group {i} block_size", per_rank)
        block_size = per_rank * (1 if mamba_replicated and spec_is(group.kv_cache_spec, MambaSpec) else ranks)
        size = f"block_size={per_rank}" + (f" over {ranks} ranks ({block_size} tokens)" if ranks > 1 else "")
        if scheduler_block_size % block_size:
            raise RuleError(
                "block-size-coherence", f"group {i} {size} does not divide scheduler_block_size={scheduler_block_size}"
            )
        if enable_caching and block_size % hash_block_size:
            raise RuleError(
                "block-size-coherence", f"group {i} {size} is not a multiple of hash_block_size={hash_block_size}"
            )


class KVCacheCoordinator(ABC):
    """The groups' managers over one shared pool.

    ``retention_interval`` (keyword-only, kvspec's addition): sparse
    checkpoint interval for sliding-window and Mamba groups; by default read
    from ``$VLLM_PREFIX_CACHE_RETENTION_INTERVAL`` like vLLM.
    """

    # vLLM's flag (0.28 on) for hits that end inside a block, which its scheduler reads: impl's never do.
    enable_partial_hash_hits = False

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        max_num_batched_tokens: int,
        use_eagle: bool,
        enable_caching: bool,
        enable_kv_cache_events: bool,
        dcp_world_size: int,
        pcp_world_size: int,
        scheduler_block_size: int,
        hash_block_size: int,
        metrics_collector: Any = None,
        *,
        retention_interval: int | None = RETENTION_FROM_ENV,
        deltas: Iterable[str] | None = None,
        num_hash_lookahead_tokens: int = 0,
    ):
        if retention_interval is RETENTION_FROM_ENV:
            retention_interval = retention_interval_from_env()
        self.deltas = require_deltas(deltas)
        self._validate(kv_cache_config, use_eagle, enable_caching, dcp_world_size, pcp_world_size,
                       scheduler_block_size, hash_block_size)
        validate_retention_interval(retention_interval, scheduler_block_size, kv_cache_config, self.deltas)
        if "pcp-outside-the-block" in self.deltas:
            pcp_world_size = 1  # the engine hands the manager no prefill ranks: a block holds block_size x dcp
        split_over = 1  # decode ranks an attention group's blocks were widened over (hybrid models)
        if len(kv_cache_config.kv_cache_groups) > 1 and dcp_world_size > 1:
            # dcp-on-hybrid-models (validated): each attention block holds every rank's slice and a Mamba
            # state is replicated, so the managers count the config's blocks over the ranks with no ranks left
            kv_cache_config = blocks_over_ranks(kv_cache_config, dcp_world_size)
            dcp_world_size, split_over = 1, dcp_world_size
        self.dcp_world_size = dcp_world_size
        self.pcp_world_size = pcp_world_size
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.scheduler_block_size = scheduler_block_size
        self.retention_interval = retention_interval
        self.block_pool = BlockPool(
            num_gpu_blocks=kv_cache_config.num_blocks,
            enable_caching=enable_caching,
            hash_block_size=hash_block_size,
            enable_kv_cache_events=enable_kv_cache_events,
            metrics_collector=metrics_collector,
            deltas=self.deltas,
            num_hash_lookahead_tokens=num_hash_lookahead_tokens,
        )
        self.eagle_group_ids = self._eagle_groups(kv_cache_config, use_eagle)
        # From 0.30 (release delta eagle-replay-boundaries) a drafter moves where a prompt's replay resumes.
        self._replay_before_drafts = "eagle-replay-boundaries" in self.deltas and has_drafter(kv_cache_config,
                                                                                               use_eagle)
        self.single_type_managers: tuple[SingleTypeKVCacheManager, ...] = tuple(
            get_manager_for_kv_cache_spec(
                kv_cache_spec=group.kv_cache_spec,
                max_num_batched_tokens=max_num_batched_tokens,
                max_model_len=max_model_len,
                block_pool=self.block_pool,
                enable_caching=enable_caching,
                kv_cache_group_id=i,
                scheduler_block_size=scheduler_block_size,
                dcp_world_size=dcp_world_size,
                pcp_world_size=pcp_world_size,
                deltas=self.deltas,
                records_new_blocks=zeroes_new_blocks(group.kv_cache_spec, kv_cache_config, self.deltas),
            )
            for i, group in enumerate(kv_cache_config.kv_cache_groups)
        )
        for manager in self.single_type_managers:
            if isinstance(manager, MambaManager):
                manager.use_eagle_checkpoint = use_eagle
            elif split_over > 1:  # each manager says over how many ranks its blocks spread, as vLLM's do
                manager.dcp_world_size = split_over
        # (manager, whether it is sized by encoder tokens): cross attention is.
        self._managers_with_kind = tuple((m, isinstance(m, CrossAttentionManager)) for m in self.single_type_managers)
        # Groups that release blocks as the request advances (others keep all).
        self.releasing_managers = tuple(m for m in self.single_type_managers if m.releases_skipped_blocks)
        # From 0.29 (release delta unrounded-caching-under-dcp): under decode ranks a Mamba align group whose
        # block is at least the hash block turns hits inside a block on, and caching is no longer rounded to A.
        self.caches_unrounded = "unrounded-caching-under-dcp" in self.deltas and split_over > 1 and any(
            isinstance(m, MambaManager) and m.mamba_cache_mode == "align" and m.block_size >= hash_block_size
            for m in self.single_type_managers)
        # vLLM's estimate is exact for every group but Mamba's align mode.
        self.inexact_group_ids = tuple(
            g for g, m in enumerate(self.single_type_managers)
            if isinstance(m, MambaManager) and m.mamba_cache_mode == "align"
        )

    def _eagle_groups(self, kv_cache_config: KVCacheConfig, use_eagle: bool) -> set[int]:
        """The groups whose hits drop the EAGLE block, as this manager's release derives them."""
        return eagle_group_ids(kv_cache_config, use_eagle,
                               drop_needs_use_eagle="eagle-drop-needs-use-eagle" in self.deltas)

    def _validate(
        self,
        kv_cache_config: KVCacheConfig,
        use_eagle: bool,
        enable_caching: bool,
        dcp_world_size: int,
        pcp_world_size: int,
        scheduler_block_size: int,
        hash_block_size: int,
    ) -> None:
        """Refuse a configuration this coordinator cannot serve (before anything is built)."""
        _require_config(kv_cache_config)
        ranks = context_parallel_ranks(dcp_world_size, pcp_world_size, self.deltas)
        groups = kv_cache_config.kv_cache_groups
        parallelism = f"context parallelism (dcp_world_size={dcp_world_size}, pcp_world_size={pcp_world_size})"
        if dcp_world_size * pcp_world_size > 1 and len(groups) != 1:
            if "dcp-on-hybrid-models" not in self.deltas:
                raise RuleError("block-size-coherence", f"{parallelism} needs a model of one KV-cache group, "
                                                        f"got {len(groups)}")
            if pcp_world_size != 1:
                raise RuleError("block-size-coherence", f"{parallelism}: a hybrid model of {len(groups)} groups "
                                                        "takes decode context parallelism only")
            if others := [type(g.kv_cache_spec).__name__ for g in groups
                          if not spec_is(g.kv_cache_spec, FullAttentionSpec, MambaSpec)]:
                raise RuleError("block-size-coherence", f"{parallelism}: a hybrid model takes it with full-attention "
                                                        f"and Mamba groups only, got {', '.join(others)}")
        validate_block_sizes(kv_cache_config, scheduler_block_size, hash_block_size, enable_caching, ranks,
                             mamba_replicated=len(groups) > 1)
        if enable_caching:
            for i, group in enumerate(kv_cache_config.kv_cache_groups):
                if spec_is(group.kv_cache_spec, CrossAttentionSpec):
                    raise RuleError(
                        "hash-map-consistency",
                        f"group {i} is cross attention, which is never cached: enable_caching must be False "
                        "for encoder-decoder models",
                    )

    # --- allocation ------------------------------------------------------------------

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: tuple[Sequence[KVCacheBlock], ...],
        num_encoder_tokens: int,
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        num_local_computed_tokens: int | None = None,
        prefill_end: int = 0,
    ) -> int:
        """Free blocks the request needs, over all groups (cross attention
        is sized once by ``num_encoder_tokens``).

        ``num_local_computed_tokens`` (vLLM's keyword from 0.26): the part of
        ``total_computed_tokens`` hit in this cache.  vLLM reads it only to
        size the copy a hit ending inside a block needs; impl's hits end on
        block boundaries, so it is checked and changes nothing.
        ``prefill_end`` (from 0.31): the token the request's prefill ends at,
        which vLLM reads only to reserve Mamba prefill checkpoint blocks;
        impl keeps none, so it too is checked and changes nothing."""
        if num_local_computed_tokens is not None and (
            type(num_local_computed_tokens) is not int or not 0 <= num_local_computed_tokens <= total_computed_tokens
        ):
            raise RuleError("allocation-accounting", f"num_local_computed_tokens {num_local_computed_tokens!r} must "
                            f"be an int within 0..total_computed_tokens ({total_computed_tokens!r})")
        if type(prefill_end) is not int or prefill_end < 0:
            raise RuleError("allocation-accounting", f"prefill_end must be an int >= 0, got {prefill_end!r}")
        return sum(self.blocks_to_allocate_per_group(
            request_id, num_tokens, new_computed_blocks, num_encoder_tokens, total_computed_tokens,
            num_tokens_main_model, apply_admission_cap,
        ))

    def blocks_to_allocate_per_group(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: tuple[Sequence[KVCacheBlock], ...],
        num_encoder_tokens: int,
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
    ) -> list[int]:
        """``get_num_blocks_to_allocate``, group by group."""
        return [
            manager.get_num_blocks_to_allocate(
                request_id, num_encoder_tokens, [], 0, num_encoder_tokens, apply_admission_cap=apply_admission_cap
            )
            if encoder
            else manager.get_num_blocks_to_allocate(
                request_id, num_tokens, hits, total_computed_tokens, num_tokens_main_model,
                apply_admission_cap=apply_admission_cap,
            )
            for (manager, encoder), hits in zip(self._managers_with_kind, new_computed_blocks, strict=True)
        ]

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: tuple[Sequence[KVCacheBlock], ...],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        """Give a new request its hit blocks, then blocks for external tokens."""
        if self.is_running(request_id):
            return
        for manager, hits in zip(self.single_type_managers, new_computed_blocks, strict=True):
            manager.add_local_computed_blocks(
                request_id, hits, num_local_computed_tokens, num_external_computed_tokens
            )
        if num_external_computed_tokens > 0:
            for manager in self.single_type_managers:
                manager.allocate_external_computed_blocks(
                    request_id, num_local_computed_tokens, num_external_computed_tokens
                )

    def blocks_beyond_estimate(
        self,
        estimates: list[int],
        request_id: str,
        new_computed_blocks: tuple[Sequence[KVCacheBlock], ...],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
        num_tokens: int,
        num_tokens_main_model: int,
        adds_computed_blocks: bool,
    ) -> int:
        """How many more free blocks the allocation really takes than the
        per-group ``estimates`` say.  Only Mamba's align mode can differ
        (``inexact_group_ids``); every other estimate is exact.  Pure."""
        adds = adds_computed_blocks and not self.is_running(request_id)
        managers = self.single_type_managers
        return sum(
            managers[g].blocks_beyond_estimate(
                estimates[g], request_id, new_computed_blocks[g], num_local_computed_tokens,
                num_external_computed_tokens, num_tokens, num_tokens_main_model, adds,
            )
            for g in self.inexact_group_ids
        )

    def is_running(self, request_id: str) -> bool:
        """Whether some group already tracks the request's cached blocks
        (then it takes no new hits)."""
        return any(request_id in manager.num_cached_block for manager in self.single_type_managers)

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int, num_encoder_tokens: int = 0
    ) -> tuple[list[KVCacheBlock], ...]:
        return tuple([
            manager.allocate_new_blocks(
                request_id, num_encoder_tokens if encoder else num_tokens, num_tokens_main_model
            )
            for manager, encoder in self._managers_with_kind
        ])

    # --- caching and freeing ------------------------------------------------------------

    def get_replay_boundaries(self, request: Any) -> tuple[int, ...]:
        """Where a later request replaying this prompt resumes, which sparse
        retention keeps in every group (see ``replay_boundaries``)."""
        return replay_boundaries(request.num_prompt_tokens, self.scheduler_block_size, self._replay_before_drafts)

    def _replay_boundaries_to_keep(self, request: Any) -> tuple[int, ...] | None:
        """``get_replay_boundaries`` where a group reads them: under a
        retention interval (``None`` otherwise, and where they are the
        default one, ``num_prompt_tokens - 1``)."""
        if self.retention_interval is None or not self._replay_before_drafts:
            return None
        return self.get_replay_boundaries(request)

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        replay = self._replay_boundaries_to_keep(request)
        for manager in self.single_type_managers:
            manager.cache_blocks(request, num_computed_tokens, self.retention_interval, replay)

    def num_cacheable_tokens(self, num_computed_tokens: int, group_id: int) -> int:
        """How many computed tokens group ``group_id`` caches: all of them
        (a hybrid stops at the scheduler's block boundary)."""
        return num_computed_tokens

    def free(self, request_id: str) -> None:
        for manager in self.single_type_managers:
            manager.free(request_id)

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        """The request's blocks of every group, group by group in token
        order, its bookkeeping forgotten; the caller frees them reversed."""
        blocks: list[KVCacheBlock] = []
        for manager in self.single_type_managers:
            blocks.extend(manager.pop_blocks_for_free(request_id))
        return blocks

    def remove_skipped_blocks(
        self, request_id: str, total_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        for manager in self.single_type_managers:
            manager.remove_skipped_blocks(request_id, total_computed_tokens, num_prompt_tokens)

    def skipped_block_plan(
        self, request_id: str, total_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> SkipPlan:
        """What ``remove_skipped_blocks`` would release: (manager, runs) for
        each group with something to release (see
        ``SingleTypeKVCacheManager.skipped_block_runs``).  Pure."""
        plan = []
        for manager in self.releasing_managers:
            runs = manager.skipped_block_runs(request_id, total_computed_tokens, num_prompt_tokens)
            if runs:
                plan.append((manager, runs))
        return plan

    @staticmethod
    def release_skipped_blocks(request_id: str, plan: SkipPlan) -> None:
        """Carry out a ``skipped_block_plan`` made since the last change."""
        for manager, runs in plan:
            manager.release_blocks(request_id, runs)

    def steady_limits(
        self, request_id: str, total_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> tuple[float, float, float]:
        """Every group's ``steady_limits`` at once: the tightest of each."""
        if len(self.single_type_managers) == 1:
            return self.single_type_managers[0].steady_limits(request_id, total_computed_tokens, num_prompt_tokens)
        slots = full = skip = math.inf
        for manager in self.single_type_managers:
            group_slots, group_full, group_skip = manager.steady_limits(
                request_id, total_computed_tokens, num_prompt_tokens
            )
            slots, full, skip = min(slots, group_slots), min(full, group_full), min(skip, group_skip)
        return slots, full, skip

    # --- queries ----------------------------------------------------------------------------

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [m.get_num_common_prefix_blocks(running_request_id) for m in self.single_type_managers]

    def get_blocks(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        return tuple(m.req_to_blocks.get(request_id) or [] for m in self.single_type_managers)

    @abstractmethod
    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        """The longest prefix hit of at most ``max_cache_hit_length`` tokens:
        per-group blocks and the hit length in tokens."""

    def new_step_starts(self) -> None:
        for manager in self.single_type_managers:
            manager.new_step_starts()


class KVCacheCoordinatorNoPrefixCache(KVCacheCoordinator):
    """Prefix caching off: any number of groups (zero included), no hits."""

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        max_num_batched_tokens: int,
        use_eagle: bool,
        enable_kv_cache_events: bool,
        dcp_world_size: int,
        pcp_world_size: int,
        scheduler_block_size: int,
        hash_block_size: int,
        metrics_collector: Any = None,
        *,
        retention_interval: int | None = RETENTION_FROM_ENV,
        deltas: Iterable[str] | None = None,
        num_hash_lookahead_tokens: int = 0,
    ):
        super().__init__(
            kv_cache_config, max_model_len, max_num_batched_tokens, use_eagle, False, enable_kv_cache_events,
            dcp_world_size, pcp_world_size, scheduler_block_size, hash_block_size, metrics_collector,
            retention_interval=retention_interval, deltas=deltas,
            num_hash_lookahead_tokens=num_hash_lookahead_tokens,
        )
        self.num_single_type_manager = len(self.single_type_managers)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [0] * self.num_single_type_manager

    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        return tuple([] for _ in range(self.num_single_type_manager)), 0


class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    """One group: hits at its own block size (hashes must be at that size)."""

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        max_num_batched_tokens: int,
        use_eagle: bool,
        enable_caching: bool,
        enable_kv_cache_events: bool,
        dcp_world_size: int,
        pcp_world_size: int,
        scheduler_block_size: int,
        hash_block_size: int,
        metrics_collector: Any = None,
        *,
        retention_interval: int | None = RETENTION_FROM_ENV,
        deltas: Iterable[str] | None = None,
        num_hash_lookahead_tokens: int = 0,
    ):
        super().__init__(
            kv_cache_config, max_model_len, max_num_batched_tokens, use_eagle, enable_caching,
            enable_kv_cache_events, dcp_world_size, pcp_world_size, scheduler_block_size, hash_block_size,
            metrics_collector, retention_interval=retention_interval, deltas=deltas,
            num_hash_lookahead_tokens=num_hash_lookahead_tokens,
        )
        self.kv_cache_spec = kv_cache_config.kv_cache_groups[0].kv_cache_spec
        self.block_size = self.single_type_managers[0].block_size  # over every context-parallel rank
        self._drop_eagle_block = 0 in self.eagle_group_ids
        self.single_type_managers[0].use_eagle = self._drop_eagle_block

    def _validate(self, kv_cache_config, use_eagle, enable_caching, dcp_world_size, pcp_world_size,
                  scheduler_block_size, hash_block_size) -> None:
        super()._validate(kv_cache_config, use_eagle, enable_caching, dcp_world_size, pcp_world_size,
                          scheduler_block_size, hash_block_size)
        groups = kv_cache_config.kv_cache_groups
        if len(groups) != 1:
            raise RuleError(
                "block-size-coherence", f"UnitaryKVCacheCoordinator needs exactly one group, got {len(groups)}"
            )
        block_size = groups[0].kv_cache_spec.block_size * context_parallel_ranks(dcp_world_size, pcp_world_size,
                                                                                 self.deltas)
        if enable_caching and hash_block_size != block_size:
            raise RuleError(
                "block-size-coherence",
                f"with one group, hash_block_size ({hash_block_size}) must equal its block_size ({block_size})",
            )
        if enable_caching:
            _refuse_eagle_chunked(kv_cache_config, use_eagle, self._eagle_groups(kv_cache_config, use_eagle))

    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        hits = self.single_type_managers[0].find_longest_cache_hit(
            block_hashes=block_hashes,
            max_length=max_cache_hit_length,
            kv_cache_group_ids=[0],
            block_pool=self.block_pool,
            kv_cache_spec=self.kv_cache_spec,
            drop_eagle_block=self._drop_eagle_block,
            alignment_tokens=self.block_size,
            dcp_world_size=self.dcp_world_size,
            pcp_world_size=self.pcp_world_size,
        )
        return hits, len(hits[0]) * self.block_size


def _refuse_eagle_chunked(kv_cache_config: KVCacheConfig, use_eagle: bool, dropping: set[int]) -> None:
    """EAGLE's hit drop is not defined for chunked local attention (vLLM
    asserts at the first lookup); refuse such a group up front."""
    for i in sorted(dropping):
        if spec_is(kv_cache_config.kv_cache_groups[i].kv_cache_spec, ChunkedLocalAttentionSpec):
            raise RuleError("hit-soundness", f"group {i}: EAGLE is not supported with chunked local attention")


class SpecGroup(NamedTuple):
    """Groups with one spec, looked up together.  ``use_eagle``: some member
    is an EAGLE group, so the whole spec group drops the EAGLE block."""

    spec: KVCacheSpec
    group_ids: list[int]
    manager_cls: type[SingleTypeKVCacheManager]
    use_eagle: bool


class HybridKVCacheCoordinator(KVCacheCoordinator):
    """Several kinds of attention: a hit is the longest length, a multiple
    of ``scheduler_block_size``, that every spec group can serve."""

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        max_num_batched_tokens: int,
        use_eagle: bool,
        enable_caching: bool,
        enable_kv_cache_events: bool,
        dcp_world_size: int,
        pcp_world_size: int,
        scheduler_block_size: int,
        hash_block_size: int,
        metrics_collector: Any = None,
        *,
        retention_interval: int | None = RETENTION_FROM_ENV,
        deltas: Iterable[str] | None = None,
        num_hash_lookahead_tokens: int = 0,
    ):
        super().__init__(
            kv_cache_config, max_model_len, max_num_batched_tokens, use_eagle, enable_caching,
            enable_kv_cache_events, dcp_world_size, pcp_world_size, scheduler_block_size, hash_block_size,
            metrics_collector, retention_interval=retention_interval, deltas=deltas,
            num_hash_lookahead_tokens=num_hash_lookahead_tokens,
        )
        self.hash_block_size = hash_block_size
        # From 0.32 (release delta eagle-lookahead-hashes) an EAGLE group may peek up to the request's last full
        # hash block, not only to the lookup's maximum: on a block-aligned prompt the last block proves the one before.
        self._lookahead_hashes = "eagle-lookahead-hashes" in self.deltas
        self.verify_and_split_kv_cache_groups()

    def _validate(self, kv_cache_config, use_eagle, enable_caching, dcp_world_size, pcp_world_size,
                  scheduler_block_size, hash_block_size) -> None:
        super()._validate(kv_cache_config, use_eagle, enable_caching, dcp_world_size, pcp_world_size,
                          scheduler_block_size, hash_block_size)
        groups = kv_cache_config.kv_cache_groups
        spec_groups = _split_by_spec(kv_cache_config, self._eagle_groups(kv_cache_config, use_eagle))
        if len(spec_groups) < 2 and "hybrid-one-spec-group" not in self.deltas:
            raise RuleError(
                "block-size-coherence",
                f"HybridKVCacheCoordinator needs at least two distinct KV-cache specs, got {len(groups)} group(s) "
                f"with {len(spec_groups)}",
            )
        for i, group in enumerate(groups):
            spec = group.kv_cache_spec
            if spec_is(spec, ChunkedLocalAttentionSpec) and spec.block_size != scheduler_block_size:
                raise RuleError(
                    "block-size-coherence",
                    f"group {i} is chunked local attention with block_size={spec.block_size}: "
                    f"its block size must equal scheduler_block_size={scheduler_block_size}",
                )
        # A spec group drops the EAGLE block for all its members.
        dropping = {gid for spec, gids, eagle in spec_groups if eagle for gid in gids}
        _refuse_eagle_chunked(kv_cache_config, use_eagle, dropping)

    def verify_and_split_kv_cache_groups(self) -> None:
        """Batch groups with equal specs into spec groups, full attention
        first (its left-to-right scan bounds the others' work)."""
        spec_groups = [
            SpecGroup(spec, gids, type(self.single_type_managers[gids[0]]), eagle)
            for spec, gids, eagle in _split_by_spec(self.kv_cache_config, self.eagle_group_ids)
        ]
        self.attention_groups: list[SpecGroup] = sorted(
            spec_groups, key=lambda g: not spec_is(g.spec, FullAttentionSpec)
        )
        for group in self.attention_groups:
            for gid in group.group_ids:
                self.single_type_managers[gid].use_eagle = group.use_eagle
        self._full_attention_groups = [g for g in self.attention_groups if spec_is(g.spec, FullAttentionSpec)]
        # One full-attention group plus one other: a single pass settles the hit.
        self._single_pass = len(self.attention_groups) == 2 and isinstance(
            self.attention_groups[0].spec, FullAttentionSpec
        )

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        replay = self._replay_boundaries_to_keep(request)
        for group_id, manager in enumerate(self.single_type_managers):
            manager.cache_blocks(request, self.num_cacheable_tokens(num_computed_tokens, group_id),
                                 self.retention_interval, replay)

    def num_cacheable_tokens(self, num_computed_tokens: int, group_id: int) -> int:
        """How many computed tokens group ``group_id`` caches: up to the last
        scheduler-block boundary (hits never end elsewhere); an EAGLE group
        also the block past it, which its lookups read and drop.  All of them
        where caching is not rounded (delta unrounded-caching-under-dcp)."""
        sbs = self.scheduler_block_size
        aligned = num_computed_tokens if self.caches_unrounded else num_computed_tokens // sbs * sbs
        manager = self.single_type_managers[group_id]
        if manager.use_eagle and aligned > 0:
            return min(num_computed_tokens, aligned + manager.block_size)
        return aligned

    def _hashes_for(self, block_hashes: list[bytes], spec: KVCacheSpec) -> Sequence[bytes]:
        return block_hashes_for_size(block_hashes, self.hash_block_size, spec.block_size)

    def _lookup(self, group: SpecGroup, block_hashes: list[bytes], max_length: int, drop_eagle: bool):
        return group.manager_cls.find_longest_cache_hit(
            block_hashes=self._hashes_for(block_hashes, group.spec),
            max_length=max_length,
            kv_cache_group_ids=group.group_ids,
            block_pool=self.block_pool,
            kv_cache_spec=group.spec,
            drop_eagle_block=drop_eagle,
            alignment_tokens=self.scheduler_block_size,
        )

    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        """Shrink a candidate length until every spec group serves it.

        Each pass asks every spec group in turn for its longest hit within
        the current candidate; a shorter answer becomes the candidate.  A
        pass that shrinks nothing ends the search.  Full attention is looked
        up once (any prefix of its hit is a hit) and then only truncated --
        every full-attention spec group, not just the first (vLLM 0.25.1
        cuts only the first, so a second full-attention spec keeps blocks
        past the hit and ``allocate_external_computed_blocks`` can ask the
        pool for a negative count).  An EAGLE group drops its lookahead
        block once per candidate: after a shrink by a non-EAGLE group, it
        must drop again."""
        num_groups = len(self.kv_cache_config.kv_cache_groups)
        found: list[list[KVCacheBlock] | None] = [None] * num_groups
        settled = max_cache_hit_length
        longest = 0
        eagle_done: set[int] = set()
        peek_limit = len(block_hashes) * self.hash_block_size if self._lookahead_hashes else max_cache_hit_length
        while True:
            candidate = settled
            for idx, group in enumerate(self.attention_groups):
                if spec_is(group.spec, FullAttentionSpec) and found[group.group_ids[0]] is not None:
                    candidate -= candidate % group.spec.block_size
                    continue
                drop = group.use_eagle and idx not in eagle_done
                limit = min(candidate + group.spec.block_size, peek_limit) if drop else candidate
                hits = self._lookup(group, block_hashes, limit, drop)
                length = len(hits[0]) * group.spec.block_size
                if drop:
                    eagle_done.add(idx)
                elif length < candidate:
                    eagle_done.clear()
                candidate = length
                for gid, blocks in zip(group.group_ids, hits, strict=True):
                    found[gid] = blocks
                longest = max(longest, candidate)
            if candidate >= settled:
                break
            settled = candidate
            if self._single_pass:
                break
        self._truncate_full_attention(found, settled)
        # Some group cached more than all agree on: a prefix worth caching (Marconi-style hint).
        self.num_uncached_common_prefix_tokens = longest - settled
        return tuple(blocks if blocks is not None else [] for blocks in found), settled

    def _truncate_full_attention(self, found: list[list[KVCacheBlock] | None], hit_length: int) -> None:
        """Cut every full-attention spec group's blocks to the hit (every
        other group's last search returned exactly the hit)."""
        for group in self._full_attention_groups:
            keep = hit_length // group.spec.block_size
            for gid in group.group_ids:
                blocks = found[gid]
                if blocks is not None:
                    del blocks[keep:]

    def find_longest_cache_hit_per_group(
        self, block_hashes: list[bytes], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], tuple[int, ...]]:
        """Each spec group's own longest hit, not reconciled (for KV connectors).
        An EAGLE group searches one block past the bound, and drops it; from
        0.32 (release delta eagle-lookahead-hashes) up to the request's last
        full hash block, as the reconciled lookup does."""
        num_groups = len(self.kv_cache_config.kv_cache_groups)
        blocks_by_group: list[list[KVCacheBlock]] = [[] for _ in range(num_groups)]
        lengths: list[int] = [0] * num_groups
        for group in self.attention_groups:
            limit = max_cache_hit_length
            if group.use_eagle and self._lookahead_hashes:
                limit = min(limit + group.spec.block_size, len(block_hashes) * self.hash_block_size)
            hits = self._lookup(group, block_hashes, limit, group.use_eagle)
            length = len(hits[0]) * group.spec.block_size
            for gid, blocks in zip(group.group_ids, hits, strict=True):
                blocks_by_group[gid] = blocks
                lengths[gid] = length
        return tuple(blocks_by_group), tuple(lengths)


def _split_by_spec(
    kv_cache_config: KVCacheConfig, eagle_ids: set[int]
) -> list[tuple[KVCacheSpec, list[int], bool]]:
    """Groups with equal specs, in first-appearance order: (spec, group
    ids, whether any member is an EAGLE group)."""
    split: list[tuple[KVCacheSpec, list[int], bool]] = []
    for i, group in enumerate(kv_cache_config.kv_cache_groups):
        for n, (spec, gids, eagle) in enumerate(split):
            if spec == group.kv_cache_spec:
                gids.append(i)
                split[n] = (spec, gids, eagle or i in eagle_ids)
                break
        else:
            split.append((group.kv_cache_spec, [i], i in eagle_ids))
    return split


def get_kv_cache_coordinator(
    kv_cache_config: KVCacheConfig,
    max_model_len: int,
    max_num_batched_tokens: int,
    use_eagle: bool,
    enable_caching: bool,
    enable_kv_cache_events: bool,
    dcp_world_size: int,
    pcp_world_size: int,
    scheduler_block_size: int,
    hash_block_size: int,
    metrics_collector: Any = None,
    *,
    retention_interval: int | None = RETENTION_FROM_ENV,
    deltas: Iterable[str] | None = None,
    num_hash_lookahead_tokens: int = 0,
) -> KVCacheCoordinator:
    """No prefix cache when caching is off; one group: unitary; else hybrid."""
    _require_config(kv_cache_config)
    common = dict(
        dcp_world_size=dcp_world_size,
        pcp_world_size=pcp_world_size,
        scheduler_block_size=scheduler_block_size,
        hash_block_size=hash_block_size,
        metrics_collector=metrics_collector,
        retention_interval=retention_interval,
        deltas=deltas,
        num_hash_lookahead_tokens=num_hash_lookahead_tokens,
    )
    if not enable_caching:
        return KVCacheCoordinatorNoPrefixCache(
            kv_cache_config, max_model_len, max_num_batched_tokens, use_eagle, enable_kv_cache_events, **common
        )
    cls = UnitaryKVCacheCoordinator if len(kv_cache_config.kv_cache_groups) == 1 else HybridKVCacheCoordinator
    return cls(
        kv_cache_config, max_model_len, max_num_batched_tokens, use_eagle, enable_caching, enable_kv_cache_events,
        **common,
    )
