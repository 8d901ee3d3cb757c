# allocate_slots with no new tokens but a local hit: refused before 0.31 (ValueError), accepted from 0.31.
# Run with a vLLM release first on the path:  PYTHONHASHSEED=0 python zero_new_tokens_with_a_hit.py
import torch
import vllm
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request

init_none_hash(sha256)
spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1, dtype=torch.float32)
config = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)])
manager = KVCacheManager(config, max_model_len=64, max_in_flight_tokens=64, scheduler_block_size=4,
                         hash_block_size=4, enable_caching=True)


def request(rid: str) -> Request:
    return Request(rid, list(range(9)), SamplingParams(max_tokens=4), None,
                   block_hasher=get_request_block_hasher(4, sha256))


first = request("a")
manager.allocate_slots(first, 9)  # caches its two full blocks
second = request("b")
blocks, hit = manager.get_computed_blocks(second)[:2]
try:
    out = manager.allocate_slots(second, 0, hit, blocks)
    print(vllm.__version__, "hit", hit, "accepted:", out is not None)
except ValueError as error:
    print(vllm.__version__, "hit", hit, "refused:", type(error).__name__, str(error)[:80])
