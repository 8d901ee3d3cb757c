"""F15, standalone: vLLM's ``KVCacheManager.allocate_slots`` trusts three
arguments its scheduler computes and never gets wrong, where a manager that
checks its input refuses, changing nothing:

1. a token count past ``max_model_len`` (33 new tokens, ``max_model_len``
   32, for a 2-token request): it is capped silently, and blocks for 32
   tokens are allocated and the request's first block cached;
2. a flag that is not a bool (``delay_cache_blocks=1``): it is read as a
   truth value;
3. new hits (``new_computed_blocks``) for a request that already holds
   blocks: an ``AssertionError`` (gone under ``python -O``), not a refusal;
4. hit blocks that lost their keys between the lookup and the allocation
   (evicted by id): taken as hits all the same;
5. blocks offered as a hit to a manager with prefix caching off: taken;
6. (not ``allocate_slots``: the same trust, in what a KV connector asks)
   ``get_block_ids_for_computed_tokens`` with a negative count: answered
   (no blocks of the attention groups) instead of refused;
7. a token count that is a float (1.5): from 0.32 taken, a block allocated
   (0.25.1 to 0.31 fail with a ``TypeError`` inside the free queue, which
   reads as a refusal);
8. hit blocks as two lists for a manager of one group (a list per group is
   the argument's shape): taken, the second list ignored;
9. (not ``allocate_slots``: the same trust, in what a KV connector's
   scheduler calls once a load is done) ``cache_blocks`` for 4 tokens of a
   request that holds no block: taken, nothing cached;
10. the same with KV-cache events on: an ``IndexError``, not a refusal.

Against vLLM alone (no kvspec import), on CPU:

    PYTHONHASHSEED=0 python docs/findings/repro/F15_allocate_slots_trusts_its_arguments.py

Exit status 1 and "BUG" while any of the ten is taken, 0 otherwise.
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


def manager(caching: bool = True, events: bool = False) -> KVCacheManager:
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    config = KVCacheConfig(num_blocks=24, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
    return KVCacheManager(config, MAX_MODEL_LEN, BLOCK, BLOCK, enable_caching=caching, enable_kv_cache_events=events)


def request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=4), None, block_hasher=HASHER)


def attempt(what: str, call, caching: bool = True, events: bool = False) -> str:
    m = manager(caching, events)
    free = m.block_pool.get_num_free_blocks()
    try:
        out = call(m)
    except (ValueError, TypeError) as refusal:
        return f"ok: {what}: refused ({type(refusal).__name__}: {refusal})"
    except Exception as error:  # noqa: BLE001
        return f"BUG: {what}: raised {type(error).__name__} ({error or 'assert'}), not a refusal"
    taken = free - m.block_pool.get_num_free_blocks()
    if isinstance(out, tuple):  # a query's answer (block ids per group)
        return f"BUG: {what}: answered {out}"
    return f"BUG: {what}: accepted ({'None' if out is None else f'{taken} blocks taken'})"


def running_hits(m: KVCacheManager):
    first = request("a", [0, 1, 2, 3])
    m.allocate_slots(first, 4)  # computed and cached: blocks for [0, 1] and [2, 3]
    first.num_computed_tokens = 4
    first.status = RequestStatus.RUNNING
    hits = m.get_computed_blocks(request("b", [0, 1, 2, 3, 4]))[0]  # the prefix, as a hit (0.34 answers 3 values)
    return m.allocate_slots(first, 1, 2, hits)  # offered to a request that runs and holds blocks


def cached_prefix_hit(m: KVCacheManager):
    """A request whose 4-token prefix another, finished request cached:
    the request, its hit (both blocks) and the hit's length."""
    first = request("a", [0, 1, 2, 3])
    m.allocate_slots(first, 4)  # computed and cached
    first.num_computed_tokens = 4
    m.free(first)
    second = request("b", [0, 1, 2, 3, 4])
    hits, num_hits = m.get_computed_blocks(second)[:2]  # (0.34 answers a third value)
    return second, hits, num_hits


def stale_hits(m: KVCacheManager):
    second, hits, num_hits = cached_prefix_hit(m)
    m.block_pool.evict_blocks({block.block_id for block in hits.blocks[0]})  # their keys go
    return m.allocate_slots(second, 1, num_hits, hits)


def hits_without_caching(m: KVCacheManager):
    first = request("a", [0, 1, 2, 3])
    m.allocate_slots(first, 4)
    first.num_computed_tokens = 4
    block = m.coordinator.single_type_managers[0].req_to_blocks["a"][0]
    return m.allocate_slots(request("b", [0, 1, 2, 3, 4]), 1, BLOCK, m.create_kv_cache_blocks(([block],)))


def negative_save(m: KVCacheManager):
    first = request("a", [0, 1, 2, 3])
    m.allocate_slots(first, 4)
    first.num_computed_tokens = 4
    return m.get_block_ids_for_computed_tokens("a", -1)  # what a connector saves of -1 computed tokens


def hits_for_two_groups(m: KVCacheManager):
    second, hits, num_hits = cached_prefix_hit(m)
    return m.allocate_slots(second, 1, num_hits, m.create_kv_cache_blocks((hits.blocks[0], [])))


def main() -> int:
    lines = [
        attempt(f"allocate_slots(2-token request, 33) with max_model_len {MAX_MODEL_LEN}",
                lambda m: m.allocate_slots(request("a", [0, 1]), MAX_MODEL_LEN + 1)),
        attempt("allocate_slots(request, 2, delay_cache_blocks=1)",
                lambda m: m.allocate_slots(request("a", [0, 1]), 2, delay_cache_blocks=1)),
        attempt("allocate_slots(running request, 1, 2, a hit of 1 block)", running_hits),
        attempt("allocate_slots(request, 1, 4, a hit of 2 blocks evicted since the lookup)", stale_hits),
        attempt("allocate_slots(request, 1, 2, a block of another request) with caching off", hits_without_caching,
                caching=False),
        attempt("get_block_ids_for_computed_tokens(request holding 2 blocks, -1)", negative_save),
        attempt("allocate_slots(3-token request, 1.5)", lambda m: m.allocate_slots(request("a", [0, 1, 2]), 1.5)),
        attempt("allocate_slots(request, 1, 4, a hit of 2 blocks and an empty list) with one group",
                hits_for_two_groups),
        attempt("cache_blocks(request holding no block, 4)",
                lambda m: m.cache_blocks(request("a", [0, 1, 2, 3, 4]), 4)),
        attempt("cache_blocks(request holding no block, 4) with KV-cache events on",
                lambda m: m.cache_blocks(request("a", [0, 1, 2, 3, 4]), 4), events=True),
    ]
    print("\n".join(lines))
    return 1 if any(line.startswith("BUG") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
