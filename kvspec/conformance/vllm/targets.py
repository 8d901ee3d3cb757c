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
from kvspec.conformance.vllm import compat
from kvspec.impl.kv_cache_coordinator import RETENTION_ENV, RETENTION_FROM_ENV, retention_interval_from_env
from kvspec.kv_cache_interface import KVCacheConfig
from kvspec.models.vllm_specs import to_vllm_config
from kvspec.request import Request


class VllmPoolTarget(VllmApiPoolTarget):
    """vLLM 0.25.1's own ``BlockPool``.

    Two deliberate differences are translated here: vLLM refuses to evict a
    block id it does not have with an ``AssertionError`` ("indicates a bug in
    the KV connector"), having changed nothing, and refuses a pool with no
    room for the null block by assertion too; the interface's refusal is a
    ``ValueError``.  (vLLM's null block keeps no ref count either; snapshots
    are compared without it, see ``PoolSnapshot.without_null_ref``.)
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True, hash_block_size: int = 16,
                 enable_kv_cache_events: bool = False):
        from vllm.v1.core.block_pool import BlockPool

        with _assertion_is_refusal():
            pool = BlockPool(num_blocks, enable_caching, hash_block_size, enable_kv_cache_events)
        super().__init__(pool)

    @classmethod
    def wrapping(cls, pool: Any) -> VllmPoolTarget:
        """A pool of vLLM's class (a fork's patched one, a subclass) built
        elsewhere -- by a ``module:factory`` target -- read with the same
        translations as vLLM's own."""
        target = cls.__new__(cls)
        VllmApiPoolTarget.__init__(target, pool)
        return target

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
        metrics_collector: Any = None,
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
        options.setdefault("log_stats", True)  # as vLLM's engine runs by default: the stats are observed
        if metrics_collector is not None:  # passed only when given: a release without the keyword still builds
            options["metrics_collector"] = metrics_collector
        vllm_config = to_vllm_config(kv_cache_config)
        with _retention_env(retention_interval), _assertion_is_refusal():
            interval = retention_interval_from_env() if retention_interval is RETENTION_FROM_ENV else retention_interval
            manager = KVCacheManager(
                vllm_config,
                max_model_len,
                scheduler_block_size,
                hash_block_size,
                enable_caching=enable_caching,
                use_eagle=use_eagle,
                enable_kv_cache_events=enable_kv_cache_events,
                **compat.manager_options(KVCacheManager, vllm_config, options, interval),
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
def _assertion_is_refusal() -> Iterator[None]:
    """vLLM checks its constructors' sizes with ``assert`` (block sizes that
    do not nest, a pool with no null block): read as the refusal it is, a
    ``ValueError``.  Anything else it raises stays what it is."""
    try:
        yield
    except AssertionError as error:
        raise refusal_of(error) from error


def refusal_of(error: AssertionError) -> ValueError:
    """vLLM's constructor assertion, as the refusal it is."""
    return ValueError(f"vLLM refused the configuration (assertion): {error or 'assert failed'}")


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
