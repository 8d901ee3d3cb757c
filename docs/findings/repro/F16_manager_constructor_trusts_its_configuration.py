"""F16, standalone: vLLM's ``KVCacheManager`` builds a manager from
configurations its engine checks (or never produces) before it builds one,
where a manager that checks its input refuses at construction:

1. cross attention with prefix caching on (the engine turns caching off
   for encoder-decoder models: cross-attention blocks are never cached);
2. a chunked-local group that is an EAGLE group;
3. in a hybrid, a chunked-local block smaller than the scheduler block;
4. a negative ``max_num_batched_tokens`` (where the manager takes one: not
   from 0.34);
5. decode context parallelism over a model of one sliding-window group;
6. ``max_model_len`` that is not an int (2.5);
7. ``use_eagle=1``, a flag that is not a bool.

Against vLLM alone (no kvspec import), on CPU:

    PYTHONHASHSEED=0 python docs/findings/repro/F16_manager_constructor_trusts_its_configuration.py

Exit status 1 and "BUG" while any of the seven is built, 0 otherwise.
"""

import inspect
import sys

import torch
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)

kv_cache_utils.init_none_hash(sha256_cbor)
SHAPE = dict(num_kv_heads=1, head_size=1, dtype=torch.float32)


def config(*specs) -> KVCacheConfig:
    groups = [KVCacheGroupSpec([f"layer.{i}"], spec) for i, spec in enumerate(specs)]
    return KVCacheConfig(num_blocks=24, kv_cache_tensors=[], kv_cache_groups=groups)


def full(block: int) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=block, **SHAPE)


def chunked(block: int) -> ChunkedLocalAttentionSpec:
    return ChunkedLocalAttentionSpec(block_size=block, attention_chunk_size=4, **SHAPE)


def attempt(what: str, build) -> str:
    try:
        build()
    except (ValueError, TypeError) as refusal:
        return f"ok: {what}: refused ({type(refusal).__name__}: {refusal})"
    except Exception as error:  # noqa: BLE001
        return f"BUG: {what}: raised {type(error).__name__} ({error or 'assert'}), not a refusal"
    return f"BUG: {what}: built a manager"


def main() -> int:
    lines = [
        attempt("cross attention with caching on", lambda: KVCacheManager(
            config(full(2), CrossAttentionSpec(block_size=2, **SHAPE)), 32, 2, 2, enable_caching=True)),
        attempt("a chunked-local EAGLE group", lambda: KVCacheManager(
            config(full(2), chunked(2)), 32, 2, 2, use_eagle=True)),
        attempt("a chunked-local block of 2 under a scheduler block of 4", lambda: KVCacheManager(
            config(full(4), chunked(2)), 32, 4, 2)),
        attempt("max_num_batched_tokens=-1", lambda: KVCacheManager(
            config(full(2)), 32, 2, 2, max_num_batched_tokens=-1))
        if "max_num_batched_tokens" in inspect.signature(KVCacheManager).parameters
        else "n/a: max_num_batched_tokens=-1: this release's KVCacheManager takes no such argument",
        attempt("dcp_world_size=2 on one sliding-window group", lambda: KVCacheManager(
            config(SlidingWindowSpec(block_size=2, sliding_window=4, **SHAPE)), 32, 4, 4, dcp_world_size=2)),
        attempt("max_model_len=2.5", lambda: KVCacheManager(config(full(2)), 2.5, 2, 2)),
        attempt("use_eagle=1", lambda: KVCacheManager(config(full(2)), 32, 2, 2, use_eagle=1)),
    ]
    print("\n".join(lines))
    return 1 if any(line.startswith("BUG") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
