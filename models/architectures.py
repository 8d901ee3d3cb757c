"""Real models as the KV-cache manager sees them.

Each architecture states its published KV-cache structure -- which layers
keep KV and of what kind, KV heads, head sizes, windows, chunk sizes, Mamba
state shapes, MLA latent sizes, encoder length -- with the source of every
number in a comment.  No weights, no downloads: only the numbers.

:func:`layer_specs` turns an architecture into one KV-cache spec per layer
the way vLLM 0.25.1's layers do (``Attention.get_kv_cache_spec`` and
friends); :func:`kv_cache_config` groups them (:mod:`.grouping`) into the
``KVCacheConfig`` the block manager is built from.  :func:`scaled` keeps a
config's groups, block sizes and windows but makes every group one small
layer (for tests that run kernels), :func:`tiny` also shrinks block sizes and
windows to a few tokens (for the conformance machines).

How vLLM 0.25.1 chooses, where it matters (read from its source):

- full attention and chunked local attention use the cache block size (16 by
  default); **sliding-window layers always use the attention kernel's
  smallest block (16)**, whatever ``--block-size`` says;
- a model whose every layer has one window (Mistral-7B-v0.1) is one
  sliding-window group; a model mixing windowed and global layers keeps both
  kinds (the hybrid KV-cache manager);
- Llama-4's chunked-local layers keep their spec (the hybrid manager stays
  on unless EAGLE or ``VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0``);
- attention sinks (gpt-oss) change the kernel, not the spec;
- MLA caches ``kv_lora_rank + qk_rope_head_dim`` values per token, one
  "head", no separate V (no factor 2 in the page);
- hybrid attention + Mamba models get an attention block size large enough
  that one attention page holds a Mamba state, and Mamba pages padded to
  match (:func:`~.grouping.mamba_aligned_block_size`); their Mamba blocks
  are ``max_model_len`` tokens without prefix caching (mode "none"), the
  attention block size with it (mode "all" where the model supports it,
  "align" otherwise);
- encoder-decoder models run without prefix caching; the decoder's
  cross-attention layers get a ``CrossAttentionSpec`` and the encoder's own
  attention no KV cache at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from math import gcd, prod
from typing import Any

from kvspec.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    cdiv,
    get_dtype_size,
)
from kvspec.models.grouping import (
    get_kv_cache_groups,
    kv_cache_config_from_groups,
    mamba_aligned_block_size,
    pad_mamba_pages,
)
from kvspec.spec.layout import Layout

DEFAULT_BLOCK_SIZE = 16  # vLLM's CacheConfig.DEFAULT_BLOCK_SIZE
KERNEL_BLOCK_ALIGNMENT = 16  # FlashAttention (and Triton, Flex): block sizes MultipleOf(16)
# The kernel block sizes of vLLM 0.25.1's FlashInfer backend (off Blackwell): the attention backend whose
# fixed sizes make vLLM split a larger manager block into kernel blocks (FlashAttention and Triton take any
# multiple of 16, so they read a 1152-token block whole).  At the real block sizes the kernel stage reads
# tables as vLLM does with FlashInfer: select_kernel_block_size over these.
KERNEL_BLOCK_SIZES = (16, 32, 64)

# Layer kinds, as they appear in an architecture's layer list.
FULL, SLIDING, CHUNKED, MLA, MAMBA, CROSS = "full", "sliding", "chunked", "mla", "mamba", "cross"


@dataclass(frozen=True)
class Mamba2:
    """A Mamba-2 mixer's state: a convolution window and an SSM state of
    ``num_heads x head_dim x state_size`` per request."""

    num_heads: int
    head_dim: int
    state_size: int
    num_groups: int
    conv_kernel: int
    chunk_size: int
    conv_dtype: str = "bfloat16"
    ssm_dtype: str = "float32"  # NemotronH's mamba_ssm_cache_dtype default in vLLM

    @property
    def conv_dim(self) -> int:
        return self.num_heads * self.head_dim + 2 * self.num_groups * self.state_size

    def shapes(self) -> tuple[tuple[int, ...], ...]:
        """vLLM's ``mamba2_state_shape`` (one GPU, "SD" conv layout)."""
        return (self.conv_kernel - 1, self.conv_dim), (self.num_heads, self.head_dim, self.state_size)

    def dtypes(self) -> tuple[str, str]:
        return self.conv_dtype, self.ssm_dtype

    def page_size_bytes(self) -> int:
        return sum(prod(s) * get_dtype_size(d) for s, d in zip(self.shapes(), self.dtypes(), strict=True))


