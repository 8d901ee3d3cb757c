"""vLLM's own ``BlockPool`` and ``KVCacheManager`` as targets, and
kvspec's configs and requests converted into vLLM's.

:class:`VllmPoolTarget` and :class:`VllmManagerTarget` take the same
constructor arguments as the impl targets (:mod:`kvspec.conformance.targets`);
vLLM is imported inside them, so that importing this module needs no vLLM.
Each kvspec request is mirrored by a vLLM ``Request`` hashed with vLLM's own
block hasher.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kvspec import hashing
from kvspec.conformance.targets.manager import KVCacheManagerTarget
from kvspec.conformance.targets.pool import VllmApiPoolTarget
from kvspec.impl.kv_cache_coordinator import RETENTION_ENV, RETENTION_FROM_ENV
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
from kvspec.request import Request


class VllmPoolTarget(VllmApiPoolTarget):
    """vLLM 0.25.1's own ``BlockPool``.

    One deliberate difference is translated here: vLLM refuses to evict a
    block id it does not have with an ``AssertionError`` ("indicates a bug in
    the KV connector"), having changed nothing; the interface's refusal is a
    ``ValueError``.  (vLLM's null block keeps no ref count either; snapshots
    are compared without it, see ``PoolSnapshot.without_null_ref``.)
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True, hash_block_size: int = 16,
                 enable_kv_cache_events: bool = False):
        from vllm.v1.core.block_pool import BlockPool

        super().__init__(BlockPool(num_blocks, enable_caching, hash_block_size, enable_kv_cache_events))

    def evict_blocks(self, block_ids: Any) -> None:
        try:
            super().evict_blocks(block_ids)
        except AssertionError as error:
            raise ValueError(f"vLLM refused the eviction: {error}") from error



class VllmManagerTarget(KVCacheManagerTarget):
    """vLLM 0.25.1's own ``KVCacheManager`` as a target, built from kvspec's
    config; kvspec requests are mirrored by vLLM ``Request`` objects.

    The two hash chains agree only when both roots come from the same
    ``PYTHONHASHSEED``; the constructor checks that.  ``retention_interval``
    (a keyword) is passed to vLLM through its environment variable.
    """

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        enable_caching: bool = True,
        use_eagle: bool = False,
        enable_kv_cache_events: bool = False,
        *,
        retention_interval: int | None = RETENTION_FROM_ENV,
        **options: Any,
    ):
        from vllm.utils.hashing import sha256_cbor
        from vllm.v1.core import kv_cache_utils
        from vllm.v1.core.kv_cache_manager import KVCacheManager

        kv_cache_utils.init_none_hash(sha256_cbor)
        if kv_cache_utils.NONE_HASH != hashing.NONE_HASH:
            raise RuntimeError(
                "vLLM's and kvspec's root hashes differ: set PYTHONHASHSEED before starting Python "
                "(or call kvspec.hashing.init_none_hash() after setting it)"
            )
        self._block_hasher = kv_cache_utils.get_request_block_hasher(hash_block_size, sha256_cbor)
        self._max_tokens = max_model_len
        self._mirrors: dict[str, tuple[Request, Any]] = {}
        with _retention_env(retention_interval):
            manager = KVCacheManager(
                to_vllm_config(kv_cache_config),
                max_model_len,
                scheduler_block_size,
                hash_block_size,
                enable_caching=enable_caching,
                use_eagle=use_eagle,
                enable_kv_cache_events=enable_kv_cache_events,
                **options,
            )
        super().__init__(manager)

    def _request(self, request: Request) -> Any:
        known = self._mirrors.get(request.request_id)
        if known is None or known[0] is not request:
            known = (request, self._new_mirror(request))
            self._mirrors[request.request_id] = known
        mirror = known[1]
        if request.num_tokens > mirror.num_tokens:
            mirror.append_output_token_ids(list(request.all_token_ids[mirror.num_tokens :]))
        from vllm.v1.request import RequestStatus

        mirror.num_computed_tokens = request.num_computed_tokens
        mirror.num_preemptions = request.num_preemptions
        mirror.status = RequestStatus[request.status.name]
        mirror.spec_token_ids = list(request.spec_token_ids)
        mirror.skip_reading_prefix_cache = request.skip_reading_prefix_cache
        return mirror

    def _new_mirror(self, request: Request) -> Any:
        from vllm import SamplingParams
        from vllm.v1.request import Request as VllmRequest

        mirror = VllmRequest(
            request.request_id,
            list(request.prompt_token_ids),
            SamplingParams(max_tokens=self._max_tokens),
            None,
            mm_features=[_vllm_mm_feature(f) for f in request.mm_features] or None,
            prompt_embeds=_vllm_prompt_embeds(request.prompt_embeds),
            lora_request=_vllm_lora(request.lora_request),
            cache_salt=request.cache_salt,
            block_hasher=self._block_hasher,
        )
        if request.num_tokens > mirror.num_tokens:
            mirror.append_output_token_ids(list(request.all_token_ids[mirror.num_tokens :]))
        return mirror


@contextmanager
def _retention_env(retention_interval: Any) -> Iterator[None]:
    """Set vLLM's retention environment variable while its manager is built."""
    if retention_interval is RETENTION_FROM_ENV:
        yield
        return
    saved = os.environ.pop(RETENTION_ENV, None)
    if retention_interval is not None:
        os.environ[RETENTION_ENV] = str(retention_interval)
    try:
        yield
    finally:
        os.environ.pop(RETENTION_ENV, None)
        if saved is not None:
            os.environ[RETENTION_ENV] = saved


# --- kvspec's config and requests as vLLM's ------------------------------------------------


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


def _vllm_prompt_embeds(embeds: Any) -> Any:
    """vLLM takes prompt embeddings as a tensor; rows of raw bytes become a
    uint8 tensor with the same bytes (all vLLM hashes is the bytes)."""
    if embeds is None or not isinstance(embeds, list | tuple):
        return embeds
    import torch

    return torch.frombuffer(bytearray(b"".join(embeds)), dtype=torch.uint8).view(len(embeds), -1)


def _vllm_lora(lora: Any) -> Any:
    if lora is None:
        return None
    from vllm.lora.request import LoRARequest

    # vLLM insists on a path; from 0.31 it enters the block hash (hashing.lora_path names it for both sides).
    return LoRARequest(lora.lora_name, lora.lora_int_id, hashing.lora_path(lora))


def _vllm_mm_feature(feature: Any) -> Any:
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

    position = feature.mm_position
    return MultiModalFeatureSpec(
        data=None,
        modality="image",
        identifier=feature.identifier,
        mm_position=PlaceholderRange(offset=position.offset, length=position.length),
    )
