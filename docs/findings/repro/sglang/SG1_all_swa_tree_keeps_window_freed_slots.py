"""SG1, standalone: on a model whose every layer is sliding-window attention
and which is not "prefill-aware", SGLang's radix cache keeps, when a request
finishes, KV slots the window had already given back to the allocator.  The
slots are then free and cached at once: the next request is handed them for
its own KV, and a request matching the first one's prefix is served them --
another request's KV, no error.  Evicting the node frees them a second time.

Against SGLang alone (no kvspec import), on CPU:

    tools/install_engine.sh sglang .venv-sglang   # sglang==0.5.23 --no-deps + import-time deps, CPU torch
    .venv-sglang/bin/python docs/findings/repro/sglang/SG1_all_swa_tree_keeps_window_freed_slots.py

What runs is SGLang's own code for an all-SWA model (``registry.
default_radix_cache_factory``: ``is_pure_swa``): ``SWAKVPool`` with no full
layers, ``PureSWATokenToKVPoolAllocator``, ``PureSWARadixCache``, a real
``Req``; admission as the scheduler does it (``init_next_round_input`` →
``match_prefix``, ``lock``, ``alloc_req_slots``, ``alloc_token_slots``),
decode steps with the window's part of ``ScheduleBatch.maybe_evict_swa``
(``evict_sliding_windows(req, req.seqlen - 1)`` once
``SGLANG_SWA_EVICTION_INTERVAL`` tokens slid out -- set to 1 here so that a
short run shows it; at the default 128 the same happens 128 tokens later),
and ``common.release_kv_cache(checkpoint=True)`` at the end.

Why: ``free_swa_out_of_window_slots`` frees ``[swa_dead_lo, seqlen - window)``
of the request's row, where ``swa_dead_lo = max(cache_protected_len,
swa_evict_floor)``; ``RadixCache.checkpoint`` cuts the key it inserts at
``swa_evict_floor`` -- "Pure-SWA trees never cache what the window already
evicted" -- but only when the floor is positive, and the scheduler sets it
(to the prompt's length) only when ``model_runner.prefill_aware_swa``: a
model defining ``is_prefill_aware_swa()`` (in 0.5.23, UnlimitedOCR alone).
Any other all-SWA model (``BeamForCausalLM`` with every layer sliding, whose
config comment says "the SWA pool also serves all-sliding schedules", or a
config opting in with ``is_hybrid_swa`` and no full layers) has floor 0, and
the whole sequence -- freed slots included -- goes into the tree.

Expected: no slot is both free and in the tree.  Exit status 1 and a "BUG"
line per symptom; 0 when none shows.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from array import array

os.environ.setdefault("SGLANG_SWA_EVICTION_INTERVAL", "1")
WINDOW = 8
SLOTS = 40


class _Absent(types.ModuleType):
    """torchvision: SGLang's multimodal configs import it, PyPI has only CUDA
    builds of it, and none of it runs here.  Not SGLang's code."""

    __path__: list = []

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Absent(f"{self.__name__}.{attr}")


class _AbsentFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] != "torchvision" or sys._getframe(2).f_code.co_name != "_find_and_load_unlocked":
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return _Absent(spec.name)

    def exec_module(self, module):
        pass


if importlib.util.find_spec("torchvision") is None:
    sys.meta_path.insert(0, _AbsentFinder())

import torch  # noqa: E402
from sglang.srt.environ import envs  # noqa: E402
from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req  # noqa: E402
from sglang.srt.mem_cache.allocation import alloc_req_slots, alloc_token_slots  # noqa: E402
from sglang.srt.mem_cache.allocator.swa import PureSWATokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.common import release_kv_cache  # noqa: E402
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.pure_swa_radix_cache import PureSWARadixCache  # noqa: E402
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components import ComponentType  # noqa: E402
from sglang.srt.runtime_context import SpawnRanks, publish, reset_context  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

reset_context()  # SGLang's process-wide config, as its own tests publish it
publish(ServerArgs(model_path="dummy", device="cpu"), role="test", ranks=SpawnRanks(world_rank=0, dp_rank=None))

pool = ReqToTokenPool(size=8, max_context_len=256, device="cpu", enable_memory_saver=False)
kv = SWAKVPool(size=0, size_swa=SLOTS, page_size=1, dtype=torch.float16, head_num=1, head_dim=1,
               swa_attention_layer_ids=[0], full_attention_layer_ids=[], device="cpu")
allocator = PureSWATokenToKVPoolAllocator(size_swa=SLOTS, page_size=1, dtype=torch.float16, device="cpu",
                                          kvcache=kv, need_sort=False)
