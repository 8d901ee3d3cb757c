"""vLLM's own worker path in the kernel stage: the persistent batch, the
block tables the kernels read, the slot mapping, the cache writes and the
Mamba state indices, as vLLM's model runner does them.

When the target is vLLM, the test is of vLLM as it runs, not of kvspec's
model of its worker.  So the :class:`~kvspec.models.runner.Engine` hands the
worker's jobs to vLLM's code:

- **the model runner's state update**: each step becomes a vLLM
  ``SchedulerOutput`` (new requests with their whole tables; running ones
  with their new blocks; resumed ones with their replacement tables;
  finished and preempted ids) and vLLM's own
  ``GPUModelRunner._update_states`` applies it to vLLM's ``InputBatch`` --
  cached request states, rows assigned, freed and condensed, block-table rows
  added, appended and replaced (``vllm/v1/worker/gpu_model_runner.py``,
  ``gpu_input_batch.py``).  The model runner object itself needs a model and
  a device, so ``_update_states`` runs on a small stand-in holding the state
  it reads (:class:`_RunnerState`); the code that runs is vLLM's;
- **the KV-cache tensors**: vLLM's ``get_kv_cache_config_from_groups``
  plans which layers share which tensor (one layer of every group each) and
  its size; the engine lays its buffers out by that plan, and the
  ``cache-layout`` check holds it to every layer having memory of its own;
- **block tables**: the ``InputBatch``'s ``MultiGroupBlockTable`` (with its
  own split of manager blocks into kernel blocks); ``commit_block_table``
  copies the rows to the device tensor, and *that* tensor, in vLLM's row
  order, is what every attention kernel and the Mamba step read;
- **positions and slot mapping**: each row's positions from the
  ``InputBatch``'s computed-token counts, then vLLM's Triton
  ``_compute_slot_mapping_kernel`` (via ``compute_slot_mapping``);
- **cache writes**: vLLM's ``triton_reshape_and_cache_flash`` writes every
  scheduled token's K and V through that slot mapping (attention groups; an
  MLA group's latent is written by kvspec: vLLM's ``concat_and_cache_mla`` is
  a CUDA op);
- **Mamba state indices** (align mode): vLLM's ``preprocess_mamba``
  (``vllm/v1/worker/mamba_utils.py``) decides which block each request's
  running state is copied from and to, and ``mamba_get_block_table_tensor``
  which block the kernel reads and writes.  The copy itself is kvspec's:
  vLLM's ``batch_memcpy`` moves raw device pointers, which Triton's
  interpreter cannot follow.

kvspec's own tables (:class:`~kvspec.models.block_table.BlockTables`) are
fed the same updates and stay the oracle: the ``vllm-block-table`` check
compares, request by request, vLLM's row, its positions, its slot mapping
and its Mamba state indices with kvspec's every step, and the other checks
(exact-gather, slot-ownership, mamba-state) judge what vLLM's tables made the
kernels read.  On a CPU, vLLM's Triton kernels run under Triton's
interpreter (``TRITON_INTERPRET=1``, set before Triton is imported).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any
from unittest import mock

import torch

from kvspec.models.block_table import manager_block_ids
from kvspec.models.kernels import triton_cannot_run
from kvspec.models.vllm_specs import to_vllm_spec
from kvspec.spec.content import mamba_token_positions

if TYPE_CHECKING:
    from kvspec.models.runner import Engine, Group, Work


def vllm_worker_available() -> str | None:
    """None when the part of vLLM's worker path both model runners share
    can run here (the cache write, the KV-cache tensor plan, the kernel
    block size), else why not (an environment problem, never the target's
    failure).  Which runner can run: :func:`vllm_worker_v1_available`, and
    :func:`~kvspec.models.vllm_worker_v2.vllm_worker_v2_available`."""
    try:
        import triton  # noqa: F401
        from vllm.v1.attention.ops.triton_reshape_and_cache_flash import triton_reshape_and_cache_flash  # noqa: F401
        from vllm.v1.kv_cache_interface import KVCacheTensor  # noqa: F401
        from vllm.v1.worker.utils import select_common_block_size  # noqa: F401
    except Exception as error:  # ImportError (einops, say), or vLLM's Triton probe refusing
        return f"vLLM's worker modules do not import ({type(error).__name__}: {error})"
    return triton_cannot_run()


def vllm_worker_v1_available() -> str | None:
    """None when vLLM's Model Runner V1 can be driven here, else why not:
    vLLM 0.34.0 removed it (``vllm/v1/worker/gpu_model_runner.py`` and
    ``gpu_input_batch.py`` are gone)."""
    problem = vllm_worker_available()
    if problem is not None:
        return problem
    import importlib.util

    if importlib.util.find_spec("vllm.v1.worker.gpu_model_runner") is None:
        return "this vLLM release has no Model Runner V1 (vllm/v1/worker/gpu_model_runner.py is gone)"
    try:
        from vllm.v1.attention.backends.mamba_attn import BaseMambaAttentionMetadataBuilder  # noqa: F401
        from vllm.v1.worker import gpu_input_batch, gpu_model_runner, mamba_utils  # noqa: F401
        from vllm.v1.worker.block_table import MultiGroupBlockTable  # noqa: F401
    except Exception as error:
        return f"vLLM's Model Runner V1 modules do not import ({type(error).__name__}: {error})"
    return None


@contextlib.contextmanager
def _on_cpu(device: torch.device) -> Iterator[None]:
    """vLLM's kernel launchers ask the CUDA device for its compute capability
    to pick tile sizes; a CPU tensor has none.  Under Triton's interpreter
    the answer only sizes the tiles, so the launcher is told a Hopper's."""
    if device.type == "cuda":
        yield
        return
    with mock.patch("torch.cuda.get_device_capability", return_value=(9, 0)):
        yield


