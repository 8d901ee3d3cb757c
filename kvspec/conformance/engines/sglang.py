"""SGLang (0.5.23) at cache scope: its ``RadixCache`` over its own token or
page allocator and request-to-token pool, with real ``Req`` objects, driven
through the functions its scheduler calls.

- admission: ``Req.init_next_round_input`` (``match_kv_cache`` →
  ``RadixCache.match_prefix``), the tree lock, ``alloc_req_slots``, and
  ``alloc_token_slots`` / ``alloc_paged_token_slots_extend`` -- each evicts
  from the tree first (``evict_from_tree_cache``) -- the request's row
  written as the scheduler writes it;
- growth: one decode step per token (``alloc_token_slots`` /
  ``alloc_paged_token_slots_decode``);
- chunked insertion: ``common.checkpoint_kv_cache``;
- finish: ``common.release_kv_cache(checkpoint=True)``; retraction:
  ``release_kv_cache(checkpoint=False)`` (SGLang discards a retracted
  request's KV);
- eviction: ``RadixCache.evict``.

Admission and growth are refused, as SGLang's ``PrefillAdder`` and
``check_decode_capacity`` refuse them, when the tokens needed exceed what
is free plus what the tree could evict; SGLang's allocators then fail
loudly (``RuntimeError``) if that promise is broken.

The content view (spec chapter 10; the mapping in docs/engines.md): a page
is a block (page 0 is SGLang's padding, never handed out); ``free`` is the
allocator's free pages; ``cached`` is every tree node's pages, keyed by the
node's namespace (``extra_key``: the LoRA id) and the tokens on its path;
a page's hold count is the lock count of the node holding it (a page only
a request's row holds -- its tail, not yet in the tree -- is that
request's alone).

``torchvision``: ``sglang.srt.configs`` imports it for multimodal
preprocessing, and PyPI has only CUDA builds of it, which fail to load
against CPU torch.  Imported here, that one import is answered with an
empty module; nothing of SGLang's is replaced.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Sequence
from typing import Any

from kvspec.conformance.engines import TickingClock
from kvspec.spec.engines import CacheLayout, CacheView, GroupedView

MAX_CONTEXT = 512
MAX_REQUESTS = 64
SWA_EVICTION_INTERVAL = 1
"""Tokens that must slide out of the window before a decode step frees them
(SGLang's ``SGLANG_SWA_EVICTION_INTERVAL``, 128 by default): kvspec slides
every token, the schedule that frees the most, the earliest."""


class _AbsentModule(types.ModuleType):
    """An import of a package SGLang names but never runs here."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _AbsentModule(f"{self.__name__}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.__name__} is not available to kvspec's SGLang target (CPU torch)")


