#!/usr/bin/env python
"""kvspec's ``KVCacheManager`` against vLLM's at the scheduler level, side by
side in one process: the installed vLLM (0.25.1), or ``--release X``, a
release the drop-in knows, with kvspec's manager as the drop-in puts it there
(impl with that release's API and deltas).

Usage (vLLM installed: tools/install_vllm.sh's environment)::

    PYTHONHASHSEED=0 .venv-vllm/bin/python benchmarks/manager_bench.py [--quick] [--json OUT] [--release X]

Workloads (each a serving loop the way vLLM's scheduler drives the manager,
block size 16, caching on, events off):

``serve full``
    96 requests running; prompts of 1-3k tokens, most behind a shared
    1,024-token system prompt; every step each running request decodes one
    token (``allocate_slots(request, 1)``, the token appended, its block
    hash computed when a block fills); a request that has generated its
    64-192 tokens finishes (``free``) and a new one is admitted
    (``get_computed_blocks``, then ``allocate_slots`` for its prompt).
``serve full+swa``
    The same with a second group, a 128-token sliding window.
``serve full+mamba``
    The same with a Mamba group (prefix caching mode "all"; "align" from
    0.33, which removed "all").
``serve eagle``
    Full attention with EAGLE: each decode step carries 2 draft tokens and
    2 lookahead slots; 0-2 drafts are accepted.  From 0.33 as its engine
    runs EAGLE: block hashes cover the drafter's lookahead token
    (``num_hash_lookahead_tokens=1``) and no hit drops a block.
``hash 32k``
    The block hashes of a 32,768-token prompt (2,048 blocks), from scratch.
``request 32k``
    vLLM's ``Request`` for that prompt built with each side's block hasher,
    as the engine builds one: the request object and its copy of the prompt
    timed too (the same on both sides).
``own request 32k``
    Each side's own request for that prompt with its own hasher: kvspec's
    ``kvspec.request.Request`` (which checks every token id's type) against
    vLLM's ``Request``, as a program using kvspec without vLLM builds one.

Both managers see the same ``vllm.v1.request.Request`` objects' twins (one
copy each, hashed by each side's own hasher), the same decisions and the
same steps; the workload is checked to stay in lockstep (the same hits, the
same number of free blocks).  What is timed is the block manager's share of
each step: the time inside the manager's methods (``get_computed_blocks``,
``allocate_slots``, ``free``, ``new_step_starts``) and the block hasher, not
the requests' own bookkeeping nor the loop (``whole_loop_ratio`` reports
the loop's wall time as well).  Each timed call pays for its two clock
reads; that cost (``timer_overhead``: an empty region timed the same way,
the least of several runs) is subtracted from both sides -- left in, it
would add the same ~0.1 us to calls that take well under a microsecond on
kvspec's side.  Steps are timed in chunks, kvspec's and
vLLM's chunks interleaved with the order alternating; the ratio is the
median over chunks of vLLM's time over kvspec's.  Garbage collection is off
while timing.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from kvspec.spec.releases import version_key

SYSTEM_PROMPT = 1024
BLOCK = 16


clock = time.perf_counter


def timer_overhead(runs: int = 7, regions: int = 100_000) -> float:
    """Seconds one timed region adds by itself: an empty region timed the
    way ``Side`` times the manager's calls, the least of several runs (so
    subtracting it never flatters either side)."""
    probe = Side.__new__(Side)
    probe.spent = 0.0
    best = float("inf")
    for _ in range(runs):
        spent = probe.spent
        for _ in range(regions):
            start = clock()
            probe.spent += clock() - start
        best = min(best, (probe.spent - spent) / regions)
    return best


class Side:
    """One manager under a miniature scheduler.  ``spent`` adds up the time
    inside the manager's methods and the block hasher -- the block manager's
    share of a scheduler step (both sides pay the same timer overhead)."""

    def __init__(self, name: str, manager: Any, hasher: Callable, use_eagle: bool):
        self.name, self.manager, self.use_eagle = name, manager, use_eagle
        self.running: dict[str, Any] = {}
        self.waiting: dict[str, Any] = {}  # refused admissions, retried next step (as a scheduler would)
        self.hits = 0
        self.spent = 0.0
        self.regions = 0  # timed regions, each costing timer_overhead() by itself

        def timed_hasher(request: Any) -> list:
            start = clock()
            hashes = hasher(request)
            self.spent += clock() - start
            self.regions += 1
            return hashes

        self.hasher = timed_hasher

    def new_step(self) -> None:
        start = clock()
        self.manager.new_step_starts()
        self.spent += clock() - start
        self.regions += 1
        for request_id, request in list(self.waiting.items()):
            del self.waiting[request_id]
            self._admit(request)

    def admit(self, request_id: str, prompt: list[int]) -> None:
        from vllm import SamplingParams
        from vllm.v1.request import Request

        self._admit(Request(request_id, prompt, SamplingParams(max_tokens=1 << 20), None, block_hasher=self.hasher))

    def _admit(self, request: Any) -> None:
        start = clock()
        computed = self.manager.get_computed_blocks(request)  # from 0.26 a third value: the shared-prefix boundary
        blocks, hit = computed[0], computed[1]
        new = self.manager.allocate_slots(request, request.num_tokens - hit, hit, blocks,
                                          num_lookahead_tokens=2 if self.use_eagle else 0)
        self.spent += clock() - start
        self.regions += 1
        if new is None:  # e.g. a Mamba state cached this step: not readable until the next
            self.waiting[request.request_id] = request
            return
        self.hits += hit
        prompt = request.all_token_ids
        request.num_computed_tokens = request.num_tokens
        request.append_output_token_ids(prompt[-1] ^ 1)
        self.running[request.request_id] = request

    def decode(self, request_id: str, token: int, drafts: list[int], accepted: int) -> None:
        request = self.running.get(request_id)
        if request is None:  # still waiting
            return
        request.spec_token_ids = drafts
        num_new = 1 + len(drafts)
        start = clock()
        new = self.manager.allocate_slots(request, num_new, num_lookahead_tokens=2 if self.use_eagle else 0)
        self.spent += clock() - start
        self.regions += 1
        if new is None:
            raise RuntimeError(f"{self.name}: the pool is too small for the benchmark")
        request.num_computed_tokens += 1 + accepted
        request.spec_token_ids = []
        request.append_output_token_ids([*drafts[:accepted], token])

    def finish(self, request_id: str) -> None:
        request = self.waiting.pop(request_id) if request_id in self.waiting else self.running.pop(request_id)
        start = clock()
        self.manager.free(request)
        self.spent += clock() - start
        self.regions += 1


class Workload:
    """A reproducible schedule: which request arrives, decodes, finishes."""

    def __init__(self, seed: int, running: int, eagle: bool):
        self.rng = random.Random(seed)
        self.system = [self.rng.randrange(32000) for _ in range(SYSTEM_PROMPT)]
        self.running, self.eagle = running, eagle
        self.next_id = 0
        self.left: dict[str, int] = {}

    def prompt(self) -> list[int]:
        head = self.system if self.rng.random() < 0.8 else []
        return head + [self.rng.randrange(32000) for _ in range(self.rng.randint(1000 - len(head) // 2, 2000))]

    def step(self) -> list[tuple]:
        """The events of one step, in order."""
        events: list[tuple] = []
        for rid in list(self.left):
            if self.left[rid] == 0:
                events.append(("finish", rid))
                del self.left[rid]
        while len(self.left) < self.running:
            self.next_id += 1
            rid = f"r{self.next_id}"
            self.left[rid] = self.rng.randint(64, 192)
            events.append(("admit", rid, self.prompt()))
        for rid in self.left:
            drafts = [self.rng.randrange(32000) for _ in range(2)] if self.eagle else []
            accepted = self.rng.randint(0, 2) if self.eagle else 0
            events.append(("decode", rid, self.rng.randrange(32000), drafts, accepted))
            self.left[rid] = max(0, self.left[rid] - 1 - accepted)
        return events


def apply(side: Side, events: list[tuple]) -> None:
    """One step: the step starts, then its events."""
    side.new_step()
    for event in events:
        if event[0] == "decode":
            side.decode(*event[1:])
        elif event[0] == "admit":
            side.admit(*event[1:])
        else:
            side.finish(event[1])


def make_sides(groups: str, num_blocks: int, release: str) -> tuple[Side, Side]:
    """vLLM's manager and kvspec's, the latter as the drop-in puts it into
    ``release`` (impl with that release's API and deltas)."""
    import torch
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1 import kv_cache_interface as v
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmManager

    from kvspec import hashing
    from kvspec.dropin_releases import API
    from kvspec.impl import KVCacheManager

    KVCacheManager = API[release].get("vllm.v1.core.kv_cache_manager", {}).get("KVCacheManager", KVCacheManager)
    kv_cache_utils.init_none_hash(sha256_cbor)
    hashing.init_none_hash()
    attention = dict(block_size=BLOCK, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
    specs = [v.FullAttentionSpec(**attention)]
    if groups == "full+swa":
        specs.append(v.SlidingWindowSpec(sliding_window=128, **attention))
    elif groups == "full+mamba":  # Mamba's "all" mode is gone from 0.33: "align" there
        mode = "align" if version_key(release) >= (0, 33) else "all"
        specs.append(v.MambaSpec(block_size=BLOCK, shapes=((4,),), dtypes=(torch.float32,), mamba_cache_mode=mode))
    config = v.KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        v.KVCacheGroupSpec([f"layer.{i}"], spec) for i, spec in enumerate(specs)])
    eagle = groups == "eagle"
    args = (config, 8192, BLOCK, BLOCK)
    options: dict[str, Any] = {"use_eagle": eagle}
    lookahead: tuple[int, ...] = ()
    if eagle and version_key(release) >= (0, 33):
        # As 0.33's engine runs EAGLE: hashes cover its lookahead token, and no hit drops a block.
        options, lookahead = {"use_eagle": False, "num_hash_lookahead_tokens": 1}, (1,)
    vllm_side = Side("vLLM", VllmManager(*args, enable_caching=True, **options),
                     kv_cache_utils.get_request_block_hasher(BLOCK, sha256_cbor, *lookahead), eagle)
    ours = Side("kvspec", KVCacheManager(*args, enable_caching=True, **options),
                hashing.get_request_block_hasher(BLOCK, hashing.sha256_cbor, *lookahead), eagle)
    return ours, vllm_side


