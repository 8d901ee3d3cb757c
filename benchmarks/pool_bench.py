#!/usr/bin/env python
"""Throughput of kvspec's production ``BlockPool`` (and vLLM 0.25.1's, side by side).

Usage::

    python benchmarks/pool_bench.py [--quick] [--sizes 1000,10000,100000,1000000]
        [--compare-size 10000] [--json OUT] [--no-vllm] [--scale-kvspec-only] [--profile]

A full run takes about 2 minutes (kvspec alone) to 3.5 minutes (with vLLM) on
a 2-core machine; ``--quick`` takes seconds and is what the smoke test runs.

What is timed: iterations per second, the best of many short repeats (31 of
about 20 ms; on a shared machine the best of many short runs is far steadier
than the best of a few long ones) of ``time.perf_counter``, garbage
collection off while timing, every workload warmed up and checked (with
assertions, outside the timed loop) before and after timing.  Every pool has
caching on, events off, ``hash_block_size`` 16, and ``size + 1`` blocks:
``size`` usable blocks plus the null block, so the free queue holds ``size``
blocks at rest.  "Free" always passes ``reversed(blocks)``, as vLLM's
scheduler and ``SingleTypeKVCacheManager.free`` do (one extra row passes a
list instead).

``alloc+free``
    ``get_new_blocks(4)`` + ``free_blocks(reversed(them))`` on a pool with no
    hashes: the blocks come from and go back to the head of the queue.
``alloc+free list``
    The same with ``free_blocks(them[::-1])`` (a list, not an iterator).
``alloc(evict)+rehash+free``
    Every free block carries a hash, so every allocation evicts.  To keep that
    steady state each iteration re-hashes its 4 blocks at the lowest level the
    two pools share (``block.set_block_hash`` + ``cached_block_hash_to_block
    .insert``) before freeing them to the tail.  The queue is FIFO over
    ``size / 4`` groups of 4 blocks, group ``j`` always re-hashed with the same
    4 keys, so keys stay unique and the evicted blocks are always the head of a
    queue of ``size`` cached blocks (checked before timing and after it).
``touch+free``
    ``touch(4 cached free blocks)`` + ``free_blocks(reversed(them))``.  The
    groups are drawn pseudo-randomly, so the touched blocks sit anywhere in a
    queue of ``size`` cached blocks (their mean relative position, 0 = head,
    1 = tail, is measured and reported; about 0.5).
``get_cached_block hit`` / ``miss``
    ``get_cached_block(hash, [0])`` over a shuffled sample of (up to 65,536)
    cached hashes / hashes that are not cached.
``alloc(evict)+cache_full_blocks+free``
    ``get_new_blocks(4)``, ``cache_full_blocks(request, blocks, 0, 4, 16, 0)``
    and the free that restores the state (the blocks rejoin the tail cached, so
    in steady state the allocation evicts, as above).  The request has
    ``block_hashes``, ``all_token_ids``, ``lora_request=None``,
    ``cache_salt=None`` and ``mm_features=[]``; the same request objects and the
    same hash bytes serve both pools (a pool treats hashes as opaque bytes).

When ``import vllm.v1.core.block_pool`` works, every workload also runs on
vLLM's ``BlockPool`` in the same process (same request objects, same hash
bytes, same iteration counts), kvspec and vLLM repeats interleaved with the
order alternating so both share the machine's noise, and a table compares
them at ``--compare-size`` blocks.

Scaling: every workload again at each of ``--sizes`` (kvspec, and vLLM unless
``--scale-kvspec-only``), the sizes' repeats interleaved, with the ratio of
the largest size's rate to the smallest's and the nanoseconds per iteration
that the largest size adds.  O(n) behaviour would cost orders of magnitude
(1000x more work at 1M than at 1k); what remains is the memory hierarchy --
random accesses into a working set of 100k-1M blocks miss the CPU caches --
which the two baseline rows measure on bare CPython containers with the same
access pattern.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import gc
import hashlib
import io
import json
import os
import platform
import pstats
import random
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import cycle, islice, repeat
from typing import Any

HASH_BLOCK_SIZE = 16
BLOCKS_PER_OP = 4
GROUP_IDS = [0]
SUFFIX0 = (0).to_bytes(4, "big")
SAMPLE = 65536  # hashes cycled through by the lookup workloads

OPS = [
    "alloc+free",
    "alloc+free list",
    "alloc(evict)+rehash+free",
    "touch+free",
    "get_cached_block hit",
    "get_cached_block miss",
    "alloc(evict)+cache_full_blocks+free",
]


# --- backends ------------------------------------------------------------------


@dataclass
class Backend:
    name: str
    block_pool_cls: Any
    version: str

    def new_pool(self, size: int) -> Any:
        return self.block_pool_cls(size + 1, enable_caching=True, hash_block_size=HASH_BLOCK_SIZE,
                                   enable_kv_cache_events=False)

    def peek_head(self, pool: Any, k: int) -> list:
        """The first ``k`` free blocks, without changing anything (O(k) where
        the queue's layout is known, O(n) otherwise)."""
        q = pool.free_block_queue
        if hasattr(q, "_queue"):  # kvspec: an OrderedDict id -> block
            return list(islice(q._queue.values(), k))
        if hasattr(q, "fake_free_list_head"):  # vLLM: a linked list
            out, node, tail = [], q.fake_free_list_head.next_free_block, q.fake_free_list_tail
            while node is not None and node is not tail and len(out) < k:
                out.append(node)
                node = node.next_free_block
            return out
        return q.get_all_free_blocks()[:k]

    def free_positions(self, pool: Any) -> dict[int, int]:
        """Block id -> position in the free queue (0 = head)."""
        return {b.block_id: i for i, b in enumerate(pool.free_block_queue.get_all_free_blocks())}


def kvspec_backend() -> Backend:
    import kvspec
    from kvspec.impl import BlockPool

    return Backend("kvspec", BlockPool, kvspec.__version__)


def vllm_backend() -> tuple[Backend | None, str]:
    """vLLM's pool, or None and the reason it is not importable."""
    # The benchmark hashes nothing with vLLM's functions (the pools get the
    # same opaque bytes), but the root hash is set up as vLLM itself would.
    os.environ.setdefault("PYTHONHASHSEED", "0")
    try:
        import vllm
        from vllm.utils.hashing import sha256_cbor  # kv_cache_utils stopped re-exporting it in 0.29
        from vllm.v1.core import kv_cache_utils
        from vllm.v1.core.block_pool import BlockPool
    except Exception as error:  # noqa: BLE001 -- any failure means "not available"
        return None, f"{type(error).__name__}: {error}".splitlines()[0][:200]
    kv_cache_utils.init_none_hash(sha256_cbor)
    return Backend("vLLM", BlockPool, getattr(vllm, "__version__", "?")), ""


# --- workload inputs ---------------------------------------------------------------


class BenchRequest:
    """What ``cache_full_blocks`` reads from a request (vLLM's ``Request`` has
    these attributes; with events off vLLM reads only ``block_hashes``)."""

    __slots__ = ("request_id", "block_hashes", "all_token_ids", "lora_request", "cache_salt", "mm_features")

    def __init__(self, request_id: str, block_hashes: list[bytes], all_token_ids: list[int]):
        self.request_id = request_id
        self.block_hashes = block_hashes
        self.all_token_ids = all_token_ids
        self.lora_request = None
        self.cache_salt = None
        self.mm_features: list = []


class Hashes:
    """Deterministic 32-byte hashes, grown on demand and shared by every pool."""

    def __init__(self, tag: bytes) -> None:
        self.tag = tag
        self.values: list[bytes] = []

    def first(self, n: int) -> list[bytes]:
        values, tag, sha = self.values, self.tag, hashlib.sha256
        while len(values) < n:
            values.append(sha(tag + len(values).to_bytes(8, "big")).digest())
        return values[:n]


CACHED = Hashes(b"kvspec-bench/cached/")
MISSING = Hashes(b"kvspec-bench/missing/")
TOKENS = list(range(BLOCKS_PER_OP * HASH_BLOCK_SIZE))


# --- workloads ------------------------------------------------------------------------


@dataclass
class Workload:
    """One operation on one pool: ``run(n)`` is what is timed, ``check(k)``
    does ``k`` more iterations of the same loop with assertions, ``invariant``
    checks the state a run must leave."""

    run: Callable[[int], None]
    check: Callable[[int], None]
    invariant: Callable[[], None]
    pool: Any
    info: dict = field(default_factory=dict)


def _check_rounds(size: int, cap: int) -> int:
    return max(3, min(cap, 4_000_000 // size))


def wl_alloc_free(be: Backend, size: int, as_list: bool = False) -> Workload:
    pool = be.new_pool(size)
    get_new, free = pool.get_new_blocks, pool.free_blocks

    if as_list:
        def run(n: int) -> None:
            for _ in repeat(None, n):
                free(get_new(4)[::-1])
    else:
        def run(n: int) -> None:
            for _ in repeat(None, n):
                free(reversed(get_new(4)))

    def check(k: int) -> None:
        for _ in range(k):
            head = be.peek_head(pool, 4)
            assert all(b.block_hash is None for b in head)
            blocks = get_new(4)
            assert blocks == head and all(b.ref_cnt == 1 for b in blocks)
            free(blocks[::-1] if as_list else reversed(blocks))
            assert be.peek_head(pool, 4) == blocks[::-1]  # unhashed blocks return to the head, in free order

    def invariant() -> None:
        assert pool.get_num_free_blocks() == size
        assert len(pool.cached_block_hash_to_block) == 0

    return Workload(run, check, invariant, pool)


def _rehash_run(pool: Any, slots) -> Callable[[int], None]:
    get_new, free = pool.get_new_blocks, pool.free_blocks
    insert = pool.cached_block_hash_to_block.insert

    def run(n: int) -> None:
        for keys in islice(slots, n):
            blocks = get_new(4)
            for block, key, num_tokens in zip(blocks, keys, (16, 32, 48, 64), strict=True):
                block.set_block_hash(key, num_tokens)
                insert(key, block)
            free(reversed(blocks))

    return run


def _slot_keys(size: int) -> list[list[bytes]]:
    assert size % BLOCKS_PER_OP == 0, "pool sizes must be multiples of 4"
    hashes = CACHED.first(size)
    return [[h + SUFFIX0 for h in hashes[j : j + 4]] for j in range(0, size, 4)]


def _cached_pool(be: Backend, size: int) -> Any:
    """A pool whose ``size`` free blocks are all cached, block ``1 + i`` under
    hash ``i`` (blocks 1-4 are allocated first, 5-8 next, ...)."""
    pool = be.new_pool(size)
    slot_keys = _slot_keys(size)
    _rehash_run(pool, iter(slot_keys))(len(slot_keys))
    assert len(pool.cached_block_hash_to_block) == size
    return pool


def _check_evicting(be: Backend, pool: Any, size: int, run: Callable[[int], None], k: int) -> None:
    for _ in range(k):
        head = be.peek_head(pool, 4)
        assert len(head) == 4 and all(b.block_hash is not None for b in head), "allocation would not evict"
        before = len(pool.cached_block_hash_to_block)
        run(1)
        assert len(pool.cached_block_hash_to_block) == before == size
        assert pool.get_num_free_blocks() == size


def wl_alloc_evict(be: Backend, size: int) -> Workload:
    pool = be.new_pool(size)
    slots = cycle(_slot_keys(size))
    run = _rehash_run(pool, slots)
    run(size // 4)  # steady state: every free block cached, FIFO by group

    def invariant() -> None:
        assert pool.get_num_free_blocks() == size
        assert len(pool.cached_block_hash_to_block) == size
        assert all(b.block_hash is not None for b in be.peek_head(pool, 4))

    return Workload(run, lambda k: _check_evicting(be, pool, size, run, k), invariant, pool)


def wl_cache_full(be: Backend, size: int) -> Workload:
    pool = be.new_pool(size)
    hashes = CACHED.first(size)
    requests = [BenchRequest(f"r{j}", hashes[j : j + 4], TOKENS) for j in range(0, size, 4)]
    slots = cycle(requests)
    get_new, free, cache = pool.get_new_blocks, pool.free_blocks, pool.cache_full_blocks

    def run(n: int) -> None:
        for request in islice(slots, n):
            blocks = get_new(4)
            cache(request, blocks, 0, 4, 16, 0)
            free(reversed(blocks))

    run(size // 4)  # steady state: every free block cached, FIFO by request

    def invariant() -> None:
        assert pool.get_num_free_blocks() == size
        assert len(pool.cached_block_hash_to_block) == size

    return Workload(run, lambda k: _check_evicting(be, pool, size, run, k), invariant, pool)


def wl_touch(be: Backend, size: int) -> Workload:
    pool = _cached_pool(be, size)
    groups = [pool.blocks[i : i + 4] for i in range(1, size + 1, 4)]
    rng = random.Random(20250101 + size)
    # Long enough that most groups are drawn: an LRU position of a random group
    # is spread over the whole queue (mean ~0.5; never-drawn groups stay at the head).
    order = [groups[rng.randrange(len(groups))] for _ in range(max(SAMPLE, 2 * len(groups)))]
    slots = cycle(order)
    touch, free = pool.touch, pool.free_blocks

    def run(n: int) -> None:
        for blocks in islice(slots, n):
            touch(blocks)
            free(reversed(blocks))

    run(2 * len(groups))  # shuffle the queue away from its initial order
    positions: list[float] = []

    def check(k: int) -> None:
        for _ in range(k):
            blocks = next(slots)
            pos = be.free_positions(pool)
            assert all(b.ref_cnt == 0 and b.block_hash is not None and b.block_id in pos for b in blocks)
            positions.append(sum(pos[b.block_id] for b in blocks) / (4 * (size - 1)))
            touch(blocks)
            assert all(b.ref_cnt == 1 for b in blocks) and pool.get_num_free_blocks() == size - 4
            free(reversed(blocks))
        info["mean_relative_position"] = round(sum(positions) / len(positions), 3)

    def invariant() -> None:
        assert pool.get_num_free_blocks() == size
        assert len(pool.cached_block_hash_to_block) == size

    info: dict = {}
    return Workload(run, check, invariant, pool, info)


def wl_lookup(be: Backend, size: int, hit: bool) -> Workload:
    pool = _cached_pool(be, size)
    if hit:
        sample = list(CACHED.first(size))
        random.Random(7 + size).shuffle(sample)
        sample = sample[:SAMPLE]
    else:
        sample = MISSING.first(min(size, SAMPLE))
    slots = cycle(sample)
    get = pool.get_cached_block

    def run(n: int) -> None:
        for block_hash in islice(slots, n):
            get(block_hash, GROUP_IDS)

    def check(k: int) -> None:
        for block_hash in islice(slots, k):
            got = get(block_hash, GROUP_IDS)
            if hit:
                assert got is not None and len(got) == 1 and got[0].block_hash == block_hash + SUFFIX0
            else:
                assert got is None

    def invariant() -> None:
        assert len(pool.cached_block_hash_to_block) == size

    return Workload(run, check, invariant, pool)


BUILDERS: dict[str, Callable[[Backend, int], Workload]] = {
    "alloc+free": wl_alloc_free,
    "alloc+free list": lambda be, size: wl_alloc_free(be, size, as_list=True),
    "alloc(evict)+rehash+free": wl_alloc_evict,
    "touch+free": wl_touch,
    "get_cached_block hit": lambda be, size: wl_lookup(be, size, hit=True),
    "get_cached_block miss": lambda be, size: wl_lookup(be, size, hit=False),
    "alloc(evict)+cache_full_blocks+free": wl_cache_full,
}
assert list(BUILDERS) == OPS


# --- timing -----------------------------------------------------------------------------


def time_run(run: Callable[[int], None], n: int) -> float:
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        run(n)
        return time.perf_counter() - start
    finally:
        gc.enable()


def calibrate(run: Callable[[int], None], target_s: float, minimum: int) -> int:
    """Iterations for one repeat of about ``target_s`` (this also warms up)."""
    n = max(minimum, 200)
    while True:
        t = time_run(run, n)
        if t >= target_s / 4 or n >= 50_000_000:
            return max(minimum, int(n * target_s / max(t, 1e-9)))
        n *= 4


@dataclass
class Settings:
    target_s: float
    repeats: int
    min_iters: int
    check_cap: int


def prepare(be: Backend, op: str, size: int, cfg: Settings) -> Workload:
    w = BUILDERS[op](be, size)
    w.run(max(cfg.min_iters, 1000))  # warm-up
    w.check(_check_rounds(size, cfg.check_cap))
    w.invariant()
    return w


def finish(w: Workload, cfg: Settings) -> None:
    w.invariant()
    w.check(1)
    w.invariant()


def measure(loads: list[Workload], cfg: Settings) -> tuple[list[float], int]:
    """Iterations/s of each workload: the same iteration count for all, the
    repeats interleaved (order alternating) so they share the machine's noise."""
    # Freeze what the workloads built (up to millions of blocks) so that the
    # gc.collect() before each repeat does not walk them every time.
    gc.collect()
    gc.freeze()
    try:
        return _measure(loads, cfg)
    finally:
        gc.unfreeze()


def _measure(loads: list[Workload], cfg: Settings) -> tuple[list[float], int]:
    n = calibrate(loads[0].run, cfg.target_s, cfg.min_iters)
    for w in loads[1:]:
        time_run(w.run, n)  # the same warm-up for the others
    best = [float("inf")] * len(loads)
    for r in range(cfg.repeats):
        order = list(range(len(loads)))
        if r % 2:
            order.reverse()
        for i in order:
            best[i] = min(best[i], time_run(loads[i].run, n))
    for w in loads:
        finish(w, cfg)
    return [n / t for t in best], n


def run_grid(ops: list[str], backends: list[Backend], sizes: list[int], cfg: Settings, log) -> dict:
    """``{op: {size: {backend: ops/s, backend_info: ..., iterations: n}}}``;
    for each operation every (backend, size) workload is built first and their
    repeats interleaved."""
    results: dict[str, dict] = {}
    for op in ops:
        keys = [(be, size) for size in sizes for be in backends]
        loads = [prepare(be, op, size, cfg) for be, size in keys]
        rates, n = measure(loads, cfg)
        by_size: dict[int, dict] = {size: {"iterations": n} for size in sizes}
        for (be, size), w, rate in zip(keys, loads, rates, strict=True):
            by_size[size][be.name] = rate
            if w.info:
                by_size[size][f"{be.name}_info"] = dict(w.info)
        results[op] = by_size
        log(f"  {op:<38} " + "  ".join(f"{be.name}@{size:,} {by_size[size][be.name]:,.0f}/s" for be, size in keys))
        del loads
        gc.collect()
    return results


def compare(backends: list[Backend], size: int, cfg: Settings, log) -> dict:
    """Every operation on every backend at ``size``."""
    results = {op: by_size[size] for op, by_size in run_grid(OPS, backends, [size], cfg, log).items()}
    if len(backends) > 1:
        for row in results.values():
            row["ratio"] = row[backends[0].name] / row[backends[1].name]
    return results


# The same access patterns on bare CPython containers, as a yardstick for what
# the memory hierarchy alone does to a random access as the size grows.


def wl_base_dict(be: Backend, size: int) -> Workload:
    hashes = CACHED.first(size)
    table = {h + SUFFIX0: i for i, h in enumerate(hashes)}
    sample = list(hashes)
    random.Random(7 + size).shuffle(sample)
    keys = cycle(sample[:SAMPLE])
    get = table.get

    def run(n: int) -> None:
        for h in islice(keys, n):
            get(h + SUFFIX0)

    def check(k: int) -> None:
        for h in islice(keys, k):
            assert get(h + SUFFIX0) is not None

    return Workload(run, check, lambda: None, table)


def wl_base_odict(be: Backend, size: int) -> Workload:
    queue = OrderedDict((i, i) for i in range(1, size + 1))
    rng = random.Random(20250101 + size)
    groups = [range(1 + 4 * g, 5 + 4 * g) for g in (rng.randrange(size // 4) for _ in range(max(SAMPLE, size // 2)))]
    slots = cycle(groups)

    def run(n: int) -> None:
        for ids in islice(slots, n):
            for i in ids:
                del queue[i]
            for i in ids:
                queue[i] = i

    def check(k: int) -> None:
        run(k)
        assert len(queue) == size

    run(size // 2)
    return Workload(run, check, lambda: None, queue)


BASELINES = ["[CPython] dict.get(hash+suffix)", "[CPython] OrderedDict 4x del + 4x set"]
BUILDERS[BASELINES[0]] = wl_base_dict
BUILDERS[BASELINES[1]] = wl_base_odict
PYTHON = Backend("python", None, platform.python_version())


def scaling(backends: list[Backend], sizes: list[int], cfg: Settings, log) -> dict:
    """Every operation and every baseline at every size."""
    results = run_grid(OPS, backends, sizes, cfg, log)
    results.update(run_grid(BASELINES, [PYTHON], sizes, cfg, log))
    lo, hi = min(sizes), max(sizes)
    for by_size in results.values():
        names = [k for k, v in by_size[lo].items() if isinstance(v, float)]
        by_size["ratio_largest_smallest"] = {k: by_size[hi][k] / by_size[lo][k] for k in names}
        by_size["added_ns_per_iteration"] = {k: 1e9 / by_size[hi][k] - 1e9 / by_size[lo][k] for k in names}
    return results


def profile_ops(be: Backend, size: int, cfg: Settings) -> str:
    out = io.StringIO()
    for op in OPS:
        w = prepare(be, op, size, cfg)
        n = calibrate(w.run, cfg.target_s, cfg.min_iters)
        prof = cProfile.Profile()
        prof.runcall(w.run, n)
        out.write(f"\n=== {be.name}: {op} ({n:,} iterations) ===\n")
        stats = pstats.Stats(prof, stream=out)
        stats.sort_stats("tottime").print_stats(8)
    return out.getvalue()


# --- output ---------------------------------------------------------------------------------


def fmt_rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        padded = (c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
        return "| " + " | ".join(padded) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), sep, *(line(r) for r in rows)])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny iteration counts (smoke test)")
    parser.add_argument("--sizes", default=None, help="pool sizes for the scaling part"
                        " (default 1000,10000,100000,1000000; --quick: 1000,10000)")
    parser.add_argument("--compare-size", type=int, default=10000, help="pool size of the kvspec/vLLM comparison")
    parser.add_argument("--json", metavar="OUT", help="write every number to this file")
    parser.add_argument("--no-vllm", action="store_true", help="skip vLLM even if importable")
    parser.add_argument("--scale-kvspec-only", action="store_true",
                        help="time only kvspec at the scaling sizes (default: vLLM too, when importable)")
    parser.add_argument("--profile", action="store_true", help="also cProfile kvspec's workloads")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--target", type=float, default=None, help="seconds per repeat")
    args = parser.parse_args(argv)

    sizes = [int(s) for s in (args.sizes or ("1000,10000" if args.quick else "1000,10000,100000,1000000")).split(",")]
    for size in [*sizes, args.compare_size]:
        if size < 8 or size % BLOCKS_PER_OP:
            parser.error(f"pool size {size} must be a multiple of {BLOCKS_PER_OP} and >= 8")
    cfg = Settings(
        # Many short repeats: on a shared machine the best of many 20 ms runs is
        # far more stable (about 3 % run to run) than the best of a few long ones.
        target_s=args.target or (0.002 if args.quick else 0.02),
        repeats=args.repeats or (3 if args.quick else 31),
        min_iters=100 if args.quick else 1000,
        check_cap=20 if args.quick else 200,
    )

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    kv = kvspec_backend()
    backends = [kv]
    vllm_note = "skipped (--no-vllm)"
    if not args.no_vllm:
        vl, why = vllm_backend()
        if vl is None:
            vllm_note = f"vllm.v1.core.block_pool is not importable in this interpreter ({why})"
        else:
            backends.append(vl)
            vllm_note = f"vLLM {vl.version}"

    # vLLM's import leaves millions of objects (torch, transformers) behind;
    # freezing them keeps each gc.collect() between repeats short.
    gc.collect()
    gc.freeze()

    log(f"comparison at {args.compare_size:,} blocks ({', '.join(b.name for b in backends)}):")
    cmp_results = compare(backends, args.compare_size, cfg, log)
    scale_backends = [kv] if args.scale_kvspec_only else backends
    scale_names = [be.name for be in scale_backends]
    log(f"scaling ({', '.join(scale_names)}), sizes {sizes}:")
    scale_results = scaling(scale_backends, sizes, cfg, log)

    # --- report
    print()
    print(f"kvspec BlockPool benchmark  python {platform.python_version()}  {platform.platform()}  "
          f"{'quick' if args.quick else 'full'} mode")
    if len(backends) == 1:
        print(f"vLLM not compared: {vllm_note}; kvspec alone.")
    print(f"\nAt {args.compare_size:,} blocks (iterations/s, best of {cfg.repeats}"
          f"{', kvspec and vLLM repeats interleaved' if len(backends) > 1 else ''}):\n")
    if len(backends) > 1:
        rows = [[op, fmt_rate(r["kvspec"]), fmt_rate(r["vLLM"]), f"{r['ratio']:.2f}"] for op, r in cmp_results.items()]
        print(table(["operation", "kvspec ops/s", "vLLM ops/s", "ratio (kvspec/vLLM)"], rows))
    else:
        rows = [[op, fmt_rate(r["kvspec"])] for op, r in cmp_results.items()]
        print(table(["operation", "kvspec ops/s"], rows))
    positions = {be.name: cmp_results["touch+free"][f"{be.name}_info"]["mean_relative_position"] for be in backends}
    print("\n(touch+free: mean relative position of the touched blocks in the free queue, 0 = head, 1 = tail: "
          + ", ".join(f"{k} {v}" for k, v in positions.items()) + ")")

    lo, hi = min(sizes), max(sizes)
    ratio_col, added_col = f"{hi:,}/{lo:,}", f"ns/iter added at {hi:,}"

    def scale_rows(ops: list[str], name: str) -> list[list[str]]:
        return [[op, *(fmt_rate(scale_results[op][s][name]) for s in sizes),
                 f"{scale_results[op]['ratio_largest_smallest'][name]:.2f}",
                 f"{scale_results[op]['added_ns_per_iteration'][name]:+,.0f}"] for op in ops]

    for name in scale_names:
        others = [n for n in scale_names if n != name]
        with_others = f", {', '.join(others)}" if others else ""
        print(f"\nScaling, {name} (iterations/s, best of {cfg.repeats};"
              f" repeats interleaved across sizes{with_others}):\n")
        print(table(["operation", *(f"{s:,}" for s in sizes), ratio_col, added_col], scale_rows(OPS, name)))
    if len(scale_names) > 1:
        a_name, b_name = scale_names[:2]
        print(f"\nRatio {a_name}/{b_name} per size:\n")
        rows = [[op, *(f"{scale_results[op][s][a_name] / scale_results[op][s][b_name]:.2f}" for s in sizes)]
                for op in OPS]
        print(table(["operation", *(f"{s:,}" for s in sizes)], rows))
    print("\nThe same random access patterns on bare CPython containers of as many entries"
          " (what the memory hierarchy alone costs as the size grows):\n")
    print(table(["baseline", *(f"{s:,}" for s in sizes), ratio_col, added_col], scale_rows(BASELINES, "python")))
    touch_pos = [scale_results["touch+free"][s].get("kvspec_info", {}).get("mean_relative_position") for s in sizes]
    print("\n(touch+free, kvspec: mean relative position of the touched blocks per size: "
          + ", ".join(f"{s:,}: {p}" for s, p in zip(sizes, touch_pos, strict=True)) + ")")
    elapsed = time.perf_counter() - t0
    print(f"\n(total {elapsed:.0f} s)")

    result = {
        "benchmark": "benchmarks/pool_bench.py",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": sys.version,
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "mode": "quick" if args.quick else "full",
        "settings": {"target_s_per_repeat": cfg.target_s, "repeats": cfg.repeats, "hash_block_size": HASH_BLOCK_SIZE,
                     "blocks_per_op": BLOCKS_PER_OP, "pool": "size usable blocks + the null block, caching on"},
        "kvspec_version": kv.version,
        "vllm": vllm_note,
        "compare": {"size": args.compare_size, "ops": cmp_results},
        "scaling": {"sizes": sizes, "backends": scale_names,
                    "ops": {op: {str(k): v for k, v in r.items()} for op, r in scale_results.items()}},
        "elapsed_s": elapsed,
    }
    if args.profile:
        text = profile_ops(kv, args.compare_size, cfg)
        print(text)
        result["profile"] = text
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
        print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main()
