"""Model layouts: every architecture's groups, block sizes and pool come out
as vLLM 0.25.1 forms them, and the scaled copies keep that structure."""

import pytest

from kvspec.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheGroupSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from kvspec.models.architectures import (
    ARCHITECTURES,
    architecture,
    kv_cache_config,
    layer_specs,
    scaled,
    tiny,
)
from kvspec.models.architectures import setup as model_setup  # a module-level "setup" is pytest 8.0's xunit hook
from kvspec.models.grouping import get_kv_cache_groups, group_size, kv_cache_config_from_groups, unify_page_sizes

GiB = 1 << 30

# (kinds of the groups in order, block sizes) as vLLM 0.25.1 groups the full models: checked by hand from
# the published layer counts and, where vLLM is installed, by tests/test_models_vs_vllm.py.
EXPECTED = {
    "llama-3-8b": ([FullAttentionSpec], [16]),
    "mistral-7b": ([SlidingWindowSpec], [16]),
    "gemma-3": ([SlidingWindowSpec] * 6 + [FullAttentionSpec], [16] * 7),  # 52 local / 10 global: groups of 10
    "gpt-oss": ([SlidingWindowSpec, FullAttentionSpec], [16, 16]),  # 12 + 12
    "llama-4-scout": ([ChunkedLocalAttentionSpec] * 3 + [FullAttentionSpec], [16] * 4),  # 36 chunked / 12 global
    "nemotron-h-8b": ([MambaSpec] * 6 + [FullAttentionSpec], [8192] * 6 + [1040]),  # 24 Mamba / 4 attention
    "deepseek-v3": ([MLAAttentionSpec], [16]),
    "whisper": ([FullAttentionSpec, CrossAttentionSpec], [16, 16]),
}


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_groups_as_vllm_forms_them(name):
    config = kv_cache_config(architecture(name), memory_bytes=40 * GiB)
    kinds, block_sizes = EXPECTED[name]
    assert [type(g.kv_cache_spec) for g in config.kv_cache_groups] == kinds
    assert [g.kv_cache_spec.block_size for g in config.kv_cache_groups] == block_sizes
    # every layer in exactly one group, every group's pages the same size
    layers = [n for g in config.kv_cache_groups for n in g.layer_names]
    assert sorted(layers) == sorted(layer_specs(architecture(name)))
    assert len({g.kv_cache_spec.page_size_bytes for g in config.kv_cache_groups}) == 1


def test_pool_size_from_memory():
    """Llama-3-8B: a 16-token bf16 block of one layer is 2 x 16 x 8 x 128 x 2 = 64 KiB; 32 layers share
    a block id, so 40 GiB hold 40 GiB / (64 KiB x 32) = 20480 blocks."""
    config = kv_cache_config(architecture("llama-3-8b"), memory_bytes=40 * GiB)
    assert config.kv_cache_groups[0].kv_cache_spec.page_size_bytes == 64 * 1024
    assert config.num_blocks == 20480
    assert len(config.kv_cache_tensors) == 32


def test_hybrid_mamba_block_size():
    """Nemotron-H-8B: a Mamba-2 state is 3 x 10240 bf16 + 128 x 64 x 128 fp32 = 4,255,744 bytes; an attention
    token is 4096 bytes: without prefix caching the attention block grows to 16 x ceil(4255744 / 65536) =
    1040 tokens, with it (mode "all") to the chunk multiple 128 x ceil(1039 / 128) = 1152, and the Mamba
    page is padded to the attention page."""
    arch = architecture("nemotron-h-8b")
    assert arch.mamba.page_size_bytes() == 4_255_744
    off = kv_cache_config(arch, num_blocks=10, prefix_caching=False).kv_cache_groups
    on = kv_cache_config(arch, num_blocks=10, prefix_caching=True).kv_cache_groups
    assert off[-1].kv_cache_spec.block_size == 1040 and off[0].kv_cache_spec.mamba_cache_mode == "none"
    assert on[-1].kv_cache_spec.block_size == 1152 and on[0].kv_cache_spec.block_size == 1152
    assert on[0].kv_cache_spec.mamba_cache_mode == "all"
    assert on[0].kv_cache_spec.page_size_bytes == on[-1].kv_cache_spec.page_size_bytes == 1152 * 4096


