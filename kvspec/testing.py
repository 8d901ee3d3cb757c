"""Building blocks for tests and layouts: one KV-cache spec constructor per
attention kind, a config of several groups, and prompt embeddings as bytes.

Every call states its block size (and window, chunk or Mamba mode): the
numbers a test depends on are read at the call, not looked up in a default
somewhere else.  The attention geometry (one KV head of 8 values, float16)
only sizes pages; pass ``num_kv_heads``/``head_size``/``dtype`` where a test
needs real ones.
"""

from __future__ import annotations

import hashlib
from typing import Any

from kvspec.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    RSWASpec,
    SlidingWindowSpec,
)
from kvspec.spec.layout import Layout

GEOMETRY: dict[str, Any] = {"num_kv_heads": 1, "head_size": 8, "dtype": "float16"}


def full(block_size: int, **geometry: Any) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=block_size, **{**GEOMETRY, **geometry})


def mla(block_size: int, **geometry: Any) -> MLAAttentionSpec:
    return MLAAttentionSpec(block_size=block_size, **{**GEOMETRY, **geometry})


def swa(block_size: int, window: int, **geometry: Any) -> SlidingWindowSpec:
    return SlidingWindowSpec(block_size=block_size, sliding_window=window, **{**GEOMETRY, **geometry})


def rswa(block_size: int, window: int, **geometry: Any) -> RSWASpec:
    return RSWASpec(block_size=block_size, rswa_window=window, **{**GEOMETRY, **geometry})


def chunked(block_size: int, chunk: int, **geometry: Any) -> ChunkedLocalAttentionSpec:
    return ChunkedLocalAttentionSpec(block_size=block_size, attention_chunk_size=chunk, **{**GEOMETRY, **geometry})


def mamba(block_size: int, mode: str, speculative: int = 0, **state: Any) -> MambaSpec:
    return MambaSpec(block_size=block_size, mamba_cache_mode=mode, num_speculative_blocks=speculative, **state)


def cross(block_size: int, **geometry: Any) -> CrossAttentionSpec:
    return CrossAttentionSpec(block_size=block_size, **{**GEOMETRY, **geometry})


def config(*specs: KVCacheSpec, num_blocks: int = 16, eagle_groups: tuple[int, ...] = ()) -> KVCacheConfig:
    """One group per spec (one layer each, ``layer.i``); the groups in
    ``eagle_groups`` are the drafter's."""
    return Layout(specs, num_blocks, eagle_groups=eagle_groups).kv_cache_config()


def embedding_rows(source: str, length: int) -> list[bytes]:
    """Prompt embeddings as raw rows (8 bytes a token), a fixed function of
    their source and position: a stand-in for a tensor, hashed byte for byte."""
    return [hashlib.blake2b(f"{source}:{p}".encode(), digest_size=8).digest() for p in range(length)]
