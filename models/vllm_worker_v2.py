"""vLLM's **Model Runner V2** as the kernel stage's worker path: its request
states, its block tables (staged writes, gather, slot mapping) and its input
preparation, as ``vllm/v1/worker/gpu/model_runner.py`` runs them each step.

vLLM 0.25.1 serves every dense generate model with Model Runner V2 on a
GPU (:mod:`.vllm_runner_choice`); this module drives it for those layouts,
as :mod:`.vllm_worker` drives Model Runner V1 for the others.  Each step
becomes a ``SchedulerOutput`` (the same one V1 is handed) and vLLM's own
``GPUModelRunner`` methods of V2 run on it, in ``execute_model``'s order:

- ``finish_requests`` (finished and preempted requests leave
  ``RequestState``), ``add_requests`` (a new or resumed request's state and
  its whole table, a staged write that overwrites the row), ``update_requests``
  (computed-token counts; a running request's new blocks, a staged append),
  then ``BlockTables.apply_staged_writes`` (Triton's ``_apply_write_kernel``,
  fused across groups);
- ``prepare_inputs``: the batch order (decode first), ``idx_mapping``,
  ``query_start_loc``, and ``prepare_pos_seq_lens`` (a Triton kernel) for
  positions and ``seq_lens``;
- ``prepare_attn``: ``gather_block_tables`` (the request rows into the
  batch's input tables, a Triton kernel) and ``compute_slot_mappings``
  (a Triton kernel, every group at once);
- after the step, ``postprocess_sampled`` (``post_update``, a Triton
  kernel): V2 advances each request's computed tokens on the device itself
  by its query length less its rejected drafts -- ``update_requests`` only
  sets the host mirror -- and the next step's positions start there.

The kernels read V2's gathered tables, in V2's batch order, and the K/V is
written through V2's slot mapping by vLLM's
``triton_reshape_and_cache_flash`` (as for V1).  kvspec's tables are the
oracle, compared request by request (**vllm-block-table**).

On a CPU, with Triton's interpreter (its loads and stores of raw pointers
work there: the buffers are host memory), the stand-ins are:

- **UVA buffers**: V2 keeps host-written buffers that the GPU reads in
  place (``UvaBuffer``, pinned memory mapped into the device).  On a CPU,
  vLLM's own CPU backend swaps in ``vllm/v1/worker/cpu/buffer_utils.py``'s
  ``UvaBuffer`` (plain host memory; ``vllm/v1/worker/cpu/shm.py`` does the
  swap); the stage does the same, and answers its ``is_uva_available``
  check yes (vLLM's own says yes on its CPU platform; here the platform is
  unspecified).  Host copies are unpinned: ``PIN_MEMORY`` off (as for V1)
  and ``Tensor.pin_memory`` returning the tensor, as ``shm.py`` does;
- **the runner object**: V2's ``GPUModelRunner`` needs a model and a
  device, so its methods run on :class:`_RunnerV2` holding what they read:
  vLLM's ``RequestState``, ``BlockTables`` and ``InputBuffers``, the runner's
  settings (no pipeline parallelism, no DCP, no speculative decoding), and
  no-op stand-ins for what the kernels do not read: the model state (M-RoPE
  and the like), LoRA state, the sampler and prompt logprobs (the stage
  samples nothing: ``is_last_pp_rank`` is off, so ``add_requests`` hands
  them nothing), the encoder cache, the KV-block zeroer (the engine poisons
  fresh blocks itself).

Not driven: Mamba groups (V2 does not serve hybrid models in 0.25.1) and
MLA's cache write (``concat_and_cache_mla`` is a CUDA op).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any
from unittest import mock

import torch

from kvspec.models.block_table import manager_block_ids
from kvspec.models.vllm_worker import VllmWorker, vllm_worker_available

if TYPE_CHECKING:
    from kvspec.models.runner import Engine, Work


def vllm_worker_v2_available() -> str | None:
    """None when vLLM's Model Runner V2 can be driven here, else why not."""
    problem = vllm_worker_available()
    if problem is not None:
        return problem
    try:
        from vllm.v1.worker.cpu import buffer_utils  # noqa: F401
        from vllm.v1.worker.gpu import block_table, input_batch, model_runner, states  # noqa: F401
    except Exception as error:
        return f"vLLM's Model Runner V2 modules do not import ({type(error).__name__}: {error})"
    return None