@dataclass(frozen=True)
class Architecture:
    """A model's KV-cache structure.  ``layers`` lists, in order, the kind of
    every layer that keeps a KV cache or a state (MLP-only layers omitted)."""

    name: str
    hf_id: str
    source: str
    hf_architecture: str  # config.json's "architectures"[0]: the class vLLM's model registry serves it with
    layers: tuple[str, ...]
    num_heads: int
    num_kv_heads: int
    head_size: int
    dtype: str = "bfloat16"
    max_model_len: int = 8192
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    sinks: bool = False
    mla_latent: int | None = None  # kv_lora_rank
    mla_rope: int | None = None  # qk_rope_head_dim
    mamba: Mamba2 | None = None
    supports_mamba_prefix_caching: bool = False
    num_encoder_tokens: int = 0
    prefix_caching: bool = True  # vLLM's default for the architecture
    notes: tuple[str, ...] = field(default=())
    hf_experts: tuple[tuple[str, int], ...] = ()  # config.json's expert counts (key, value): MoE for vLLM

    def count(self, kind: str) -> int:
        return self.layers.count(kind)


def _pattern(num_layers: int, kind_of: Callable[[int], str]) -> tuple[str, ...]:
    return tuple(kind_of(i) for i in range(num_layers))


# --- the architectures ------------------------------------------------------------------------------------
# Numbers from each model's Hugging Face config.json (read from copies: the hub page itself was not
# reachable here); the reasoning about vLLM's choices from vLLM 0.25.1's model files.

LLAMA_3_8B = Architecture(
    name="llama-3-8b",
    hf_id="meta-llama/Meta-Llama-3-8B",
    # config.json: num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8, hidden_size 4096
    # (head_dim 128), max_position_embeddings 8192, torch_dtype bfloat16.
    source="https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json",
    hf_architecture="LlamaForCausalLM",
    layers=(FULL,) * 32,
    num_heads=32, num_kv_heads=8, head_size=128, max_model_len=8192,
)

MISTRAL_7B = Architecture(
    name="mistral-7b",
    hf_id="mistralai/Mistral-7B-v0.1",
    # config.json: 32 layers, 32 heads, 8 KV heads, hidden 4096 (head_dim 128), sliding_window 4096,
    # max_position_embeddings 32768.  No layer_types: vLLM puts the window on every layer (one group).
    source="https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json",
    hf_architecture="MistralForCausalLM",
    layers=(SLIDING,) * 32,
    num_heads=32, num_kv_heads=8, head_size=128, max_model_len=32768, sliding_window=4096,
)

GEMMA_3_27B = Architecture(
    name="gemma-3",
    hf_id="google/gemma-3-27b-it",
    # text_config: 62 layers, 32 heads, 16 KV heads, head_dim 128, sliding_window 1024; transformers'
    # Gemma3 default sliding_window_pattern 6: layer i is global when (i + 1) % 6 == 0 (10 global, 52 local).
    source="https://huggingface.co/google/gemma-3-27b-it/blob/main/config.json",
    hf_architecture="Gemma3ForConditionalGeneration",
    layers=_pattern(62, lambda i: FULL if (i + 1) % 6 == 0 else SLIDING),
    num_heads=32, num_kv_heads=16, head_size=128, max_model_len=131072, sliding_window=1024,
)

GPT_OSS_20B = Architecture(
    name="gpt-oss",
    hf_id="openai/gpt-oss-20b",
    # config.json: 24 layers, layer_types alternating sliding_attention / full_attention (layer 0
    # sliding), 64 heads, 8 KV heads, head_dim 64, sliding_window 128, max_position_embeddings 131072.
    # Attention sinks: one learned logit per head (a weight, not a config field).
    source="https://huggingface.co/openai/gpt-oss-20b/blob/main/config.json",
    hf_architecture="GptOssForCausalLM", hf_experts=(("num_local_experts", 32),),  # config.json
    layers=_pattern(24, lambda i: SLIDING if i % 2 == 0 else FULL),
    num_heads=64, num_kv_heads=8, head_size=64, max_model_len=131072, sliding_window=128, sinks=True,
)

