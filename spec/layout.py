"""A model's layout: its KV-cache groups and the pool they share.

One type serves everyone: the conformance machines build managers from it,
the rules read each group's kind and sizes from it, the vectors write it
down.  A layout is given by its groups' specs (:mod:`kvspec.kv_cache_interface`)
and a few numbers; everything else follows:

- the **scheduler block size** -- every group's block boundary is a
  scheduling boundary: the least common multiple of the block sizes;
- the **hash block size** -- the finest granularity every group's blocks are
  made of: the greatest common divisor (one group, or caching off: the
  scheduler block size);
- the **EAGLE groups** (:func:`kvspec.kv_cache_interface.eagle_group_ids`);
- each group's **view** (:class:`GroupView`): its kind and the numbers the
  rules need, without the spec classes;
- an optional **retention interval** (vLLM's
  ``VLLM_PREFIX_CACHE_RETENTION_INTERVAL``): sliding-window and Mamba groups
  then cache one checkpoint per that many tokens (``0``: only the one a
  replay of the prompt hits), not every block a hit could use;
- an optional **context parallelism** (vLLM's ``dcp_world_size`` and
  ``pcp_world_size``): each attention block's tokens are spread over that
  many ranks, one slice a rank, so to the block manager one block holds
  ``block_size * dcp_world_size * pcp_world_size`` tokens (from 0.26.0,
  ``block_size * dcp_world_size``: release delta ``pcp-outside-the-block``;
  a Mamba group, which context parallelism replicates rather than splits,
  keeps its ``block_size``).  The group specs keep the per-rank
  ``block_size`` (as vLLM's config does); :attr:`Layout.managed_groups` are
  the specs as the manager counts them, under the release judged.

A config from elsewhere (vLLM's scheduler, a real model) names its own
scheduler and hash block sizes: give them, and they are kept.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from kvspec.kv_cache_interface import (
    AttentionKind,
    CrossAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
    eagle_group_ids,
    managed_kind,
    spec_is,
)
from kvspec.spec import releases
from kvspec.spec.releases import Release

TARGET_OPTIONS = {"retention_interval": None, "max_num_batched_tokens": None, "dcp_world_size": 1,
                  "pcp_world_size": 1, "watermark": 0.0}
"""The layout fields a target factory is given as keywords, with the value
that means "not set" (a field at it is not passed)."""


def block_ranks(dcp_world_size: int, pcp_world_size: int, release: Release = releases.REFERENCE) -> int:
    """The ranks one attention block's tokens are spread over: decode times
    prefill context parallelism, or (``release`` with delta
    ``pcp-outside-the-block``, 0.26.0) decode context parallelism alone --
    prefill ranks then no longer widen a block.  ``release``: the one
    judged (default: the reference release)."""
    return dcp_world_size * (1 if release.has("pcp-outside-the-block") else pcp_world_size)


def managed_spec(spec: KVCacheSpec, ranks: int = 1) -> KVCacheSpec:
    """``spec`` as the block manager counts it: with context parallelism
    (``ranks``: :func:`block_ranks`, each rank holding ``block_size`` of a
    block's tokens) one attention block holds ``block_size`` times the
    ranks.  A Mamba state is replicated on every rank, not split: its block
    keeps its size."""
    if ranks == 1 or spec_is(spec, MambaSpec):
        return spec
    return dataclasses.replace(spec, block_size=spec.block_size * ranks)


@dataclass(frozen=True)
class GroupView:
    """One KV-cache group as the rules see it."""

    kind: AttentionKind  # never MLA_ATTENTION: MLA's blocks are full attention's (managed_kind)
    block_size: int
    sliding_window: int | None = None
    rswa_window: int | None = None
    attention_chunk_size: int | None = None
    mamba_cache_mode: str | None = None
    num_speculative_blocks: int = 0
    eagle: bool = False
    window_hold_back: int = 0  # Mamba: tokens held back before freeing states (:func:`mamba_hold_back`)


def mamba_hold_back(num_speculative_blocks: int, release: Release = releases.REFERENCE) -> int:
    """How many of a request's computed tokens a Mamba group does not count
    when it frees states that left the window.  In the base, ``s`` (its
    speculative blocks): the caller may count draft tokens that are still
    to be verified, so the group assumes all of them rejected.  From 0.26
    (release delta ``processed-token-windows``) none: the caller passes
    only processed tokens (computed minus in flight)."""
    return 0 if release.has("processed-token-windows") else num_speculative_blocks


def view_of(spec: KVCacheSpec, eagle: bool, release: Release = releases.REFERENCE) -> GroupView:
    """A spec's kind (:func:`~kvspec.kv_cache_interface.managed_kind`: MLA is
    full attention here) and the numbers its rules read under ``release``."""
    kind = managed_kind(spec)
    if kind is None:
        raise TypeError(f"unsupported KV-cache spec {type(spec).__name__}")
    numbers = {
        AttentionKind.RSWA: lambda: {"rswa_window": spec.rswa_window},
        AttentionKind.SLIDING_WINDOW: lambda: {"sliding_window": spec.sliding_window},
        AttentionKind.CHUNKED_LOCAL_ATTENTION: lambda: {"attention_chunk_size": spec.attention_chunk_size},
        AttentionKind.MAMBA: lambda: {"mamba_cache_mode": spec.mamba_cache_mode,
                                      "num_speculative_blocks": spec.num_speculative_blocks,
                                      "window_hold_back": mamba_hold_back(spec.num_speculative_blocks, release)},
    }.get(kind, dict)()
    return GroupView(kind, block_size=spec.block_size, eagle=eagle, **numbers)


@dataclass(frozen=True)
class Layout:
    """A model's KV-cache groups and the pool they share (see the module docstring).

    ``eagle_groups``: the groups the config marks as the drafter's.  A
    ``scheduler_block_size``/``hash_block_size`` not given (``None``) is derived.
    ``retention_interval``: ``None`` (dense caching) or the interval;
    ``dcp_world_size``/``pcp_world_size``: context parallelism's ranks;
    ``max_num_batched_tokens``: the scheduler's token budget per step
    (``None``: ``max_model_len``), which caps what a sliding-window or
    chunked request can hold and so the full-sequence admission estimate;
    ``watermark``: the share of ``num_blocks`` (rounded down) an admission
    must leave free while other requests are scheduled -- keywords a target
    factory is given only when they are set.  ``release``: the vLLM release
    whose rules count its blocks (default the reference release;
    :meth:`for_release`) -- what depends on it (the managed sizes, the
    views) is computed from it, so one process holds a layout for each
    release it judges, side by side."""

    groups: tuple[KVCacheSpec, ...]
    num_blocks: int = 24
    max_model_len: int = 32
    enable_caching: bool = True
    use_eagle: bool = False
    eagle_groups: tuple[int, ...] = field(default=())
    given_scheduler_block_size: int | None = None
    given_hash_block_size: int | None = None
    retention_interval: int | None = None
    dcp_world_size: int = 1
    pcp_world_size: int = 1
    max_num_batched_tokens: int | None = None
    watermark: float = 0.0  # the share of the pool kept free from admissions while others run
    release: Release = field(default=releases.REFERENCE, repr=False)

    def for_release(self, release: Release | str | None) -> Layout:
        """This layout as ``release`` counts it (a version, a
        :class:`~kvspec.spec.releases.Release`, or ``None``: the reference)."""
        release = releases.as_release(release)
        return self if release == self.release else dataclasses.replace(self, release=release)

    @classmethod
    def from_config(cls, kv_cache_config: KVCacheConfig, scheduler_block_size: int, hash_block_size: int,
                    enable_caching: bool = True, use_eagle: bool = False, max_model_len: int = 0,
                    dcp_world_size: int = 1, pcp_world_size: int = 1,
                    release: Release = releases.REFERENCE) -> Layout:
        """The layout of a config built elsewhere, with its own sizes."""
        groups = kv_cache_config.kv_cache_groups
        return cls(tuple(g.kv_cache_spec for g in groups), kv_cache_config.num_blocks, max_model_len,
                   enable_caching, use_eagle, tuple(i for i, g in enumerate(groups) if g.is_eagle_group),
                   scheduler_block_size, hash_block_size, dcp_world_size=dcp_world_size,
                   pcp_world_size=pcp_world_size, release=release)

    @property
    def context_parallel_ranks(self) -> int:
        """The ranks each attention block's tokens are spread over under the
        release judged (1: no context parallelism; :func:`block_ranks`)."""
        return block_ranks(self.dcp_world_size, self.pcp_world_size, self.release)

    @cached_property
    def managed_groups(self) -> tuple[KVCacheSpec, ...]:
        """The group specs as the block manager counts them: with context
        parallelism a block holds every rank's slice (:func:`managed_spec`)."""
        return tuple(managed_spec(g, self.context_parallel_ranks) for g in self.groups)

    @cached_property
    def scheduler_block_size(self) -> int:
        if self.given_scheduler_block_size is not None:
            return self.given_scheduler_block_size
        return math.lcm(*(g.block_size for g in self.managed_groups)) if self.groups else 1

    @cached_property
    def hash_block_size(self) -> int:
        if self.given_hash_block_size is not None:
            return self.given_hash_block_size
        if len(self.groups) <= 1 or not self.enable_caching:
            return self.scheduler_block_size
        return math.gcd(*(g.block_size for g in self.managed_groups))

    @cached_property
    def hit_alignment(self) -> int:
        """Hits are multiples of this: the scheduler block size in a hybrid
        model, the block size with one group."""
        return self.scheduler_block_size if len(self.groups) != 1 else self.managed_groups[0].block_size

    @property
    def has_cross_attention(self) -> bool:
        return any(spec_is(g, CrossAttentionSpec) for g in self.groups)

    @cached_property
    def mamba_cache_modes(self) -> frozenset[str]:
        """The cache modes of the Mamba groups (empty: none)."""
        return frozenset(g.mamba_cache_mode for g in self.groups if spec_is(g, MambaSpec))

    @property
    def has_mamba_align(self) -> bool:
        return "align" in self.mamba_cache_modes

    def kv_cache_config(self) -> KVCacheConfig:
        """One group per spec (one layer each, ``layer.i``)."""
        return KVCacheConfig(
            num_blocks=self.num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec([f"layer.{i}"], spec, is_eagle_group=i in self.eagle_groups)
                             for i, spec in enumerate(self.groups)],
        )

    @cached_property
    def views(self) -> tuple[GroupView, ...]:
        """Each group's kind and numbers, with its EAGLE flag."""
        eagle = eagle_group_ids(self.kv_cache_config(), self.use_eagle,
                                drop_needs_use_eagle=self.release.has("eagle-drop-needs-use-eagle"))
        return tuple(view_of(spec, i in eagle, self.release) for i, spec in enumerate(self.managed_groups))

    def target_args(self, enable_kv_cache_events: bool = True) -> tuple:
        """Positional arguments of a ManagerTarget factory."""
        return (self.kv_cache_config(), self.max_model_len, self.scheduler_block_size, self.hash_block_size,
                self.enable_caching, self.use_eagle, enable_kv_cache_events)

    def target_options(self) -> dict[str, int]:
        """Keyword arguments of a ManagerTarget factory: only what this layout
        sets, so a factory that knows no retention interval (or no context
        parallelism) builds every layout that has none."""
        return {name: getattr(self, name) for name, unset in TARGET_OPTIONS.items() if getattr(self, name) != unset}

    def make_target(self, factory: Callable[..., Any], enable_kv_cache_events: bool = True, **extra: Any) -> Any:
        """``factory`` called with this layout's arguments and options (and
        ``extra`` keywords: what the caller observes the target with)."""
        return factory(*self.target_args(enable_kv_cache_events), **self.target_options(), **extra)
