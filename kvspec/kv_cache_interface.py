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
- **reference sliding window** (``RSWASpec``): the prompt stays visible,
  generated tokens only within ``rswa_window``; blocks between the prompt and
  the window are freed as decoding moves on.
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
from enum import IntEnum, StrEnum
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


class AttentionKind(StrEnum):
    """kvspec's one vocabulary of attention kinds: what a group's layers
    are, named as the spec, the views, impl's manager map and the adapters
    name them.  :func:`attention_kind` is the one place a spec is sorted
    into a kind; :func:`managed_kind` folds in the kinds whose blocks are
    managed as another's."""

    FULL_ATTENTION = "full_attention"
    MLA_ATTENTION = "mla_attention"  # a latent per token; its blocks are kept as full attention's
    RSWA = "rswa"  # reference sliding window: the prompt stays, generated tokens slide
    SLIDING_WINDOW = "sliding_window"
    CHUNKED_LOCAL_ATTENTION = "chunked_local_attention"
    MAMBA = "mamba"
    CROSS_ATTENTION = "cross_attention"


class KVCacheSpecKind(StrEnum):
    """vLLM's names for a group's kind in KV-cache event metadata (its API;
    RSWA reports as full attention there).  See :data:`EVENT_KIND`."""

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


class KVQuantMode(IntEnum):
    """How the KV cache is quantized (vLLM's values: a vLLM ``KVQuantMode``
    compares equal to kvspec's).  It changes the bytes per head in a page,
    so the page size; the block manager never looks at it."""

    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4  # two values per byte
    NVFP4 = 5  # fp4 values plus one fp8 scale per 16 of them

    @property
    def is_per_token_head(self) -> bool:
        """A float32 scale per token and head, for K and for V, in the page too."""
        return self in (KVQuantMode.INT8_PER_TOKEN_HEAD, KVQuantMode.FP8_PER_TOKEN_HEAD,
                        KVQuantMode.INT4_PER_TOKEN_HEAD)

    def head_bytes(self, head_size: int) -> int:
        """Elements stored per head of ``head_size`` (each of the spec's dtype)."""
        if self is KVQuantMode.NVFP4:
            return head_size // 2 + head_size // 16
        if self is KVQuantMode.INT4_PER_TOKEN_HEAD:
            return head_size // 2
        return head_size


@dataclass(frozen=True, kw_only=True)
class AttentionSpec(KVCacheSpec):
    """Attention's KV for ``block_size`` tokens per page.

    ``kv_quant_mode`` sets the bytes per head (``KVQuantMode``);
    ``page_size_padded`` pads the page to a larger size (alignment, or one
    size for every group); ``indexes_kv_by_block_stride`` records how the
    attention backend addresses pages.  As in vLLM, none of them changes
    which blocks a request holds."""

    num_kv_heads: int
    head_size: int
    dtype: Any
    kv_quant_mode: KVQuantMode = KVQuantMode.NONE
    page_size_padded: int | None = None
    indexes_kv_by_block_stride: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            mode = KVQuantMode(self.kv_quant_mode)
        except ValueError:
            raise ValueError(f"kv_quant_mode must be a KVQuantMode, got {self.kv_quant_mode!r}") from None
        object.__setattr__(self, "kv_quant_mode", mode)
        padded = self.page_size_padded
        if padded is not None and (type(padded) is not int or padded < self._unpadded_page_size_bytes()):
            raise ValueError(
                f"page_size_padded must be an int >= the page's {self._unpadded_page_size_bytes()} bytes, "
                f"got {padded!r}"
            )

    @property
    def real_page_size_bytes(self) -> int:
        """K and V for ``block_size`` tokens, without scales or padding."""
        head = self.kv_quant_mode.head_bytes(self.head_size)
        return 2 * self.block_size * self.num_kv_heads * head * get_dtype_size(self.dtype)

    def _unpadded_page_size_bytes(self) -> int:
        size = self.real_page_size_bytes
        if self.kv_quant_mode.is_per_token_head:  # the scales share the page's memory
            size += 2 * self.block_size * self.num_kv_heads * 4
        return size

    @property
    def page_size_bytes(self) -> int:
        """The page: K and V, per-token-head scales, padding."""
        return self.page_size_padded if self.page_size_padded is not None else self._unpadded_page_size_bytes()