def test_layers_split_round_robin():
    """Layer i of a kind goes to group i mod n, so pipeline stages stay balanced (vLLM's rule)."""
    groups = kv_cache_config(architecture("gemma-3"), num_blocks=8).kv_cache_groups
    sliding = [g for g in groups if isinstance(g.kv_cache_spec, SlidingWindowSpec)]
    assert sliding[0].layer_names[:2] == ["layers.0.sliding", "layers.7.sliding"]
    assert [len(g.layer_names) for g in sliding] == [9, 9, 9, 9, 8, 8]


def test_group_size_rule():
    assert group_size([12, 13]) == 13  # gpt-oss + a drafter layer: pad to the larger
    assert group_size([10, 52]) == 10
    assert group_size([4, 24]) == 4


def test_page_sizes_that_cannot_be_unified_are_refused():
    a = FullAttentionSpec(block_size=16, num_kv_heads=3, head_size=64, dtype="bfloat16")
    b = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype="bfloat16")
    with pytest.raises(ValueError, match="does not divide"):
        unify_page_sizes({"a": a, "b": b})


def test_smaller_pages_get_bigger_blocks():
    a = FullAttentionSpec(block_size=16, num_kv_heads=4, head_size=64, dtype="bfloat16")
    b = SlidingWindowSpec(block_size=16, num_kv_heads=2, head_size=64, dtype="bfloat16", sliding_window=128)
    unified = unify_page_sizes({"a": a, "b": b})
    assert unified["b"].block_size == 32 and unified["a"] is a


def test_config_needs_one_size_argument():
    groups = [KVCacheGroupSpec(["x"], FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype="fp16"))]
    with pytest.raises(ValueError, match="exactly one"):
        kv_cache_config_from_groups(groups)
    assert kv_cache_config_from_groups([], num_blocks=5).num_blocks == 1  # attention-free: the null block
    assert get_kv_cache_groups({}) == []


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_scaled_copies_keep_the_structure(name):
    full = kv_cache_config(architecture(name), num_blocks=1)
    small = scaled(full, num_blocks=50)
    little = tiny(full)
    for copy in (small, little):
        assert [type(g.kv_cache_spec) for g in copy.kv_cache_groups] == [type(g.kv_cache_spec)
                                                                          for g in full.kv_cache_groups]
        assert all(len(g.layer_names) == 1 for g in copy.kv_cache_groups)
    assert [g.kv_cache_spec.block_size for g in small.kv_cache_groups] == [g.kv_cache_spec.block_size
                                                                           for g in full.kv_cache_groups]
    for a, b in zip(full.kv_cache_groups, small.kv_cache_groups, strict=True):
        assert getattr(a.kv_cache_spec, "sliding_window", None) == getattr(b.kv_cache_spec, "sliding_window", None)
    sizes = {g.kv_cache_spec.block_size for g in little.kv_cache_groups
             if not (isinstance(g.kv_cache_spec, MambaSpec) and g.kv_cache_spec.mamba_cache_mode == "none")}
    assert min(sizes) == 2


@pytest.mark.parametrize("name", ARCHITECTURES)
@pytest.mark.parametrize("scale", ["tiny", "small"])
def test_setups_build_managers(name, scale):
    from kvspec.impl import KVCacheManager

    s = model_setup(name, scale)
    layout = s.layout
    manager = KVCacheManager(layout.kv_cache_config(), layout.max_model_len, layout.scheduler_block_size,
                             layout.hash_block_size, enable_caching=layout.enable_caching)
    assert manager.block_pool.get_num_free_blocks() == layout.num_blocks - 1


def test_unknown_model_and_scale():
    with pytest.raises(ValueError, match="no model named 'gpt-5'"):
        model_setup("gpt-5")
    with pytest.raises(ValueError, match="unknown scale"):
        model_setup("gpt-oss", "huge")
