"""S2, standalone: a KV load that failed stays in vLLM's prefix cache; if
its request is aborted before it recomputes, the next request with the same
prefix is scheduled as having that prefix computed -- on blocks nothing
ever wrote.

Against vLLM alone (no kvspec import), on CPU; seen in 0.25.1 through 0.33.0:

    pip install --no-deps vllm==0.33.0   # plus its import-time deps; or tools/install_vllm.sh
    PYTHONHASHSEED=0 python docs/findings/repro/S2_failed_load_served_after_abort.py

vLLM's own ``Scheduler`` (one full-attention group, blocks of 16, prefix
caching, ``kv_load_failure_policy="recompute"``) with a KV connector -- the
small one below, loaded as any third-party connector is -- that holds 49
tokens of request A's 49-token prompt and loads them synchronously:

1. step 1 schedules A with 48 tokens to load (3 blocks, cached at once,
   as every block a step will fill is) and 1 to compute; the worker reports
   A's 3 blocks invalid (the load failed).  Under the recompute policy the
   scheduler rolls A back to 0 computed tokens and keeps the blocks cached,
   because A "will recompute them" (vLLM PR #26813).
2. the client aborts A (``finish_requests(..., FINISHED_ABORTED)``, the
   engine's path for a disconnect) and request B with the same prompt
   arrives.
3. step 2 schedules B with 48 tokens computed: a prefix-cache hit on the
   3 blocks the failed load never filled.  B's attention reads whatever the
   blocks held before -- wrong KV, no error.

Exit status 1 and "BUG" when B is scheduled on the never-written blocks, 0
when it is not (a fixed vLLM evicts them, or refuses the hit).
"""

import sys

import torch
from vllm import SamplingParams
from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, SchedulerConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

BLOCK = 16
PROMPT = [864] * 48 + [0]


class FailingStore(KVConnectorBase_V1):
    """Holds the whole prompt of request "A"; loads synchronously."""

    loads: dict = {}

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        held = len(PROMPT) if request.request_id == "A" else 0
        return max(0, min(held, request.num_tokens - 1) - num_computed_tokens), False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        if num_external_tokens:
            self.loads[request.request_id] = blocks.get_block_ids()[0][: num_external_tokens // BLOCK]

    def build_connector_meta(self, scheduler_output):
        return KVConnectorMetadata()

    def start_load_kv(self, forward_context, **kwargs):
        raise NotImplementedError

    def wait_for_layer_load(self, layer_name):
        raise NotImplementedError

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        raise NotImplementedError

    def wait_for_save(self):
        raise NotImplementedError


class Model:
    """What the scheduler reads of a decoder-only model config (no hub access)."""

    is_encoder_decoder = is_diffusion = is_multimodal_model = is_moe = is_hybrid = False
    is_attention_free = enable_return_routed_experts = False
    runner_type = "generate"
    architectures = ()
    skip_tokenizer_init = True
    max_model_len = 256

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return None


scheduler_config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256,
                                   enable_chunked_prefill=True, is_encoder_decoder=False)
cache_config = CacheConfig(block_size=BLOCK, enable_prefix_caching=True)
cache_config.num_gpu_blocks = 12
transfer = KVTransferConfig(kv_connector="FailingStore", kv_role="kv_both", kv_connector_module_path=__name__,
                            kv_load_failure_policy="recompute")
config = VllmConfig(scheduler_config=scheduler_config, cache_config=cache_config,
                    device_config=DeviceConfig(device="cpu"), kv_transfer_config=transfer)
object.__setattr__(config, "model_config", Model())
attention = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float16)
kv_cache_config = KVCacheConfig(num_blocks=12, kv_cache_tensors=[],
                                kv_cache_groups=[KVCacheGroupSpec(["attn"], attention)])
scheduler = Scheduler(vllm_config=config, kv_cache_config=kv_cache_config, log_stats=False,
                      structured_output_manager=StructuredOutputManager(config), block_size=BLOCK)

init_none_hash(sha256_cbor)
hasher = get_request_block_hasher(BLOCK, sha256_cbor)


def request(request_id):
    return Request(request_id, list(PROMPT), SamplingParams(max_tokens=1, ignore_eos=True), None,
                   block_hasher=hasher)


def run(out, invalid=frozenset()):
    ids = list(out.num_scheduled_tokens)
    sampled = [[] if scheduler.requests[r].request_id in invalid_owners else [7] for r in ids]
    output = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                               sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={}, pooler_output=[],
                               kv_connector_output=KVConnectorOutput(invalid_block_ids=set(invalid)))
    scheduler.update_from_output(out, output)


# Step 1: A loads 48 tokens (3 blocks) and computes 1; the load fails.
scheduler.add_request(request("A"))
out = scheduler.schedule()
failed = FailingStore.loads["A"]
invalid_owners = {"A"}
run(out, invalid=set(failed))
print(f"step 1: A's load into blocks {failed} failed; A rolled back to "
      f"{scheduler.requests['A'].num_computed_tokens} computed tokens")

# The client goes away; B asks the same prompt.
scheduler.finish_requests("A", RequestStatus.FINISHED_ABORTED)
scheduler.add_request(request("B"))
out = scheduler.schedule()
(new,) = out.scheduled_new_reqs
hit_blocks = new.block_ids[0][: new.num_computed_tokens // BLOCK]
print(f"step 2: B scheduled with {new.num_computed_tokens} tokens computed on blocks {hit_blocks}")
if set(hit_blocks) & set(failed):
    print(f"BUG: B's computed prefix sits in blocks {sorted(set(hit_blocks) & set(failed))}, "
          "which the failed load never wrote and nobody recomputed")
    sys.exit(1)
print("ok: B does not read the blocks of the failed load")