LLAMA_4_SCOUT = Architecture(
    name="llama-4-scout",
    hf_id="meta-llama/Llama-4-Scout-17B-16E",
    # text_config: 48 layers, 40 heads, 8 KV heads, head_dim 128, attention_chunk_size 8192; transformers'
    # no_rope_layers default: every 4th layer (3, 7, ...) is NoPE and global, the others chunked local.
    source="https://huggingface.co/meta-llama/Llama-4-Scout-17B-16E/blob/main/config.json",
    hf_architecture="Llama4ForConditionalGeneration",
    hf_experts=(("num_local_experts", 16),),  # text_config.num_local_experts
    layers=_pattern(48, lambda i: FULL if (i + 1) % 4 == 0 else CHUNKED),
    num_heads=40, num_kv_heads=8, head_size=128, max_model_len=262144, attention_chunk_size=8192,
)

_NEMOTRON_H_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
NEMOTRON_H_8B = Architecture(
    name="nemotron-h-8b",
    hf_id="nvidia/Nemotron-H-8B-Base-8K",
    # config.json: hybrid_override_pattern (M Mamba-2, * attention, - MLP: 24 M, 4 *, 24 -),
    # 32 heads, 8 KV heads, head_dim 128; mamba_num_heads 128, mamba_head_dim 64, ssm_state_size 128,
    # n_groups 8, conv_kernel 4, chunk_size 128; max_position_embeddings 8192, bfloat16.
    # vLLM: NemotronH supports Mamba prefix caching (mode "all"); hybrid models run without prefix
    # caching unless asked; the SSM state is float32 by default.
    source="https://huggingface.co/nvidia/Nemotron-H-8B-Base-8K/blob/main/config.json",
    hf_architecture="NemotronHForCausalLM",
    layers=tuple(MAMBA if c == "M" else FULL for c in _NEMOTRON_H_PATTERN if c in "M*"),
    num_heads=32, num_kv_heads=8, head_size=128, max_model_len=8192,
    mamba=Mamba2(num_heads=128, head_dim=64, state_size=128, num_groups=8, conv_kernel=4, chunk_size=128),
    supports_mamba_prefix_caching=True, prefix_caching=False,
)

DEEPSEEK_V3 = Architecture(
    name="deepseek-v3",
    hf_id="deepseek-ai/DeepSeek-V3",
    # config.json: 61 layers, 128 heads, kv_lora_rank 512, qk_rope_head_dim 64 (the MLA cache holds
    # 512 + 64 values per token), max_position_embeddings 163840, bfloat16.
    source="https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json",
    hf_architecture="DeepseekV3ForCausalLM", hf_experts=(("n_routed_experts", 256),),  # config.json
    layers=(MLA,) * 61,
    num_heads=128, num_kv_heads=1, head_size=512 + 64, max_model_len=163840, mla_latent=512, mla_rope=64,
)

WHISPER_LARGE_V3 = Architecture(
    name="whisper",
    hf_id="openai/whisper-large-v3",
    # config.json: decoder_layers 32, decoder_attention_heads 20, d_model 1280 (head_dim 64),
    # max_source_positions 1500 (encoder tokens), max_target_positions 448.  Each decoder layer has a
    # self-attention (full) and a cross-attention; the encoder's attention keeps no cache.
    source="https://huggingface.co/openai/whisper-large-v3/blob/main/config.json",
    hf_architecture="WhisperForConditionalGeneration",
    layers=(FULL, CROSS) * 32,
    num_heads=20, num_kv_heads=20, head_size=64, dtype="float16", max_model_len=448,
    num_encoder_tokens=1500, prefix_caching=False,
)

ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in (LLAMA_3_8B, MISTRAL_7B, GEMMA_3_27B, GPT_OSS_20B, LLAMA_4_SCOUT, NEMOTRON_H_8B, DEEPSEEK_V3,
              WHISPER_LARGE_V3)
}


def architecture(name: str) -> Architecture:
    if name not in ARCHITECTURES:
        raise ValueError(f"no model named {name!r}; choose one of {sorted(ARCHITECTURES)}")
    return ARCHITECTURES[name]


# --- from layers to specs to a config ----------------------------------------------------------------------


