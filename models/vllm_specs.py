"""kvspec's KV-cache specs and configs as vLLM's objects: the one
conversion, used by vLLM's worker path in the kernel stage
(:mod:`.vllm_worker`) and by vLLM's manager targets
(:mod:`kvspec.conformance.vllm.targets`).  vLLM is imported inside the
functions: importing this module needs no vLLM."""

from __future__ import annotations

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


def _torch_dtype(dtype: Any) -> Any:
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    return getattr(torch, str(dtype).removeprefix("torch."))


def _construct(cls: Any, ours: Any = None, /, **fields: Any) -> Any:
    """``cls(**fields)`` across vLLM releases: a field the installed release
    does not have is dropped when kvspec's value is the neutral one (the
    default of ``ours``'s class, or false / zero / ``None``) -- the release
    predates or removed the feature -- and refused otherwise (the layout
    needs what this release cannot express)."""
    import dataclasses
    import inspect

    if dataclasses.is_dataclass(cls):
        known = {f.name for f in dataclasses.fields(cls)}
    else:
        known = set(inspect.signature(cls).parameters)
    defaults = {f.name: f.default for f in dataclasses.fields(type(ours))} if dataclasses.is_dataclass(ours) else {}
    for name in sorted(set(fields) - known):
        value = fields.pop(name)
        if value and value != defaults.get(name):
            raise TypeError(f"this vLLM release's {cls.__name__} has no field {name!r}; "
                            f"the layout sets it to {value!r}")
    return cls(**fields)


def _attention_fields(spec: Any) -> dict[str, Any]:
    from vllm.v1 import kv_cache_interface as v

    quant = getattr(v, "KVQuantMode", None)
    return dict(
        block_size=spec.block_size,
        num_kv_heads=spec.num_kv_heads,
        head_size=spec.head_size,
        dtype=_torch_dtype(spec.dtype),
        kv_quant_mode=quant(int(spec.kv_quant_mode)) if quant else int(spec.kv_quant_mode),
        page_size_padded=spec.page_size_padded,
        indexes_kv_by_block_stride=spec.indexes_kv_by_block_stride,
    )


def to_vllm_spec(spec: KVCacheSpec) -> Any:
    """vLLM's spec object for one of kvspec's (same kind, same fields)."""
    from vllm.v1 import kv_cache_interface as v

    if isinstance(spec, MLAAttentionSpec):
        return _construct(v.MLAAttentionSpec, spec,
            **_attention_fields(spec), head_size_v=spec.head_size_v, sliding_window=spec.sliding_window,
            attention_chunk_size=spec.attention_chunk_size, cache_dtype_str=spec.cache_dtype_str,
            compress_ratio=spec.compress_ratio,
        )
    if isinstance(spec, RSWASpec):
        return _construct(v.RSWASpec, spec,
            **_attention_fields(spec), head_size_v=spec.head_size_v, non_causal=spec.non_causal,
            rswa_window=spec.rswa_window,
        )
    if isinstance(spec, FullAttentionSpec):
        return _construct(v.FullAttentionSpec, spec,
            **_attention_fields(spec), head_size_v=spec.head_size_v, sliding_window=spec.sliding_window,
            attention_chunk_size=spec.attention_chunk_size, non_causal=spec.non_causal,
        )
    if isinstance(spec, SlidingWindowSpec):
        return _construct(v.SlidingWindowSpec, spec,
            **_attention_fields(spec), sliding_window=spec.sliding_window, head_size_v=spec.head_size_v
        )
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return _construct(v.ChunkedLocalAttentionSpec, spec, **_attention_fields(spec),
                          attention_chunk_size=spec.attention_chunk_size)
    if isinstance(spec, CrossAttentionSpec):
        return _construct(v.CrossAttentionSpec, spec, **_attention_fields(spec))
    if isinstance(spec, MambaSpec):
        return _construct(v.MambaSpec, spec,
            block_size=spec.block_size,
            shapes=spec.shapes,
            dtypes=tuple(_torch_dtype(d) for d in spec.dtypes),
            page_size_padded=spec.page_size_padded,
            mamba_cache_mode=spec.mamba_cache_mode,
            num_speculative_blocks=spec.num_speculative_blocks,
        )
    raise TypeError(f"no vLLM spec for {type(spec).__name__}")


def to_vllm_config(config: KVCacheConfig) -> Any:
    from vllm.v1 import kv_cache_interface as v

    return v.KVCacheConfig(
        num_blocks=config.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            _construct(v.KVCacheGroupSpec, layer_names=list(g.layer_names), kv_cache_spec=to_vllm_spec(g.kv_cache_spec),
                       is_eagle_group=g.is_eagle_group)
            for g in config.kv_cache_groups
        ],
    )