def bench_serving(groups: str, *, running: int, chunks: int, chunk_steps: int, overhead: float, release: str,
                  seed: int = 0) -> dict:
    num_blocks = running * 260 * (2 if groups != "full" else 1) + 4096
    ours, theirs = make_sides(groups, num_blocks, release)
    workload = Workload(seed, running, eagle=groups == "eagle")
    warm = workload.step()  # the first admissions
    apply(ours, warm)
    apply(theirs, warm)
    times: dict[str, list[float]] = {"kvspec": [], "vLLM": []}
    walls: dict[str, list[float]] = {"kvspec": [], "vLLM": []}
    for chunk in range(chunks):
        events = [workload.step() for _ in range(chunk_steps)]
        order = (ours, theirs) if chunk % 2 == 0 else (theirs, ours)
        for side in order:
            gc.collect()
            gc.disable()
            spent, regions, start = side.spent, side.regions, clock()
            for step in events:
                apply(side, step)
            walls[side.name].append(clock() - start)
            times[side.name].append(side.spent - spent - (side.regions - regions) * overhead)
            gc.enable()
        if ours.hits != theirs.hits or (ours.manager.block_pool.get_num_free_blocks()
                                        != theirs.manager.block_pool.get_num_free_blocks()):
            raise AssertionError(f"{groups}: the two managers left lockstep at chunk {chunk}")
    ratios = [v / k for k, v in zip(times["kvspec"], times["vLLM"], strict=True)]
    wall_ratios = [v / k for k, v in zip(walls["kvspec"], walls["vLLM"], strict=True)]
    steps = chunks * chunk_steps
    return {
        "steps": steps, "running": running, "hit_tokens": ours.hits,
        "kvspec_manager_us_per_step": 1e6 * sum(times["kvspec"]) / steps,
        "vllm_manager_us_per_step": 1e6 * sum(times["vLLM"]) / steps,
        "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
        "whole_loop_ratio_median": statistics.median(wall_ratios),
        "timer_overhead_ns": 1e9 * overhead, "timed_regions": ours.regions,
    }


