"""F8, standalone: vLLM's block estimate (0.25.1 and every later release measured) for a Mamba group in align
mode goes negative once rejected draft tokens left the request's state table
longer than it needs, and the negative count offsets the other groups' needs.

Against vLLM alone (no kvspec import), on CPU:

    pip install vllm==0.25.1   # or: bash tools/install_vllm.sh .venv-vllm
    PYTHONHASHSEED=0 python docs/findings/repro/F8_mamba_align_negative_estimate.py

A model with one full-attention group and one Mamba group (``align`` cache
mode, two speculative blocks), blocks of 4 tokens.  A request prefills 8
tokens, then decodes one token with 4 draft tokens, all of them rejected
(9 tokens computed).  For its next token ``MambaManager.get_num_blocks_to_allocate``
returns -1: ``cdiv(10, 4) + 2 - 6`` blocks, passed on unclamped when it is not
positive.  With 7 lookahead slots the full-attention group needs one new
block, so the coordinator's total is 0 and ``allocate_slots``' capacity check
passes with no free block; ``get_new_blocks`` then raises ``ValueError``
half-way through the allocation.

vLLM's own scheduler passes the same ``num_lookahead_tokens`` at every step
of a running request, so there the other groups need nothing whenever the
Mamba count is negative: the wrong count is not known to reach a failure
through ``Scheduler.schedule()``, only through the manager's API.

Measured on 0.25.1-0.34.0: the estimate is ``[1, -1]`` on each.  Only
0.25.1's allocation fails half-way: from 0.26 ``allocate_slots`` frees the
previous Mamba state (on the processed-token basis) before it allocates, and
that block covers the full-attention group's need here.

Exit status 1 and "BUG" when the estimate is negative or the allocation fails
half-way, 0 otherwise (a fixed vLLM).
"""

import inspect
import sys

import torch
from vllm import SamplingParams
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec
from vllm.v1.request import Request

BLOCK = 4

full = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float16)
mamba = MambaSpec(block_size=BLOCK, shapes=((1,),), dtypes=(torch.float32,), mamba_cache_mode="align",
                  num_speculative_blocks=2)
config = KVCacheConfig(
    num_blocks=40,
    kv_cache_tensors=[],
    kv_cache_groups=[KVCacheGroupSpec(["attn"], full), KVCacheGroupSpec(["mamba"], mamba)],
)
kv_cache_utils.init_none_hash(sha256_cbor)
manager = KVCacheManager(config, max_model_len=64, scheduler_block_size=BLOCK, hash_block_size=BLOCK,
                         enable_caching=True)
request = Request("r1", list(range(8)), SamplingParams(max_tokens=32), None,
                  block_hasher=kv_cache_utils.get_request_block_hasher(BLOCK, sha256_cbor))

# Prefill 8 tokens; then one token with 4 drafts, all rejected: 9 tokens computed.
manager.new_step_starts()
manager.allocate_slots(request, 8)
request.num_computed_tokens = 8
request.append_output_token_ids([1])
manager.new_step_starts()
manager.allocate_slots(request, 1 + 4)
request.num_computed_tokens = 9
request.append_output_token_ids([1])

# The next token, with 7 lookahead slots (full attention needs one more block).
manager.new_step_starts()
computed = request.num_computed_tokens
# The arguments allocate_slots passes for a running request; from 0.26 they include the tokens of the
# local hit (0: a running request takes no hits).
arguments = dict(request_id=request.request_id, num_tokens=computed + 1 + 7, new_computed_blocks=[],
                 total_computed_tokens=computed, num_tokens_main_model=computed + 1)
estimate = manager.coordinator.single_type_managers[0].get_num_blocks_to_allocate
if "num_local_computed_tokens" in inspect.signature(estimate).parameters:
    arguments["num_local_computed_tokens"] = 0
per_group = [m.get_num_blocks_to_allocate(**arguments) for m in manager.coordinator.single_type_managers]
print(f"estimates per group: {per_group} (full attention, Mamba)")
others = manager.block_pool.get_new_blocks(manager.block_pool.get_num_free_blocks())  # other requests hold the rest
try:
    manager.allocate_slots(request, 1, num_lookahead_tokens=7)
except ValueError as error:
    print(f"BUG: the capacity check passed with {sum(per_group)} blocks needed and 0 free, then: {error}")
    sys.exit(1)
if min(per_group) < 0:
    print(f"BUG: a negative block estimate ({per_group})")
    sys.exit(1)
print("ok: no negative estimate, no half-way failure")
