"""Faults planted in the manager or the model runner, each a bug class that
serves wrong KV without crashing; the kernel stage must catch every one.

A fault is a target factory (a broken manager) or an engine class (a broken
worker), with the check expected to catch it and a scripted schedule that
reaches it (``scenario(engine)``); :func:`catch` runs the schedule and
returns the check that fired.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broken_managers import hasher_ignoring_embeddings, without_tenant
from kvspec.conformance.targets.manager import ImplManagerTarget
from kvspec.kv_cache_interface import cdiv
from kvspec.models.runner import Engine, KernelStageError
from kvspec.request import Request
from kvspec.testing import embedding_rows

# --- broken managers ------------------------------------------------------------------------------------------


def trusting_its_hits(target: ImplManagerTarget) -> None:
    """Make ``target`` take the hits it is given, as vLLM's manager does.
    impl checks each hit block against the request's hash and refuses a
    stale or foreign one before any kernel reads it; a lookup fault must get
    past that check to be the kernel stage's to catch."""
    target.manager._check_hits = lambda request, hits: None


class StaleHashOnReuse(ImplManagerTarget):
    """The pool hands a cached block out again but leaves its hash in the
    table: the next lookup of that hash is served whatever the block holds now."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        trusting_its_hits(self)
        pool = self.manager.block_pool
        table, take = pool.cached_block_hash_to_block._cache, pool.get_new_blocks

        def get_new_blocks(num_blocks: int) -> list:
            node, keys = pool.free_block_queue.head.next_free_block, []
            for _ in range(max(0, min(num_blocks, pool.free_block_queue.num_free_blocks))):
                keys.append((node._block_hash, node))
                node = node.next_free_block
            blocks = take(num_blocks)
            for key, block in keys:
                if key is not None:
                    table[key] = block  # the stale entry stays
            return blocks

        pool.get_new_blocks = get_new_blocks


class IgnoresSalt(ImplManagerTarget):
    """Looks prefixes up without the cache salt and LoRA adapter: one
    tenant's blocks are served to another."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        trusting_its_hits(self)

    def get_computed_blocks(self, request: Request):
        return super().get_computed_blocks(without_tenant(request, self.manager.block_pool.hash_block_size))


class WindowFreedEarly(ImplManagerTarget):
    """Sliding-window groups skip one block too many: a block still in the
    window is released (and may be reused)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        for m in self.manager.coordinator.single_type_managers:
            window = getattr(m, "sliding_window", None)
            if window is not None:
                m.get_num_skipped_tokens = lambda n, w=window, bs=m.block_size: max(0, n - w + 1 + bs)


class MambaSameStepHit(ImplManagerTarget):
    """Mamba groups forget which states were cached this step: a request may
    hit a state another request computes in the same step, read before it
    is written."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)

        class Forgetful(set):
            def add(self, item: Any) -> None:
                pass

        for m in self.manager.coordinator.single_type_managers:
            if hasattr(m, "cached_blocks_this_step"):
                m.cached_blocks_this_step = Forgetful()


class CachesBeforeLoad(ImplManagerTarget):
    """Ignores ``delay_cache_blocks``: blocks a connector is still loading
    are published as cache hits, served before their KV lands."""

    def allocate_slots(self, request: Request, *args: Any, delay_cache_blocks: bool = False, **kwargs: Any):
        return super().allocate_slots(request, *args, delay_cache_blocks=False, **kwargs)


# --- broken workers --------------------------------------------------------------------------------------------


