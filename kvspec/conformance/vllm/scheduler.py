"""vLLM 0.25.1's own ``Scheduler`` on a CPU, with no model: built from a
kvspec layout, fed synthetic model-runner outputs.

The scheduler needs a ``VllmConfig``; a real ``ModelConfig`` inspects the
model's architecture (importing model code, which needs vLLM's compiled
ops), so a stand-in carries the handful of facts the scheduler reads about
the model.  Everything else -- the scheduler, its ``KVCacheManager`` (or
kvspec's, under the drop-in), requests and outputs -- is vLLM's own.

:func:`serve` runs a reproducible serving loop: requests with a shared
system prompt arrive, are scheduled, emit one sampled token per step once
their prompt is computed, and finish after a few tokens; it returns what
every step scheduled, so that two runs (vLLM's block manager, kvspec's) can
be compared decision by decision.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import random
from collections.abc import Callable
from typing import Any

from kvspec.spec.layout import Layout


class ModelStandIn:
    """What vLLM's scheduler reads of ``model_config`` for a decoder-only
    text model."""

    is_encoder_decoder = False
    is_diffusion = False
    is_multimodal_model = False
    runner_type = "generate"
    enable_return_routed_experts = False
    is_moe = False
    is_hybrid = False
    is_attention_free = False
    architectures: tuple[str, ...] = ()
    skip_tokenizer_init = True  # token ids only

    def __init__(self, max_model_len: int):
        self.max_model_len = max_model_len

    def __getattr__(self, name: str) -> None:
        # Anything else the scheduler's paths ask (logits processors, routed experts, ...): not set.
        if name.startswith("__"):
            raise AttributeError(name)
        return None


def eagle_config(k: int) -> Any:
    """vLLM's own ``SpeculativeConfig`` for EAGLE with ``k`` draft tokens
    per step, built without the hub: every field at its default, ``method``
    and ``num_speculative_tokens`` set, and ``__post_init__`` -- which loads
    the draft model's config -- not run.  What the scheduler asks of it
    (``use_eagle()``, the block-drop switches of later releases) is then
    the installed release's own code, not a stand-in's answer."""

    from vllm.config import SpeculativeConfig

    config = object.__new__(SpeculativeConfig)
    for field in dataclasses.fields(SpeculativeConfig):
        if field.default is not dataclasses.MISSING:
            object.__setattr__(config, field.name, field.default)
        elif field.default_factory is not dataclasses.MISSING:
            object.__setattr__(config, field.name, field.default_factory())
    object.__setattr__(config, "method", "eagle")
    object.__setattr__(config, "num_speculative_tokens", k)
    return config


FAILURE_POLICIES = ("recompute", "fail")
"""vLLM's ``kv_load_failure_policy``: a failed load's request recomputes the
tokens, or fails (vLLM's default)."""


def make_scheduler(layout: Layout, *, max_num_seqs: int = 16, max_num_batched_tokens: int = 256,
                   connector: bool = False, num_draft_tokens: int = 0, failure_policy: str = "recompute",
                   async_scheduling: bool = False, engine_retention: bool = False,
                   lookahead_hashes: bool = True) -> Any:
    """A vLLM ``Scheduler`` over ``layout``'s KV cache (vLLM's spec classes);
    with ``connector``, vLLM loads :class:`~kvspec.conformance.vllm.connector.ScriptedConnector`
    as a deployment loads a third-party connector, a failed load handled by
    ``failure_policy`` (:data:`FAILURE_POLICIES`); with ``num_draft_tokens``,
    EAGLE speculative decoding (the layout must say ``use_eagle``); with
    ``async_scheduling``, vLLM's ``AsyncScheduler`` under the config that
    selects it (the engine's default where the executor supports it).  The
    KV-cache config's retention interval is the layout's; with
    ``engine_retention`` and a layout that sets none, it is the one vLLM's
    engine writes there from its ``CacheConfig`` (from 0.29: 0, sparse, unless
    configured), as ``vllm serve`` runs.  From 0.33 an EAGLE drafter's block
    hashes cover its lookahead tokens, and no hit drops a block; without
    ``lookahead_hashes`` the scheduler runs as
    ``--speculative-config '{"disable_lookahead_block_hashes": true}'`` sets
    it: the legacy hashes and the block drop (before 0.33, the only way)."""
    if num_draft_tokens and not layout.use_eagle:
        raise ValueError(f"num_draft_tokens={num_draft_tokens} needs a layout with use_eagle")
    if failure_policy not in FAILURE_POLICIES:
        raise ValueError(f"failure_policy must be one of {FAILURE_POLICIES}, not {failure_policy!r}")
    from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    from kvspec.models.vllm_specs import to_vllm_config

    block_size = layout.scheduler_block_size
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=layout.max_model_len, enable_chunked_prefill=True, is_encoder_decoder=False, watermark=0.0,
        async_scheduling=async_scheduling,
    )
    cache_config = CacheConfig(block_size=block_size, gpu_memory_utilization=0.9, cache_dtype="auto",
                               enable_prefix_caching=layout.enable_caching)
    cache_config.num_gpu_blocks = layout.num_blocks
    if layout.mamba_cache_modes:
        cache_config.mamba_cache_mode = next(iter(layout.mamba_cache_modes))
    transfer = None
    if connector:
        transfer = KVTransferConfig(kv_connector="ScriptedConnector", kv_role="kv_both",
                                    kv_connector_module_path="kvspec.conformance.vllm.connector",
                                    kv_load_failure_policy=failure_policy)
    vllm_config = VllmConfig(scheduler_config=scheduler_config, cache_config=cache_config,
                             device_config=DeviceConfig(device="cpu"), kv_transfer_config=transfer)
    object.__setattr__(vllm_config, "model_config", ModelStandIn(layout.max_model_len))
    if num_draft_tokens:
        speculative = eagle_config(num_draft_tokens)
        if not lookahead_hashes and hasattr(speculative, "disable_lookahead_block_hashes"):
            object.__setattr__(speculative, "disable_lookahead_block_hashes", True)
        object.__setattr__(vllm_config, "speculative_config", speculative)
        if hasattr(vllm_config, "_resolve_num_hash_lookahead_tokens"):
            # From 0.34 the count is a field its __post_init__ resolves: resolved again by the release's own
            # code, now that the drafter is set (as an engine given the drafter at construction has it).
            object.__setattr__(vllm_config, "num_hash_lookahead_tokens",
                               vllm_config._resolve_num_hash_lookahead_tokens())
    scheduler_class = AsyncScheduler if async_scheduling else Scheduler
    kv_cache_config = to_vllm_config(layout.kv_cache_config())
    if hasattr(kv_cache_config, "prefix_cache_retention_interval"):  # 0.29 on; before, the environment
        retention = layout.retention_interval
        if retention is None and engine_retention:
            retention = cache_config.prefix_cache_retention_interval
        kv_cache_config.prefix_cache_retention_interval = retention
    return scheduler_class(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                     log_stats=True, structured_output_manager=StructuredOutputManager(vllm_config),
                     block_size=block_size)


