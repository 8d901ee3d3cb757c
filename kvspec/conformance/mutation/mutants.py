"""Named mutants: real bug classes of paged KV-cache managers, each a small
patch applied in memory to a block manager's classes.

A conformance gate is worth the bugs it catches.  Each :class:`Mutant`
reintroduces one bug -- a reference count that leaks, a freed block still in
use, a stale hash served as someone's prefix, a window off by one -- into a
*family* of classes: kvspec's own ``impl`` or vLLM's ``vllm.v1.core`` (the
two share class and method names, so one patch fits both).  ``kvspec
mutate`` (:mod:`kvspec.conformance.mutation.mutate`) runs the gate against each and
reports which it kills, at which level, by which rule, and how fast.

A patch wraps the original method and bends its inputs, outputs or side
effects; it never copies a method body, so it applies to any version of a
family that keeps the method's name and signature.  Every mutant names its
bug class and says what goes wrong; ``l1`` says why a level-1 run cannot see
it, where by design it cannot (the policy rules are L2).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

FAMILY_MODULES = {
    "impl": ("kvspec.impl.block_pool", "kvspec.impl.single_type_kv_cache_manager",
             "kvspec.impl.kv_cache_coordinator", "kvspec.impl.kv_cache_manager"),
    "vllm": ("vllm.v1.core.block_pool", "vllm.v1.core.single_type_kv_cache_manager",
             "vllm.v1.core.kv_cache_coordinator", "vllm.v1.core.kv_cache_manager", "vllm.v1.core.kv_cache_utils",
             "vllm.v1.core.sched.scheduler"),
}
"""Where each family's classes live (the targets ``impl`` and ``vllm``)."""


class Family:
    """The classes of one implementation, by name."""

    def __init__(self, name: str):
        if name not in FAMILY_MODULES:
            raise ValueError(f"no mutant family {name!r}: use one of {sorted(FAMILY_MODULES)}")
        self.name = name
        self.modules = [importlib.import_module(m) for m in FAMILY_MODULES[name]]

    def module(self, suffix: str) -> Any:
        """The family's module whose name ends with ``suffix`` (``kv_cache_utils``)."""
        for module in self.modules:
            if module.__name__.endswith("." + suffix):
                return module
        raise AttributeError(f"the {self.name} family has no module {suffix}")

    def __getattr__(self, cls_name: str) -> Any:
        for module in self.modules:
            if hasattr(module, cls_name):
                return getattr(module, cls_name)
        raise AttributeError(f"the {self.name} family has no {cls_name}")


Patch = tuple[Any, str, Any]  # (class or module, attribute, replacement)


@dataclass(frozen=True)
class Mutant:
    """One reintroduced bug.  ``patches(family)`` gives the replacements;
    ``families`` the implementations it applies to; ``l1`` why a level-1 run
    cannot catch it (``None``: it should)."""

    name: str
    bug_class: str
    what: str
    patches: Callable[[Family], list[Patch]]
    families: tuple[str, ...] = ("impl", "vllm")
    l1: str | None = None