def vllm_worker_v2_serves(layout: Any) -> str | None:
    """None when the stage can drive Model Runner V2 for ``layout``, else
    why not: V2 cannot run here, or the layout has a Mamba group (V2's
    Mamba state handling, ``model_states/mamba_hybrid.py``, is not driven by
    kvspec yet; on 0.25.1 vLLM runs hybrid models on V1 anyway)."""
    problem = vllm_worker_v2_available()
    if problem is not None:
        return problem
    if any(type(g).__name__ == "MambaSpec" for g in layout.groups):
        return ("the layout has a Mamba group, and kvspec does not drive Model Runner V2's Mamba state "
                "(vllm/v1/worker/gpu/model_states/mamba_hybrid.py) yet")
    return None


@contextlib.contextmanager
def host_buffers(device: torch.device) -> Iterator[None]:
    """V2's UVA buffers as vLLM's CPU backend makes them (see the module
    docstring); nothing changes on a CUDA device."""
    if device.type == "cuda":
        yield
        return
    import vllm.utils.torch_utils as torch_utils
    from vllm.v1.worker.cpu import buffer_utils as cpu_buffers
    from vllm.v1.worker.gpu import buffer_utils as gpu_buffers

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(gpu_buffers, "UvaBuffer", cpu_buffers.UvaBuffer))
        # vLLM's CPU platform answers yes; 0.25.1 asks in the CPU UvaBuffer, 0.34.0 in gpu/buffer_utils.py
        # (its staged writes and buffer pools choose UVA by it).
        for module in (cpu_buffers, gpu_buffers):
            if hasattr(module, "is_uva_available"):
                stack.enter_context(mock.patch.object(module, "is_uva_available", lambda: True))
        stack.enter_context(mock.patch.object(torch_utils, "PIN_MEMORY", False))
        stack.enter_context(mock.patch.object(torch.Tensor, "pin_memory", _unpinned))
        yield