@dataclass(frozen=True, kw_only=True)
class FullAttentionSpec(AttentionSpec):
    """Every token is kept.  ``sliding_window`` / ``attention_chunk_size``
    only record what the kernel computes when the hybrid allocator is off."""

    head_size_v: int | None = None
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    non_causal: bool = False

    def __post_init__(self) -> None:
        if self.head_size_v is None:
            object.__setattr__(self, "head_size_v", self.head_size)
        super().__post_init__()

    @property
    def real_page_size_bytes(self) -> int:
        mode = self.kv_quant_mode
        last_dim = mode.head_bytes(self.head_size) + mode.head_bytes(self.head_size_v)
        return self.block_size * self.num_kv_heads * last_dim * get_dtype_size(self.dtype)


@dataclass(frozen=True, kw_only=True)
class RSWASpec(FullAttentionSpec):
    """Reference sliding-window attention: the prompt stays visible to
    every later token, generated tokens only to the next ``rswa_window``.
    Allocated and hit like full attention; the blocks between the prompt
    and the window (the gap) are released as decoding moves on."""

    rswa_window: int

    def __post_init__(self) -> None:
        _positive("rswa_window", self.rswa_window)
        super().__post_init__()


@dataclass(frozen=True, kw_only=True)
class MLAAttentionSpec(FullAttentionSpec):
    """DeepSeek-style multi-head latent attention: one compressed latent per
    token instead of K and V (so the page holds one vector per token)."""

    cache_dtype_str: str | None = None
    compress_ratio: int = 1

    @property
    def real_page_size_bytes(self) -> int:
        """One latent per token (``block_size // compress_ratio`` stored);
        ``fp8_ds_mla`` is DeepSeek-V3.2's 656-byte layout per token; NVFP4
        does not apply to the latent."""
        if self.cache_dtype_str == "fp8_ds_mla":
            return self.block_size * 656
        head = self.head_size // 2 if self.kv_quant_mode is KVQuantMode.INT4_PER_TOKEN_HEAD else self.head_size
        return self.block_size // self.compress_ratio * self.num_kv_heads * head * get_dtype_size(self.dtype)


@dataclass(frozen=True, kw_only=True)
class SlidingWindowSpec(AttentionSpec):
    sliding_window: int
    head_size_v: int | None = None

    def __post_init__(self) -> None:
        _positive("sliding_window", self.sliding_window)
        if self.head_size_v is None:
            object.__setattr__(self, "head_size_v", self.head_size)
        super().__post_init__()

    @property
    def real_page_size_bytes(self) -> int:
        """K and V (``head_size_v`` wide); quantized only as NVFP4 (vLLM's rule)."""
        mode = self.kv_quant_mode if self.kv_quant_mode is KVQuantMode.NVFP4 else KVQuantMode.NONE
        last_dim = mode.head_bytes(self.head_size) + mode.head_bytes(self.head_size_v)
        return self.block_size * self.num_kv_heads * last_dim * get_dtype_size(self.dtype)

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


def attention_kind(spec: KVCacheSpec) -> AttentionKind | None:
    """The kind of ``spec`` (None for a spec kvspec does not know).  The
    most specific class wins: RSWA and MLA are full attention's subclasses.
    Classes are matched by name (:func:`spec_is`), so vLLM's own specs sort
    the same."""
    for cls, kind in KIND_OF_CLASS:
        if spec_is(spec, cls):
            return kind
    return None


def managed_kind(spec: KVCacheSpec) -> AttentionKind | None:
    """The kind whose rules keep ``spec``'s blocks: MLA's are full
    attention's (a latent instead of K and V, the same blocks)."""
    kind = attention_kind(spec)
    return AttentionKind.FULL_ATTENTION if kind is AttentionKind.MLA_ATTENTION else kind


def get_kv_cache_spec_kind(spec: KVCacheSpec) -> KVCacheSpecKind:
    """vLLM's event-metadata name for ``spec``'s kind."""
    kind = attention_kind(spec)
    return KVCacheSpecKind.UNKNOWN if kind is None else EVENT_KIND[kind]


