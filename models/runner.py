"""The kernel stage's engine: a real KV-cache manager, a scheduler in
miniature, and a model runner that writes K/V where the block tables say and
runs attention and Mamba kernels over them -- checking after every step that
what the kernels read is what the requests computed.

**Memory.**  All groups draw blocks from one pool, and as in vLLM's hybrid
layout one memory buffer backs every group: block ``b`` is one *page* of
the buffer, which a full-attention group views as K and V of its block
tokens, a Mamba group as a recurrent state (:class:`PagedCache`).  A block
that two groups hold at once therefore corrupts one of them, as it would on
a GPU.  Every page starts poisoned (NaN); a block is poisoned again when the
manager stops keeping its content: freed without a hash, evicted from the
prefix cache, or handed out afresh.  A block freed with its hash keeps its
content -- that is what makes it a cache hit.

**A step** (:meth:`Engine.execute`): the scheduler has called the manager
(``get_computed_blocks`` / ``allocate_slots`` / ``free``) and told the
worker which requests run, with which new blocks.  Then, as vLLM's model
runner does, per group: the worker's block tables are updated; the K/V of
every scheduled token is written through the slot mapping (for a connector's
tokens, into the blocks the manager named); every request's attention reads
through its row; Mamba layers read each request's state from one block and
write it to others.  Writes of a layer precede its reads, so a same-step
prefix hit on attention KV is sound -- a same-step hit on a Mamba state is
not, and reads poison.

**The checks** (each a name in :data:`CHECKS`), after every step, raising
:class:`KernelStageError` naming the first that fails.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from kvspec.hashing import get_request_block_hasher
from kvspec.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    KVCacheGroupSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    cdiv,
)
from kvspec.models import kernels as K
from kvspec.models.architectures import layer_names
from kvspec.models.block_table import NULL_BLOCK, BlockTables, select_kernel_block_size
from kvspec.models.content import AttentionContent, ContentIds, MambaContent, MLAContent
from kvspec.models.grouping import kv_cache_config_from_groups
from kvspec.request import LoRARequest, Request, RequestStatus
from kvspec.spec.content import mamba_token_positions
from kvspec.spec.interface import ManagerTarget
from kvspec.spec.layout import Layout

CHECKS = {
    "cache-layout": "every layer has memory of its own: the KV-cache tensors bind each layer to exactly one tensor "
                    "of at least num_blocks pages, and no tensor holds two layers of one group",
    "table-coherence": "the worker's block-table row holds what the manager's table holds, except blocks the "
                       "manager has since released",
    "slot-ownership": "every slot a step writes lies in a block the request holds at that position",
    "exact-gather": "the cache rows a request's attention reads hold exactly the K/V of its own tokens "
                    "(torch.equal)",
    "reference-vs-truth": "attention over the gathered K/V equals attention over K/V computed from the tokens "
                          "with no cache (bitwise)",
    "kernel-output": "each kernel's output is within tolerance of the reference",
    "mamba-state": "the state block a Mamba step reads holds the state of exactly the request's computed tokens",
    "mamba-output": "the Mamba layer's outputs equal a from-scratch scan of the request's tokens, within tolerance",
    "vllm-block-table": "with vLLM's worker: every scheduled request is in vLLM's persistent batch, its row holds "
                        "the blocks kvspec's tables hold at kvspec's kernel block size, its positions are the ones "
                        "scheduled, its slot mapping puts every token where kvspec's does and its Mamba state "
                        "moves where kvspec's model says",
}

WORKERS = {
    "kvspec": "kvspec's model of vLLM's worker: its own block tables, slot mapping and cache writes",
    "vllm": "vLLM's own: _update_states over its InputBatch, its block tables, Triton slot mapping, "
            "triton_reshape_and_cache_flash and Mamba state indices "
            "(kvspec's tables stay the oracle)",
    "vllm-v2": "vLLM's Model Runner V2: its request states, BlockTables (staged writes, gather, slot mapping) "
               "and input preparation, triton_reshape_and_cache_flash (kvspec's tables stay the oracle)",
}

TAG_CHUNKS, TAG_BITS = 6, 8  # a Mamba page's tag: the state's 48-bit content id in 8-bit pieces (exact in bf16)
ATTENTION_SPECS = (SlidingWindowSpec, ChunkedLocalAttentionSpec, CrossAttentionSpec)


class KernelStageError(AssertionError):
    """A check failed: ``check`` names it (a key of :data:`CHECKS`)."""

    def __init__(self, check: str, message: str):
        super().__init__(f"[{check}] {message}")
        self.check = check


def fail(check: str, message: str) -> None:
    raise KernelStageError(check, message)


# --- the groups --------------------------------------------------------------------------------------------------


@dataclass
class Group:
    """One KV-cache group as the model runner sees it."""

    index: int
    kind: str  # attention, mla, mamba, cross
    block_size: int  # the manager's
    kernel_block_size: int
    window: int | None = None
    chunk: int | None = None
    mamba_mode: str | None = None
    layers: tuple[str, ...] = ()  # the group's layers (each its own K/V, or state, behind one block table)
    contents: list[Any] = field(default_factory=list)  # the test model of each layer

    @property
    def blocks_per_block(self) -> int:
        return self.block_size // self.kernel_block_size


def describe_groups(layout: Layout, *, kernel_block_sizes: Sequence[int] | None, heads: int, sinks: bool,
                    layers: Sequence[Sequence[str]] | None = None, seed: int = 0) -> list[Group]:
    """The runner's view of each group, with the test model of each of its
    ``layers`` (names per group; default: one layer each).
    ``kernel_block_sizes``: the attention backend's (see
    :func:`~kvspec.models.block_table.select_kernel_block_size`)."""
    layers = layers if layers is not None else layer_names(layout, 1)
    if len(layers) != len(layout.groups) or not all(layers):
        raise ValueError(f"layer names for {len(layers)} groups (some empty?); the layout has "
                         f"{len(layout.groups)} groups")
    groups = []
    for g, spec in enumerate(layout.groups):
        # Attention kernels may read a manager block as several kernel blocks; a Mamba state is one page,
        # never split (vLLM gives Mamba groups their manager block size as the kernel's).
        kbs = spec.block_size if isinstance(spec, MambaSpec) else \
            select_kernel_block_size(spec.block_size, kernel_block_sizes)
        common = dict(index=g, block_size=spec.block_size, kernel_block_size=kbs, layers=tuple(layers[g]))
        seeds = [seed + 100 * g + 1000 * i for i in range(len(layers[g]))]  # layer 0: the one-layer stage's
        if isinstance(spec, MambaSpec):
            (_, conv_dim), (nh, hd, ds) = spec.shapes
            num_groups = (conv_dim - nh * hd) // (2 * ds)
            groups.append(Group(kind="mamba", mamba_mode=spec.mamba_cache_mode,
                                contents=[MambaContent(nh, hd, num_groups, ds, s) for s in seeds], **common))
        elif isinstance(spec, MLAAttentionSpec):
            rope = spec.head_size // 9  # DeepSeek's 512 + 64
            groups.append(Group(kind="mla", contents=[MLAContent(heads, spec.head_size - rope, rope, s)
                                                      for s in seeds], **common))
        else:
            kind = "cross" if isinstance(spec, CrossAttentionSpec) else "attention"
            groups.append(Group(
                kind=kind, window=getattr(spec, "sliding_window", None) if isinstance(spec, SlidingWindowSpec)
                else None, chunk=spec.attention_chunk_size if isinstance(spec, ChunkedLocalAttentionSpec) else None,
                contents=[AttentionContent(heads, spec.num_kv_heads, spec.head_size, s) for s in seeds], **common))
    if sinks:
        gen = torch.Generator().manual_seed(seed + 7)
        for group in groups:
            if group.kind == "attention":
                for content in group.contents:
                    content.sinks = torch.randint(-64, 64, (heads,), generator=gen).float() / 32
    return groups


class PagedCache:
    """The KV cache as vLLM lays out a hybrid model: one buffer of
    ``num_blocks`` pages (block-major) per KV-cache tensor of the plan, each
    tensor shared by one layer of every group (vLLM's
    ``get_kv_cache_config_from_groups``; kvspec's model of it,
    :func:`~kvspec.models.grouping.kv_cache_config_from_groups`, unless a
    plan is given) -- so groups draw blocks from one pool and a block two
    groups hold at once is corrupted, while the layers of one group never
    share memory.  ``views[g][i]``: layer ``i`` of group ``g``'s tensors
    over its buffer.  :meth:`plan_problems` says what is wrong with a plan."""

    def __init__(self, groups: Sequence[Group], layout: Layout, num_blocks: int,
                 dtype: torch.dtype, device: str | torch.device, plan: Callable[[int], Any] | None = None):
        self.groups, self.layout, self.dtype, self.num_blocks = groups, layout, dtype, num_blocks
        natural = [self._page_elems(g) for g in groups]
        multiple = math.lcm(*(g.blocks_per_block for g in groups)) if groups else 1
        self.page = cdiv(max(natural, default=1), multiple) * multiple
        self.page_bytes = self.page * torch.empty((), dtype=dtype).element_size()
        self.tensors = list((plan or self.kvspec_plan)(self.page_bytes))
        self.problems = self.plan_problems()
        self.buffers = [torch.full((num_blocks, self.page), float("nan"), dtype=dtype, device=device)
                        for _ in self.tensors]
        tensor_of = {name: i for i, t in reversed(list(enumerate(self.tensors))) for name in t.shared_by}
        if any(name not in tensor_of for g in groups for name in g.layers):  # a broken plan: cache-layout says so
            self.buffers.append(torch.full((num_blocks, self.page), float("nan"), dtype=dtype, device=device))
        self.views = [[self._views(g, self.buffers[tensor_of.get(name, -1)]) for name in g.layers] for g in groups]

    def kvspec_plan(self, page_bytes: int) -> list[Any]:
        """kvspec's plan: one tensor per layer index, shared by that layer of
        every group, its pages padded to ``page_bytes`` or to the largest
        spec's page (the stage keeps a Mamba page's state and tag only)."""
        page = max(page_bytes, *(self._spec(g).page_size_bytes for g in self.groups))
        specs = [KVCacheGroupSpec(list(g.layers), replace(self._spec(g), page_size_padded=page)) for g in self.groups]
        return kv_cache_config_from_groups(specs, num_blocks=self.num_blocks).kv_cache_tensors

    def plan_problems(self) -> list[str]:
        """What breaks the ``cache-layout`` rule in this plan."""
        problems, seen = [], Counter(name for t in self.tensors for name in t.shared_by)
        for g in self.groups:
            for name in g.layers:
                if seen[name] != 1:
                    problems.append(f"layer {name} (group {g.index}) is bound to {seen[name]} tensors")
        group_of = {name: g.index for g in self.groups for name in g.layers}
        for i, t in enumerate(self.tensors):
            groups = Counter(group_of.get(name) for name in t.shared_by)
            shared = [g for g, n in groups.items() if n > 1 and g is not None]
            if shared:
                problems.append(f"tensor {i} holds {groups[shared[0]]} layers of group {shared[0]} "
                                f"({', '.join(n for n in t.shared_by if group_of.get(n) == shared[0])})")
            if t.size < self.page_bytes * self.num_blocks:
                problems.append(f"tensor {i} has {t.size} bytes, not the {self.num_blocks} pages of "
                                f"{self.page_bytes} bytes its layers index")
        return problems

    def _spec(self, g: Group) -> Any:
        return self.layout.groups[g.index]

    def _page_elems(self, g: Group) -> int:
        spec = self._spec(g)
        if g.kind == "mamba":
            (_, _), (nh, hd, ds) = spec.shapes
            return nh * hd * ds + TAG_CHUNKS
        if g.kind == "mla":
            return g.block_size * spec.head_size
        return 2 * g.block_size * spec.num_kv_heads * spec.head_size

    def _views(self, g: Group, buf: torch.Tensor) -> dict[str, torch.Tensor]:
        spec, nb = self._spec(g), buf.shape[0]
        if g.kind == "mamba":
            (_, _), (nh, hd, ds) = spec.shapes
            state = buf.as_strided((nb, nh, hd, ds), (self.page, hd * ds, ds, 1))
            tag = buf.as_strided((nb, TAG_CHUNKS), (self.page, 1), nh * hd * ds)
            return {"state": state, "tag": tag}
        k, b = g.blocks_per_block, g.kernel_block_size
        stride = self.page // k  # one kernel block's share of a page
        if g.kind == "mla":
            width = spec.head_size
            latent = buf.as_strided((nb * k, b, 1, width), (stride, width, width, 1))
            return {"key": latent, "value": latent}
        h, d = spec.num_kv_heads, spec.head_size
        key = buf.as_strided((nb * k, b, h, d), (stride, h * d, d, 1))
        value = buf.as_strided((nb * k, b, h, d), (stride, h * d, d, 1), b * h * d)
        return {"key": key, "value": value}

    def poison(self, blocks: Sequence[int]) -> None:
        """NaN into ``blocks``' pages of every buffer (each buffer is block-major, whoever planned it)."""
        if blocks:
            ids = torch.tensor(sorted(blocks), dtype=torch.long)
            for buffer in self.buffers:
                buffer[ids] = float("nan")