def mamba_cache_mode(arch: Architecture, prefix_caching: bool) -> str:
    if not prefix_caching:
        return "none"
    return "all" if arch.supports_mamba_prefix_caching else "align"


def attention_block_size(arch: Architecture, block_size: int, prefix_caching: bool) -> int:
    """The block size of the full/chunked attention layers: ``block_size``,
    raised for a hybrid Mamba model until a page holds a state."""
    if arch.mamba is None:
        return block_size
    per_token = FullAttentionSpec(block_size=1, num_kv_heads=arch.num_kv_heads, head_size=arch.head_size,
                                  dtype=arch.dtype).page_size_bytes
    return mamba_aligned_block_size(
        per_token, arch.mamba.page_size_bytes(), block_size=block_size, kernel_alignment=KERNEL_BLOCK_ALIGNMENT,
        mamba_cache_mode=mamba_cache_mode(arch, prefix_caching), mamba_chunk_size=arch.mamba.chunk_size,
    )


def layer_specs(arch: Architecture, *, block_size: int = DEFAULT_BLOCK_SIZE,
                prefix_caching: bool | None = None) -> dict[str, KVCacheSpec]:
    """One KV-cache spec per layer, named ``layers.<i>.<kind>``, as vLLM's
    layers report them (before grouping)."""
    caching = arch.prefix_caching if prefix_caching is None else prefix_caching
    attn_bs = attention_block_size(arch, block_size, caching)
    common = dict(num_kv_heads=arch.num_kv_heads, head_size=arch.head_size, dtype=arch.dtype)
    specs: dict[str, KVCacheSpec] = {}
    mode = mamba_cache_mode(arch, caching)
    for i, kind in enumerate(arch.layers):
        if kind == FULL:
            spec: KVCacheSpec = FullAttentionSpec(block_size=attn_bs, **common)
        elif kind == SLIDING:
            spec = SlidingWindowSpec(block_size=KERNEL_BLOCK_ALIGNMENT, sliding_window=arch.sliding_window, **common)
        elif kind == CHUNKED:
            spec = ChunkedLocalAttentionSpec(block_size=attn_bs, attention_chunk_size=arch.attention_chunk_size,
                                             **common)
        elif kind == MLA:
            spec = MLAAttentionSpec(block_size=attn_bs, **common)
        elif kind == CROSS:
            spec = CrossAttentionSpec(block_size=attn_bs, **common)
        elif kind == MAMBA:
            spec = MambaSpec(
                block_size=attn_bs if mode != "none" else arch.max_model_len,
                shapes=arch.mamba.shapes(), dtypes=arch.mamba.dtypes(), mamba_type="mamba2", mamba_cache_mode=mode,
            )
        else:
            raise ValueError(f"{arch.name}: unknown layer kind {kind!r}")
        specs[f"layers.{i}.{kind}"] = spec
    if arch.mamba is not None:
        attention_page = next(s for s in specs.values() if not isinstance(s, MambaSpec)).page_size_bytes
        specs = pad_mamba_pages(specs, attention_page)
    return specs


def kv_cache_config(arch: Architecture, *, memory_bytes: int | None = None, num_blocks: int | None = None,
                    block_size: int = DEFAULT_BLOCK_SIZE, prefix_caching: bool | None = None) -> KVCacheConfig:
    """The model's ``KVCacheConfig``: its groups, and a pool of
    ``num_blocks`` blocks or as many as ``memory_bytes`` holds."""
    groups = get_kv_cache_groups(layer_specs(arch, block_size=block_size, prefix_caching=prefix_caching))
    return kv_cache_config_from_groups(groups, memory_bytes=memory_bytes, num_blocks=num_blocks)


# --- smaller copies for tests --------------------------------------------------------------------------------

SMALL = dict(num_kv_heads=1, head_size=16)  # attention dims of the scaled copies
SMALL_MLA = (32, 4)  # latent, rope: DeepSeek's 8:1
SMALL_MAMBA = Mamba2(num_heads=2, head_dim=4, state_size=4, num_groups=1, conv_kernel=4, chunk_size=8,
                     conv_dtype="float32")