class HashesWithoutEmbeddings(Engine):
    """Requests are hashed by token ids alone: a prompt given as embeddings
    shares blocks with any prompt of the same placeholder ids."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.hasher = hasher_ignoring_embeddings(self.layout.hash_block_size)


class SwapsTableEntries(Engine):
    """The worker swaps the first two entries of every row it extends."""

    def _update_tables(self, w):
        super()._update_tables(w)
        table = self.tables[0]
        row = self.tables.row_of(w.request.request_id)
        if table.num_blocks[row] >= 2:
            table.tensor[row, [0, 1]] = table.tensor[row, [1, 0]]


class ReadsWrongState(Engine):
    """The Mamba step reads the state one block before the right one."""

    def mamba_read_position(self, group, w):
        return max(0, cdiv(w.start, group.block_size) - 2)


class WritesNextBlock(Engine):
    """The slot mapping is one kernel block off: K/V land in a block the
    request does not own."""

    def slot_mapping(self, group, row, positions):
        return super().slot_mapping(group, row, positions) + group.kernel_block_size


class LayersShareMemory(Engine):
    """The model runner binds every layer of a group to its first layer's
    memory (the tensor plan is right; the binding is not)."""

    kinds = ("attention", "mla", "cross", "mamba")

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.cache.views = [[layers[0]] * len(layers) if group.kind in self.kinds else layers
                            for group, layers in zip(self.groups, self.cache.views, strict=True)]


class MambaLayersShareMemory(LayersShareMemory):
    """The same, for Mamba groups only."""

    kinds = ("mamba",)


# --- the faults, their schedules and the checks that must catch them ------------------------------------------


def _two_requests_sharing(engine: Engine, prompt: list[int], *, salt_b: str | None = None,
                          first_chunk: int | None = None, same_step: bool = False) -> None:
    """``a`` computes ``prompt`` (and finishes); ``b`` with the same prompt
    looks it up -- in a later step, or the same one."""
    engine.begin_step()
    a = engine.new_request(prompt)
    engine.admit(a, first_chunk or len(prompt), engine.lookup(a))
    if not same_step:
        engine.execute()
        engine.finish(a)
        engine.begin_step()
    b = engine.new_request(prompt, salt=salt_b)
    hit = engine.lookup(b)
    engine.admit(b, len(prompt) - hit[1], hit)
    engine.execute()


def stale_hit(engine: Engine) -> None:
    """A prompt is cached and freed; other prompts take every free block, so
    its blocks are reused; the first prompt's lookup then hits them."""
    first = [0, 1, 0, 1, 1, 0]
    engine.begin_step()
    a = engine.new_request(first)
    engine.admit(a, 6, engine.lookup(a))
    engine.execute()
    engine.finish(a)
    for i in range(2):  # 24 tokens each, different from the first prompt: every free block is taken once
        engine.begin_step()
        b = engine.new_request([1, 1, i] + [0] * 21)
        engine.admit(b, 24, (None, 0))
        engine.execute()
        engine.finish(b)
    engine.begin_step()
    c = engine.new_request(first)
    hit = engine.lookup(c)
    engine.admit(c, len(first) - hit[1], hit)
    engine.execute()


def other_embeddings(engine: Engine) -> None:
    """Two prompts of the same placeholder ids, given as other embeddings."""
    engine.begin_step()
    a = engine.new_request(None, prompt_embeds=embedding_rows("source-a", 8))
    engine.admit(a, 8, engine.lookup(a))
    engine.execute()
    engine.begin_step()
    b = engine.new_request(None, prompt_embeds=embedding_rows("source-b", 9))
    hit = engine.lookup(b)
    engine.admit(b, 9 - hit[1], hit)
    engine.execute()


def cross_tenant(engine: Engine) -> None:
    _two_requests_sharing(engine, [0, 1, 1, 0, 1, 0, 0], salt_b="tenant-b")


def window_early(engine: Engine) -> None:
    """One request decodes past its window while another takes every free
    block (a released block is reused at once)."""
    engine.begin_step()
    a = engine.new_request([0, 1, 0, 0, 1, 1, 0, 1])
    engine.admit(a, 8, engine.lookup(a))
    engine.execute({a.request_id: 1})
    engine.begin_step()
    engine.advance(a)
    b = engine.new_request([1, 1, 1] + [0] * 17)
    engine.admit(b, 20, (None, 0))
    engine.execute({a.request_id: 0, b.request_id: 0})


def swapped_entries(engine: Engine) -> None:
    engine.begin_step()
    a = engine.new_request([0, 1, 0, 0, 1, 1, 0, 1])
    engine.admit(a, 4, engine.lookup(a))
    engine.execute()
    engine.begin_step()
    engine.advance(a, 4)
    engine.execute()