def tag_values(content_id: int) -> list[float]:
    return [float((content_id >> (TAG_BITS * i)) & ((1 << TAG_BITS) - 1)) for i in range(TAG_CHUNKS)]


def read_tag(values: torch.Tensor) -> int | None:
    if bool(torch.isnan(values.float()).any()):
        return None
    return sum(int(v) << (TAG_BITS * i) for i, v in enumerate(values.float().tolist()))


STATE_ID_MASK = (1 << (TAG_BITS * TAG_CHUNKS)) - 1


# --- requests in flight ------------------------------------------------------------------------------------------


@dataclass
class Work:
    """A request scheduled in this step: ``num_new`` tokens from ``start``
    (the last ``len(drafts)`` of them speculative), after ``external``
    connector tokens loaded at ``start - external``."""

    request: Request
    start: int
    num_new: int
    drafts: list[int] = field(default_factory=list)
    joins: bool = False  # the worker gets the whole table (new or resumed request)
    new_block_ids: tuple[list[int], ...] | None = None
    external: int = 0

    @property
    def end(self) -> int:
        return self.start + self.num_new


@dataclass
class StepOutputs:
    """What the step's kernels returned, per group, per kernel name."""

    attention: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    mamba: dict[int, torch.Tensor] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # request ids in batch order