def request_factory(hash_block_size: int, num_hash_lookahead_tokens: int = 0) -> Callable[[str, list[int], int], Any]:
    """``new(request_id, prompt, max_tokens)``: a vLLM ``Request`` hashed
    with vLLM's own block hasher (sha256-cbor, as its engine does) that
    samples exactly ``max_tokens`` tokens; from 0.33 the hasher covers the
    ``num_hash_lookahead_tokens`` the engine reads off its config (an EAGLE
    drafter's lookahead, as ``EngineCore`` passes it)."""
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256_cbor)  # as vLLM's engine does at start
    lookahead = (num_hash_lookahead_tokens,) if num_hash_lookahead_tokens else ()  # an argument since 0.33
    hasher = get_request_block_hasher(hash_block_size, sha256_cbor, *lookahead)
    arrivals = itertools.count()

    def new(request_id: str, prompt: list[int], max_tokens: int) -> Any:
        # Arrival times count requests, not seconds: a run does not depend on the clock.
        return Request(request_id, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True), None,
                       block_hasher=hasher, arrival_time=float(next(arrivals)))

    return new


@dataclasses.dataclass
class StepRecord:
    """What one ``schedule()`` decided."""

    scheduled: dict[str, int]  # request id -> tokens scheduled
    new_blocks: dict[str, list[list[int]]]  # new requests -> their block ids per group
    computed: dict[str, int]  # new requests -> tokens already computed (prefix hits)
    preempted: list[str]
    finished: list[str]
    offers: dict[str, list[tuple[int, int, int]]]  # Mamba states handed to a KV connector (0.29 on; else none)
    # running requests -> the block ids they got this step, per group
    grown: dict[str, list[list[int]]] = dataclasses.field(default_factory=dict)