def get_kv_cache_spec_sliding_window(spec: KVCacheSpec) -> int | None:
    return spec.sliding_window if spec_is(spec, SlidingWindowSpec) else None


def event_metadata(spec: KVCacheSpec) -> tuple[str, int | None]:
    """What a manager's ``Stored`` events say about their group: the kind of
    its spec (vLLM's name) and its sliding window, if it has one -- so that
    a consumer of the events can tell the groups apart as it learns them."""
    return get_kv_cache_spec_kind(spec).value, get_kv_cache_spec_sliding_window(spec)


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


def has_drafter(kv_cache_config: Any, use_eagle: bool) -> bool:
    """Whether a drafter (EAGLE) reads this model's KV cache: ``use_eagle``,
    or a group marked as the drafter's.  (vLLM's coordinator asks whether
    its EAGLE groups, Mamba ones included, are any; :func:`eagle_group_ids`
    leaves Mamba groups out, so it can be empty where this is true.)"""
    return use_eagle or any(g.is_eagle_group for g in kv_cache_config.kv_cache_groups)


def eagle_group_ids(kv_cache_config: Any, use_eagle: bool, *, drop_needs_use_eagle: bool = False) -> set[int]:
    """The groups whose hits drop the EAGLE block: those marked as the
    drafter's (``is_eagle_group``), or every group when ``use_eagle`` is set
    and none is marked -- never a Mamba group -- and, in a model of several
    groups, every group whose spec equals a marked one's (the hybrid lookup
    searches equal specs together, with one drop).

    Draft models have no Mamba layers and a Mamba hit (one state block) has
    nothing to drop.  vLLM 0.25.1 marks Mamba groups too when it falls back
    to "every group", and its hybrid search then looks one block *past* the
    candidate for them, for a drop that never comes: the Mamba hit can
    outrun the candidate and the full-attention blocks (rule hit-soundness,
    finding F7).  Excluding them keeps every other layout exactly as vLLM's.
    This is the one place the set is derived: the spec, impl and the rules
    all ask here.

    ``drop_needs_use_eagle`` (release delta eagle-drop-needs-use-eagle, vLLM
    0.33): the marks alone drop nothing -- without ``use_eagle`` (which 0.33's
    scheduler clears when block hashes cover the drafter's lookahead) no
    group drops; the base drops for marked groups whatever ``use_eagle`` says."""
    if drop_needs_use_eagle and not use_eagle:
        return set()
    groups = kv_cache_config.kv_cache_groups
    marked = {i for i, g in enumerate(groups) if g.is_eagle_group}
    if use_eagle and not marked:
        marked = set(range(len(groups)))
    marked = {i for i in marked if not spec_is(groups[i].kv_cache_spec, MambaSpec)}
    if len(groups) > 1:
        marked = {i for i, g in enumerate(groups)
                  if any(groups[j].kv_cache_spec == g.kv_cache_spec for j in marked)}
    return marked


KIND_OF_CLASS: tuple[tuple[type[KVCacheSpec], AttentionKind], ...] = (
    (RSWASpec, AttentionKind.RSWA),
    (MLAAttentionSpec, AttentionKind.MLA_ATTENTION),
    (FullAttentionSpec, AttentionKind.FULL_ATTENTION),
    (SlidingWindowSpec, AttentionKind.SLIDING_WINDOW),
    (ChunkedLocalAttentionSpec, AttentionKind.CHUNKED_LOCAL_ATTENTION),
    (MambaSpec, AttentionKind.MAMBA),
    (CrossAttentionSpec, AttentionKind.CROSS_ATTENTION),
)
KIND_SPEC_CLASSES: tuple[str, ...] = tuple(cls.__name__ for cls, _ in KIND_OF_CLASS)
"""The spec classes kvspec sorts into kinds, by name (for error messages)."""

EVENT_KIND: dict[AttentionKind, KVCacheSpecKind] = {
    **{kind: KVCacheSpecKind(kind.value) for kind in AttentionKind if kind is not AttentionKind.RSWA},
    AttentionKind.RSWA: KVCacheSpecKind.FULL_ATTENTION,
}
"""Each kind as vLLM 0.25.1 names it in event metadata."""