class _Absent(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers ``import torchvision...`` only -- not availability probes
    (``importlib.util.find_spec``), so libraries still see it missing."""

    NAMES = ("torchvision",)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.split(".")[0] not in self.NAMES:
            return None
        if sys._getframe(2).f_code.co_name != "_find_and_load_unlocked":
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> Any:
        return _AbsentModule(spec.name)

    def exec_module(self, module: Any) -> None:
        pass


def _prepare() -> None:
    if not any(isinstance(f, _Absent) for f in sys.meta_path):
        if importlib.util.find_spec("torchvision") is None or _torchvision_broken():
            sys.meta_path.insert(0, _Absent())
    with warnings.catch_warnings():  # "only CUDA supports AWQ/GGUF ...": SGLang's imports, on a CPU
        warnings.simplefilter("ignore")
        import sglang.srt.managers.schedule_batch  # noqa: F401
        import sglang.srt.mem_cache.radix_cache  # noqa: F401
        from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
        from sglang.srt.server_args import ServerArgs

    reset_context()  # SGLang's process-wide config, published as its own tests do
    publish(ServerArgs(model_path="dummy", device="cpu"), role="test", ranks=SpawnRanks(world_rank=0, dp_rank=None))


def _torchvision_broken() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:
        sys.modules.pop("torchvision", None)
        return True
    return False


def problem() -> str | None:
    """Why SGLang's mem_cache does not import here (``None``: it does)."""
    if importlib.util.find_spec("sglang") is None:
        return "sglang is not installed"
    try:
        _prepare()
    except Exception as error:
        return f"importing sglang.srt.mem_cache failed: {type(error).__name__}: {error}"
    return None


def unsupported(layout: CacheLayout) -> str | None:
    if layout.groups:
        if layout.groups != ("full", "swa"):
            return f"groups {layout.groups}: SGLang's UnifiedRadixCache is driven with full+SWA only (Mamba: not yet)"
        return None
    if layout.window is not None and layout.block_size != 1:
        return ("SGLang's all-SWA cache (PureSWARadixCache over PureSWATokenToKVPoolAllocator) takes pages of one "
                "token only; its windows over larger pages are a hybrid model's (the full+swa layout)")
    return None


def target(layout: CacheLayout) -> SglangCacheTarget:
    return SglangUnifiedTarget(layout) if layout.groups else SglangCacheTarget(layout)


class SglangCacheTarget:
    """SGLang's RadixCache, allocators and requests, as a :class:`CacheTarget`.

    On a windowed layout, ``prefill_aware`` says whether the model keeps its
    prompt's KV whole (``is_prefill_aware_swa()``; SGLang's scheduler then
    sets the request's ``swa_evict_floor`` to the prompt's length).  The
    gate drives a prefill-aware model -- the only all-SWA architecture that
    declares it in 0.5.23 is UnlimitedOCR; any other all-SWA model is not,
    and meets finding SG1 (docs/engines.md)."""

    def __init__(self, layout: CacheLayout, *, prefill_aware: bool = True):
        _prepare()
        from sglang.srt.mem_cache import radix_cache
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

        radix_cache.time = TickingClock()  # repeatable LRU order (see docs/engines.md)
        self.block_size = layout.block_size
        self.num_blocks = layout.num_blocks
        self.window = layout.window
        self.prefill_aware = prefill_aware
        self.pool = ReqToTokenPool(size=MAX_REQUESTS, max_context_len=MAX_CONTEXT, device="cpu",
                                   enable_memory_saver=False)
        self.released: dict[str, set[int]] = {}  # row positions whose slots the window freed, per request
        self.allocator, self.tree = self._build(layout)
        self.running: dict[str, Any] = {}

    def _build(self, layout: CacheLayout) -> tuple[Any, Any]:
        """SGLang's allocator and tree cache for ``layout``."""
        return (_radix if self.window is None else _all_swa)(layout, self.pool)

    # --- capacity, as SGLang's admission budget and decode check see it --------------------

    def _fits(self, num_tokens: int) -> bool:
        return num_tokens <= self.allocator.available_size() + self.tree.evictable_size()

    # --- the CacheTarget operations ------------------------------------------------------

    def admit(self, request_id: str, tokens: Sequence[int], tenant: Any) -> int | None:
        from array import array

        import torch
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.mem_cache.allocation import (
            alloc_paged_token_slots_extend,
            alloc_req_slots,
            alloc_token_slots,
            get_last_loc_torch,
        )
        from sglang.srt.sampling.sampling_params import SamplingParams

        B = self.block_size  # noqa: N806
        req = Req(request_id, "", array("q", tokens), SamplingParams(max_new_tokens=1 << 20),
                  lora_id=None if tenant is None else str(tenant))
        req.init_next_round_input(self.tree)
        hit, end = req.prefix_len, len(tokens)
        # As SGLang's PrefillAdder: the matched prefix locked first (it is no longer evictable), then the rest
        # must fit in what is free and evictable -- the paged extend over-estimating by a page per request.
        req.lock = self.tree.lock(req.last_node)
        if not self._fits(end - hit + (B if B > 1 else 0)):
            self.tree.unlock(req.lock)  # it stays waiting in SGLang; the client gives up
            return None
        prefix = self.tree.prefix_device_indices(req)
        req.extend_end = end
        [row] = alloc_req_slots(self.pool, [req], self.tree)
        if B == 1:
            out = alloc_token_slots(self.tree, end - hit)
        else:
            prefix_lens, seq_lens = torch.tensor([hit]), torch.tensor([end])
            last = get_last_loc_torch(self.pool.req_to_token, torch.tensor([row]), prefix_lens)
            out = alloc_paged_token_slots_extend(self.tree, prefix_lens, prefix_lens, seq_lens, seq_lens, last,
                                                 end - hit)
        self.pool.write((row, slice(0, hit)), prefix)
        self.pool.write((row, slice(hit, end)), out)
        req.kv.kv_allocated_len = req.kv.kv_committed_len = end
        if self.window is not None:
            if self.prefill_aware:  # SGLang's scheduler, after prepare_for_extend: the prompt is never window-freed
                req.kv.swa_evict_floor = req.extend_end
            self.released[request_id] = set()
        self.running[request_id] = req
        return hit

    def append(self, request_id: str, tokens: Sequence[int]) -> bool:
        import torch
        from sglang.srt.mem_cache.allocation import alloc_paged_token_slots_decode, alloc_token_slots

        req = self.running[request_id]
        for token in tokens:  # one decode step each
            if not self._fits(self.block_size):  # check_decode_capacity: SGLang retracts the request
                self.preempt(request_id)
                return False
            req.output_ids.append(int(token))
            if self.window is not None:
                self._slide(request_id, req)
            length = req.kv.kv_committed_len + 1
            row = req.kv.req_pool_idx
            if self.block_size == 1:
                out = alloc_token_slots(self.tree, 1)
            else:
                seq_lens = torch.tensor([length])
                last = self.pool.req_to_token[row, length - 2:length - 1].to(torch.int64)
                out = alloc_paged_token_slots_decode(self.tree, seq_lens, seq_lens, last)
            self.pool.write((row, slice(length - 1, length)), out)
            req.kv.kv_allocated_len = req.kv.kv_committed_len = length
            req.decode_batch_idx += 1
        return True

    def _slide(self, request_id: str, req: Any) -> None:
        """The window's part of a decode step (``ScheduleBatch.maybe_evict_swa``
        before the step's allocation): from the second decode step on, once
        :data:`SWA_EVICTION_INTERVAL` tokens have slid out, the request's
        slots behind the window go back to the pool."""
        from sglang.srt.mem_cache.unified_cache.components import ComponentType

        kv, pre_len = req.kv, req.seqlen - 1  # the new token's KV is this step's to write
        cursor = kv.get_evicted_seqlen(ComponentType.SWA)
        if req.decode_batch_idx < 1 or pre_len - self.window < cursor + SWA_EVICTION_INTERVAL:
            return
        first = max(cursor, kv.swa_dead_lo(self.block_size))
        self.tree.evict_sliding_windows(req, pre_len)
        self.released[request_id] |= set(range(first, kv.get_evicted_seqlen(ComponentType.SWA)))

    def cache(self, request_id: str) -> None:
        from sglang.srt.mem_cache.common import checkpoint_kv_cache

        req = self.running[request_id]
        req.refresh_fill_ids()
        req.extend_end = req.kv.kv_committed_len
        checkpoint_kv_cache(req, self.tree)

    def finish(self, request_id: str) -> None:
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH
        from sglang.srt.mem_cache.common import release_kv_cache

        req = self._leave(request_id)
        req.finished_reason = FINISH_LENGTH(length=len(req.output_ids))
        req.finished_len = len(req.output_ids)
        release_kv_cache(req, self.tree, checkpoint=True)

    def preempt(self, request_id: str) -> None:
        from sglang.srt.mem_cache.common import release_kv_cache

        req = self._leave(request_id)
        release_kv_cache(req, self.tree, checkpoint=False)
        req.reset_for_retract()

    def _leave(self, request_id: str) -> Any:
        """The request, no longer running (finished or retracted)."""
        self.released.pop(request_id, None)
        return self.running.pop(request_id)

    def evict(self, num_blocks: int) -> int:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        evicted = self.tree.evict(EvictParams(num_tokens=num_blocks * self.block_size)).num_tokens_evicted
        return evicted // self.block_size

    # --- the content view ----------------------------------------------------------------

    def view(self) -> CacheView:
        B = self.block_size  # noqa: N806
        cached: dict[int, tuple[Any, tuple[int, ...]]] = {}
        locks: dict[int, int] = {}

        def walk(node: Any, path: tuple[int, ...]) -> None:
            for child in node.children.values():
                tokens = path + tuple(int(t) for t in child.key.token_ids)
                slots = child.value.tolist()
                for i in range(0, len(slots), B):
                    page = int(slots[i]) // B
                    cached[page] = (child.key.extra_key or None, tokens[:len(path) + i + B])
                    locks[page] = child.lock_ref
                walk(child, tokens)

        walk(self.tree.root_node, ())
        tables, holds = {}, {b: n for b, n in locks.items() if n}
        for request_id, req in self.running.items():
            row = self.pool.req_to_token[req.kv.req_pool_idx, :req.kv.kv_committed_len].tolist()
            released = self.released.get(request_id, ())
            tables[request_id] = tuple(None if i in released else int(row[i]) // B for i in range(0, len(row), B))
            for page in tables[request_id]:
                if page is not None and page not in cached:
                    holds[page] = holds.get(page, 0) + 1  # a page no node holds: its request's alone
        # its free pages, and those released but not yet merged back (all-SWA: its one SWA pool's)
        allocator = getattr(self.allocator, "swa_attn_allocator", self.allocator)
        free = frozenset(int(p) for pages in (allocator.free_pages, allocator.release_pages) if pages is not None
                         for p in pages.tolist())
        return CacheView(blocks=frozenset(range(1, self.num_blocks + 1)), block_size=B, free=free, tables=tables,
                         holds=holds, cached=cached)


class SglangUnifiedTarget(SglangCacheTarget):
    """SGLang's ``UnifiedRadixCache`` for a hybrid model of full-attention
    and sliding-window layers -- the cache SGLang's factory builds for it
    (``registry.default_radix_cache_factory`` → ``create_unified_radix_cache``
    with components FULL and SWA; docs/engines.md says when) -- over its
    ``SWATokenToKVPoolAllocator`` (a full pool and an SWA pool, a token's
    SWA slot found through ``full_to_swa_index_mapping``), with its Python
    TreeCore (``tree_core_backend="python"``: the Rust core's nodes are not
    readable from Python; see docs/engines.md).

    The scheduler's calls are :class:`SglangCacheTarget`'s -- SGLang's
    ``Req``, ``alloc_*`` and ``common`` functions are the same for every
    tree cache -- but for the admission budget, the lesser of the two
    pools' free-plus-evictable (``prefill_budget``), and the window's
    slide inside the allocator's free group, as ``maybe_evict_swa`` does.

    The view is a :class:`GroupedView` of two groups, ``full`` and ``swa``,
    block ids ``("full", page)`` and ``("swa", page)``: each group's free
    pages, its tree values (an SWA tombstone caches nothing in ``swa``),
    its per-component lock counts.  A request's ``swa`` row is its slots'
    SWA pages where it holds them: the tree's pages inside its lock's
    window segment (from its lock's node up to the node carrying the
    receipt's SWA uuid, as ``release_component_lock`` walks it), its own
    pages past the tree, ``None`` elsewhere (behind the window)."""

    def __init__(self, layout: CacheLayout):
        super().__init__(layout, prefill_aware=False)  # no hybrid model declares is_prefill_aware_swa

    def _build(self, layout: CacheLayout) -> tuple[Any, Any]:
        return _unified_swa(layout, self.pool)

    def _fits(self, num_tokens: int) -> bool:
        full = self.allocator.full_available_size() + self.tree.full_evictable_size()
        swa = self.allocator.swa_available_size() + self.tree.swa_evictable_size()
        return num_tokens <= min(full, swa)

    def _slide(self, request_id: str, req: Any) -> None:
        self.allocator.free_group_begin()
        try:
            super()._slide(request_id, req)
        finally:
            self.allocator.free_group_end()

    def evict(self, num_blocks: int) -> int:
        """Both pools asked for ``num_blocks`` pages, as an allocation of that
        many tokens asks (``SWATokenToKVPoolAllocator.evict_to_free_tokens``):
        whole leaves go, and internal nodes' SWA alone (tombstones)."""
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        n = num_blocks * self.block_size
        result = self.tree.evict(EvictParams(num_tokens=n, swa_num_tokens=n))
        return max(result.num_tokens_evicted, result.swa_num_tokens_evicted) // self.block_size

    def view(self) -> GroupedView:
        from sglang.srt.mem_cache.unified_cache.components import ComponentType

        B = self.block_size  # noqa: N806
        full_t, swa_t = ComponentType.FULL, ComponentType.SWA
        cached: dict[str, dict[Any, Any]] = {"full": {}, "swa": {}}
        locks: dict[str, dict[Any, int]] = {"full": {}, "swa": {}}
        core = self.tree.tree_core

        def pages(value: Any) -> list[int]:
            return [int(v) // B for v in value.tolist()[::B]]

        def walk(node: Any, path: tuple[int, ...]) -> None:
            for child in node.children.values():
                tokens = path + tuple(int(t) for t in child.key.raw_token_ids())
                for group, ct in (("full", full_t), ("swa", swa_t)):
                    data = child.component_data[ct]
                    if data.value is None:
                        continue  # a tombstone (SWA) or an evicted node (full): nothing of this group cached
                    for i, page in enumerate(pages(data.value)):
                        cached[group][(group, page)] = (child.key.extra_key or None,
                                                        tokens[:len(path) + (i + 1) * B])
                        locks[group][(group, page)] = data.lock_ref
                walk(child, tokens)

        walk(core.root_node, ())
        holds = {g: {b: n for b, n in locks[g].items() if n} for g in locks}
        tables: dict[str, dict[str, tuple[Any, ...]]] = {"full": {}, "swa": {}}
        mapping = self.allocator.full_to_swa_index_mapping
        for request_id, req in self.running.items():
            row = self.pool.req_to_token[req.kv.req_pool_idx, :req.kv.kv_committed_len]
            full_row = [int(s) // B for s in row.tolist()[::B]]
            swa_row = [int(mapping[int(s)]) // B for s in row.tolist()[::B]]
            segment = self._swa_segment(req)
            released = self.released.get(request_id, ())
            tables["full"][request_id] = tuple(("full", p) for p in full_row)
            tables["swa"][request_id] = tuple(
                None if i * B in released or p == 0 or (("swa", p) in cached["swa"] and ("swa", p) not in segment)
                else ("swa", p) for i, p in enumerate(swa_row))
            for group in ("full", "swa"):
                for block in tables[group][request_id]:
                    if block is not None and block not in cached[group]:
                        holds[group][block] = holds[group].get(block, 0) + 1  # past the tree: its request's alone
        groups = {}
        for group, allocator in (("full", self.allocator.full_attn_allocator),
                                 ("swa", self.allocator.swa_attn_allocator)):
            free = frozenset((group, int(p)) for ps in (allocator.free_pages, allocator.release_pages)
                             if ps is not None for p in ps.tolist())
            groups[group] = CacheView(blocks=frozenset((group, p) for p in range(1, self.num_blocks + 1)),
                                      block_size=B, free=free, tables=tables[group], holds=holds[group],
                                      cached=cached[group])
        return GroupedView(groups=groups, windows={"full": None, "swa": self.window})

    def _swa_segment(self, req: Any) -> set[Any]:
        """The SWA pages the request's tree lock holds: the nodes from its
        lock's node up to the one stamped with the receipt's SWA uuid (or
        the root), as ``SWAComponent.release_component_lock`` will walk them."""
        from sglang.srt.mem_cache.unified_cache.components import ComponentType

        lock = getattr(req, "lock", None)
        if lock is None or lock.swa_released:
            return set()
        core = self.tree.tree_core
        uuid = lock.receipt.get_lock_uuid(ComponentType.SWA)
        node, held = core.node_by_id(lock.node) if not hasattr(lock.node, "children") else lock.node, set()
        while node is not None and node is not core.root_node:
            data = node.component_data[ComponentType.SWA]
            if data.value is not None:
                held |= {("swa", int(v) // self.block_size) for v in data.value.tolist()[::self.block_size]}
            if uuid and data.metadata.get("uuid") == uuid:
                break
            node = node.parent
        return held


def _unified_swa(layout: CacheLayout, pool: Any) -> tuple[Any, Any]:
    """SGLang's cache for a hybrid full+SWA model: an ``SWAKVPool`` (one
    full-attention layer and one SWA layer, one head of one dimension:
    nothing here reads KV), its ``SWATokenToKVPoolAllocator`` with pools of
    the same size, and a ``UnifiedRadixCache`` with components FULL and SWA
    (``create_unified_radix_cache``'s, for ``is_hybrid_swa``)."""
    import torch
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    B, size = layout.block_size, layout.num_blocks * layout.block_size  # noqa: N806
    kv = SWAKVPool(size=size, size_swa=size, page_size=B, dtype=torch.float16, head_num=1, head_dim=1,
                   swa_attention_layer_ids=[0], full_attention_layer_ids=[1], device="cpu")
    allocator = SWATokenToKVPoolAllocator(size=size, size_swa=size, page_size=B, dtype=torch.float16, device="cpu",
                                          kvcache=kv, need_sort=False)
    tree = UnifiedRadixCache(CacheInitParams(
        disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=allocator, page_size=B,
        sliding_window_size=layout.window, tree_components=(ComponentType.FULL, ComponentType.SWA),
        tree_core_backend="python"))
    return allocator, tree


def _radix(layout: CacheLayout, pool: Any) -> tuple[Any, Any]:
    """SGLang's ``RadixCache`` over its token allocator (pages of one token)
    or its paged allocator."""
    import torch
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.radix_cache import RadixCache

    B = layout.block_size  # noqa: N806
    if B == 1:
        allocator = TokenToKVPoolAllocator(size=layout.num_blocks, dtype=torch.float16, device="cpu", kvcache=None,
                                           need_sort=False)
    else:
        allocator = PagedTokenToKVPoolAllocator(size=layout.num_blocks * B, page_size=B, dtype=torch.float16,
                                                device="cpu", kvcache=None, need_sort=False)
    tree = RadixCache(CacheInitParams(disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=allocator,
                                      page_size=B))
    return allocator, tree


def _all_swa(layout: CacheLayout, pool: Any) -> tuple[Any, Any]:
    """SGLang's cache for a model whose every layer is sliding-window
    attention (``registry.default_radix_cache_factory``: ``is_pure_swa``):
    one SWA KV pool (one layer, one head of one dimension: nothing here reads
    KV), its ``PureSWATokenToKVPoolAllocator`` and a ``PureSWARadixCache``."""
    import torch
    from sglang.srt.mem_cache.allocator.swa import PureSWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.pure_swa_radix_cache import PureSWARadixCache
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    size = layout.num_blocks
    kv = SWAKVPool(size=0, size_swa=size, page_size=1, dtype=torch.float16, head_num=1, head_dim=1,
                   swa_attention_layer_ids=[0], full_attention_layer_ids=[], device="cpu")
    allocator = PureSWATokenToKVPoolAllocator(size_swa=size, page_size=1, dtype=torch.float16, device="cpu",
                                              kvcache=kv, need_sort=False)
    tree = PureSWARadixCache(CacheInitParams(disable=False, req_to_token_pool=pool,
                                             token_to_kv_pool_allocator=allocator, page_size=1,
                                             sliding_window_size=layout.window))
    return allocator, tree