def bench_hashing(*, tokens: int, repeats: int, whole_request: bool = False, own_request: bool = False) -> dict:
    """The block hashes of a prompt of ``tokens`` tokens, from scratch: the
    hasher alone on a bare request, or (``whole_request``) a vLLM ``Request``
    built with the hasher, as the engine builds one (its own bookkeeping and
    the prompt's copy timed too, the same on both sides), or
    (``own_request``) each side's own ``Request`` class with its hasher."""
    from types import SimpleNamespace

    from vllm import SamplingParams
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.request import Request

    from kvspec import hashing
    from kvspec.request import Request as KvspecRequest

    kv_cache_utils.init_none_hash(sha256_cbor)
    hashing.init_none_hash()
    rng = random.Random(1)
    prompt = [rng.randrange(32000) for _ in range(tokens)]
    hashers = {"kvspec": hashing.get_request_block_hasher(BLOCK, hashing.sha256_cbor),
               "vLLM": kv_cache_utils.get_request_block_hasher(BLOCK, sha256_cbor)}
    params = SamplingParams(max_tokens=16)

    def bare() -> Any:
        # From 0.34 vLLM's hasher reads the request's own token buffer (_all_token_ids).
        return SimpleNamespace(block_hashes=[], all_token_ids=prompt, _all_token_ids=prompt, num_tokens=tokens,
                               mm_features=[], lora_request=None, cache_salt=None, prompt_embeds=None,
                               _prompt_embeds_per_block_hashes={})

    def hashes(name: str) -> list:
        if own_request:
            built = KvspecRequest if name == "kvspec" else Request
            return built("r", prompt, params, None, block_hasher=hashers[name]).block_hashes
        if whole_request:
            return Request("r", prompt, params, None, block_hasher=hashers[name]).block_hashes
        return hashers[name](bare())

    if hashes("kvspec") != hashes("vLLM"):
        raise AssertionError("the two hashers disagree")
    times: dict[str, list[float]] = {"kvspec": [], "vLLM": []}
    for i in range(repeats):
        for name in (("kvspec", "vLLM") if i % 2 == 0 else ("vLLM", "kvspec")):
            gc.disable()
            start = time.perf_counter()
            hashes(name)
            times[name].append(time.perf_counter() - start)
            gc.enable()
    ratios = [v / k for k, v in zip(times["kvspec"], times["vLLM"], strict=True)]
    return {"tokens": tokens, "kvspec_ms": 1e3 * statistics.median(times["kvspec"]),
            "vllm_ms": 1e3 * statistics.median(times["vLLM"]), "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios), "ratio_max": max(ratios)}


def use_release(version: str) -> None:
    """Put vLLM ``version`` first on the path (installed alone under
    kvspec's cache if it is not yet), before anything imports vLLM."""
    from kvspec.conformance.vllm import upstream
    from kvspec.errors import SetupError

    if "vllm" in sys.modules:
        raise RuntimeError("use_release must run before vLLM is imported")
    try:
        sys.path[:0] = upstream.release_path(upstream.install(version))
    except SetupError as error:
        print(f"manager_bench: vLLM {version} cannot be installed: {error}", file=sys.stderr)
        raise SystemExit(2) from None


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few chunks (the smoke test)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--only", action="append", help="run only these workloads")
    parser.add_argument("--release", help="benchmark against this vLLM release, installed alone under kvspec's "
                        "cache and put first on the path (default: the installed vLLM)")
    args = parser.parse_args(argv)
    chunks, chunk_steps, running = (4, 5, 16) if args.quick else (21, 20, 96)
    results: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform(),
                               "date": time.strftime("%Y-%m-%d"), "workloads": {}}
    if args.release:
        use_release(args.release)
    try:
        import vllm

        from kvspec.dropin import DropinError, check_release

        release = check_release(vllm.__version__)
        results["vllm"] = f"vLLM {vllm.__version__}"
    except ImportError:
        print("manager_bench: vLLM is not installed here; run it from tools/install_vllm.sh's environment",
              file=sys.stderr)
        raise SystemExit(2) from None
    except DropinError as error:
        print(f"manager_bench: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    overhead = timer_overhead()
    results["timer_overhead_ns"] = 1e9 * overhead
    print(f"timer overhead {1e9 * overhead:.0f} ns per timed call (subtracted from both sides)", flush=True)
    names = ["serve full", "serve full+swa", "serve full+mamba", "serve eagle", "hash 32k", "request 32k",
             "own request 32k"]
    for name in names:
        if args.only and name not in args.only:
            continue
        if name.endswith("32k"):
            r = bench_hashing(tokens=2048 if args.quick else 32768, repeats=5 if args.quick else 21,
                              whole_request=name.startswith("request"), own_request=name.startswith("own"))
        else:
            r = bench_serving(name.split()[1], running=running, chunks=chunks, chunk_steps=chunk_steps,
                              overhead=overhead, release=release)
        results["workloads"][name] = r
        loop = f"; whole loop {r['whole_loop_ratio_median']:.2f}x" if "whole_loop_ratio_median" in r else ""
        spread = f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f}"
        print(f"{name:<18} kvspec/vLLM {r['ratio_median']:.2f}x  (chunks {spread}{loop})", flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return results


if __name__ == "__main__":
    main()