def wrap(owner: Any, attr: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Patch:
    """``owner.attr`` replaced by ``make(original)``, a classmethod staying one."""
    static = inspect.getattr_static(owner, attr)
    if isinstance(static, classmethod):
        return owner, attr, classmethod(make(static.__func__))
    return owner, attr, make(getattr(owner, attr))


@contextlib.contextmanager
def applied(mutant: Mutant, family: Family) -> Iterator[None]:
    """``mutant`` in force on ``family``'s classes, undone on exit."""
    if family.name not in mutant.families:
        raise ValueError(f"mutant {mutant.name} does not apply to {family.name} ({mutant.families})")
    patches = mutant.patches(family)
    saved = [(owner, attr, owner.__dict__.get(attr, _ABSENT)) for owner, attr, _ in patches]
    try:
        for owner, attr, replacement in patches:
            setattr(owner, attr, replacement)
        yield
    finally:
        for owner, attr, old in reversed(saved):
            if old is _ABSENT:
                delattr(owner, attr)
            else:
                setattr(owner, attr, old)


_ABSENT = object()


def _bind(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> inspect.BoundArguments:
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    return bound


def _with(name: str, change: Callable[[Any, inspect.BoundArguments], Any]):
    """A wrapper maker: call the original with argument ``name`` changed."""
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def mutated(*args: Any, **kwargs: Any) -> Any:
            bound = _bind(original, args, kwargs)
            bound.arguments[name] = change(bound.arguments[name], bound)
            return original(*bound.args, **bound.kwargs)
        return mutated
    return make


def _managers_with(family: Family, attr: str) -> list[Any]:
    """The single-type manager classes that define ``attr`` themselves."""
    names = ("SingleTypeKVCacheManager", "FullAttentionManager", "SlidingWindowManager",
             "ChunkedLocalAttentionManager", "MambaManager", "CrossAttentionManager")
    return [c for c in (getattr(family, n) for n in names) if attr in c.__dict__]


def _coordinators_with(family: Family, attr: str) -> list[Any]:
    names = ("KVCacheCoordinator", "KVCacheCoordinatorNoPrefixCache", "UnitaryKVCacheCoordinator",
             "HybridKVCacheCoordinator")
    return [c for c in (getattr(family, n) for n in names) if attr in c.__dict__]


def _valid_count(pool: Any, n: Any) -> bool:
    return type(n) is int and 0 <= n <= pool.get_num_free_blocks()


class _RequestWithHashes:
    """A request seen through other block hashes (everything else as is)."""

    def __init__(self, request: Any, block_hashes: list[Any]):
        self._request, self.block_hashes = request, block_hashes

    def __getattr__(self, name: str) -> Any:
        return getattr(self._request, name)


# --- the pool ---------------------------------------------------------------------------------------------


def _free_skips_last(f: Family) -> list[Patch]:
    def make(free):
        def free_blocks(self, ordered_blocks):
            blocks = list(ordered_blocks)
            return free(self, blocks[:-1] if len(blocks) > 1 else blocks)
        return free_blocks
    return [wrap(f.BlockPool, "free_blocks", make)]


def _double_free_shared(f: Family) -> list[Patch]:
    def make(free):
        def free_blocks(self, ordered_blocks):
            blocks = list(ordered_blocks)
            shared = [b for b in blocks if b.ref_cnt > 1 and not b.is_null][:1]
            free(self, blocks)
            if shared:
                free(self, shared)  # the holder's reference dropped twice
        return free_blocks
    return [wrap(f.BlockPool, "free_blocks", make)]


def _null_block_queued(f: Family) -> list[Patch]:
    def make(free):
        def free_blocks(self, ordered_blocks):
            blocks = list(ordered_blocks)
            free(self, blocks)
            null = self.null_block
            if any(b is null for b in blocks) and null.prev_free_block is None and null.next_free_block is None:
                self.free_block_queue.append(null)
        return free_blocks
    return [wrap(f.BlockPool, "free_blocks", make)]


def _reuse_keeps_hash(f: Family) -> list[Patch]:
    def make(get_new):
        def get_new_blocks(self, num_blocks):
            if not _valid_count(self, num_blocks):
                return get_new(self, num_blocks)
            blocks = self.free_block_queue.popleft_n(num_blocks)
            for block in blocks:  # reused without evicting the old key
                block.ref_cnt = 1
            return blocks
        return get_new_blocks
    return [wrap(f.BlockPool, "get_new_blocks", make)]


def _touch_keeps_queued(f: Family) -> list[Patch]:
    def make(touch):
        def mutated(self, blocks):
            for block in blocks:
                block.ref_cnt += 1  # taken, but left in the free queue
        return mutated
    return [wrap(f.BlockPool, "touch", make)]


def _touch_skips_held(f: Family) -> list[Patch]:
    def make(touch):
        def mutated(self, blocks):
            touch(self, [b for b in blocks if b.ref_cnt == 0 or b.is_null])
        return mutated
    return [wrap(f.BlockPool, "touch", make)]


def _cached_freed_to_head(f: Family) -> list[Patch]:
    def make(free):
        def free_blocks(self, ordered_blocks):
            blocks = list(ordered_blocks)
            free(self, blocks)
            once = {id(b): b for b in blocks}.values()  # vLLM's blocks are unhashable dataclasses
            cached = [b for b in once if b.ref_cnt == 0 and not b.is_null and b.block_hash is not None]
            for block in cached:
                self.free_block_queue.remove(block)
            self.free_block_queue.prepend_n(cached)  # evicted next, before the unhashed ones
        return free_blocks
    return [wrap(f.BlockPool, "free_blocks", make)]


def _refusal_takes_blocks(f: Family) -> list[Patch]:
    def make(get_new):
        def get_new_blocks(self, num_blocks):
            if type(num_blocks) is int and num_blocks > self.get_num_free_blocks() > 0:
                get_new(self, 1)  # taken before the refusal
            return get_new(self, num_blocks)
        return get_new_blocks
    return [wrap(f.BlockPool, "get_new_blocks", make)]


def _reset_while_in_use(f: Family) -> list[Patch]:
    def make(reset):
        def reset_prefix_cache(self):
            if reset(self):
                return True
            self.evict_blocks({b.block_id for b in self.blocks if b.block_hash is not None and not b.is_null})
            return True
        return reset_prefix_cache
    return [wrap(f.BlockPool, "reset_prefix_cache", make)]


def _reset_keeps_hashes(f: Family) -> list[Patch]:
    def make(reset):
        def reset_prefix_cache(self):
            keys = [(b, b.block_hash) for b in self.blocks if b.block_hash is not None]
            done = reset(self)
            if done:
                for block, key in keys:  # the table is empty, the blocks still carry keys
                    block.set_block_hash(key)
            return done
        return reset_prefix_cache
    return [wrap(f.BlockPool, "reset_prefix_cache", make)]


def _cache_next_group(f: Family) -> list[Patch]:
    return [wrap(f.BlockPool, "cache_full_blocks", _with("kv_cache_group_id", lambda g, _: g + 1))]


def _cache_shifted_hashes(f: Family) -> list[Patch]:
    def shifted(request, _):
        hashes = list(request.block_hashes)
        return _RequestWithHashes(request, hashes[:1] + hashes[:-1])  # block i under the hash of i - 1
    return [wrap(f.BlockPool, "cache_full_blocks", _with("request", shifted))]


def _hit_first_group_only(f: Family) -> list[Patch]:
    def make(get_cached):
        def get_cached_block(self, block_hash, kv_cache_group_ids):
            first = get_cached(self, block_hash, list(kv_cache_group_ids)[:1])
            return None if first is None else first * len(kv_cache_group_ids)
        return get_cached_block
    return [wrap(f.BlockPool, "get_cached_block", make)]


# --- managers and coordinators ------------------------------------------------------------------------------


def _hit_includes_last_token(f: Family) -> list[Patch]:
    return [wrap(c, "find_longest_cache_hit", _with("max_cache_hit_length", lambda n, _: n + 1))
            for c in _coordinators_with(f, "find_longest_cache_hit")]


def _eagle_keeps_last_block(f: Family) -> list[Patch]:
    patches = [wrap(c, "find_longest_cache_hit", _with("drop_eagle_block", lambda _, __: False))
               for c in _managers_with(f, "find_longest_cache_hit")]
    swa = f.SlidingWindowManager  # a window asks for one more block instead of dropping one
    patches.append(wrap(swa, "_contiguous_blocks_for_hit", _with("use_eagle", lambda _, __: False)))
    return patches


def _swa_skips_one_more(f: Family) -> list[Patch]:
    def make(skipped):
        def get_num_skipped_tokens(self, num_computed_tokens):
            return skipped(self, num_computed_tokens) + 1
        return get_num_skipped_tokens
    return [wrap(f.SlidingWindowManager, "get_num_skipped_tokens", make)]


def _swa_hit_run_short(f: Family) -> list[Patch]:
    def make(contiguous):
        def mutated(cls, *args, **kwargs):
            return max(1, contiguous(cls, *args, **kwargs) - 1)
        return mutated
    return [wrap(f.SlidingWindowManager, "_contiguous_blocks_for_hit", make)]


def _swa_hit_past_limit(f: Family) -> list[Patch]:
    return [wrap(f.SlidingWindowManager, "find_longest_cache_hit",
                 _with("max_length", lambda n, bound: n + bound.arguments["kv_cache_spec"].block_size))]


def _chunk_skips_a_block_more(f: Family) -> list[Patch]:
    # Chunks are whole blocks, so a token more never reaches another block: the off-by-one is a block.
    def make(skipped):
        def get_num_skipped_tokens(self, num_computed_tokens):
            n = skipped(self, num_computed_tokens)
            return n + self.block_size if n > 0 else n
        return get_num_skipped_tokens
    return [wrap(f.ChunkedLocalAttentionManager, "get_num_skipped_tokens", make)]


def _mamba_same_step_hit(f: Family) -> list[Patch]:
    def make(cache):
        def cache_blocks(self, *args, **kwargs):
            cache(self, *args, **kwargs)
            self.cached_blocks_this_step.clear()  # states cached this step look readable at once
        return cache_blocks
    return [wrap(f.MambaManager, "cache_blocks", make)]


def _mamba_frees_running_state(f: Family) -> list[Patch]:
    def make(skipped):
        def get_num_skipped_tokens(self, num_computed_tokens):
            return skipped(self, num_computed_tokens) + 1  # every token, the last one's state included
        return get_num_skipped_tokens
    return [wrap(f.MambaManager, "get_num_skipped_tokens", make)]


def _external_before_touch(f: Family) -> list[Patch]:
    def make(allocate):
        def allocate_new_computed_blocks(self, *args, **kwargs):
            bound = _bind(allocate, (self, *args), kwargs).arguments
            request_id, hits = bound["request_id"], bound["new_computed_blocks"]
            local, external = bound["num_local_computed_tokens"], bound["num_external_computed_tokens"]
            managers = self.single_type_managers
            if any(request_id in m.num_cached_block for m in managers):
                return allocate(self, *args, **kwargs)
            for manager, group_hits in zip(managers, hits, strict=True):
                manager.add_local_computed_blocks(request_id, group_hits, local, external)
                if external > 0:  # before the later groups' hits are touched
                    manager.allocate_external_computed_blocks(request_id, local, external)
        return allocate_new_computed_blocks
    return [wrap(f.KVCacheCoordinator, "allocate_new_computed_blocks", make)]


def _refusal_touches_hits(f: Family) -> list[Patch]:
    def make(allocate):
        def allocate_slots(self, *args, **kwargs):
            bound = _bind(allocate, (self, *args), kwargs)
            result = allocate(self, *args, **kwargs)
            hits = bound.arguments.get("new_computed_blocks")
            if result is None and hits is not None:
                self.block_pool.touch([b for group in hits.blocks for b in group if not b.is_null])
            return result
        return allocate_slots
    return [wrap(f.KVCacheManager, "allocate_slots", make)]


def _estimate_one_short(f: Family) -> list[Patch]:
    def make(estimate):
        def get_num_blocks_to_allocate(self, *args, **kwargs):
            n = estimate(self, *args, **kwargs)
            return n - 1 if n > 0 else n
        return get_num_blocks_to_allocate
    return [wrap(f.KVCacheCoordinator, "get_num_blocks_to_allocate", make)]


def _free_forgets_blocks(f: Family) -> list[Patch]:
    def make(free):
        def mutated(self, request_id):
            self.pop_blocks_for_free(request_id)  # the table is dropped, its blocks never return
        return mutated
    return [wrap(f.SingleTypeKVCacheManager, "free", make)]


def _free_keeps_table(f: Family) -> list[Patch]:
    def make(free):
        def mutated(self, request_id):
            blocks = list(self.req_to_blocks.get(request_id, ()))
            free(self, request_id)
            if blocks:
                self.req_to_blocks[request_id] = blocks  # freed, still listed as the request's
        return mutated
    return [wrap(f.SingleTypeKVCacheManager, "free", make)]


def _free_head_first(f: Family) -> list[Patch]:
    def make(pop):
        def pop_blocks_for_free(self, request_id):
            return list(reversed(pop(self, request_id)))  # the caller's "tail first" becomes head first
        return pop_blocks_for_free
    return [wrap(c, "pop_blocks_for_free", make) for c in _managers_with(f, "pop_blocks_for_free")]


def _evict_keeps_table(f: Family) -> list[Patch]:
    def make(evict):
        def evict_blocks(self, block_ids):
            keyed = [(self.blocks[i], self.blocks[i].block_hash) for i in block_ids
                     if 0 <= i < len(self.blocks) and self.blocks[i].block_hash is not None]
            evict(self, block_ids)
            for block, key in keyed:  # the block forgot its key, the table did not
                self.cached_block_hash_to_block.insert(key, block)
        return evict_blocks
    return [wrap(f.BlockPool, "evict_blocks", make)]


def _stored_events_bent(bend: Callable[[Any], None]) -> Callable[[Family], list[Patch]]:
    """A pool whose ``BlockStored`` events ``bend`` changes before anyone reads them."""
    def patches(f: Family) -> list[Patch]:
        def make(take):
            def take_events(self):
                events = take(self)
                for event in events:
                    if type(event).__name__ == "BlockStored":
                        bend(event)
                return events
            return take_events
        return [wrap(f.BlockPool, "take_events", make)]
    return patches


def _cut_parent(event: Any) -> None:
    event.parent_block_hash = None


def _shift_tokens(event: Any) -> None:
    event.token_ids = [*list(event.token_ids)[1:], 0]


def _released_late(f: Family) -> list[Patch]:
    def make(skipped):
        def get_num_skipped_tokens(self, num_computed_tokens):
            return max(0, skipped(self, num_computed_tokens) - self.block_size)
        return get_num_skipped_tokens
    return [wrap(c, "get_num_skipped_tokens", make) for c in _managers_with(f, "get_num_skipped_tokens")]


def _common_prefix_one_more(f: Family) -> list[Patch]:
    def make(count):
        def get_num_common_prefix_blocks(self, running_request_id):
            n = count(self, running_request_id)
            return n + 1 if n > 0 else n
        return get_num_common_prefix_blocks
    return [wrap(c, "get_num_common_prefix_blocks", make) for c in _managers_with(f, "get_num_common_prefix_blocks")
            if c.__name__ == "FullAttentionManager"]


def _usage_counts_null(f: Family) -> list[Patch]:
    def make(usage):
        def get_usage(self):
            return usage(self) * (self.num_gpu_blocks - 1) / self.num_gpu_blocks  # over every block, null included
        return get_usage
    return [wrap(f.BlockPool, "get_usage", make)]


def _stats_fold_preempted(f: Family) -> list[Patch]:
    def make(stats_of):
        def make_prefix_cache_stats(self):
            stats = stats_of(self)
            if stats is not None:  # a recomputing request's lookup counted as a new request's
                for name in ("requests", "queries", "hits"):
                    setattr(stats, name, getattr(stats, name) + getattr(stats, "preempted_" + name))
                    setattr(stats, "preempted_" + name, 0)
            return stats
        return make_prefix_cache_stats
    return [wrap(f.KVCacheManager, "make_prefix_cache_stats", make)]


class _Muted:
    """A metrics collector with one call muted; the rest reach the real one."""

    def __init__(self, collector: Any, muted: str):
        self._collector, self._muted = collector, muted

    def __getattr__(self, name: str) -> Any:
        return (lambda *_: None) if name == self._muted else getattr(self._collector, name)


def _metrics_miss_reuse(f: Family) -> list[Patch]:
    def make(get_new):
        def get_new_blocks(self, num_blocks):
            collector = self.metrics_collector
            if collector is None:
                return get_new(self, num_blocks)
            self.metrics_collector = _Muted(collector, "on_block_evicted")  # a reused block's old record stays
            try:
                return get_new(self, num_blocks)
            finally:
                self.metrics_collector = collector
        return get_new_blocks
    return [wrap(f.BlockPool, "get_new_blocks", make)]


def _partial_entry_outlives_block(f: Family) -> list[Patch]:
    def make(get_new):
        def get_new_blocks(self, num_blocks):
            owned = self.cached_block_hashes_by_block
            self.cached_block_hashes_by_block = {}  # eviction finds no partial entries to drop
            try:
                return get_new(self, num_blocks)
            finally:
                owned.update(self.cached_block_hashes_by_block)
                self.cached_block_hashes_by_block = owned
        return get_new_blocks
    return [wrap(f.BlockPool, "get_new_blocks", make)]


def _lookahead_ignored(f: Family) -> list[Patch]:
    return [wrap(f.KVCacheManager, "allocate_slots", _with("num_lookahead_tokens", lambda _, __: 0))]


def _new_block_twice(f: Family) -> list[Patch]:
    def make(get_new):
        def get_new_blocks(self, num_blocks):
            blocks = get_new(self, num_blocks)
            if len(blocks) >= 2:
                blocks[-1] = blocks[0]  # handed out twice; the real last block is taken and never used
            return blocks
        return get_new_blocks
    return [wrap(f.BlockPool, "get_new_blocks", make)]


def _skipped_blocks_kept_null(f: Family) -> list[Patch]:
    def make(remove):
        def remove_skipped_blocks(self, request_id, *args, **kwargs):
            blocks = self.req_to_blocks.get(request_id, [])
            before = list(blocks)
            remove(self, request_id, *args, **kwargs)
            freed = [i for i, (old, new) in enumerate(zip(before, blocks, strict=False)) if old is not new]
            if freed:  # the block is freed, but the table slot keeps pointing at it
                blocks[freed[-1]] = before[freed[-1]]
        return remove_skipped_blocks
    return [wrap(c, "remove_skipped_blocks", make) for c in _managers_with(f, "remove_skipped_blocks")]


# --- hashing (vLLM's own; impl's requests carry kvspec's hashes, the spec's) ----------------------------------


def _hash_drops_salt(f: Family) -> list[Patch]:
    def make(extra_keys):
        def generate_block_hash_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx):
            keys, mm_idx = extra_keys(request, start_token_idx, end_token_idx, start_mm_idx)
            salt = getattr(request, "cache_salt", None)
            if keys and salt is not None and start_token_idx == 0:
                keys = tuple(k for k in keys if k != salt) or None
            return keys, mm_idx
        return generate_block_hash_extra_keys
    return [wrap(f.module("kv_cache_utils"), "generate_block_hash_extra_keys", make)]


def _hash_drops_lora(f: Family) -> list[Patch]:
    def make(lora_keys):
        def mutated(request):
            return []
        return mutated
    return [wrap(f.module("kv_cache_utils"), "_gen_lora_extra_hash_keys", make)]


def _mm_key_where_it_starts(f: Family) -> list[Patch]:
    def make(mm_keys):
        def mutated(request, start_token_idx, end_token_idx, start_mm_idx):
            keys, next_idx = mm_keys(request, start_token_idx, end_token_idx, start_mm_idx)
            return [k for k in keys if k[1] >= 0], next_idx  # an item that began in an earlier block: not keyed
        return mutated
    return [wrap(f.module("kv_cache_utils"), "_gen_mm_extra_hash_keys", make)]


def _rollback_one_block_short(f: Family) -> list[Patch]:
    def make(update):
        def mutated(self, requests, invalid_block_ids, num_scheduled_tokens, evict_blocks=True):
            before = {r.request_id: r.num_computed_tokens - num_scheduled_tokens.get(r.request_id, 0)
                      for r in requests}
            result = update(self, requests, invalid_block_ids, num_scheduled_tokens, evict_blocks)
            for request in requests:  # a request rolled back to its first failed block keeps that block
                if request.num_computed_tokens < before[request.request_id]:
                    request.num_computed_tokens = min(request.num_computed_tokens + self.block_size,
                                                      before[request.request_id])
            return result
        return mutated
    return [wrap(f.Scheduler, "_update_requests_with_invalid_blocks", make)]


def _zeroing_misses_a_block(f: Family) -> list[Patch]:
    def make(take):
        def take_new_block_ids(self):
            return take(self)[:-1]  # the last fresh block of each group is never zeroed
        return take_new_block_ids
    return [wrap(f.SingleTypeKVCacheManager, "take_new_block_ids", make)]


def _connector_saves_one_more(f: Family) -> list[Patch]:
    def make(get_ids):
        def get_block_ids_for_computed_tokens(self, request_id, num_computed_tokens):
            return get_ids(self, request_id, num_computed_tokens + 1)
        return get_block_ids_for_computed_tokens
    return [wrap(f.KVCacheManager, "get_block_ids_for_computed_tokens", make)]


VLLM_ONLY = ("vllm",)
L2_POLICY = "free order is a policy rule (L2): any order is safe"
IMPL_RECHECKS = ("impl: allocate_slots re-checks the exact count before it takes a block (blocks_beyond_estimate), "
                 "so the short estimate never reaches the pool; it refuses where the spec accepts, which only "
                 "lockstep (L3) compares.  vLLM takes the blocks on the estimate's word and fails half-way")

MUTANTS: tuple[Mutant, ...] = (
    Mutant("free-skips-last", "ref-count leak",
           "free_blocks drops the last block of every multi-block free: it keeps a reference forever",
           _free_skips_last),
    Mutant("double-free-shared", "double free",
           "freeing a shared block drops two references: it returns to the queue while its other holder reads it",
           _double_free_shared),
    Mutant("null-block-queued", "null block in the queue",
           "freeing a table that holds the null block puts the null block into the free queue",
           _null_block_queued),
    Mutant("reuse-keeps-hash", "stale hash on reuse",
           "a cached block taken for reuse keeps its key: the next hit serves its new owner's KV",
           _reuse_keeps_hash),
    Mutant("touch-keeps-queued", "eviction of a block in use",
           "a hit takes a reference but leaves the block in the free queue, where allocation can take it",
           _touch_keeps_queued),
    Mutant("touch-skips-held", "ref-count leak",
           "a hit on a block someone already holds takes no reference: the first free releases it",
           _touch_skips_held),
    Mutant("cached-freed-to-head", "wrong free order",
           "freed cached blocks go to the head of the queue: they are evicted before unhashed ones",
           _cached_freed_to_head, l1=L2_POLICY),
    Mutant("refusal-takes-blocks", "refused allocation that changes state",
           "an allocation too large for the pool takes a block before it refuses",
           _refusal_takes_blocks),
    Mutant("reset-while-in-use", "reset while blocks are in use",
           "resetting the prefix cache succeeds (evicting every key) while requests still hold blocks",
           _reset_while_in_use),
    Mutant("reset-keeps-hashes", "reset leaving hashes",
           "a reset empties the table but leaves every block's key on the block",
           _reset_keeps_hashes),
    Mutant("cache-next-group", "hash chain without its group",
           "full blocks are cached under the next group's id: another group's lookup finds them",
           _cache_next_group),
    Mutant("cache-shifted-hashes", "stale hash (chain off by one)",
           "block i is cached under the hash of block i - 1: a hit serves the wrong tokens",
           _cache_shifted_hashes),
    Mutant("hit-first-group-only", "hybrid lookup across groups",
           "a lookup for several groups returns the first group's block for all of them",
           _hit_first_group_only),
    Mutant("hit-includes-last-token", "hit soundness",
           "the hit may cover the whole request: no token is left to compute the logits from",
           _hit_includes_last_token),
    Mutant("eagle-keeps-last-block", "EAGLE drop missing",
           "with EAGLE the last hit block is not dropped: the drafter lacks the hidden states it needs",
           _eagle_keeps_last_block),
    Mutant("swa-skips-one-more", "window arithmetic off by one",
           "a sliding window releases one token more than it may: a block still in the window is freed",
           _swa_skips_one_more),
    Mutant("swa-hit-run-short", "window arithmetic off by one",
           "a sliding-window hit needs one contiguous block fewer than the window reads",
           _swa_hit_run_short),
    Mutant("swa-hit-past-limit", "hybrid fixed point",
           "the sliding-window lookup searches one block past the length the groups agreed on",
           _swa_hit_past_limit),
    Mutant("chunk-skips-a-block-more", "window arithmetic off by one",
           "chunked local attention releases the current chunk's first block with the previous chunks",
           _chunk_skips_a_block_more),
    Mutant("mamba-same-step-hit", "Mamba same-step hit",
           "a Mamba state cached this step can be hit in the same step, before the forward pass writes it",
           _mamba_same_step_hit),
    Mutant("mamba-frees-running-state", "window arithmetic off by one",
           "a Mamba group releases the block of its last computed token: the running state is lost",
           _mamba_frees_running_state),
    Mutant("external-before-touch", "connector block accounting (vLLM #33775)",
           "each group takes its connector blocks before the later groups' hits are touched: it may evict them",
           _external_before_touch),
    Mutant("refusal-touches-hits", "refused allocation that changes state",
           "an allocation refused for lack of blocks has already taken its hits",
           _refusal_touches_hits),
    Mutant("estimate-one-short", "allocation accounting",
           "the coordinator estimates one block fewer than the allocation takes",
           _estimate_one_short, l1=IMPL_RECHECKS),
    Mutant("free-forgets-blocks", "ref-count leak",
           "freeing a request forgets its table without returning its blocks",
           _free_forgets_blocks),
    Mutant("free-keeps-table", "freed block still in use",
           "freeing a request returns its blocks but keeps them in its table",
           _free_keeps_table),
    Mutant("free-head-first", "wrong free order",
           "a request's blocks are freed head first: its prefix is evicted before its tail",
           _free_head_first, l1=L2_POLICY),
    Mutant("evict-keeps-table", "stale hash in the table",
           "evicting a block by id clears the block's key but leaves the table entry that names it",
           _evict_keeps_table),
    Mutant("lookahead-ignored", "EAGLE lookahead dropped",
           "allocate_slots ignores the lookahead tokens: draft tokens get no slots",
           _lookahead_ignored),
    Mutant("new-block-twice", "aliasing",
           "an allocation of several blocks hands its first block out twice (and leaks the last)",
           _new_block_twice),
    Mutant("skipped-block-still-listed", "freed block still in use",
           "dropping out-of-window blocks frees the last one but leaves it in the table",
           _skipped_blocks_kept_null),
    Mutant("window-released-late", "late release (a leak)",
           "blocks leave the window one block late: a sliding window, chunk or Mamba state is held a block longer "
           "than any query reads it",
           _released_late),
    Mutant("common-prefix-one-more", "cascade prefix over-count",
           "full attention's common prefix counts one block past what every request shares: cascade attention "
           "reads one request's K/V as the whole batch's prefix",
           _common_prefix_one_more),
    Mutant("usage-counts-null", "usage off the ledger",
           "the usage is computed over every block, the null block included: the pool never reads as full",
           _usage_counts_null),
    Mutant("stats-fold-preempted", "prefix-cache stats off the lookups",
           "the prefix-cache stats count a preempted request's lookup as a new request's: the hit rate the "
           "metrics report mixes recomputation into first-time traffic",
           _stats_fold_preempted),
    Mutant("metrics-miss-reuse", "metrics collector off the blocks",
           "the metrics collector is not told that a reused block's previous residency ended: its first record "
           "stays, and the lifetimes and reuse gaps it reports span many owners (the leak vLLM's pool guards "
           "against)",
           _metrics_miss_reuse),
    Mutant("partial-entry-outlives-block", "partial entry outlives its block",
           "a reused block loses its own key but keeps its partial entries: the prefix they name is served from a "
           "block that now holds another request's KV",
           _partial_entry_outlives_block),
    Mutant("event-parent-cut", "wrong KV-event contents",
           "BlockStored events name no parent: a router roots every continuation at the top of its prefix tree",
           _stored_events_bent(_cut_parent)),
    Mutant("event-tokens-shifted", "wrong KV-event contents",
           "BlockStored events carry their tokens shifted by one: a router indexes prefixes nobody computed",
           _stored_events_bent(_shift_tokens)),
    Mutant("hash-drops-salt", "hash chain missing an extra key",
           "vLLM's block hasher leaves out the cache salt: tenants share prefixes",
           _hash_drops_salt, families=VLLM_ONLY),
    Mutant("mm-key-where-it-starts", "hash chain missing an extra key",
           "vLLM's block hasher keys an image only in the block where it starts: the blocks an image straddles "
           "into are shared with any prompt of the same placeholders",
           _mm_key_where_it_starts, families=VLLM_ONLY),
    Mutant("hash-drops-lora", "hash chain missing an extra key",
           "vLLM's block hasher leaves out the LoRA adapter: adapters share prefixes",
           _hash_drops_lora, families=VLLM_ONLY),
    Mutant("zeroing-misses-a-block", "stale KV not zeroed",
           "take_new_block_ids leaves out each group's last fresh block: the worker never zeroes it, and the step "
           "reads its previous owner's KV in the slots it has not written yet",
           _zeroing_misses_a_block),
    Mutant("connector-saves-one-more", "connector saves unwritten slots",
           "the blocks a KV connector saves for a finished request cover one token more than it computed: at a "
           "block boundary it ships a block the request never wrote (only where the table reaches past the "
           "computed tokens: drafts' lookahead slots)",
           _connector_saves_one_more),
    Mutant("rollback-one-block-short", "failed load counted as computed",
           "vLLM's scheduler rolls a request whose connector load failed back to one block past its first failed "
           "block: the next step reads a block the load never filled (scheduler scope only)",
           _rollback_one_block_short, families=VLLM_ONLY),
)
"""The catalogue, in the order ``kvspec mutate`` runs it."""

MUTANTS_BY_NAME = {m.name: m for m in MUTANTS}


def for_family(family: str) -> list[Mutant]:
    """The mutants that apply to ``family``."""
    return [m for m in MUTANTS if family in m.families]