tree = PureSWARadixCache(CacheInitParams(disable=False, req_to_token_pool=pool,
                                         token_to_kv_pool_allocator=allocator, page_size=1,
                                         sliding_window_size=WINDOW))


def admit(rid, tokens):
    req = Req(rid, "", array("q", tokens), SamplingParams(max_new_tokens=1 << 20))
    req.init_next_round_input(tree)
    hit = req.prefix_len
    req.lock = tree.lock(req.last_node)
    prefix = tree.prefix_device_indices(req)
    req.extend_end = len(tokens)
    [row] = alloc_req_slots(pool, [req], tree)
    pool.write((row, slice(0, hit)), prefix)
    pool.write((row, slice(hit, len(tokens))), alloc_token_slots(tree, len(tokens) - hit))
    req.kv.kv_allocated_len = req.kv.kv_committed_len = len(tokens)
    return req, hit  # not prefill-aware: req.kv.swa_evict_floor stays 0, as the scheduler leaves it


def decode(req, token):
    req.output_ids.append(token)
    pre_len = req.seqlen - 1
    interval = envs.SGLANG_SWA_EVICTION_INTERVAL.get()
    if req.decode_batch_idx >= 1 and pre_len - WINDOW >= req.kv.get_evicted_seqlen(ComponentType.SWA) + interval:
        tree.evict_sliding_windows(req, pre_len)  # ScheduleBatch.maybe_evict_swa -> _evict_swa
    out = alloc_token_slots(tree, 1)
    pool.write((req.kv.req_pool_idx, slice(pre_len, pre_len + 1)), out)
    req.kv.kv_allocated_len = req.kv.kv_committed_len = pre_len + 1
    req.decode_batch_idx += 1


def finish(req):
    req.finished_reason = FINISH_LENGTH(length=len(req.output_ids))
    req.finished_len = len(req.output_ids)
    release_kv_cache(req, tree, checkpoint=True)


def tree_slots():
    slots, stack = set(), [tree.root_node]
    while stack:
        node = stack.pop()
        stack += node.children.values()
        if node is not tree.root_node:
            slots |= set(node.value.tolist())
    return slots


def free_slots():
    inner = allocator.swa_attn_allocator
    return set(inner.free_pages.tolist()) | set(inner.release_pages.tolist())


def main():
    bugs = 0
    prompt_a = list(range(100, 116))  # 16 tokens
    a, _ = admit("A", prompt_a)
    for t in range(200, 220):  # 20 decode steps: the window frees A's oldest slots as it slides
        decode(a, t)
    freed = sorted(set(pool.req_to_token[a.kv.req_pool_idx, :a.kv.kv_committed_len].tolist()) & free_slots())
    print(f"A ran {a.kv.kv_committed_len} tokens; the window gave back {len(freed)} of its slots: {freed}")
    sequence = prompt_a + list(range(200, 219))  # what A's KV covers (the last sampled token has none)
    finish(a)

    both = sorted(tree_slots() & free_slots())
    print(f"after A finished: the tree caches {len(tree_slots())} slots, the allocator has {len(free_slots())} free")
    if both:
        bugs += 1
        print(f"BUG: slots {both} are in the radix tree and free at once")

    b, _ = admit("B", list(range(500, 512)))  # an unrelated request takes free slots for its own KV
    row_b = set(pool.req_to_token[b.kv.req_pool_idx, :12].tolist())
    c, hit = admit("C", sequence[:12] + [999])  # A's prefix again
    row_c = pool.req_to_token[c.kv.req_pool_idx, :hit].tolist()
    window = row_c[max(0, hit - WINDOW + 1):hit]  # what C's next token reads of the hit (its own KV aside)
    shared = sorted(row_b & set(window))
    print(f"B holds {sorted(row_b)}; C matches {hit} tokens of A's prefix on {row_c}; "
          f"its first computed token's window reads slots {window}")
    if shared:
        bugs += 1
        print(f"BUG: C's window reads slots {shared} as A's KV; B holds them for its own, different tokens")

    finish(b)
    finish(c)
    try:
        tree.evict(EvictParams(num_tokens=SLOTS))
    except AssertionError:  # PureSWATokenToKVPoolAllocator.free: available_size() <= size
        bugs += 1
        print("BUG: evicting the tree frees A's window-freed slots a second time: SGLang's allocator asserts "
              "that it holds more free slots than it has")
    if not bugs:
        print("ok: no slot was both free and cached")
    return 1 if bugs else 0


if __name__ == "__main__":
    sys.exit(main())
