"""S2, standalone: a KV load that failed stays in vLLM's prefix cache when
its request is aborted before anything rewrites it, and the next request
with the same prefix is scheduled as having that prefix computed -- on
blocks nothing ever wrote.  Wrong KV, no error.

Against vLLM alone (no kvspec import), on CPU; seen in 0.25.1 through 0.34.0:

    pip install --no-deps vllm==0.34.0   # plus its import-time deps; or tools/install_vllm.sh
    PYTHONHASHSEED=0 python docs/findings/repro/S2_failed_load_served_after_abort.py

vLLM's own scheduler (one full-attention group, blocks of 16, prefix
caching) with a KV connector -- the small one below, loaded as any
third-party connector is -- that holds request A's 49-token prompt and loads
48 tokens of it synchronously, into 3 blocks that are cached at once (as
every block a step fills is); the worker reports the 3 blocks invalid (the
load failed).  Then the client aborts A and request B with the same prompt
arrives.  The script runs every configuration:

- ``kv_load_failure_policy``: ``recompute`` (A is rolled back and keeps the
  blocks cached to recompute them, vLLM PR #26813) or ``fail`` (vLLM's
  default: A fails and the blocks are evicted);
- the scheduler: ``Scheduler`` or ``AsyncScheduler`` (async scheduling, on
  by default);
- when the abort lands: *between steps*, or *while the step runs* -- the
  engine drains the aborts that arrived during the forward pass right
  before it hands the step's output to ``update_from_output``
  (``EngineCore.step`` and ``step_with_batch_queue`` both call
  ``_process_aborts_queue()`` there), so A is gone when the scheduler
  handles the invalid blocks: it looks for their holders among the running
  requests, finds none, and evicts nothing.

Expected: B is never scheduled with computed tokens on A's unwritten
blocks.  Actual (0.25.1 ... 0.34.0): under ``recompute`` B is, whichever the
scheduler and whenever the abort lands; under ``fail`` B is when the abort
lands while the step runs.  Asynchronous loads are not affected (their
blocks are cached only once the load succeeds).

Exit status 1 and a "BUG" line per configuration hit; 0 when none is (a
fixed vLLM: docs/findings/S2-fix.patch).
"""

import dataclasses
import sys

import torch
from vllm import SamplingParams
from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, SchedulerConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
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


def make_scheduler(policy, asynchronous):
    scheduler_config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256,
                                       enable_chunked_prefill=True, is_encoder_decoder=False,
                                       async_scheduling=asynchronous)
    cache_config = CacheConfig(block_size=BLOCK, enable_prefix_caching=True)
    cache_config.num_gpu_blocks = 12
    transfer = KVTransferConfig(kv_connector="FailingStore", kv_role="kv_both", kv_connector_module_path=__name__,
                                kv_load_failure_policy=policy)
    config = VllmConfig(scheduler_config=scheduler_config, cache_config=cache_config,
                        device_config=DeviceConfig(device="cpu"), kv_transfer_config=transfer)
    object.__setattr__(config, "model_config", Model())
    attention = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float16)
    kv_cache_config = KVCacheConfig(num_blocks=12, kv_cache_tensors=[],
                                    kv_cache_groups=[KVCacheGroupSpec(["attn"], attention)])
    cls = AsyncScheduler if asynchronous else Scheduler
    return cls(vllm_config=config, kv_cache_config=kv_cache_config, log_stats=False,
               structured_output_manager=StructuredOutputManager(config), block_size=BLOCK)


init_none_hash(sha256_cbor)
hasher = get_request_block_hasher(BLOCK, sha256_cbor)


def request(request_id):
    return Request(request_id, list(PROMPT), SamplingParams(max_tokens=1, ignore_eos=True), None,
                   block_hasher=hasher)


def output(ids, sampled, invalid):
    extra = {}  # releases through 0.33 also map each request to its row
    if "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}:
        extra["req_id_to_index"] = {r: i for i, r in enumerate(ids)}
    return ModelRunnerOutput(req_ids=ids, sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
                             pooler_output=[], kv_connector_output=KVConnectorOutput(invalid_block_ids=set(invalid)),
                             **extra)


def scenario(policy, asynchronous, abort_while_running):
    """A's load fails and A is aborted; returns the failed load's blocks B is scheduled on as computed."""
    FailingStore.loads.clear()
    scheduler = make_scheduler(policy, asynchronous)
    scheduler.add_request(request("A"))
    out = scheduler.schedule()  # A: 48 tokens loaded, 1 computed
    failed = FailingStore.loads["A"]
    ids = list(out.num_scheduled_tokens)
    if abort_while_running:  # drained right before the step's output, as EngineCore does
        scheduler.finish_requests("A", RequestStatus.FINISHED_ABORTED)
    scheduler.update_from_output(out, output(ids, [[7] for _ in ids], failed))
    if not abort_while_running:
        scheduler.finish_requests("A", RequestStatus.FINISHED_ABORTED)
    scheduler.add_request(request("B"))
    out = scheduler.schedule()
    (new,) = out.scheduled_new_reqs
    computed = new.block_ids[0][: new.num_computed_tokens // BLOCK]
    return sorted(set(computed) & set(failed)), failed


bugs = 0
for policy in ("recompute", "fail"):
    for asynchronous in (False, True):
        for abort_while_running in (False, True):
            name = (f"policy={policy:<9} {'AsyncScheduler' if asynchronous else 'Scheduler':<14} abort "
                    f"{'while the step runs' if abort_while_running else 'between steps'}")
            unwritten, failed = scenario(policy, asynchronous, abort_while_running)
            if unwritten:
                bugs += 1
                print(f"BUG: {name}: B is scheduled with its prefix computed on blocks {unwritten}, "
                      f"which A's failed load never wrote and nobody recomputed")
            else:
                print(f"ok:  {name}: B does not read the blocks of the failed load {failed}")
sys.exit(1 if bugs else 0)
