"""Every configuration kvspec's managers refuse, each with an error that names
the rule and the offending value (vLLM asserts, or fails at the first lookup)."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from kvspec.errors import RuleError, RuleTypeError
from kvspec.impl import KVCacheManager
from kvspec.impl.block_pool import BlockPool
from kvspec.impl.kv_cache_coordinator import (
    HybridKVCacheCoordinator,
    UnitaryKVCacheCoordinator,
    get_kv_cache_coordinator,
)
from kvspec.impl.single_type_kv_cache_manager import MambaManager, get_manager_for_kv_cache_spec
from kvspec.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from kvspec.testing import GEOMETRY, config, full, mamba, swa

RETENTION = "VLLM_PREFIX_CACHE_RETENTION_INTERVAL"


def manager(*specs: KVCacheSpec, sbs: int = 4, hbs: int = 4, **kwargs) -> KVCacheManager:
    return KVCacheManager(config(*specs), 64, sbs, hbs, **kwargs)


@contextmanager
def refused(match: str, rule: str = "block-size-coherence", error: type = RuleError):
    """Expect ``error`` for ``rule`` whose message contains ``match``."""
    with pytest.raises(error, match=match) as info:
        yield
    assert info.value.rule == rule


@pytest.fixture(autouse=True)
def no_retention_env(monkeypatch):
    monkeypatch.delenv(RETENTION, raising=False)


# --- block sizes nest: hash | group | scheduler ------------------------------------------


def test_group_block_size_must_divide_scheduler_block_size():
    with refused(r"group 1 block_size=8 does not divide scheduler_block_size=12"):
        manager(full(4), swa(8, window=8), sbs=12)


def test_hash_block_size_must_divide_every_group_block_size():
    with refused(r"group 1 block_size=6 is not a multiple of hash_block_size=4"):
        manager(full(4), swa(6, window=8), sbs=12, hbs=4)


def test_scheduler_block_size_must_be_a_multiple_of_hash_block_size():
    with refused(r"scheduler_block_size=4 is not a multiple of hash_block_size=8"):
        manager(full(4), sbs=4, hbs=8)


def test_without_caching_hashes_need_not_divide_group_blocks():
    # vLLM gives a Mamba-only model without caching one block of max_model_len tokens.
    m = KVCacheManager(config(MambaSpec(block_size=60)), 60, 60, 4, enable_caching=False)
    assert m.coordinator.__class__.__name__ == "KVCacheCoordinatorNoPrefixCache"


def test_unitary_needs_hash_block_size_equal_to_block_size_when_caching():
    with refused(r"hash_block_size \(4\) must equal its block_size \(8\)"):
        manager(full(8), sbs=8, hbs=4)
    manager(full(8), sbs=8, hbs=4, enable_caching=False)  # no hashes are read


def test_unitary_coordinator_needs_exactly_one_group():
    with refused(r"exactly one group, got 2"):
        UnitaryKVCacheCoordinator(config(full(4), swa(4, window=8)), 64, 64, False, True, False, 1, 1, 4, 4)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(sbs=0), r"scheduler_block_size must be >= 1, got 0"),
        (dict(sbs=4, hbs=-4), r"hash_block_size must be >= 1, got -4"),
        (dict(max_model_len=0), r"max_model_len must be >= 1, got 0"),
        (dict(max_num_batched_tokens=-1), r"max_num_batched_tokens must be >= 0, got -1"),
        (dict(watermark=-0.1), r"watermark must be a finite number >= 0, got -0.1"),
        (dict(watermark=float("inf")), r"watermark must be a finite number >= 0, got inf"),
        (dict(watermark=float("nan")), r"watermark must be a finite number >= 0, got nan"),
    ],
)
def test_non_positive_sizes(kwargs, match):
    sbs, hbs = kwargs.pop("sbs", 4), kwargs.pop("hbs", 4)
    max_model_len = kwargs.pop("max_model_len", 64)
    rule = "allocation-accounting" if "watermark" in match else "block-size-coherence"
    with refused(match, rule):
        KVCacheManager(config(full(4)), max_model_len, sbs, hbs, **kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(sbs=4.0), r"scheduler_block_size must be an int, got 4.0"),
        (dict(hbs=True), r"hash_block_size must be an int, got True"),
        (dict(max_model_len=64.0), r"max_model_len must be an int, got 64.0"),
        (dict(max_num_batched_tokens="8"), r"max_num_batched_tokens must be an int, got '8'"),
    ],
)
def test_sizes_that_are_not_ints_are_type_errors(kwargs, match):
    """Chapter 2's constructor table: a size that is not an ``int`` is a
    ``TypeError``, one that is not positive a ``ValueError`` (vectors
    ``manager/configs/constructor/max-model-len-not-an-int`` and the pool's)."""
    sbs, hbs = kwargs.pop("sbs", 4), kwargs.pop("hbs", 4)
    max_model_len = kwargs.pop("max_model_len", 64)
    with refused(match, error=RuleTypeError):
        KVCacheManager(config(full(4)), max_model_len, sbs, hbs, **kwargs)


def test_a_zero_token_budget_is_a_size_the_constructor_takes():
    """``max_num_batched_tokens`` is refused only when negative (chapter 2);
    0 caps a window's admission at what its window holds."""
    assert KVCacheManager(config(full(4)), 64, 4, 4, max_num_batched_tokens=0).max_model_len == 64


def test_a_pool_size_that_is_not_an_int_is_a_type_error():
    with refused(r"num_gpu_blocks must be an int, got 12.5", "null-exclusion", RuleTypeError):
        BlockPool(12.5, True, 4)
    with refused(r"hash_block_size must be an int, got 2.5", error=RuleTypeError):
        BlockPool(12, True, 2.5)
    with refused(r"num_gpu_blocks must be >= 1 \(block 0 is the null block\), got 0", "null-exclusion"):
        BlockPool(0, True, 4)


def test_non_positive_pool_and_block_sizes_are_refused_by_the_config():
    with refused(r"num_blocks must be an int >= 1, got 0", "null-exclusion"):
        KVCacheConfig(num_blocks=0)
    with refused(r"block_size must be a positive int, got 0"):
        FullAttentionSpec(block_size=0, **GEOMETRY)
    with refused(r"sliding_window must be a positive int, got 0"):
        SlidingWindowSpec(block_size=4, sliding_window=0, **GEOMETRY)


# --- hybrid-only requirements ----------------------------------------------------------------


@pytest.mark.parametrize("dcp, pcp", [(2, 1), (1, 2), (2, 2)])
def test_context_parallelism_is_refused_for_hybrid(dcp, pcp):
    with refused(rf"dcp_world_size={dcp}, pcp_world_size={pcp}"):
        manager(full(4), swa(4, window=8), dcp_world_size=dcp, pcp_world_size=pcp)


def test_context_parallelism_counts_every_rank_in_a_block():
    """One full-attention group over 4 ranks: a block holds 16 tokens, the
    scheduler and hash block sizes are given in them."""
    cp = manager(full(4), sbs=16, hbs=16, dcp_world_size=2, pcp_world_size=2)
    assert cp.coordinator.single_type_managers[0].block_size == 16
    with refused(r"group 0 block_size=4 over 4 ranks \(16 tokens\) does not divide scheduler_block_size=4"):
        manager(full(4), dcp_world_size=4)  # the sizes given per rank: refused


@pytest.mark.parametrize("spec, what", [(swa(4, window=8), "a SlidingWindowSpec group"),
                                        (mamba(4, "all"), "a MambaSpec group")])
def test_context_parallelism_is_refused_where_a_block_cannot_be_split(spec, what):
    with refused(rf"does not split {what} over ranks"):
        manager(spec, sbs=8, hbs=8, dcp_world_size=2)


def test_world_sizes_must_be_positive():
    with refused(r"dcp_world_size must be >= 1, got 0"):
        manager(full(4), dcp_world_size=0)


def test_hybrid_needs_two_distinct_specs():
    with refused(r"at least two distinct KV-cache specs, got 2 group\(s\) with 1"):
        HybridKVCacheCoordinator(config(full(4), full(4)), 64, 64, False, True, False, 1, 1, 4, 4)


def test_chunked_local_in_a_hybrid_needs_the_scheduler_block_size():
    chunked = ChunkedLocalAttentionSpec(block_size=4, attention_chunk_size=8, **GEOMETRY)
    with refused(r"group 1 is chunked local attention with block_size=4: .* scheduler_block_size=8"):
        manager(full(8), chunked, sbs=8)


def test_eagle_with_chunked_local_attention_is_refused():
    chunked = ChunkedLocalAttentionSpec(block_size=4, attention_chunk_size=8, **GEOMETRY)
    with refused(r"group 1: EAGLE is not supported with chunked local attention", "hit-soundness"):
        manager(full(4), chunked, use_eagle=True)
    with refused(r"group 0: EAGLE", "hit-soundness"):
        manager(chunked, use_eagle=True)
    # Only the drafter's groups drop the EAGLE block: a chunked group that is not one is fine.
    KVCacheManager(config(full(4), chunked, eagle_groups=(0,)), 64, 4, 4, use_eagle=True)


def test_cross_attention_with_caching_is_refused():
    with refused(r"group 1 is cross attention, which is never cached", "hash-map-consistency"):
        manager(full(4), CrossAttentionSpec(block_size=4, **GEOMETRY))
    manager(full(4), CrossAttentionSpec(block_size=4, **GEOMETRY), enable_caching=False)


# --- retention interval ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "interval, match",
    [
        (-8, r"retention_interval=-8 must be non-negative and a multiple of scheduler_block_size=8"),
        (12, r"retention_interval=12 must be non-negative and a multiple of scheduler_block_size=8"),
    ],
)
def test_retention_interval_must_be_a_non_negative_multiple(interval, match):
    with refused(match):
        manager(full(8), swa(8, window=8), sbs=8, hbs=8, retention_interval=interval)