def _unpinned(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``Tensor.pin_memory`` on a machine with no accelerator: the tensor
    itself (vLLM's CPU backend patches it the same way, ``fake_pin_memory``)."""
    return self


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def _block_table_args(engine: Engine, kernel_block_sizes: list[int], max_num_batched_tokens: int, max_len: int,
                      device: torch.device) -> dict[str, Any]:
    """``BlockTables``' arguments as V2's ``initialize_kv_cache`` passes them,
    for the installed release: 0.25.1 takes the kernel block sizes (its
    tables split manager blocks); 0.34.0 takes none (its tables hold manager
    blocks) but each group's sliding-window reach (``gather_block_tables``
    masks blocks out of the window: ``SlidingWindowSpec.num_retained_tokens``
    of vLLM's spec), whether it has a slot mapping, and whether it is
    DCP-sharded."""
    import inspect

    from vllm.v1.worker.gpu.block_table import BlockTables

    from kvspec.models.vllm_specs import to_vllm_spec

    groups = engine.groups
    args: dict[str, Any] = dict(block_sizes=[g.block_size for g in groups], max_num_reqs=engine.max_num_reqs,
                                max_num_batched_tokens=max_num_batched_tokens,
                                max_num_blocks_per_group=[-(-max_len // g.block_size) for g in groups], device=device)
    params = inspect.signature(BlockTables).parameters
    if "kernel_block_sizes" in params:
        args["kernel_block_sizes"] = kernel_block_sizes
    elif kernel_block_sizes != [g.block_size for g in groups]:
        raise RuntimeError("this release's Model Runner V2 block tables hold manager blocks whole; the layout reads "
                           f"them as kernel blocks of {kernel_block_sizes} (not driven here)")
    if "sliding_window_reach" in params:
        specs = [to_vllm_spec(engine.layout.groups[g.index]) for g in groups]
        args["sliding_window_reach"] = [int(getattr(s, "num_retained_tokens", 0) or 0)
                                        if type(s).__name__ == "SlidingWindowSpec" else 0 for s in specs]
        args["slot_mapping_enabled"] = [bool(getattr(s, "uses_slot_mapping", True)) for s in specs]
    return args


class _RunnerV2:
    """What V2's ``GPUModelRunner`` step methods read, for a runner with no
    model, no pipeline or context parallelism and no speculative decoding;
    the request states, block tables and input buffers are vLLM's."""

    def __init__(self, engine: Engine, kernel_block_sizes: list[int], max_num_batched_tokens: int,
                 device: torch.device):
        from vllm.v1.worker.gpu.block_table import BlockTables
        from vllm.v1.worker.gpu.input_batch import InputBuffers
        from vllm.v1.worker.gpu.states import RequestState

        layout = engine.layout
        self.device = device
        self.max_num_reqs = engine.max_num_reqs
        max_len = max(layout.max_model_len, engine.num_encoder_tokens)
        self.req_states = RequestState(self.max_num_reqs, max_len, max_num_batched_tokens, num_speculative_steps=0,
                                       vocab_size=1 << 20, device=device)
        self.block_tables = BlockTables(**_block_table_args(engine, kernel_block_sizes, max_num_batched_tokens,
                                                            max_len, device))
        self.input_buffers = InputBuffers(self.max_num_reqs, max_num_batched_tokens, device)
        self.model_state = SimpleNamespace(remove_request=_nothing, add_request=_nothing, postprocess_state=_nothing,
                                           apply_staged_writes=_nothing, num_new_sampled_tokens_per_step=1)
        self.lora_state = SimpleNamespace(remove_request=_nothing, add_request=_nothing)
        self.pp_handler = self.encoder_cache = self.prompt_logprobs_worker = self.sampler = None
        self.is_last_pp_rank = False  # nothing sampled: the sampler is handed no request
        self.kv_block_zeroer = SimpleNamespace(zero_block_ids=_nothing)  # the engine poisons fresh blocks itself
        self.use_dcp = self.use_pp = False
        self.decode_query_len = 1
        self.model_config = SimpleNamespace(rswa_window=None)
        # 0.34.0 reads these too: no pooling, no speculator or adaptive verification, no prefill context
        # parallelism, no fast prefill, no drafts to hand over, no LoRA config, no block copies to make.
        self.pooling_runner = self.speculator = self.adaptive_verification = self.pcp_manager = None
        self.fast_prefill = self.lora_config = None
        self.draft_tokens_handler = SimpleNamespace(discard=_nothing, begin_step=_nothing)
        self.kv_caches: list[Any] = []
        self.replayssm_block_copy_tensors: list[Any] = []

    def _remove_request(self, req_id: str) -> bool:
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner

        return GPUModelRunner._remove_request(self, req_id)


class VllmWorkerV2(VllmWorker):
    """Model Runner V2's request states, block tables, input preparation,
    slot mapping and cache writes for one engine (see the module
    docstring).  Rows are V2's batch indices this step."""

    runner_name = "Model Runner V2"

    def __init__(self, engine: Engine):
        problem = vllm_worker_v2_available()
        if problem is not None:
            raise RuntimeError(problem)
        if any(g.kind == "mamba" for g in engine.groups):
            raise RuntimeError("Model Runner V2 does not serve Mamba groups (vLLM runs hybrid models on V1)")
        self.engine = engine
        self.device = torch.device(engine.device)
        self.max_num_reqs = engine.max_num_reqs
        self.max_num_batched_tokens = 4 * engine.layout.max_model_len
        self.kernel_block_sizes = [self._kernel_block_size(g) for g in engine.groups]
        with host_buffers(self.device):
            self.runner = _RunnerV2(engine, self.kernel_block_sizes, self.max_num_batched_tokens, self.device)
        self.masks_window = bool(getattr(self.runner.block_tables, "has_sliding_window_groups", False))
        self.finished: set[str] = set()
        self.preempted: set[str] = set()
        self.resumed: set[str] = set()
        self.positions: dict[str, list[int]] = {}
        self.seq_lens: dict[str, int] = {}
        self.known: set[str] = set()  # requests V2 holds state for (the scheduler sends these as cached)
        self._rows: dict[str, int] = {}
        self._tables: tuple[torch.Tensor, ...] = ()
        self._slot_mappings: torch.Tensor | None = None
        self._query_start: list[int] = [0]
        self._idx: list[int] = []
        self._last_batch: Any = None  # the last step's input batch, whose tokens count as computed next step

    def prepare(self, work: Sequence[Work]) -> None:
        """The step through V2: ``finish_requests``, ``add_requests``,
        ``update_requests``, the staged writes applied, ``prepare_inputs``
        and ``prepare_attn`` -- vLLM's methods, in ``execute_model``'s order."""
        from vllm.config import CUDAGraphMode
        from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner

        output = self._scheduler_output(work)
        runner = self.runner
        with host_buffers(self.device):
            if self._last_batch is not None:  # the end of the last step: computed tokens advanced on the device
                GPUModelRunner.postprocess_num_computed_tokens(runner, self._last_batch)
                self._last_batch = None
            GPUModelRunner.finish_requests(runner, output)
            if hasattr(GPUModelRunner, "free_states"):  # 0.34.0: the encoder cache's frees (none here)
                GPUModelRunner.free_states(runner, output)
            GPUModelRunner.add_requests(runner, output)
            GPUModelRunner.update_requests(runner, output)
            runner.block_tables.apply_staged_writes()
            self.finished, self.preempted = set(), set()
            self.known = set(runner.req_states.req_id_to_index)
            if output.total_num_scheduled_tokens == 0:
                self._rows, self.positions = {}, {}
                return
            if output.total_num_scheduled_tokens > self.max_num_batched_tokens:
                raise ValueError(f"a step of {output.total_num_scheduled_tokens} tokens; the worker was sized for "
                                 f"{self.max_num_batched_tokens}")
            desc = BatchExecutionDescriptor(cg_mode=CUDAGraphMode.NONE, num_tokens=output.total_num_scheduled_tokens,
                                            num_reqs=None)
            if hasattr(GPUModelRunner, "gather_batch_req_state"):  # 0.34.0: the batch's request state first
                batch_state, _ = GPUModelRunner.gather_batch_req_state(runner, output, False)
                batch = GPUModelRunner.prepare_inputs(runner, output, batch_state, desc, 0)
            else:
                batch = GPUModelRunner.prepare_inputs(runner, output, desc)
            self._last_batch = batch
            self._tables, slot_mappings = GPUModelRunner.prepare_attn(runner, batch)
        self._slot_mappings = slot_mappings.to("cpu", torch.int64)
        starts = [int(x) for x in batch.query_start_loc[: batch.num_reqs + 1].tolist()]
        positions = batch.positions[: batch.num_tokens].tolist()
        seq_lens = batch.seq_lens[: batch.num_reqs].tolist()
        self._rows = {rid: i for i, rid in enumerate(batch.req_ids)}
        self._idx = [int(i) for i in batch.idx_mapping.tolist()]
        self._query_start = starts
        self.positions = {rid: positions[starts[i]:starts[i + 1]] for i, rid in enumerate(batch.req_ids)}
        self.seq_lens = {rid: int(seq_lens[i]) for i, rid in enumerate(batch.req_ids)}

    def _scheduler_output(self, work: Sequence[Work]) -> Any:
        """V1's scheduler output, with what V2 also reads: each new
        request's prefill tokens (its tokens so far, as vLLM's scheduler
        sends them to V2).  A
        resumed request is sent as new: vLLM's scheduler does so for V2."""
        output = self._v1_output(work)
        resumed = set(self.resumed)
        if resumed:
            output = self._resumed_as_new(output, work, resumed)
        requests = {w.request.request_id: w.request for w in work}
        for new in output.scheduled_new_reqs:  # as vLLM's scheduler does for V2: the request's tokens so far
            new.prefill_token_ids = list(getattr(requests[new.req_id], "_all_token_ids", None) or
                                         new.prompt_token_ids)
        return output

    # the V1 path's requests dict decides new vs cached: V2's request states do here
    def _v1_output(self, work: Sequence[Work]) -> Any:
        self.runner.requests = {rid: SimpleNamespace(output_token_ids=[]) for rid in self.known}
        return VllmWorker._scheduler_output(self, work)

    def _resumed_as_new(self, output: Any, work: Sequence[Work], resumed: set[str]) -> Any:
        from vllm import SamplingParams
        from vllm.v1.core.sched.output import NewRequestData

        from kvspec.models.vllm_worker import _prompt_ids

        cached = output.scheduled_cached_reqs
        keep = [i for i, rid in enumerate(cached.req_ids) if rid not in resumed]
        for w in work:
            rid = w.request.request_id
            if rid in resumed:
                output.scheduled_new_reqs.append(NewRequestData(
                    req_id=rid, prompt_token_ids=_prompt_ids(w.request), mm_features=[],
                    sampling_params=SamplingParams(max_tokens=self.engine.layout.max_model_len), pooling_params=None,
                    block_ids=tuple(list(i) for i in self.engine.target.get_block_ids(rid)),
                    num_computed_tokens=w.start, lora_request=None, prefill_token_ids=None))
        cached.req_ids = [cached.req_ids[i] for i in keep]
        cached.new_block_ids = [cached.new_block_ids[i] for i in keep]
        cached.num_computed_tokens = [cached.num_computed_tokens[i] for i in keep]
        cached.num_output_tokens = [cached.num_output_tokens[i] for i in keep]
        if hasattr(cached, "resumed_req_ids"):  # gone in 0.34.0, where resumed requests are always sent as new
            cached.resumed_req_ids = set()
        return output

    def after_step(self, work: Sequence[Work], accepted: dict[str, int]) -> None:
        """The end of the step as V2's ``postprocess_sampled`` makes it: each
        request's computed tokens advance on the device by its query length
        less its rejected drafts (``post_update``, a Triton kernel).  No token
        is handed over as sampled (``num_sampled`` 0): the stage's tokens are
        the engine's, and V2's token buffers are not what the kernels read."""
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner

        batch, self._last_batch = self._last_batch, None
        if batch is None:
            return
        rejected = torch.zeros(batch.num_reqs, dtype=torch.int32, device=self.device)
        for w in work:
            if w.drafts and w.request.request_id in self._rows:
                rejected[self._rows[w.request.request_id]] = len(w.drafts) - accepted.get(w.request.request_id, 0)
        none = torch.zeros(batch.num_reqs, dtype=torch.int32, device=self.device)
        sampled = torch.zeros(batch.num_reqs, 1, dtype=torch.int64, device=self.device)
        with host_buffers(self.device):
            GPUModelRunner.postprocess_sampled(self.runner, batch.idx_mapping, sampled, none, rejected,
                                               batch.query_start_loc)

    def nulled_below_window(self, group: Any, work: Any) -> int:
        """From 0.34.0 V2's ``gather_block_tables`` puts the null block in
        every entry of a sliding-window group wholly below the window of
        the request's first scheduled token (those blocks may already be
        freed and reused).  kvspec's rule for which entries no query of the
        step reads: a window of ``W`` tokens lets the query at ``start``
        read from ``start - W + 1``, so the blocks wholly below that -- and
        only those -- may be null.  0.25.1 gathers rows whole."""
        if not self.masks_window or group.window is None or group.kind != "attention":
            return 0
        return max(work.start - group.window + 1, 0) // group.block_size

    def row_of(self, request_id: str) -> int:
        """The request's batch index in V2's input batch this step."""
        return self._rows[request_id]

    def block_table(self, group: int) -> torch.Tensor:
        """V2's gathered input block table for this step's batch."""
        return self._tables[group][: len(self._rows)]

    def held(self, group: int, row: int) -> torch.Tensor:
        """The kernel-block ids V2 gathered into batch row ``row``: as many
        as its ``BlockTables.num_blocks`` says the request holds."""
        n = int(self.runner.block_tables.num_blocks.np[group, self._idx[row]])
        return self._tables[group][row, :n].to("cpu")

    def row(self, group: int, row: int) -> list[int]:
        per_block = getattr(self.runner.block_tables, "blocks_per_kv_block", None)  # 0.34.0: no split, 1
        return manager_block_ids(self.held(group, row).tolist(), per_block[group] if per_block else 1)

    def slot_mapping(self, group: int, row: int) -> torch.Tensor:
        start, end = self._query_start[row], self._query_start[row + 1]
        assert self._slot_mappings is not None
        return self._slot_mappings[group, start:end]

    def mamba_state(self, group: Any, request_id: str) -> tuple[int, int, int]:
        raise RuntimeError("Model Runner V2 drives no Mamba group")

    def compare(self, work: Sequence[Work], check: Any) -> None:
        """V1's comparison over V2's rows, slots and positions, then V2's
        ``seq_lens`` against the scheduled ends."""
        super().compare(work, check)
        for w in work:
            rid = w.request.request_id
            if rid in self.seq_lens and self.seq_lens[rid] != w.end:
                check(f"request {rid}: Model Runner V2's seq_lens says {self.seq_lens[rid]}, the scheduler "
                      f"scheduled up to {w.end}")
                return

