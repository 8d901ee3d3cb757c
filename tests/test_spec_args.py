"""The attention specs take vLLM 0.25.1's constructor arguments --
``kv_quant_mode``, ``page_size_padded``, ``indexes_kv_by_block_stride`` --
and size their pages as vLLM does (compared with vLLM's own specs where it
is installed); none of them changes which blocks a request holds."""

from __future__ import annotations

import itertools

import pytest

from kvspec.hashing import get_request_block_hasher
from kvspec.impl import KVCacheManager
from kvspec.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVQuantMode,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from kvspec.request import Request

SPECS = {
    "FullAttentionSpec": (FullAttentionSpec, {}),
    "FullAttentionSpec(head_size_v)": (FullAttentionSpec, {"head_size_v": 32}),
    "MLAAttentionSpec": (MLAAttentionSpec, {}),
    "SlidingWindowSpec": (SlidingWindowSpec, {"sliding_window": 128}),
    "ChunkedLocalAttentionSpec": (ChunkedLocalAttentionSpec, {"attention_chunk_size": 256}),
    "CrossAttentionSpec": (CrossAttentionSpec, {}),
}


def _spec(module, name: str, mode: int, padded: int | None = None, dtype="bfloat16"):
    cls_name = name.split("(")[0]
    kwargs = dict(SPECS[name][1])
    if module is not None:  # vLLM's classes want a torch dtype and its own enum
        import torch

        dtype = getattr(torch, dtype)
        mode = module.KVQuantMode(mode)
    cls = getattr(module, cls_name) if module is not None else SPECS[name][0]
    return cls(block_size=16, num_kv_heads=4, head_size=64, dtype=dtype, kv_quant_mode=mode,
               page_size_padded=padded, indexes_kv_by_block_stride=True, **kwargs)


def test_page_sizes_by_hand():
    full = FullAttentionSpec(block_size=16, num_kv_heads=4, head_size=64, dtype="bfloat16")
    assert full.page_size_bytes == 16 * 4 * 128 * 2
    int4 = FullAttentionSpec(block_size=16, num_kv_heads=4, head_size=64, dtype="int8",
                             kv_quant_mode=KVQuantMode.INT4_PER_TOKEN_HEAD)
    # Two int4 values per byte, plus a float32 scale per token and head for K and for V.
    assert int4.page_size_bytes == 16 * 4 * 64 * 1 + 2 * 16 * 4 * 4
    nvfp4 = FullAttentionSpec(block_size=16, num_kv_heads=4, head_size=64, dtype="uint8",
                              kv_quant_mode=KVQuantMode.NVFP4)
    assert nvfp4.page_size_bytes == 16 * 4 * 2 * (32 + 4)
    padded = FullAttentionSpec(block_size=16, num_kv_heads=4, head_size=64, dtype="bfloat16",
                               page_size_padded=20000)
    assert padded.page_size_bytes == 20000 and padded.real_page_size_bytes == 16384


@pytest.mark.parametrize(("bad", "message"), [
    ({"kv_quant_mode": 9}, "kv_quant_mode must be a KVQuantMode"),
    ({"kv_quant_mode": "fp8"}, "kv_quant_mode must be a KVQuantMode"),
    ({"page_size_padded": 100}, "page_size_padded must be an int >= the page's 16384 bytes"),
    ({"page_size_padded": 20000.0}, "page_size_padded must be an int"),
])
def test_bad_arguments_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        FullAttentionSpec(block_size=16, num_kv_heads=4, head_size=64, dtype="bfloat16", **bad)


def test_the_arguments_leave_allocation_alone():
    """A padded, quantized spec allocates exactly as the plain one."""
    tables = []
    for extra in ({}, {"kv_quant_mode": KVQuantMode.FP8_PER_TOKEN_HEAD, "page_size_padded": 1 << 20,
                       "indexes_kv_by_block_stride": True}):
        spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16", **extra)
        config = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)])
        manager = KVCacheManager(config, 64, 4, 4)
        request = Request("r", list(range(10)), block_hasher=get_request_block_hasher(4))
        tables.append(manager.allocate_slots(request, 10).get_block_ids())
    assert tables[0] == tables[1]


@pytest.mark.parametrize(("name", "mode"), list(itertools.product(sorted(SPECS), list(KVQuantMode))))
def test_page_sizes_are_vllms(name, mode):
    vllm_interface = pytest.importorskip("vllm.v1.kv_cache_interface")
    ours, theirs = _spec(None, name, mode), _spec(vllm_interface, name, mode)
    assert ours.real_page_size_bytes == theirs.real_page_size_bytes
    assert ours.page_size_bytes == theirs.page_size_bytes
    padded = theirs.page_size_bytes + 4096
    assert _spec(None, name, mode, padded).page_size_bytes == _spec(vllm_interface, name, mode, padded).page_size_bytes
    assert ours.kv_quant_mode == theirs.kv_quant_mode and ours.indexes_kv_by_block_stride