@contextlib.contextmanager
def _unpinned(device: torch.device) -> Iterator[None]:
    """vLLM's ``InputBatch`` pins its host buffers when the platform says
    it can; with no accelerator there is no pinned allocator, so on a CPU
    they are plain host memory (what they hold is the same)."""
    if device.type == "cuda":
        yield
        return
    from vllm.v1.worker import gpu_input_batch

    with mock.patch.object(gpu_input_batch, "PIN_MEMORY", False):
        yield


def _prompt_ids(request: Any) -> list[int]:
    """The prompt as token ids for vLLM's batch (zeros for a prompt given as
    embeddings: the block tables do not read tokens)."""
    if request.prompt_token_ids is not None:
        return list(request.prompt_token_ids)
    return [0] * request.num_prompt_tokens


RELEASE_DROPPED = frozenset({"resumed_req_ids", "all_token_ids", "num_common_prefix_blocks"})
"""Scheduler-output fields that vLLM 0.34.0 removed: with Model Runner V1
gone, a resumed request is always sent as new (no ``resumed_req_ids``, no
``all_token_ids``), and cascade attention's ``num_common_prefix_blocks``
went with ``get_num_common_prefix_blocks`` (spec/releases/v0_34_0.py)."""


def _release_fields(cls: Any, **fields: Any) -> Any:
    """``cls(**fields)`` leaving out those of :data:`RELEASE_DROPPED` that the
    installed release's ``cls`` no longer has (any other unknown field is an
    error, as it was)."""
    import dataclasses

    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in fields.items() if k in known or k not in RELEASE_DROPPED})