def test_retention_interval_needs_a_sliding_window_or_mamba_group():
    with refused(r"retention_interval=16 is set but the model has no sliding-window or Mamba KV-cache group"):
        manager(full(4), retention_interval=16)
    manager(full(4), swa(4, window=8), retention_interval=16)
    manager(full(4), MambaSpec(block_size=4, mamba_cache_mode="align"), retention_interval=0)


def test_retention_interval_comes_from_the_environment_by_default(monkeypatch):
    monkeypatch.setenv(RETENTION, "-4")
    with refused(r"retention_interval=-4"):
        manager(full(4), swa(4, window=8))
    monkeypatch.setenv(RETENTION, "16")
    assert manager(full(4), swa(4, window=8)).coordinator.retention_interval == 16
    assert manager(full(4), swa(4, window=8), retention_interval=None).coordinator.retention_interval is None
    monkeypatch.setenv(RETENTION, "sixteen")
    with refused(r"VLLM_PREFIX_CACHE_RETENTION_INTERVAL must be an integer, got 'sixteen'"):
        manager(full(4), swa(4, window=8))


def test_retention_interval_must_be_an_int():
    with refused(r"retention_interval must be an int or None, got 8.0", error=RuleTypeError):
        manager(full(4), swa(4, window=8), retention_interval=8.0)


