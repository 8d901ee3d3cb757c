"""F10, standalone: with context parallelism, vLLM 0.25.1's
``KVCacheManager.get_block_ids_for_computed_tokens`` -- the blocks the
scheduler hands a KV connector's ``request_finished`` -- counts a block as
``block_size`` tokens, but under decode/prefill context parallelism a block
holds ``block_size * dcp_world_size * pcp_world_size`` tokens (every other
part of the manager counts it so).  So it returns blocks past the computed
tokens: the lookahead block of a speculative-decoding request that finishes,
which holds no KV.

Against vLLM alone (no kvspec import), on CPU:

    pip install vllm==0.25.1   # or: bash tools/install_vllm.sh .venv-vllm
    PYTHONHASHSEED=0 python docs/findings/repro/F10_cp_connector_saves_uncomputed.py

The setting is a P/D prefill instance of an MLA model with DCP 2 and MTP
(3 lookahead slots): a 30-token prompt is prefilled in one step with its
lookahead slots (33 slots: two blocks of 32 tokens) and finishes (a prefill
request of max_tokens=1).  Its 30 computed tokens lie in the first block;
vLLM hands the connector both.  vLLM's scheduler reaches this: it allocates
lookahead slots for new requests (``Scheduler.schedule``) and calls
``get_block_ids_for_computed_tokens`` in ``_connector_finished``.  Upstream:
vllm-project/vllm#49965 (open) describes the same and clips by the manager's
block size.

Exit status 1 and "BUG" while the uncomputed block is handed over, 0 otherwise.
"""

import sys

import torch
from vllm import SamplingParams
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request

PER_RANK_BLOCK, DCP = 16, 2
BLOCK = PER_RANK_BLOCK * DCP  # tokens a block holds over the ranks: the scheduler and hash block size
PROMPT, LOOKAHEAD = 30, 3

kv_cache_utils.init_none_hash(sha256_cbor)
spec = FullAttentionSpec(block_size=PER_RANK_BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
config = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
manager = KVCacheManager(config, 256, BLOCK, BLOCK, dcp_world_size=DCP)
request = Request("r", list(range(PROMPT)), SamplingParams(max_tokens=1), None,
                  block_hasher=kv_cache_utils.get_request_block_hasher(BLOCK, sha256_cbor))
manager.get_computed_blocks(request)
manager.allocate_slots(request, PROMPT, num_lookahead_tokens=LOOKAHEAD)
request.num_computed_tokens = PROMPT

table = manager.get_block_ids(request.request_id)[0]
saved = manager.get_block_ids_for_computed_tokens(request.request_id, PROMPT)[0]
covering = -(-PROMPT // BLOCK)
print(f"table {table}: blocks of {BLOCK} tokens ({PER_RANK_BLOCK} on each of {DCP} ranks)")
print(f"{PROMPT} computed tokens lie in the first {covering} block(s): {table[:covering]}")
print(f"get_block_ids_for_computed_tokens -> {saved}")
if saved != table[:covering]:
    print(f"BUG: the connector is handed {saved[covering:]} too, which holds no computed KV")
    sys.exit(1)
sys.exit(0)