# --- the engine ------------------------------------------------------------------------------------------------


class Engine:
    """A KV-cache manager (any :class:`ManagerTarget`) under a scheduler in
    miniature and a model runner with real kernels.

    The caller schedules (``begin_step``, ``admit``, ``advance``,
    ``preempt``, ``finish``, ``evict``, ``reset``) and then calls
    :meth:`execute`, which runs the step's kernels and every check, and
    moves the requests on (``sampled``: the next token of each request that
    finished its prompt; ``accepted``: how many drafts each kept)."""

    def __init__(self, layout: Layout, target_factory: Callable[..., ManagerTarget], *,
                 kernels: Sequence[str] = ("reference", "flex"), dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", kernel_block_sizes: Sequence[int] | None = None, heads: int = 2,
                 sinks: bool = False, num_encoder_tokens: int = 0, max_num_reqs: int = 16,
                 worker: str = "kvspec", skip_checks: Sequence[str] = (), layers: Sequence[Sequence[str]] | None = None,
                 seed: int = 0):
        self.layout = layout
        self.target = layout.make_target(target_factory, enable_kv_cache_events=False)
        self.rules_layout = layout
        self.kernel_block_sizes = kernel_block_sizes
        self.groups = describe_groups(layout, kernel_block_sizes=kernel_block_sizes, heads=heads, sinks=sinks,
                                      layers=layers, seed=seed)
        self.kernels = list(kernels)
        unknown = set(skip_checks) - set(CHECKS)
        if unknown:
            raise ValueError(f"unknown checks {sorted(unknown)}; the checks are {sorted(CHECKS)}")
        self.skip_checks = frozenset(skip_checks)
        self.checks_run: dict[str, int] = dict.fromkeys(CHECKS, 0)
        self.dtype, self.device = dtype, device
        self.num_encoder_tokens = num_encoder_tokens if layout.has_cross_attention else 0
        self.max_num_reqs = max_num_reqs
        self.tables = BlockTables([g.block_size for g in self.groups], max_num_reqs,
                                  max(layout.max_model_len, self.num_encoder_tokens),
                                  [g.kernel_block_size for g in self.groups], device)
        if worker not in WORKERS:
            raise ValueError(f"unknown worker {worker!r}; choose one of {sorted(WORKERS)}")
        self.worker = None  # kvspec's own tables and writes: self.tables
        if worker == "vllm":
            from kvspec.models.vllm_worker import VllmWorker

            self.worker = VllmWorker(self)  # the kernels read vLLM's; self.tables stays the oracle
        elif worker == "vllm-v2":
            from kvspec.models.vllm_worker_v2 import VllmWorkerV2

            self.worker = VllmWorkerV2(self)  # Model Runner V2's tables; self.tables stays the oracle
        # The caches: one tensor per layer index as vLLM's worker plans them, or kvspec's model of that plan
        # (where the installed vLLM plans them another way: VllmWorker.plans_cache).
        self.cache = PagedCache(self.groups, layout, layout.num_blocks, dtype, device,
                                plan=self.worker.cache_plan if self.worker and self.worker.plans_cache else None)
        if self.cache.problems:
            self._fail("cache-layout", "; ".join(self.cache.problems[:3]))
        self.checks_run["cache-layout"] = 1
        self.hasher = get_request_block_hasher(layout.hash_block_size)
        self.requests: dict[str, Request] = {}
        self.contents: dict[str, ContentIds] = {}
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self._scans: dict[tuple[str, int, int], tuple[int, torch.Tensor | None]] = {}  # the Mamba reference's place
        self.loading: dict[str, tuple[int, int, int]] = {}  # async connector loads: id -> start, end, steps left
        self.work: list[Work] = []
        self.in_batch: set[str] = set()  # requests with a worker row
        self.steps = 0
        self.events: Counter[str] = Counter()  # what the schedule did: hit tokens, preemptions, ...
        self.log: list[str] = []
        self._next_id = 0
        self._snapshot = self.target.snapshot()

    @classmethod
    def from_setup(cls, setup: Any, target_factory: Callable[..., ManagerTarget], **options: Any) -> Engine:
        """An engine for a :class:`~kvspec.models.architectures.ModelSetup`."""
        options.setdefault("layers", setup.layers)
        return cls(setup.layout, target_factory, kernel_block_sizes=setup.kernel_block_sizes, heads=setup.heads,
                   sinks=setup.sinks, num_encoder_tokens=setup.num_encoder_tokens, **options)

    def _fail(self, check: str, message: str) -> None:
        if check not in self.skip_checks:
            fail(check, message)

    # --- the manager, watched -------------------------------------------------------------------

    def call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """Call the manager; poison every block whose content it stopped keeping."""
        result = getattr(self.target, op)(*args, **kwargs)
        after = self.target.snapshot()
        self.cache.poison(released_blocks(self._snapshot.pool, after.pool))
        self._snapshot = after
        self.log.append(f"{op}({', '.join(_short(a) for a in args)}) -> {_short(result)}")
        return result

    # --- scheduling -----------------------------------------------------------------------------------

    def new_request(self, tokens: Sequence[int] | None, *, salt: str | None = None, lora: str | None = None,
                    prompt_embeds: Any = None) -> Request:
        """A request arrives (waiting); ``tokens`` None with ``prompt_embeds``: a prompt given as embeddings."""
        self._next_id += 1
        request = Request(f"r{self._next_id}", None if tokens is None else list(tokens), cache_salt=salt,
                          block_hasher=self.hasher, lora_request=LoRARequest(lora, 1) if lora else None,
                          prompt_embeds=prompt_embeds)
        self.requests[request.request_id] = request
        self.contents[request.request_id] = ContentIds(request)
        self.waiting.append(request)
        return request

    def begin_step(self) -> None:
        """A step starts: the manager hears it, and connector loads whose
        time has come complete (their K/V land, their blocks get cached)."""
        self.work = []
        self.call("new_step_starts")
        for rid, (start, end, steps) in list(self.loading.items()):
            if steps > 1:
                self.loading[rid] = (start, end, steps - 1)
                continue
            request = self.requests[rid]
            self._write_external(request, start, end)
            self.call("cache_blocks", request, end)
            request.num_computed_tokens = end
            request.status = RequestStatus.WAITING
            del self.loading[rid]

    def lookup(self, request: Request) -> tuple[Any, int]:
        """The request's prefix-cache hit: (blocks per group, tokens)."""
        blocks, hit = self.call("get_computed_blocks", request)
        self.events["lookups"] += 1
        self.events["hit tokens"] += hit
        return blocks, hit

    def admit(self, request: Request, num_new: int, hit: tuple[Any, int] | None = None, *, external: int = 0,
              async_load: bool = False, load_steps: int = 1) -> bool:
        """A waiting request computes ``num_new`` tokens after its prefix-cache
        ``hit`` (from :meth:`lookup`) and ``external`` tokens a connector
        holds.  ``async_load``: the connector's tokens land ``load_steps``
        steps later, and the request computes nothing now.  False when the
        manager refuses (the request stays waiting, nothing changed)."""
        if request.request_id in self.loading:
            raise ValueError(f"request {request.request_id} is still loading from the connector")
        blocks, num_hit = hit if hit is not None else (None, 0)
        start = request.num_computed_tokens + num_hit
        new = self.call(
            "allocate_slots", request, 0 if async_load else num_new, num_hit, blocks,
            num_external_computed_tokens=external, delay_cache_blocks=async_load,
            num_encoder_tokens=self.num_encoder_tokens if start == 0 and not async_load else 0,
        )
        if new is None:
            return False
        self.events["admissions"] += 1
        self.events["connector tokens"] += external
        if async_load:
            self.events["async loads"] += 1
            request.num_computed_tokens = start  # the loaded tokens count once they land
            self.loading[request.request_id] = (start, start + external, load_steps)
            request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
            return True
        self.waiting.remove(request)
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        self.work.append(Work(request, start + external, num_new, joins=True, external=external))
        return True

    def advance(self, request: Request, num_new: int | None = None, drafts: Sequence[int] = ()) -> bool:
        """A running request computes its next ``num_new`` prompt tokens, or
        decodes its last token plus ``drafts``.  False: the manager refused,
        and the request was preempted."""
        start = request.num_computed_tokens
        if num_new is None:
            request.spec_token_ids = list(drafts)
            num_new = request.num_tokens - start + len(drafts)
        new = self.call("allocate_slots", request, num_new)
        if new is None:
            self.events["refused (preempted)"] += 1
            request.spec_token_ids = []
            self.preempt(request)
            return False
        self.work.append(Work(request, start, num_new, drafts=list(request.spec_token_ids), new_block_ids=new))
        return True

    def preempt(self, request: Request) -> None:
        self.events["preemptions"] += 1
        self.call("free", request)
        self.running.remove(request)
        self._leave_batch(request, finished=False)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.waiting.append(request)

    def finish(self, request: Request) -> None:
        self.events["finished"] += 1
        self.call("free", request)
        (self.running if request in self.running else self.waiting).remove(request)
        self.loading.pop(request.request_id, None)
        self._leave_batch(request, finished=True)
        request.status = RequestStatus.FINISHED_STOPPED

    def evict(self, block_ids: set[int]) -> None:
        self.events["evictions"] += 1
        self.call("evict_blocks", block_ids)

    def reset(self) -> bool:
        done = self.call("reset_prefix_cache")
        self.events["resets" if done else "resets refused"] += 1
        return done

    def _leave_batch(self, request: Request, finished: bool) -> None:
        if request.request_id in self.in_batch:
            self.in_batch.discard(request.request_id)
            if self.worker:
                self.worker.leave(request.request_id, finished)
            self.tables.remove(request.request_id)

    def row_of(self, request_id: str) -> int:
        """The request's row in the tables the kernels read: vLLM's
        persistent batch with vLLM's worker, else kvspec's tables."""
        return self.worker.row_of(request_id) if self.worker else self.tables.row_of(request_id)

    # --- the worker ------------------------------------------------------------------------------------

    def execute(self, sampled: dict[str, int] | None = None, accepted: dict[str, int] | None = None) -> StepOutputs:
        """Run the scheduled work through the kernels, check, and move the
        requests on."""
        self.steps += 1
        outputs = StepOutputs(order=[w.request.request_id for w in self.work])
        for w in self.work:
            self._update_tables(w)
        for w in self.work:
            self.check_tables(w.request)
        if self.worker and self.work:
            self.worker.prepare(self.work)
            self.checks_run["vllm-block-table"] += 1
            self.worker.compare(self.work, lambda message: self._fail("vllm-block-table", message))
        for w in self.work:
            if w.external:
                self._write_external(w.request, w.start - w.external, w.start)
        for group in self.groups:
            if group.kind == "mamba":
                outputs.mamba[group.index] = self._run_mamba(group)
            else:
                outputs.attention[group.index] = self._run_attention(group)
        self._move_on(sampled or {}, accepted or {})
        return outputs

    def _update_tables(self, w: Work) -> None:
        rid = w.request.request_id
        if w.joins or rid not in self.in_batch:
            ids = self.target.get_block_ids(rid)
            if rid in self.in_batch:
                self.tables.replace(rid, ids)
            else:
                self.tables.add(rid, ids)
                self.in_batch.add(rid)
        else:
            self.tables.append(rid, w.new_block_ids)

    def check_tables(self, request: Request) -> None:
        self.checks_run["table-coherence"] += 1
        problems = self.tables.stale_positions(request.request_id, self.target.get_block_ids(request.request_id))
        if problems:
            self._fail("table-coherence", f"request {request.request_id}: " + "; ".join(problems[:3]))

    # --- attention -----------------------------------------------------------------------------------

    def _tokens(self, w: Work) -> list[int]:
        """Content ids of the request's tokens through the end of the step (drafts included)."""
        content = self.contents[w.request.request_id]
        return content.with_drafts(w.drafts)[: w.end] if w.drafts else content.ids(w.end)

    def slot_mapping(self, group: Group, row: int, positions: Sequence[int]) -> torch.Tensor:
        """Where the K/V of ``positions`` go (through the worker's row): with
        vLLM's worker, the slots it computed for the step's tokens."""
        if self.worker and group.kind != "cross":
            return self.worker.slot_mapping(group.index, row)
        return self.tables[group.index].slot_mapping([row], [positions])

    def _check_owned(self, group: Group, request: Request, positions: Sequence[int], slots: torch.Tensor) -> None:
        self.checks_run["slot-ownership"] += 1
        table = self.target.get_block_ids(request.request_id)[group.index]
        k = group.blocks_per_block
        for p, slot in zip(positions, slots.tolist(), strict=True):
            i = p // group.block_size
            owner = table[i] if i < len(table) else None
            block = slot // group.kernel_block_size // k
            if owner is None or owner == NULL_BLOCK or block != owner:
                self._fail("slot-ownership", f"request {request.request_id} group {group.index}: token {p} is written "
                     f"to slot {slot} in block {block}; the manager holds {owner} at position {i}")

    def _write_kv(self, group: Group, request: Request, positions: Sequence[int], ids: Sequence[int]) -> None:
        """Every layer of the group writes the K/V of ``positions`` through
        the one slot mapping."""
        if not positions:
            return
        # Cross attention's slots are kvspec's (vLLM maps encoder positions elsewhere): its rows are kvspec's too.
        rid = request.request_id
        slots = self.slot_mapping(group, self.tables.row_of(rid) if group.kind == "cross" else self.row_of(rid),
                                  positions)
        self._check_owned(group, request, positions, slots)
        bs = group.kernel_block_size
        for content, views in zip(group.contents, self.cache.views[group.index], strict=True):
            if self.worker and group.kind != "mla":  # vLLM's concat_and_cache_mla is a CUDA op: MLA's is ours
                self.worker.write_kv(group, content.k(ids, self.dtype, self.device),
                                     content.v(ids, self.dtype, self.device), views["key"], views["value"], slots)
                continue
            blocks, offsets = slots // bs, slots % bs
            if group.kind == "mla":
                views["key"][blocks, offsets, 0] = content.kv(ids, self.dtype, self.device)
            else:
                views["key"][blocks, offsets] = content.k(ids, self.dtype, self.device)
                views["value"][blocks, offsets] = content.v(ids, self.dtype, self.device)

    def _write_external(self, request: Request, start: int, end: int) -> None:
        """A connector writes the K/V of tokens ``[start, end)`` straight into
        the blocks the manager gave the request (not through the worker)."""
        ids = self.contents[request.request_id].ids(end)
        tables = self.target.get_block_ids(request.request_id)
        for group in self.groups:
            if group.kind not in ("attention", "mla"):
                continue
            table = tables[group.index]
            for p in range(start, end):
                block = table[p // group.block_size]
                if block == NULL_BLOCK:
                    continue
                k = group.blocks_per_block
                kb = block * k + (p % group.block_size) // group.kernel_block_size
                off = p % group.kernel_block_size
                for content, views in zip(group.contents, self.cache.views[group.index], strict=True):
                    if group.kind == "mla":
                        views["key"][kb, off, 0] = content.kv([ids[p]], self.dtype, self.device)[0]
                    else:
                        views["key"][kb, off] = content.k([ids[p]], self.dtype, self.device)[0]
                        views["value"][kb, off] = content.v([ids[p]], self.dtype, self.device)[0]

    def _attention_batch(self, group: Group, layer: int, work: list[Work]) -> tuple[K.AttentionBatch, list[list[int]]]:
        content = group.contents[layer]
        queries, starts, lens, rows, all_ids = [], [0], [], [], []
        cross = group.kind == "cross"
        for w in work:
            ids = self._tokens(w)
            all_ids.append(ids)
            q_ids = ids[w.start:w.end]
            queries.append(content.q(q_ids, torch.float32))
            starts.append(starts[-1] + len(q_ids))
            lens.append(self.num_encoder_tokens if cross else w.end)
            rows.append(self.row_of(w.request.request_id))
        tensor = self.worker.block_table(group.index) if self.worker else self.tables[group.index].tensor
        table = tensor[torch.tensor(rows, device=tensor.device)]
        views = self.cache.views[group.index][layer]
        spec = self.layout.groups[group.index]
        head = spec.head_size
        value = views["key"][..., : content.latent] if group.kind == "mla" else views["value"]
        batch = K.AttentionBatch(
            query=torch.cat(queries), query_start=starts, seq_lens=lens, block_table=table,
            key_cache=views["key"], value_cache=value, block_size=group.kernel_block_size, scale=head ** -0.5,
            window=group.window, chunk=group.chunk, causal=not cross, sinks=getattr(content, "sinks", None))
        return batch, all_ids

    def _run_attention(self, group: Group) -> dict[str, torch.Tensor]:
        """Writes, then each layer's attention and checks; each kernel's
        outputs stacked over the layers."""
        work = [w for w in self.work if w.num_new > 0]
        if not work:
            return {}
        for w in work:  # writes first (vLLM's reshape_and_cache precedes attention)
            if group.kind == "cross":
                if w.start == 0:
                    enc = self.contents[w.request.request_id].encoder_ids(self.num_encoder_tokens)
                    self._write_kv(group, w.request, list(range(self.num_encoder_tokens)), enc)
                continue
            ids = self._tokens(w)
            self._write_kv(group, w.request, list(range(w.start, w.end)), ids[w.start:w.end])
        per_layer = [self._attend(group, layer, work) for layer in range(len(group.layers))]
        return {name: torch.stack([outputs[name] for outputs in per_layer]) for name in per_layer[0]}

    def _attend(self, group: Group, layer: int, work: list[Work]) -> dict[str, torch.Tensor]:
        where = f"group {group.index} layer {group.layers[layer]}"
        batch, all_ids = self._attention_batch(group, layer, work)
        self._check_gather(group, layer, batch, work, all_ids)
        outputs = {"reference": K.reference_attention(batch)}
        truth = self._ground_truth(group, layer, batch, work, all_ids)
        self.checks_run["reference-vs-truth"] += 1
        if not torch.equal(outputs["reference"], truth):
            self._fail("reference-vs-truth", f"{where}: attention over the cache differs from attention "
                 f"with no cache by {K.max_error(outputs['reference'], truth):.3g}")
        for name in self.kernels:
            if name == "reference":
                continue
            out = run_kernel(name, group, layer, batch)
            if out is None:
                continue
            outputs[name] = out
            self.checks_run["kernel-output"] += 1
            self.events[f"kernel {name}"] += 1
            if not K.close(out, outputs["reference"], self.dtype):
                self._fail("kernel-output", f"{where} ({group.kind}): kernel {name} differs from the "
                     f"reference by {K.max_error(out, outputs['reference']):.3g}")
        return outputs

    def _expected_kv(self, group: Group, layer: int, ids: list[int], positions: torch.Tensor,
                     w: Work) -> tuple[torch.Tensor, ...]:
        content = group.contents[layer]
        if group.kind == "cross":
            enc = self.contents[w.request.request_id].encoder_ids(self.num_encoder_tokens)
            sel = [enc[p] for p in positions.tolist()]
        else:
            sel = [ids[p] for p in positions.tolist()]
        if group.kind == "mla":
            kv = content.kv(sel, self.dtype)[:, None, :]
            return kv, kv[..., : content.latent]
        return content.k(sel, self.dtype), content.v(sel, self.dtype)

    def _check_gather(self, group: Group, layer: int, batch: K.AttentionBatch, work: list[Work],
                      all_ids: list[list[int]]) -> None:
        for r, w in enumerate(work):
            self.checks_run["exact-gather"] += 1
            positions = K.key_positions(batch, r)
            row = batch.block_table[r]
            got_k = K.gather(batch.key_cache, row, positions, batch.block_size).cpu()
            got_v = K.gather(batch.value_cache, row, positions, batch.block_size).cpu()
            want_k, want_v = self._expected_kv(group, layer, all_ids[r], positions, w)
            for name, got, want in (("key", got_k, want_k), ("value", got_v, want_v)):
                if not torch.equal(got, want):
                    bad = int(positions[(got != want).flatten(1).any(1)][0])
                    block = int(row[bad // batch.block_size])
                    what = "poison (NaN): never written, or released" if bool(torch.isnan(
                        got[(positions == bad).nonzero()[0, 0]]).any()) else "another token's K/V"
                    self._fail("exact-gather", f"request {w.request.request_id} group {group.index} layer "
                               f"{group.layers[layer]}: the {name} of token {bad} read from block {block} is {what}")

    def _ground_truth(self, group: Group, layer: int, batch: K.AttentionBatch, work: list[Work],
                      all_ids: list[list[int]]) -> torch.Tensor:
        outs = []
        for r, w in enumerate(work):
            q = batch.query[batch.query_start[r]:batch.query_start[r + 1]]
            q_pos, k_pos = batch.query_positions(r), K.key_positions(batch, r)
            k, v = (t.to(batch.key_cache.device) for t in self._expected_kv(group, layer, all_ids[r], k_pos, w))
            outs.append(K.dense_attention(q, k, v, q_pos, k_pos, scale=batch.scale, lowest=batch.lowest_key(q_pos),
                                          causal=batch.causal, sinks=batch.sinks))
        return torch.cat(outs)

    # --- Mamba --------------------------------------------------------------------------------------------

    def mamba_read_position(self, group: Group, w: Work) -> int:
        """Where a step's initial state is read: the state after ``start`` tokens."""
        return cdiv(w.start, group.block_size) - 1

    def _run_mamba(self, group: Group) -> torch.Tensor:
        """Where each request's state is read and written (one table for the
        group), then every layer's step over its own states; the outputs
        stacked over the layers."""
        work = [w for w in self.work if w.num_new > 0]
        gl = self.rules_layout.views[group.index]
        plans = []
        for w in work:
            if w.drafts:
                raise ValueError("the kernel stage runs Mamba groups without speculative drafts")
            r = self.row_of(w.request.request_id)
            row = self.worker.row(group.index, r) if self.worker else self.tables[group.index].row(r)
            dst = [row[p] for p in mamba_token_positions(gl, w.start, w.end)]
            read = self.mamba_read_position(group, w)
            if self.worker is not None and group.mamba_mode in ("align", "all"):
                # vLLM's own state indices (the vllm-block-table check compared them with kvspec's)
                read, _, block = self.worker.mamba_state(group, w.request.request_id)
                dst = [block] * w.num_new if group.mamba_mode == "align" else [*dst[:-1], block]
            src = dst[0] if w.start == 0 else row[read] if 0 <= read < len(row) else NULL_BLOCK
            plans.append((w, self._tokens(w), read, src, dst))
        outs = [self._mamba_layer(group, layer, plans) for layer in range(len(group.layers))]
        return torch.stack(outs) if outs and outs[0].numel() else torch.zeros(0)

    def _mamba_layer(self, group: Group, layer: int, plans: list) -> torch.Tensor:
        views = self.cache.views[group.index][layer]
        state, tag = views["state"], views["tag"]
        where = f"group {group.index} layer {group.layers[layer]}"
        for w, ids, read, src, _ in plans:
            if w.start == 0:
                state[src] = 0
                continue
            self.checks_run["mamba-state"] += 1
            have, want = read_tag(tag[src]), ids[w.start - 1] & STATE_ID_MASK
            if have != want:
                what = "poison: never written, or released" if have is None else "another sequence's state"
                self._fail("mamba-state", f"request {w.request.request_id} {where}: the state read from block "
                           f"{src} (position {read}) is {what}, not the state after its {w.start} tokens")
        c = group.contents[layer]
        outs: list[torch.Tensor] = []
        for w, ids, _, src, dst in plans:  # tokens in order; each token reads the last one's block
            toks = ids[w.start:w.end]
            x, dt, B, C = c.x(toks), c.dt(toks), c.B(toks), c.C(toks)
            hd = x.shape[-1]
            A = c.A[:, None, None].expand(-1, hd, B.shape[-1])
            y = []
            prev = src
            for i, block in enumerate(dst):
                y.append(run_mamba_kernel(self.kernels, state, x[i:i + 1], dt[i:i + 1, :, None].expand(-1, -1, hd),
                                          A, B[i:i + 1], C[i:i + 1], c.D[:, None].expand(-1, hd),
                                          c.dt_bias[:, None].expand(-1, hd), prev, block))
                tag[block] = torch.tensor(tag_values(ids[w.start + i] & STATE_ID_MASK), dtype=tag.dtype)
                prev = block
            out = torch.cat(y)
            self._check_mamba_output(group, layer, w, ids, out)
            outs.append(out)
        return torch.cat(outs) if outs else torch.zeros(0)

    def _reference_scan(self, group: Group, layer: int, rid: str, ids: list[int], start: int,
                        end: int) -> torch.Tensor:
        """The from-scratch scan's outputs for tokens ``[start, end)`` of a
        request.  The scan's state after the last tokens checked is kept, so
        the next step continues it instead of re-scanning the whole prefix
        (bitwise the same: see :func:`~kvspec.models.kernels.scan_from`); a
        request that starts over (preempted, or a hit ahead of the kept state)
        is scanned from its first token again."""
        c = group.contents[layer]
        kept_at, state = self._scans.get((rid, group.index, layer), (0, None))
        if kept_at > start:
            kept_at, state = 0, None
        toks = ids[kept_at:end]
        x = c.x(toks)
        hd = x.shape[-1]
        out, state = K.scan_from(state, x, c.dt(toks)[..., None].expand(-1, -1, hd),
                                 c.A[:, None, None].expand(-1, hd, c.B.a.shape[-1]), c.B(toks), c.C(toks),
                                 c.D[:, None].expand(-1, hd), c.dt_bias[:, None].expand(-1, hd))
        self._scans[(rid, group.index, layer)] = (end, state)
        return out[start - kept_at:]

    def _check_mamba_output(self, group: Group, layer: int, w: Work, ids: list[int], out: torch.Tensor) -> None:
        self.checks_run["mamba-output"] += 1
        truth = self._reference_scan(group, layer, w.request.request_id, ids, w.start, w.end)
        if not K.close(out, truth, self.dtype):
            self._fail("mamba-output", f"request {w.request.request_id} group {group.index} layer "
                       f"{group.layers[layer]}: outputs of tokens [{w.start}, {w.end}) differ from a from-scratch "
                       f"scan by {K.max_error(out, truth):.3g}")

    # --- after the step ----------------------------------------------------------------------------------

    def _move_on(self, sampled: dict[str, int], accepted: dict[str, int]) -> None:
        if self.worker is not None and hasattr(self.worker, "after_step"):
            self.worker.after_step(self.work, accepted)  # Model Runner V2 advances its own computed tokens
        for w in self.work:
            request = w.request
            if w.num_new == 0:
                continue
            self.events["tokens computed"] += w.num_new
            if w.drafts:
                kept = accepted.get(request.request_id, 0)
                self.events["drafts"] += len(w.drafts)
                self.events["drafts rejected"] += len(w.drafts) - kept
                request.append_output_token_ids(w.drafts[:kept])
                request.spec_token_ids = []
                request.num_computed_tokens = w.end - len(w.drafts) + kept
            else:
                request.num_computed_tokens = w.end
            if request.num_computed_tokens >= request.num_tokens:
                request.append_output_token_ids(sampled.get(request.request_id, 0))
        self.work = []


def run_kernel(name: str, group: Group, layer: int, batch: K.AttentionBatch) -> torch.Tensor | None:
    """Kernel ``name`` over an attention layer's batch; None where it does not apply."""
    if name == "flex":
        return K.flex_attention_paged(batch)
    if name == "vllm":
        from kvspec.models import vllm_kernels

        if group.kind == "mla":
            if batch.query.shape[0] != batch.num_requests:
                return None  # vLLM's MLA decode kernel takes decodes only
            return vllm_kernels.vllm_mla_decode(batch, group.contents[layer].latent)
        return vllm_kernels.vllm_unified_attention(batch)
    raise ValueError(f"unknown kernel {name!r}; choose from reference, flex, vllm")


def run_mamba_kernel(kernels: Sequence[str], state: torch.Tensor, x, dt, A, B, C, D, dt_bias, src: int,
                     dst: int) -> torch.Tensor:
    kernel = K.selective_state_update
    if "vllm" in kernels and state.is_cuda:
        from kvspec.models.vllm_kernels import vllm_selective_state_update as kernel
    dev = state.device
    return kernel(state, x.to(dev), dt.to(dev), A.to(dev), B.to(dev), C.to(dev), D.to(dev), dt_bias.to(dev),
                  dt_softplus=True, state_batch_indices=torch.tensor([src], device=dev),
                  dst_state_batch_indices=torch.tensor([dst], device=dev)).cpu()


def released_blocks(before: Any, after: Any) -> set[int]:
    """Blocks whose content nobody keeps any more, between two pool
    snapshots: a block's content is kept while it is held, or free with its
    hash (a cache hit waiting to happen).  Released: freed without a hash,
    dropped from the cache while free, or handed out afresh (a touched hit
    keeps its hash)."""
    released = set()
    before_free, after_free = set(before.free), set(after.free)
    for b in range(1, after.num_blocks):
        old, new = before.key_of.get(b), after.key_of.get(b)
        if b in after_free:
            kept_before = b not in before_free or old is not None
            if new is None and kept_before:
                released.add(b)
        elif b in before_free and (new is None or new != old):
            released.add(b)
    return released


def _short(value: Any) -> str:
    if isinstance(value, Request):
        return value.request_id
    text = repr(value)
    return text if len(text) < 60 else text[:57] + "..."