def _small_spec(spec: KVCacheSpec, dtype: Any) -> KVCacheSpec:
    if isinstance(spec, MLAAttentionSpec):
        return replace(spec, num_kv_heads=1, head_size=sum(SMALL_MLA), head_size_v=sum(SMALL_MLA), dtype=dtype)
    if isinstance(spec, FullAttentionSpec | SlidingWindowSpec):
        return replace(spec, head_size_v=SMALL["head_size"], dtype=dtype, **SMALL)
    if isinstance(spec, ChunkedLocalAttentionSpec | CrossAttentionSpec):
        return replace(spec, dtype=dtype, **SMALL)
    if isinstance(spec, MambaSpec):
        return replace(spec, shapes=SMALL_MAMBA.shapes(), dtypes=(dtype, dtype), page_size_padded=None)
    raise TypeError(f"no small form for {type(spec).__name__}")


def scaled(config: KVCacheConfig, *, num_blocks: int, dtype: Any = "float32", small: bool = True) -> KVCacheConfig:
    """The same groups -- kinds, order, block sizes, windows, chunk sizes,
    Mamba modes -- each with one layer, over ``num_blocks`` blocks: a small
    one (1 KV head of 16, a 32+4 MLA latent, a 2x4x4 Mamba state), or with
    ``small=False`` the model's own (real KV heads and head sizes, in
    ``dtype``).  Small pages differ between groups; the kernel stage pads
    them to one page."""
    def layer(spec: KVCacheSpec) -> KVCacheSpec:
        if small:
            return _small_spec(spec, dtype)
        if isinstance(spec, MambaSpec):
            return replace(spec, dtypes=tuple(dtype for _ in spec.dtypes), page_size_padded=None)
        return replace(spec, dtype=dtype)

    groups = [KVCacheGroupSpec([g.layer_names[0]], layer(g.kv_cache_spec), is_eagle_group=g.is_eagle_group)
              for g in config.kv_cache_groups]
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


