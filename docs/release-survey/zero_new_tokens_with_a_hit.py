# M9: allocate_slots with no new tokens but a local hit: refused before 0.31, accepted from 0.31.
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
m = KVCacheManager(config, max_model_len=64, max_in_flight_tokens=64, scheduler_block_size=4, hash_block_size=4,
                   enable_caching=True)
def req(rid):
    return Request(rid, list(range(9)), SamplingParams(max_tokens=4), None, block_hasher=get_request_block_hasher(4, sha256))
a = req("a")
m.allocate_slots(a, 9); a.num_computed_tokens = 9; m.cache_blocks(a, 9) if hasattr(m, "cache_blocks") else None
b = req("b")
blocks, hit = m.get_computed_blocks(b)[:2]
try:
    out = m.allocate_slots(b, 0, hit, blocks)
    print(vllm.__version__, "hit", hit, "accepted:", out is not None)
except Exception as e:
    print(vllm.__version__, "hit", hit, "refused:", type(e).__name__, str(e)[:80])
