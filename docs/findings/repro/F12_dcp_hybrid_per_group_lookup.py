"""F12, standalone: in vLLM 0.26.0 to 0.28.0, decode context parallelism on a
hybrid model of full attention and Mamba (which 0.26.0 started to accept)
breaks the per-group prefix lookup.
``HybridKVCacheCoordinator.find_longest_cache_hit_per_group`` calls the
full-attention finder without ``dcp_world_size``.  The finder then reads the
request's hashes at the per-rank block size (1 token here), which the hash
block size (2) does not divide, and ``resolve_block_hashes`` raises
``AssertionError`` on the first request.  ``get_computed_blocks`` on the same
request works: it passes ``dcp_world_size``.

Against vLLM alone (no kvspec import), on CPU:

    pip install vllm==0.26.0
    PYTHONHASHSEED=0 python docs/findings/repro/F12_dcp_hybrid_per_group_lookup.py

The setting is a Qwen3-Next-like model (one full-attention group with blocks
of 1 token per rank, one Mamba group in align mode with blocks of 2) decoded
over 2 ranks.  The sizes are the ones vLLM's engine derives for it
(``resolve_kv_cache_block_sizes``): attention blocks scaled by the ranks,
Mamba unscaled, so scheduler and hash block size are both 2.  vLLM's
scheduler reaches this: ``Scheduler.schedule`` calls
``find_longest_cache_hit_per_group`` for every new request when a KV
connector is configured and the model has Mamba layers (P/D disaggregation).
In 0.29.0 the per-group lookup passes each manager's DCP geometry, and this
prints "ok".  Upstream: vllm-project/vllm#53598 ("Use each manager's
effective block size and DCP/PCP geometry during prefix-cache lookup",
merged 2026-08) matches that change.  Releases before 0.26.0 refuse the
configuration; this script then prints "n/a".

Exit status 1 and "BUG:" where the lookup raises, 0 otherwise.
"""

import sys
import traceback

import torch
import vllm
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec
from vllm.v1.request import Request

AFFECTS = ("0.26.0", "0.29.0")  # the first release with the bug, the first without it

print("vllm", vllm.__version__)
init_none_hash(sha256)
full = FullAttentionSpec(block_size=1, num_kv_heads=1, head_size=1, dtype=torch.float32)
mamba = MambaSpec(block_size=2, shapes=((1,),), dtypes=(torch.float32,), mamba_cache_mode="align")
config = KVCacheConfig(num_blocks=24, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(["attn"], full), KVCacheGroupSpec(["mamba"], mamba)])
budget = "max_in_flight_tokens" if "max_in_flight_tokens" in KVCacheManager.__init__.__code__.co_varnames \
    else "max_num_batched_tokens"
try:
    manager = KVCacheManager(config, max_model_len=32, scheduler_block_size=2, hash_block_size=2,
                             enable_caching=True, dcp_world_size=2, pcp_world_size=1, **{budget: 32})
except AssertionError as refusal:
    print(f"n/a: this release refuses decode context parallelism on a hybrid model ({refusal})")
    sys.exit(0)
request = Request("r1", prompt_token_ids=[1, 2, 3, 4, 5], sampling_params=SamplingParams(max_tokens=4),
                  pooling_params=None, block_hasher=get_request_block_hasher(2, sha256))
print("get_computed_blocks: hit of", manager.get_computed_blocks(request)[1], "tokens")
try:
    _, lengths = manager.coordinator.find_longest_cache_hit_per_group(request.block_hashes, request.num_tokens - 1)
except AssertionError:
    print("BUG: find_longest_cache_hit_per_group raised AssertionError on the first request:")
    traceback.print_exc(limit=-2, file=sys.stdout)
    sys.exit(1)
print("ok: find_longest_cache_hit_per_group ->", lengths)