def tiny(config: KVCacheConfig, *, block_size: int = 2, max_window_blocks: int = 3, max_model_len: int = 32,
         num_blocks: int | None = None, dtype: Any = "float32") -> KVCacheConfig:
    """A :func:`scaled` copy whose token counts shrink too, so that a few
    dozen tokens cross windows and chunks: block sizes divided by a common
    factor (the smallest becomes ``block_size``; their ratios stay), windows
    and chunks clipped to ``max_window_blocks`` blocks, Mamba blocks of mode
    "none" to ``max_model_len``.  The pool defaults to 4 + 10 blocks per group."""
    specs = [g.kv_cache_spec for g in config.kv_cache_groups]
    sized = [s.block_size for s in specs if not (isinstance(s, MambaSpec) and s.mamba_cache_mode == "none")]
    unit = gcd(*sized) if sized else 1
    smallest = min(sized) if sized else unit
    factor = max(1, smallest // block_size)

    def shrink(spec: KVCacheSpec) -> KVCacheSpec:
        if isinstance(spec, MambaSpec) and spec.mamba_cache_mode == "none":
            return replace(spec, block_size=max_model_len)
        bs = max(1, spec.block_size // factor)
        if isinstance(spec, SlidingWindowSpec):
            return replace(spec, block_size=bs, sliding_window=min(cdiv(spec.sliding_window, spec.block_size),
                                                                   max_window_blocks) * bs)
        if isinstance(spec, ChunkedLocalAttentionSpec):
            chunk_blocks = min(cdiv(spec.attention_chunk_size, spec.block_size), max_window_blocks)
            return replace(spec, block_size=bs, attention_chunk_size=chunk_blocks * bs)
        return replace(spec, block_size=bs)

    groups = [
        KVCacheGroupSpec(list(g.layer_names[:1]), shrink(_small_spec(g.kv_cache_spec, dtype)),
                         is_eagle_group=g.is_eagle_group)
        for g in config.kv_cache_groups
    ]
    num_blocks = num_blocks or 4 + 10 * len(groups)
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


# --- ready to run ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSetup:
    """A layout as the manager machines and the kernel stage take it: the
    groups, pool and limits; the attention kernel's block size where the
    manager's blocks are larger; the encoder length; query heads per KV
    head; whether attention has sinks; the layers of each group the kernel
    stage runs (each with its own K/V or state behind the group's one block
    table)."""

    name: str
    layout: Layout
    kernel_block_sizes: tuple[int, ...] | None = None  # the backend's; None: kernels read manager blocks whole
    num_encoder_tokens: int = 0
    heads: int = 2
    sinks: bool = False
    layers: tuple[tuple[str, ...], ...] | None = None  # per group; None: one layer each


SCALES = ("tiny", "small", "gpu")
LAYERS = 2  # layers per group the kernel stage runs by default: enough for two to share a table, not a page


def layer_names(layout: Layout, layers: int) -> tuple[tuple[str, ...], ...]:
    """``layers`` layer names for each group of a layout whose layers have
    no names of their own (layer ``i`` of every group, as vLLM interleaves them)."""
    return tuple(tuple(f"layers.{i * len(layout.groups) + g}" for i in range(layers))
                 for g in range(len(layout.groups)))


def setup(name: str, scale: str = "tiny", *, prefix_caching: bool | None = None, num_blocks: int | None = None,
          max_model_len: int | None = None, layers: int = LAYERS) -> ModelSetup:
    """Model ``name`` at ``scale``: ``"tiny"`` (:func:`tiny`: blocks of 2
    tokens, windows of a few blocks, 32-token requests -- what the
    conformance machines search) or ``"small"`` (:func:`scaled`: the real
    block sizes, windows and chunks with small layers).  Prefix caching
    follows vLLM's default for the architecture, except that hybrid Mamba
    models turn it on (their cached states are the interesting part); pass
    ``prefix_caching`` to choose.  ``"gpu"``: the model's own KV heads and
    head sizes in bf16, real block sizes and windows, tens of thousands of
    blocks (Mamba hybrids: two thousand, their states are megabytes), up to
    32 query heads.  Each group keeps its first ``layers`` layers (fewer
    where the model's group has fewer)."""
    arch = architecture(name)
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; choose one of {SCALES}")
    if layers < 1:
        raise ValueError(f"layers={layers}: a group runs at least one layer")
    if prefix_caching is None:
        prefix_caching = arch.prefix_caching or arch.mamba is not None
    full = kv_cache_config(arch, num_blocks=1, prefix_caching=prefix_caching)
    if scale == "tiny":
        max_model_len = max_model_len or 32
        config = tiny(full, max_model_len=max_model_len, num_blocks=num_blocks)
        kernel_block_sizes, encoder = None, 6 if arch.num_encoder_tokens else 0
    elif scale == "small":
        max_model_len = max_model_len or min(arch.max_model_len, 16384)
        config = scaled(full, num_blocks=num_blocks or 64 * len(full.kv_cache_groups))
        kernel_block_sizes, encoder = KERNEL_BLOCK_SIZES, arch.num_encoder_tokens
    else:
        max_model_len = max_model_len or min(arch.max_model_len, 16384)
        blocks = num_blocks or (2048 if arch.mamba is not None else 32768)
        config = scaled(full, num_blocks=blocks, dtype="bfloat16", small=False)
        kernel_block_sizes, encoder = KERNEL_BLOCK_SIZES, arch.num_encoder_tokens
        heads = min(32, arch.num_heads) if arch.mla_latent else arch.num_heads
    layout = Layout(tuple(g.kv_cache_spec for g in config.kv_cache_groups), num_blocks=config.num_blocks,
                           max_model_len=max_model_len, enable_caching=prefix_caching)
    label = f"model:{arch.name}" + ("" if scale == "tiny" else f"@{scale}")
    return ModelSetup(label, layout, kernel_block_sizes, encoder, heads=heads if scale == "gpu" else 2,
                      sinks=arch.sinks, layers=tuple(tuple(g.layer_names[:layers]) for g in full.kv_cache_groups))


def setup_from_layout(name: str, layout: Layout, *, num_encoder_tokens: int = 6, layers: int = LAYERS) -> ModelSetup:
    """Any manager layout (say one of the conformance machines') with small
    layers, ``layers`` per group, ready for the kernel stage."""
    if layers < 1:
        raise ValueError(f"layers={layers}: a group runs at least one layer")
    small = replace(layout, groups=tuple(_small_spec(g, "float32") for g in layout.groups))
    return ModelSetup(name, small, num_encoder_tokens=num_encoder_tokens if layout.has_cross_attention else 0,
                      layers=layer_names(layout, layers))


def model_layout_names() -> list[str]:
    """``model:<name>`` for every architecture (the tiny scale)."""
    return [f"model:{name}" for name in ARCHITECTURES]
