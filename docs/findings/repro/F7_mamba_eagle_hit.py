"""F7, standalone: vLLM 0.25.1's prefix-cache hit outruns full attention when
EAGLE is on and a Mamba group is treated as an EAGLE group.

Against vLLM alone (no kvspec import), on CPU:

    pip install vllm==0.25.1   # or: bash tools/install_vllm.sh .venv-vllm
    PYTHONHASHSEED=0 python docs/findings/repro/F7_mamba_eagle_hit.py

A model with one full-attention group and one Mamba group (``all`` cache
mode), blocks of 2 tokens, ``use_eagle=True`` and no group flagged as the
drafter's.  A request with a 1-token prompt is computed, decodes one token
(3 tokens, 2 computed), is preempted (freed) and looks up its prefix
again.  vLLM reports a hit of 2 tokens although the full-attention group hands back no block at all: the
request would skip computing tokens whose full-attention KV it never had.
The path: ``KVCacheCoordinator.__init__`` flags every group as an EAGLE group
(Mamba included); ``HybridKVCacheCoordinator.find_longest_cache_hit`` then
searches the Mamba group one block past the candidate expecting a drop that
``MambaManager.find_longest_cache_hit`` never makes.

Exit status 1 and "BUG" when the hit outruns the full-attention blocks, 0
when the hit is covered (a fixed vLLM).
"""

import sys

import torch
from vllm import SamplingParams
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec
from vllm.v1.request import Request

BLOCK = 2

full = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float16)
mamba = MambaSpec(block_size=BLOCK, shapes=((1,),), dtypes=(torch.float32,), mamba_cache_mode="all")
config = KVCacheConfig(
    num_blocks=16,
    kv_cache_tensors=[],
    kv_cache_groups=[KVCacheGroupSpec(["attn"], full), KVCacheGroupSpec(["mamba"], mamba)],
)
kv_cache_utils.init_none_hash(sha256_cbor)
manager = KVCacheManager(config, max_model_len=32, scheduler_block_size=BLOCK, hash_block_size=BLOCK,
                         enable_caching=True, use_eagle=True)

request = Request("r1", [0], SamplingParams(max_tokens=8), None,
                  block_hasher=kv_cache_utils.get_request_block_hasher(BLOCK, sha256_cbor))

# Step 1: prefill the one prompt token, then decode one token.
manager.new_step_starts()
blocks, hit = manager.get_computed_blocks(request)
manager.allocate_slots(request, 1, hit, blocks)
request.num_computed_tokens = 1
request.append_output_token_ids([0])
manager.allocate_slots(request, 1)
request.num_computed_tokens = 2
request.append_output_token_ids([0])  # the decode step's sampled token: 3 tokens, 2 computed

# Step 2: preempted -- its blocks go back to the pool, still cached -- and looked up again.
manager.new_step_starts()
manager.free(request)
request.num_computed_tokens = 0
blocks, hit = manager.get_computed_blocks(request)
full_blocks, mamba_blocks = blocks.get_block_ids()
covered = len(full_blocks) * BLOCK

print(f"hit {hit} tokens; full-attention blocks {full_blocks} ({covered} tokens); Mamba blocks {mamba_blocks}")
if hit > covered:
    print(f"BUG: the hit ({hit}) outruns the full-attention blocks ({covered} tokens)")
    sys.exit(1)
print("ok: every group covers the hit")
