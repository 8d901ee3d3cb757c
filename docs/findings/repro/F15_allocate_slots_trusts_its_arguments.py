"""F15, standalone: vLLM's ``KVCacheManager.allocate_slots`` trusts three
arguments its scheduler computes and never gets wrong, where a manager that
checks its input refuses, changing nothing:

1. a token count past ``max_model_len`` (33 new tokens, ``max_model_len``
   32, for a 2-token request): it is capped silently, and blocks for 32
   tokens are allocated and the request's first block cached;
2. a flag that is not a bool (``delay_cache_blocks=1``): it is read as a
   truth value;
3. new hits (``new_computed_blocks``) for a request that already holds
   blocks: an ``AssertionError`` (gone under ``python -O``), not a refusal.

Against vLLM alone (no kvspec import), on CPU:

    PYTHONHASHSEED=0 python docs/findings/repro/F15_allocate_slots_trusts_its_arguments.py

Exit status 1 and "BUG" while any of the three is taken, 0 otherwise.
"""

import sys

import torch
from vllm import SamplingParams
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request, RequestStatus

BLOCK, MAX_MODEL_LEN = 2, 32
kv_cache_utils.init_none_hash(sha256_cbor)
HASHER = kv_cache_utils.get_request_block_hasher(BLOCK, sha256_cbor)


def manager() -> KVCacheManager:
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    config = KVCacheConfig(num_blocks=24, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
    return KVCacheManager(config, MAX_MODEL_LEN, BLOCK, BLOCK, enable_caching=True)


def request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=4), None, block_hasher=HASHER)


def attempt(what: str, call) -> str:
    m = manager()
    free = m.block_pool.get_num_free_blocks()
    try:
        out = call(m)
    except (ValueError, TypeError) as refusal:
        return f"ok: {what}: refused ({type(refusal).__name__}: {refusal})"
    except Exception as error:  # noqa: BLE001
        return f"BUG: {what}: raised {type(error).__name__} ({error or 'assert'}), not a refusal"
    taken = free - m.block_pool.get_num_free_blocks()
    return f"BUG: {what}: accepted ({'None' if out is None else f'{taken} blocks taken'})"


def running_hits(m: KVCacheManager):
    first = request("a", [0, 1, 2, 3])
    m.allocate_slots(first, 4)  # computed and cached: blocks for [0, 1] and [2, 3]
    first.num_computed_tokens = 4
    first.status = RequestStatus.RUNNING
    hits, _ = m.get_computed_blocks(request("b", [0, 1, 2, 3, 4]))  # the prefix, as a hit
    return m.allocate_slots(first, 1, 2, hits)  # offered to a request that runs and holds blocks


def main() -> int:
    lines = [
        attempt(f"allocate_slots(2-token request, 33) with max_model_len {MAX_MODEL_LEN}",
                lambda m: m.allocate_slots(request("a", [0, 1]), MAX_MODEL_LEN + 1)),
        attempt("allocate_slots(request, 2, delay_cache_blocks=1)",
                lambda m: m.allocate_slots(request("a", [0, 1]), 2, delay_cache_blocks=1)),
        attempt("allocate_slots(running request, 1, 2, a hit of 1 block)", running_hits),
    ]
    print("\n".join(lines))
    return 1 if any(line.startswith("BUG") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