def serve(scheduler: Any, *, steps: int, seed: int = 0, hash_block_size: int = 16,
          prompt_len: tuple[int, int] = (8, 120), max_tokens: int = 6, overlap: bool = False) -> list[StepRecord]:
    """Drive ``scheduler`` for ``steps`` steps; a request arrives on most
    steps (a shared system prompt on half of them), every scheduled request
    whose prompt is done samples one token, and stops after ``max_tokens``.

    ``overlap``: as vLLM's engine runs a scheduler with async scheduling
    (``EngineCore.step_with_batch_queue``, two batches in the queue): step
    ``n + 1`` is scheduled while step ``n`` is still in the forward pass, and
    ``n``'s output comes back after, so the scheduler allocates with tokens
    in flight.  Without it, each step's output comes back before the next
    is scheduled."""

    rng = random.Random(seed)
    new_request = request_factory(hash_block_size, getattr(scheduler.vllm_config, "num_hash_lookahead_tokens", 0))
    system = [rng.randrange(1000) for _ in range(48)]
    records: list[StepRecord] = []
    in_forward: list[tuple[Any, Any]] = []  # (scheduler output, its model output), oldest first
    for step in range(steps):
        if rng.random() < 0.7:
            prompt = (system if rng.random() < 0.5 else []) + [rng.randrange(1000)
                                                              for _ in range(rng.randint(*prompt_len))]
            scheduler.add_request(new_request(f"req-{step}", prompt, max_tokens))
        out = scheduler.schedule()
        ids = list(out.num_scheduled_tokens)
        # A step samples a token for a request whose prompt it completes (a model runner returns nothing
        # for a partial prefill chunk); schedule() has counted the step's tokens as computed already.
        sampled = [[] if scheduler.requests[rid].is_prefill_chunk else [rng.randrange(1000)] for rid in ids]
        cached = out.scheduled_cached_reqs
        records.append(StepRecord(
            scheduled=dict(out.num_scheduled_tokens),
            new_blocks={r.req_id: [list(b) for b in r.block_ids] for r in out.scheduled_new_reqs},
            computed={r.req_id: r.num_computed_tokens for r in out.scheduled_new_reqs},
            preempted=sorted(getattr(out, "preempted_req_ids", None) or []),
            finished=sorted(out.finished_req_ids),
            offers=getattr(scheduler.connector, "offers", {}),
            grown={rid: [list(b) for b in new_ids] for rid, new_ids in zip(cached.req_ids, cached.new_block_ids,
                                                                            strict=True) if new_ids},
        ))
        in_forward.append((out, runner_output(ids, sampled)))
        if len(in_forward) > int(overlap):
            scheduler.update_from_output(*in_forward.pop(0))
    for out, output in in_forward:
        scheduler.update_from_output(out, output)
    return records


def runner_output(ids: list[str], sampled: list[list[int]], connector_output: Any = None) -> Any:
    """The ``ModelRunnerOutput`` a forward pass over requests ``ids`` hands
    the scheduler: ``sampled[i]`` is what request ``ids[i]`` sampled (empty
    for a prefill chunk).  Through 0.33 the output also maps each id to its
    row (``req_id_to_index``); 0.34 dropped that field."""
    from vllm.v1.outputs import ModelRunnerOutput

    extra = {"req_id_to_index": {r: i for i, r in enumerate(ids)}} if _maps_ids_to_rows() else {}
    return ModelRunnerOutput(req_ids=ids, sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
                             pooler_output=[], kv_connector_output=connector_output, **extra)


def abort(scheduler: Any, request_ids: str | list[str]) -> None:
    """The client aborts ``request_ids``: the scheduler finishes them as aborted."""
    from vllm.v1.request import RequestStatus

    scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)


def connector_output(received: set[str], invalid_block_ids: set[int]) -> Any:
    """The ``KVConnectorOutput`` of a step: the requests whose asynchronous
    loads finished, and the blocks a failed load left invalid."""
    from vllm.v1.outputs import KVConnectorOutput

    return KVConnectorOutput(finished_recving=received or None, invalid_block_ids=invalid_block_ids)


def propose_drafts(scheduler: Any, request_ids: list[str], proposals: list[list[int]]) -> None:
    """The drafter hands the scheduler ``proposals[i]`` for ``request_ids[i]``."""
    from vllm.v1.outputs import DraftTokenIds

    scheduler.update_draft_token_ids(DraftTokenIds(request_ids, proposals))


@functools.cache
def _maps_ids_to_rows() -> bool:
    """Whether the installed release's ``ModelRunnerOutput`` has ``req_id_to_index`` (asked once, not each step)."""
    import dataclasses

    from vllm.v1.outputs import ModelRunnerOutput

    return "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}
