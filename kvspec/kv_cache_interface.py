"""What a model's KV cache looks like: per-layer specs, groups, the config.

Names, fields and constructors follow vLLM 0.25.1's
``vllm.v1.kv_cache_interface`` so configs written for vLLM build here
unchanged.  This is data, shared by :mod:`kvspec.spec` and
:mod:`kvspec.impl`; the behaviour each spec implies (how many blocks a
request needs, which blocks a hit may use) lives in the managers.

The kinds of attention, as the block manager sees them:

- **full attention** (``FullAttentionSpec``, and ``MLAAttentionSpec`` for
  DeepSeek's compressed latent cache): every token's KV is kept until the
  request ends; a prefix hit is any run of cached blocks from the start.
- **sliding window** (``SlidingWindowSpec``): a token attends to the last
  ``sliding_window`` tokens only, so blocks that fall out of the window are
  freed (their slot keeps the null block), and a hit needs only the blocks of
  the last window before the hit boundary.
- **chunked local** (``ChunkedLocalAttentionSpec``): tokens attend within
  their ``attention_chunk_size`` chunk; earlier chunks are freed.
- **Mamba** (``MambaSpec``): a state-space layer keeps one recurrent state
  per request, not per token; with prefix caching (``mamba_cache_mode``
  ``"all"`` or ``"align"``) the state at a block boundary is cached.
- **cross attention** (``CrossAttentionSpec``): an encoder-decoder model's
  decoder reads the encoder's KV; allocated per request, never cached.

Layers with the same spec form a **KV-cache group** sharing one block table.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from math import prod
from typing import Any

from kvspec.errors import RuleError

_DTYPE_BYTES = {
    "float32": 4, "float": 4, "fp32": 4,
    "float16": 2, "half": 2, "fp16": 2, "bfloat16": 2, "bf16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1, "int8": 1, "uint8": 1,
}


def get_dtype_size(dtype: Any) -> int:
    """Bytes per element of ``dtype``: a ``torch.dtype`` (anything with
    ``itemsize``) or a name such as ``"bfloat16"``."""
    itemsize = getattr(dtype, "itemsize", None)
    if isinstance(itemsize, int):
        return itemsize
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; use a torch.dtype or one of {sorted(_DTYPE_BYTES)}")
    return _DTYPE_BYTES[name]


def cdiv(a: int, b: int) -> int:
    """Ceiling division: blocks needed for ``a`` tokens of ``b`` per block."""
    return -(a // -b)


def _positive(name: str, value: Any) -> None:
    if type(value) is not int or value <= 0:
        raise RuleError("block-size-coherence", f"{name} must be a positive int, got {value!r}")


class KVCacheSpecKind(StrEnum):
    FULL_ATTENTION = "full_attention"
    MLA_ATTENTION = "mla_attention"
    SLIDING_WINDOW = "sliding_window"
    CHUNKED_LOCAL_ATTENTION = "chunked_local_attention"
    MAMBA = "mamba"
    CROSS_ATTENTION = "cross_attention"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class KVCacheSpec:
    """The KV-cache format of one layer: at least its block size in tokens."""

    block_size: int

    def __post_init__(self) -> None:
        _positive("block_size", self.block_size)

    @property
    def page_size_bytes(self) -> int:
        raise NotImplementedError

    def copy_with_new_block_size(self, block_size: int) -> KVCacheSpec:
        return replace(self, block_size=block_size)

    @classmethod
    def merge(cls, specs: list[KVCacheSpec]) -> KVCacheSpec:
        """One spec for a group of layers; they must all be equal."""
        if not specs or any(s != specs[0] for s in specs[1:]):
            raise ValueError("all layers in one KV-cache group must have the same spec")
        return specs[0]


@dataclass(frozen=True, kw_only=True)
class AttentionSpec(KVCacheSpec):
    num_kv_heads: int
    head_size: int
    dtype: Any

    @property
    def page_size_bytes(self) -> int:
        """K and V for ``block_size`` tokens."""
        return 2 * self.block_size * self.num_kv_heads * self.head_size * get_dtype_size(self.dtype)


@dataclass(frozen=True, kw_only=True)
class FullAttentionSpec(AttentionSpec):
    """Every token is kept.  ``sliding_window`` / ``attention_chunk_size``
    only record what the kernel computes when the hybrid allocator is off."""

    head_size_v: int | None = None
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    non_causal: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.head_size_v is None:
            object.__setattr__(self, "head_size_v", self.head_size)

    @property
    def page_size_bytes(self) -> int:
        return (
            self.block_size * self.num_kv_heads * (self.head_size + self.head_size_v) * get_dtype_size(self.dtype)
        )


@dataclass(frozen=True, kw_only=True)
class MLAAttentionSpec(FullAttentionSpec):
    """DeepSeek-style multi-head latent attention: one compressed latent per
    token instead of K and V (so the page holds one vector per token)."""

    cache_dtype_str: str | None = None
    compress_ratio: int = 1

    @property
    def page_size_bytes(self) -> int:
        return self.block_size * self.num_kv_heads * self.head_size * get_dtype_size(self.dtype)


@dataclass(frozen=True, kw_only=True)
class SlidingWindowSpec(AttentionSpec):
    sliding_window: int
    head_size_v: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("sliding_window", self.sliding_window)
        if self.head_size_v is None:
            object.__setattr__(self, "head_size_v", self.head_size)

    def max_admission_blocks_per_request(self, max_num_batched_tokens: int, max_model_len: int) -> int:
        """At most the last ``sliding_window - 1`` computed tokens plus one
        step's tokens are held, plus one block because the window need not
        start at a block boundary."""
        tokens = min(self.sliding_window - 1 + max_num_batched_tokens, max_model_len)
        return cdiv(tokens, self.block_size) + 1


@dataclass(frozen=True, kw_only=True)
class ChunkedLocalAttentionSpec(AttentionSpec):
    attention_chunk_size: int

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("attention_chunk_size", self.attention_chunk_size)

    def max_admission_blocks_per_request(self, max_num_batched_tokens: int, max_model_len: int) -> int:
        """At most one chunk plus one step's tokens are held."""
        return cdiv(min(self.attention_chunk_size + max_num_batched_tokens, max_model_len), self.block_size)