def wrong_state(engine: Engine) -> None:
    """A Mamba request prefills in two aligned chunks, the second reading the first's state."""
    engine.begin_step()
    a = engine.new_request([0, 1, 0, 0, 1, 1, 0, 1, 1, 1])
    engine.admit(a, 4, engine.lookup(a))
    engine.execute()
    engine.begin_step()
    engine.advance(a, 4)
    engine.execute()


def same_step_mamba_hit(engine: Engine) -> None:
    _two_requests_sharing(engine, [0, 1, 0, 0, 1, 1, 0, 1], first_chunk=4, same_step=True)


def hit_before_load(engine: Engine) -> None:
    """``a``'s first 4 tokens come from a connector, asynchronously; ``b``
    with the same prompt looks up in the same step."""
    prompt = [0, 1, 1, 0, 1, 0, 0, 1]
    engine.begin_step()
    a = engine.new_request(prompt)
    engine.admit(a, 0, engine.lookup(a), external=4, async_load=True)
    b = engine.new_request(prompt)
    hit = engine.lookup(b)
    engine.admit(b, len(prompt) - hit[1], hit)
    engine.execute()


@dataclass(frozen=True)
class Fault:
    name: str
    model: str  # a model of kvspec.models.architectures, tiny scale
    check: str | None  # the check that must fire first (None: nothing can)
    scenario: Callable[[Engine], None]
    target: type = ImplManagerTarget
    engine: type[Engine] = Engine
    disable: tuple[str, ...] = ()  # checks switched off (to show a deeper line of defence)
    search: int = 60  # examples within which the random search must find it too (0: not asserted)


FAULTS = [
    Fault("stale prefix hit", "llama-3-8b", "exact-gather", stale_hit, target=StaleHashOnReuse),
    Fault("cross-tenant hit (salt ignored)", "llama-3-8b", "exact-gather", cross_tenant, target=IgnoresSalt),
    Fault("prompt embeddings left out of the block hash", "llama-3-8b", "exact-gather", other_embeddings,
          engine=HashesWithoutEmbeddings),
    Fault("sliding-window block freed one block early", "mistral-7b", "exact-gather", window_early,
          target=WindowFreedEarly),
    Fault("two block-table entries swapped", "llama-3-8b", "table-coherence", swapped_entries,
          engine=SwapsTableEntries),
    Fault("two block-table entries swapped (worker checks off)", "llama-3-8b", "exact-gather", swapped_entries,
          engine=SwapsTableEntries, disable=("table-coherence", "slot-ownership")),
    # Softmax attention does not see the order of the keys it reads whole, so kernels that agree with each
    # other over a wrong table notice nothing: only a check against the tokens themselves does.
    Fault("two block-table entries swapped (kernels only)", "llama-3-8b", None, swapped_entries,
          engine=SwapsTableEntries,
          disable=("table-coherence", "slot-ownership", "exact-gather", "reference-vs-truth")),
    Fault("Mamba step reads the wrong state block", "nemotron-h-8b", "mamba-state", wrong_state,
          engine=ReadsWrongState),
    Fault("K/V written to a block the request does not own", "llama-3-8b", "slot-ownership", swapped_entries,
          engine=WritesNextBlock),
    Fault("same-step hit on a Mamba state not yet written", "nemotron-h-8b", "mamba-state", same_step_mamba_hit,
          target=MambaSameStepHit),
    Fault("two layers of a group share memory", "llama-3-8b", "exact-gather", swapped_entries,
          engine=LayersShareMemory),
    Fault("two Mamba layers of a group share memory", "nemotron-h-8b", "mamba-output", wrong_state,
          engine=MambaLayersShareMemory),
    Fault("hit on blocks a connector has not loaded yet", "llama-3-8b", "exact-gather", hit_before_load,
          target=CachesBeforeLoad),
]


def catch(fault: Fault, engine: Engine) -> str | None:
    """Run the fault's schedule; the check that fired, or None."""
    try:
        fault.scenario(engine)
    except KernelStageError as error:
        return error.check
    return None
