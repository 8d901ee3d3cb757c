"""F9, standalone: vLLM 0.25.1's ``KVCacheManager`` and ``BlockPool`` take
sizes of 0 without a word -- a scheduler block size of 0 and a
``max_model_len`` of 0 build a manager, a hash block size of 0 builds a pool
-- as is a ``dcp_world_size`` of 0 on a one-group model -- and the manager
built with a hash block size of 0 raises
``ZeroDivisionError``, not a refusal; so is a pool's hash block size that is
not an int (2.5).  Its other size checks are ``assert`` statements (gone
under ``python -O``).

Against vLLM alone (no kvspec import), on CPU:

    pip install vllm==0.25.1   # or: bash tools/install_vllm.sh .venv-vllm
    PYTHONHASHSEED=0 python docs/findings/repro/F9_zero_sizes_accepted.py

vLLM's engine is meant to validate these sizes before the manager sees them
(``CacheConfig``, ``ModelConfig``); upstream reports that it did not for all
three (vllm-project/vllm#43496 ``--block-size 0``, #43521
``--hash-block-size 0``, #43532 ``max_model_len=0``).  The manager then
accepts and misbehaves silently: built with ``max_model_len=0`` it answers
``allocate_slots`` for 4 tokens with success and no block at all.

Exit status 1 and "BUG" while any size of 0 is taken, 0 otherwise.
"""

import sys

import torch
from vllm import SamplingParams
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request

BLOCK = 2


def config() -> KVCacheConfig:
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    return KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])


def attempt(what: str, build) -> str:
    try:
        build()
    except (ValueError, TypeError) as refusal:
        return f"{what}: refused ({type(refusal).__name__}: {refusal})"
    except Exception as error:  # noqa: BLE001
        return f"BUG: {what} raised {type(error).__name__}: {error} -- not a refusal"
    return f"BUG: {what} accepted"


def allocate_with_max_model_len_0() -> None:
    kv_cache_utils.init_none_hash(sha256_cbor)
    manager = KVCacheManager(config(), 0, BLOCK, BLOCK)
    request = Request("r", [1, 2, 3, 4], SamplingParams(max_tokens=1), None,
                      block_hasher=kv_cache_utils.get_request_block_hasher(BLOCK, sha256_cbor))
    blocks = manager.allocate_slots(request, 4)
    print(f"  with max_model_len=0, allocate_slots(4 tokens) -> {blocks.get_block_ids() if blocks else blocks}")


results = [
    attempt("KVCacheManager(scheduler_block_size=0)", lambda: KVCacheManager(config(), 32, 0, BLOCK)),
    attempt("KVCacheManager(max_model_len=0)", lambda: KVCacheManager(config(), 0, BLOCK, BLOCK)),
    attempt("KVCacheManager(hash_block_size=0)", lambda: KVCacheManager(config(), 32, BLOCK, 0)),
    attempt("KVCacheManager(dcp_world_size=0)", lambda: KVCacheManager(config(), 32, BLOCK, BLOCK, dcp_world_size=0)),
    attempt("BlockPool(hash_block_size=0)", lambda: BlockPool(8, True, 0)),
    attempt("BlockPool(hash_block_size=-2)", lambda: BlockPool(8, True, -2)),
    attempt("BlockPool(hash_block_size=2.5)", lambda: BlockPool(8, True, 2.5)),
]
print("\n".join(results))
allocate_with_max_model_len_0()
sys.exit(1 if any(line.startswith("BUG") for line in results) else 0)
