# From vLLM 0.33 (release delta mamba-boundary-remark-fixed): Mamba align keys the state at the prompt's last
# reusable boundary again only where its block lost that key -- here to evict_blocks (as the scheduler evicts the
# blocks a KV connector failed to load) while the request still holds it; the key comes back at the next caching
# call, counted cached this step, and a sibling whose hit ends on it is refused a slot that step.
# 0.34.0 prints False, True, False.
# Run with a vLLM release first on the path:  PYTHONHASHSEED=0 python boundary_rekeyed_after_eviction.py
import torch
import vllm
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec
from vllm.v1.request import Request

init_none_hash(sha256)
full = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32)
mamba = MambaSpec(block_size=16, shapes=((1,),), dtypes=(torch.float32,), mamba_cache_mode="align")
config = KVCacheConfig(num_blocks=64, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(["attn"], full), KVCacheGroupSpec(["mamba"], mamba)])
manager = KVCacheManager(config, max_model_len=256, max_in_flight_tokens=256, scheduler_block_size=16,
                         hash_block_size=16, enable_caching=True)
prompt = list(range(33))  # the prompt's last reusable boundary: (33 - 1) // 16 * 16 = 32


def request(rid: str) -> Request:
    params = SamplingParams(max_tokens=8)
    params.update_from_generation_config({}, eos_token_id=100)
    return Request(rid, prompt, params, None, block_hasher=get_request_block_hasher(16, sha256))


first = request("a")
assert manager.allocate_slots(first, 32) is not None  # the prefill's chunk ends on the block: the state at 32
first.num_computed_tokens = 32
state = manager.get_blocks("a").blocks[1][1]  # Mamba's state block at 32
manager.evict_blocks({state.block_id})
print(vllm.__version__, "state block keyed after eviction:", state.block_hash is not None)
manager.new_step_starts()
assert manager.allocate_slots(first, 1) is not None  # a computes its last prompt token
print(vllm.__version__, "state block keyed after the next step's caching call:", state.block_hash is not None)
second = request("b")
blocks, hit = manager.get_computed_blocks(second)[:2]
out = manager.allocate_slots(second, 33 - hit, hit, blocks)
print(vllm.__version__, f"sibling's hit {hit} tokens, admitted in that step:", out is not None)