class _RunnerState:
    """What ``GPUModelRunner._update_states`` reads from the model runner,
    for a runner with no model, no pipeline parallelism, no speculative
    decoding config and synchronous scheduling: the persistent batch and the
    cached request states are real vLLM objects; the rest are the settings
    of such a runner."""

    def __init__(self, input_batch: Any, device: torch.device):
        self.input_batch = input_batch
        self.device = device
        self.requests: dict[str, Any] = {}  # vLLM's CachedRequestState per request id
        self.num_prompt_logprobs: dict[str, int] = {}
        self.encoder_cache: dict[str, Any] = {}
        self.late_interaction_runner = SimpleNamespace(on_requests_finished=lambda ids: None,
                                                       register_request=lambda *args: None)
        self.speculative_config = None
        self.is_pooling_model = False
        self.uses_mrope = False
        self.uses_xdrope_dim = 0
        self.use_async_spec_decode = False
        self.use_async_scheduling = False
        self.zeroed: list[int] = []

    def _zero_block_ids(self, block_ids: Any) -> None:
        self.zeroed.extend(block_ids)  # the caches' zeroing is the engine's (it poisons fresh blocks itself)

    def _may_reorder_batch(self, scheduler_output: Any) -> None:
        """The attention backends' reordering: none for the kernels driven here."""