# --- specs and managers ----------------------------------------------------------------------


def test_bad_mamba_cache_mode():
    with pytest.raises(ValueError, match=r"mamba_cache_mode must be one of .*, got 'sometimes'"):
        MambaSpec(block_size=4, mamba_cache_mode="sometimes")
    spec = MambaSpec(block_size=4)
    object.__setattr__(spec, "mamba_cache_mode", "sometimes")  # a spec that skipped its own check
    pool = BlockPool(8, True, 4)
    with refused(r"mamba_cache_mode must be one of .*, got 'sometimes'"):
        MambaManager(spec, pool, enable_caching=True, kv_cache_group_id=0, scheduler_block_size=4)


def test_unknown_spec_type():
    class Sink(KVCacheSpec):
        pass

    with refused(r"no KV-cache manager for Sink", error=RuleTypeError):
        get_manager_for_kv_cache_spec(Sink(block_size=4), 64, 64)


def test_kv_cache_config_type():
    with refused(r"kv_cache_config must be a KVCacheConfig", error=RuleTypeError):
        get_kv_cache_coordinator([], 64, 64, False, True, False, 1, 1, 4, 4)


def test_zero_groups_without_caching_is_fine():
    m = KVCacheManager(KVCacheConfig(num_blocks=4), 64, 4, 4, enable_caching=False)
    assert m.get_computed_blocks(None) == (m.empty_kv_cache_blocks, 0)