MAMBA_CACHE_MODES = ("none", "all", "align")


@dataclass(frozen=True)
class MambaSpec(KVCacheSpec):
    """A recurrent state per request.  ``mamba_cache_mode``: ``"none"`` keeps
    only the running state (no prefix caching), ``"all"`` caches the state at
    every block boundary, ``"align"`` only at boundaries a prefill chunk ends
    on.  ``num_speculative_blocks`` extra states hold draft tokens."""

    shapes: tuple[tuple[int, ...], ...] = ((1,),)
    dtypes: tuple[Any, ...] = ("float32",)
    page_size_padded: int | None = None
    mamba_type: str = "mamba2"
    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mamba_cache_mode not in MAMBA_CACHE_MODES:
            raise ValueError(f"mamba_cache_mode must be one of {MAMBA_CACHE_MODES}, got {self.mamba_cache_mode!r}")
        if type(self.num_speculative_blocks) is not int or self.num_speculative_blocks < 0:
            raise ValueError(f"num_speculative_blocks must be an int >= 0, got {self.num_speculative_blocks!r}")

    @property
    def page_size_bytes(self) -> int:
        size = sum(prod(shape) * get_dtype_size(dtype) for shape, dtype in zip(self.shapes, self.dtypes, strict=True))
        return self.page_size_padded if self.page_size_padded is not None else size


@dataclass(frozen=True, kw_only=True)
class CrossAttentionSpec(AttentionSpec):
    """The decoder's view of the encoder output (Whisper): per request, never cached."""


_SPEC_NAMES: dict[type, frozenset[str]] = {}


def spec_is(spec: Any, *classes: type) -> bool:
    """Whether ``spec`` is one of these spec classes -- by class name along
    its MRO, so that vLLM's own spec objects (same names, same fields)
    count as kvspec's: managers built from a vLLM ``KVCacheConfig`` work
    unchanged."""
    names = _SPEC_NAMES.get(type(spec))
    if names is None:
        names = _SPEC_NAMES[type(spec)] = frozenset(c.__name__ for c in type(spec).__mro__)
    return any(c.__name__ in names for c in classes)


def get_kv_cache_spec_kind(spec: KVCacheSpec) -> KVCacheSpecKind:
    for cls, kind in (
        (MLAAttentionSpec, KVCacheSpecKind.MLA_ATTENTION),
        (FullAttentionSpec, KVCacheSpecKind.FULL_ATTENTION),
        (ChunkedLocalAttentionSpec, KVCacheSpecKind.CHUNKED_LOCAL_ATTENTION),
        (SlidingWindowSpec, KVCacheSpecKind.SLIDING_WINDOW),
        (MambaSpec, KVCacheSpecKind.MAMBA),
        (CrossAttentionSpec, KVCacheSpecKind.CROSS_ATTENTION),
    ):
        if spec_is(spec, cls):
            return kind
    return KVCacheSpecKind.UNKNOWN


def get_kv_cache_spec_sliding_window(spec: KVCacheSpec) -> int | None:
    return spec.sliding_window if spec_is(spec, SlidingWindowSpec) else None


@dataclass
class KVCacheTensor:
    """How a worker lays out one KV-cache tensor (carried, not used here)."""

    size: int
    shared_by: list[str]
    offset: int = 0
    block_stride: int = 0


@dataclass
class KVCacheGroupSpec:
    """Layers that share one block table."""

    layer_names: list[str]
    kv_cache_spec: KVCacheSpec
    is_eagle_group: bool = False


@dataclass
class KVCacheConfig:
    """The KV cache of a model: the number of blocks in the pool (the null
    block included) and its groups."""

    num_blocks: int
    kv_cache_tensors: list[KVCacheTensor] = field(default_factory=list)
    kv_cache_groups: list[KVCacheGroupSpec] = field(default_factory=list)

    def __post_init__(self) -> None:
        if type(self.num_blocks) is not int or self.num_blocks < 1:
            raise RuleError("null-exclusion", f"num_blocks must be an int >= 1, got {self.num_blocks!r}")

    @property
    def has_mamba_layers(self) -> bool:
        return any(spec_is(g.kv_cache_spec, MambaSpec) for g in self.kv_cache_groups)