class VllmWorker:
    """vLLM's worker-side persistent batch, block tables, slot mapping,
    cache writes and Mamba state indices for one engine (see the module
    docstring).  Rows are vLLM's: :meth:`row_of` says where a request is."""

    def __init__(self, engine: Engine):
        problem = vllm_worker_v1_available()
        if problem is not None:
            raise RuntimeError(problem)
        from vllm.v1.worker import gpu_input_batch

        self.engine = engine
        self.device = torch.device(engine.device)
        self.max_num_reqs = engine.max_num_reqs
        self.max_num_batched_tokens = 4 * engine.layout.max_model_len
        self.kernel_block_sizes = [self._kernel_block_size(g) for g in engine.groups]
        with _unpinned(self.device):
            self.batch = gpu_input_batch.InputBatch(
                max_num_reqs=self.max_num_reqs, max_model_len=engine.layout.max_model_len,
                max_num_batched_tokens=self.max_num_batched_tokens, device=self.device, vocab_size=1 << 20,
                block_sizes=[g.block_size for g in engine.groups], kernel_block_sizes=self.kernel_block_sizes)
        self.runner = _RunnerState(self.batch, self.device)
        self.table = self.batch.block_table
        self.finished: set[str] = set()  # since the last step: the scheduler output's finished_req_ids
        self.preempted: set[str] = set()  # ... and preempted_req_ids
        self.resumed: set[str] = set()  # resumed this step (the scheduler output's resumed_req_ids, to 0.33)
        self.mamba_state_idx: dict[str, int] = {}  # vLLM's model runner's, kept across steps
        self.mamba_copies: dict[str, tuple[int, int]] = {}  # align mode: request -> state copied from, to
        self.mamba_all: dict[tuple[int, str], tuple[int, int]] = {}  # all mode: (block size, request) -> read, last
        self.positions: dict[str, list[int]] = {}  # request -> the positions vLLM computed this step
        self._slots: dict[int, tuple[int, int]] = {}  # row -> [start, end) in this step's slot mapping
        self._num_rows = 0

    def _kernel_block_size(self, group: Group) -> int:
        """The kernel block size vLLM's model runner picks for a group:
        ``select_common_block_size`` over the backend's supported sizes
        (those the engine's setup names; a backend stand-in carries them:
        FlashInfer's module needs the flashinfer package), Mamba groups
        never split (as ``prepare_kernel_block_sizes`` does)."""
        supported = self.engine.kernel_block_sizes
        if group.kind == "mamba" or supported is None:
            return group.block_size
        from vllm.v1.worker.utils import select_common_block_size

        backend = type("KernelBackend", (), {"get_supported_kernel_block_sizes": staticmethod(lambda: list(supported))})
        return select_common_block_size(group.block_size, [backend])

    @property
    def plans_cache(self) -> bool:
        """Whether :meth:`cache_plan` is vLLM's: releases up to 0.33 plan the
        KV-cache tensors with ``get_kv_cache_config_from_groups`` in
        ``kv_cache_utils``, one tensor per layer index ``shared_by`` a layer
        of every group.  0.34.0 moved it (``kv_cache_planning``) and plans
        by byte offsets and strides (``KVCacheTensor.layers``,
        ``layer_stride``, ``block_stride``), which the engine's caches do
        not lay out yet: there the engine keeps kvspec's model of the plan
        (the ``cache-layout`` check then judges kvspec's plan, not vLLM's)."""
        from vllm.v1.core import kv_cache_utils

        return hasattr(kv_cache_utils, "get_kv_cache_config_from_groups")

    def cache_plan(self, page_bytes: int) -> list[Any]:
        """vLLM's plan of the KV-cache tensors -- which layers share which
        tensor, and its size -- from vLLM's ``get_kv_cache_config_from_groups``
        over the engine's groups and layers (vLLM's specs, their pages padded
        to one size as vLLM pads hybrid models' pages), for the engine's pool."""
        from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups
        from vllm.v1.kv_cache_interface import KVCacheGroupSpec

        groups = self.engine.groups
        specs = [self.engine.layout.groups[g.index] for g in groups]
        page = max(page_bytes, *(to_vllm_spec(s).page_size_bytes for s in specs))
        vllm_groups = [KVCacheGroupSpec(layer_names=list(g.layers),
                                        kv_cache_spec=to_vllm_spec(replace(s, page_size_padded=page)))
                       for g, s in zip(groups, specs, strict=True)]
        settings = SimpleNamespace(cache_config=SimpleNamespace(num_gpu_blocks_override=None), kv_transfer_config=None)
        memory = page * self.engine.layout.num_blocks * max(len(g.layers) for g in groups)
        return get_kv_cache_config_from_groups(settings, vllm_groups, memory).kv_cache_tensors

    # --- what the scheduler tells the worker --------------------------------------------------------------

    def leave(self, request_id: str, finished: bool) -> None:
        """A request leaves the batch: finished, or preempted (it may resume)."""
        (self.finished if finished else self.preempted).add(request_id)

    # --- a step --------------------------------------------------------------------------------------------

    def prepare(self, work: Sequence[Work]) -> None:
        """Before the kernels run: the step's scheduler output through vLLM's
        ``_update_states``, the rows to the device tensor, the positions and
        slot mapping of every scheduled token in vLLM's row order, and (align
        mode) vLLM's Mamba state indices."""
        from vllm.v1.worker import gpu_model_runner

        output = self._scheduler_output(work)
        with mock.patch.object(gpu_model_runner, "get_pp_group", return_value=SimpleNamespace(is_last_rank=True)):
            gpu_model_runner.GPUModelRunner._update_states(self.runner, output)
        self.finished, self.preempted = set(), set()
        batch = self.batch
        self._num_rows = batch.num_reqs
        starts, positions, self.positions = [0], [], {}
        for row, rid in enumerate(batch.req_ids[: self._num_rows]):
            first = int(batch.num_computed_tokens_cpu[row])
            mine = list(range(first, first + output.num_scheduled_tokens.get(rid, 0)))
            self.positions[rid] = mine
            positions += mine
            starts.append(len(positions))
        self._slots = {row: (starts[row], starts[row + 1]) for row in range(self._num_rows)}
        self._query_start = starts
        if len(positions) > self.max_num_batched_tokens:
            raise ValueError(f"a step of {len(positions)} tokens; the worker was sized for "
                             f"{self.max_num_batched_tokens}")
        self.table.commit_block_table(self._num_rows)
        if positions:
            self.table.compute_slot_mapping(self._num_rows, torch.tensor(starts, dtype=torch.int32,
                                                                         device=self.device),
                                            torch.tensor(positions, dtype=torch.int64, device=self.device))
        self._mamba_indices(output)

    def _scheduler_output(self, work: Sequence[Work]) -> Any:
        """The step as vLLM's scheduler would send it to the worker."""
        from vllm import SamplingParams
        from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

        new, cached = [], []
        for w in work:
            rid = w.request.request_id
            if rid not in self.runner.requests:
                ids = self.engine.target.get_block_ids(rid)
                new.append(NewRequestData(  # prefill_token_ids: V2's (set there); required from 0.34.0
                    req_id=rid, prompt_token_ids=_prompt_ids(w.request), mm_features=[],
                    sampling_params=SamplingParams(max_tokens=self.engine.layout.max_model_len), pooling_params=None,
                    block_ids=tuple(list(i) for i in ids), num_computed_tokens=w.start, lora_request=None,
                    prefill_token_ids=None))
            elif w.joins:  # resumed after a preemption: the whole table replaces the old one
                cached.append((rid, tuple(list(i) for i in self.engine.target.get_block_ids(rid)), w.start, True))
            else:
                ids = None if w.new_block_ids is None else tuple(list(i) for i in w.new_block_ids)
                cached.append((rid, ids, w.start, False))
        self.resumed = {c[0] for c in cached if c[3]}
        cached_data = _release_fields(
            CachedRequestData, req_ids=[c[0] for c in cached], resumed_req_ids=self.resumed, new_token_ids=[],
            all_token_ids={}, new_block_ids=[c[1] for c in cached], num_computed_tokens=[c[2] for c in cached],
            num_output_tokens=[len(self.runner.requests[c[0]].output_token_ids) for c in cached])
        scheduled = {w.request.request_id: w.num_new for w in work}
        return _release_fields(
            SchedulerOutput, scheduled_new_reqs=new, scheduled_cached_reqs=cached_data,
            num_scheduled_tokens=scheduled, total_num_scheduled_tokens=sum(scheduled.values()),
            scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={},
            num_common_prefix_blocks=[0] * len(self.engine.groups), finished_req_ids=set(self.finished),
            free_encoder_mm_hashes=[], preempted_req_ids=set(self.preempted))

    def _mamba_indices(self, output: Any) -> None:
        """Each Mamba group's state positions per request, from vLLM's code:
        align mode -- where ``preprocess_mamba`` copies the running state
        from and to (one call for every Mamba group, as the model runner
        makes it); all mode -- the last computed and last scheduled token's
        blocks, from the Mamba metadata builder's
        ``_compute_prefix_caching_block_indices``."""
        self.mamba_copies, self.mamba_all = {}, {}
        modes = {g.mamba_mode for g in self.engine.groups if g.kind == "mamba"}
        if "align" in modes:
            self._align_copies(output)
        if "all" in modes and self.positions:
            self._all_indices()

    def _align_copies(self, output: Any) -> None:
        from vllm.v1.worker import mamba_utils

        groups = [g.index for g in self.engine.groups if g.kind == "mamba" and g.mamba_mode == "align"]
        copies: dict[str, tuple[int, int]] = {}

        def collect(bufs, config, funcs, group_ids, src, dst, bias, req_state, context) -> None:
            copies[req_state.req_id] = (src, dst)

        spec = self.engine.layout.groups[groups[0]]
        bufs = SimpleNamespace(mamba_group_ids=groups, offset=0, mamba_spec=SimpleNamespace(
            block_size=spec.block_size, num_speculative_blocks=spec.num_speculative_blocks))
        with mock.patch.object(mamba_utils, "collect_mamba_copy_meta", collect), \
                mock.patch.object(mamba_utils, "do_mamba_copy_block", lambda bufs: None):
            mamba_utils.preprocess_mamba(output, None, SimpleNamespace(enable_prefix_caching=True),
                                         self.mamba_state_idx, self.batch, self.runner.requests, {}, (), bufs)
        for rid in self.positions:
            current = self.mamba_state_idx[rid]
            self.mamba_copies[rid] = copies.get(rid, (current, current))

    def _all_indices(self) -> None:
        from vllm.v1.attention.backend import CommonAttentionMetadata
        from vllm.v1.attention.backends.mamba_attn import BaseMambaAttentionMetadataBuilder

        rids = self.batch.req_ids[: self._num_rows]
        seq_lens = torch.tensor([self.positions[rid][-1] + 1 if self.positions[rid] else 0 for rid in rids])
        meta = SimpleNamespace(query_start_loc=torch.tensor(self._query_start), seq_lens=seq_lens,
                               _num_computed_tokens_cache=None)
        meta.compute_num_computed_tokens = lambda: CommonAttentionMetadata.compute_num_computed_tokens(meta)
        for g in {g.block_size for g in self.engine.groups if g.kind == "mamba" and g.mamba_mode == "all"}:
            computed, _, scheduled = BaseMambaAttentionMetadataBuilder._compute_prefix_caching_block_indices(
                None, meta, g)
            for i, rid in enumerate(rids):
                self.mamba_all[(g, rid)] = (int(computed[i]), int(scheduled[i]))

    def nulled_below_window(self, group: Group, work: Work) -> int:
        """How many leading entries of the request's row the worker holds as
        the null block because no query of the step can attend them: none
        here (Model Runner V1 gathers rows whole)."""
        return 0

    def row_of(self, request_id: str) -> int:
        """The request's row in vLLM's persistent batch this step."""
        return self.batch.req_id_to_index[request_id]

    def block_table(self, group: int) -> torch.Tensor:
        """The device tensor the kernels read (rows 0..n-1 of this step)."""
        return self.table[group].get_device_tensor(self._num_rows)

    def held(self, group: int, row: int) -> torch.Tensor:
        """The kernel-block ids ``row`` of vLLM's table holds for ``group``."""
        table = self.table[group]
        return table.get_cpu_tensor()[row, :int(table.num_blocks_per_row[row])]

    def row(self, group: int, row: int) -> list[int]:
        """The manager-sized block ids of ``row`` in vLLM's table (for Mamba
        rows, which vLLM never splits into kernel blocks)."""
        return manager_block_ids(self.held(group, row).tolist(), self.table[group].blocks_per_kv_block)

    def mamba_state(self, group: Group, request_id: str) -> tuple[int, int, int]:
        """Where vLLM runs the request's Mamba step: the table position its
        initial state is read from, the position the step's final state is
        kept at, and the block the kernel writes that final state to.  Align
        mode: the copy ``preprocess_mamba`` makes before the step, and the
        block ``mamba_get_block_table_tensor`` gathers from the row; all
        mode: the metadata builder's last computed and last scheduled
        blocks, read from the row."""
        row = self.row_of(request_id)
        if group.mamba_mode == "all":
            read, last = self.mamba_all[(group.block_size, request_id)]
            table = self.row(group.index, row)
            return read, last, table[last] if 0 <= last < len(table) else -1
        from vllm.v1.attention.backends.utils import mamba_get_block_table_tensor

        src, dst = self.mamba_copies[request_id]
        seq_len = self.positions[request_id][-1] + 1
        block = mamba_get_block_table_tensor(self.table[group.index].get_cpu_tensor()[row:row + 1],
                                             torch.tensor([seq_len]), self._vllm_mamba_spec(group), "align")
        return src, dst, int(block[0, 0])

    def _vllm_mamba_spec(self, group: Group) -> Any:
        """vLLM's ``MambaSpec`` for a group (its metadata code asks for one)."""
        from vllm.v1.kv_cache_interface import MambaSpec

        ours = self.engine.layout.groups[group.index]
        return MambaSpec(block_size=ours.block_size, shapes=ours.shapes,
                         dtypes=tuple(getattr(torch, d) if isinstance(d, str) else d for d in ours.dtypes),
                         mamba_cache_mode=ours.mamba_cache_mode, num_speculative_blocks=ours.num_speculative_blocks)

    def slot_mapping(self, group: int, row: int) -> torch.Tensor:
        """The slots vLLM computed for ``row``'s tokens this step (int64)."""
        start, end = self._slots[row]
        return self.table[group].slot_mapping.gpu[start:end].to("cpu", torch.int64)

    def write_kv(self, group: Group, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                 value_cache: torch.Tensor, slots: torch.Tensor) -> None:
        """vLLM's ``triton_reshape_and_cache_flash``: token ``i``'s K and V
        into slot ``slots[i]`` of the group's caches."""
        from vllm.v1.attention.ops.triton_reshape_and_cache_flash import triton_reshape_and_cache_flash

        one = torch.ones((), dtype=torch.float32, device=self.device)
        with _on_cpu(self.device):
            triton_reshape_and_cache_flash(key.to(self.device).contiguous(), value.to(self.device).contiguous(),
                                           key_cache, value_cache, slots.to(self.device), "auto", one, one)

    # --- the oracle ------------------------------------------------------------------------------------------

    def compare(self, work: Sequence[Work], check: Any) -> None:
        """vLLM's rows, positions, slot mapping and Mamba state indices
        against kvspec's tables, request by request (the ``vllm-block-table``
        check); ``check(message)`` reports the first difference."""
        ours_tables = self.engine.tables
        for group, size in zip(self.engine.groups, self.kernel_block_sizes, strict=True):
            if size != group.kernel_block_size:
                check(f"group {group.index}: vLLM's model runner reads {group.block_size}-token blocks as "
                      f"{size}-token kernel blocks, kvspec as {group.kernel_block_size}")
                return
        for w in work:
            rid = w.request.request_id
            if rid not in self.positions:  # vLLM's persistent batch computed no positions for it
                check(f"request {rid} is scheduled but not in vLLM's persistent batch")
                return
            if self.positions[rid] != list(range(w.start, w.end)):
                check(f"request {rid}: vLLM's model runner computes positions {_span(self.positions[rid])}, the "
                      f"scheduler scheduled {_span(range(w.start, w.end))}")
                return
        for g, group in enumerate(self.engine.groups):
            ours = ours_tables[g]
            for w in work:
                rid = w.request.request_id
                mine, row = ours_tables.row_of(rid), self.row_of(rid)
                n = ours.num_blocks[mine]
                held = self.held(g, row)
                want = ours.tensor[mine, :n].clone()
                want[: self.nulled_below_window(group, w)] = 0
                if len(held) != n or not torch.equal(held.to(ours.tensor.device), want):
                    check(f"group {g} request {rid}: vLLM's table row {row} holds {held.tolist()}, kvspec's "
                          f"{want.tolist()}")
                    return
                if group.kind in ("attention", "mla"):
                    want = ours.slot_mapping([mine], [list(range(w.start, w.end))])
                    got = self.slot_mapping(g, row)
                    if not torch.equal(got, want):
                        check(f"group {g} request {rid}: vLLM's slot mapping {got.tolist()}, kvspec's "
                              f"{want.tolist()}")
                        return
                elif group.kind == "mamba" and group.mamba_mode in ("align", "all"):
                    src, dst, block = self.mamba_state(group, rid)
                    # kvspec's model of where the step reads and keeps the state (the engine's own rule).
                    want_src = self.engine.mamba_read_position(group, w)
                    want_dst = mamba_token_positions(self.engine.rules_layout.views[g], w.start, w.end)[-1]
                    table = self.row(g, row)
                    if (src if w.start else -1, dst) != (want_src, want_dst) or \
                            not 0 <= dst < len(table) or block != table[dst]:
                        check(f"group {g} request {rid}: vLLM moves the Mamba state from position {src} to {dst} "
                              f"and its kernel reads block {block}; the state after {w.start} tokens is at position "
                              f"{want_src}, the step's final state belongs at {want_dst}")
                        return


def _span(positions: Any) -> str:
    positions = list(positions)
    return f"{positions[0]}..{positions[-1]}" if positions else "none"
