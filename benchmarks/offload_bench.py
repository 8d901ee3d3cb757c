#!/usr/bin/env python
"""Throughput of kvspec's offloading tier (``impl/offload.py``) and vLLM
0.25.1's ``CPUOffloadingManager`` side by side, LRU and ARC (spec chapter 11).

Usage::

    python benchmarks/offload_bench.py [--quick] [--blocks 10000] [--no-vllm]

Ratios are printed, nothing is asserted: timings on a shared machine are
noisy, so each workload is the best of several short repeats, garbage
collection off while timing.  Each workload is one connector's request
over the same seeded key stream, on a tier of ``--blocks`` blocks that the
stream overfills four times (so stores evict):

``request``
    ``lookup`` each of 16 keys, ``touch`` them, ``prepare_store`` them and
    ``complete_store`` the keys to store.
``load``
    ``prepare_load`` + ``complete_load`` of 16 stored keys.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from collections.abc import Callable

from kvspec.impl.offload import CPUOffloadingManager as ImplTier

KEYS_PER_REQUEST = 16


def vllm_tier() -> Callable[..., object] | None:
    try:
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
    except Exception:  # noqa: BLE001 (no vLLM here: kvspec alone)
        return None
    return CPUOffloadingManager


def stream(blocks: int, requests: int, seed: int = 0) -> list[list[bytes]]:
    """Requests of 16 keys drawn from 4x the tier's blocks, a hot quarter asked more often."""
    rng = random.Random(seed)
    universe = [i.to_bytes(28, "big") + bytes(4) for i in range(4 * blocks)]
    hot = universe[: blocks // 4]
    return [rng.sample(hot if rng.random() < 0.5 else universe, KEYS_PER_REQUEST) for _ in range(requests)]


def requests(tier: object, work: list[list[bytes]]) -> None:
    for keys in work:
        for key in keys:
            tier.lookup(key, None)
        tier.touch(keys, None)
        out = tier.prepare_store(keys, None)
        if out is not None and out.keys_to_store:
            tier.complete_store(out.keys_to_store, None)


def loads(tier: object, work: list[list[bytes]]) -> None:
    for keys in work:
        tier.prepare_load(keys, None)
        tier.complete_load(keys, None)


def best(fn: Callable[[], None], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        gc.disable()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        gc.enable()
    return min(times)


def measure(make: Callable[..., object], policy: str, blocks: int, work: list[list[bytes]], repeats: int
            ) -> dict[str, float]:
    """Requests per second of each workload on a fresh tier each repeat."""
    def run_requests() -> None:
        requests(make(blocks, cache_policy=policy), work)

    tier = make(blocks, cache_policy=policy)
    requests(tier, work)
    held = [k for keys in work[-blocks // KEYS_PER_REQUEST // 2:] for k in keys
            if tier.lookup(k, None).name == "HIT"]
    load_work = [held[i:i + KEYS_PER_REQUEST] for i in range(0, len(held) - KEYS_PER_REQUEST + 1, KEYS_PER_REQUEST)]
    load_work = (load_work * (len(work) // max(1, len(load_work)) + 1))[: len(work)] if load_work else []
    return {"request": len(work) / best(run_requests, repeats),
            "load": len(load_work) / best(lambda: loads(tier, load_work), repeats) if load_work else float("nan")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="a small tier and few repeats (seconds)")
    parser.add_argument("--no-vllm", action="store_true")
    args = parser.parse_args(argv)
    blocks, count, repeats = (500, 200, 3) if args.quick else (args.blocks, 2_000, 7)
    work = stream(blocks, count)
    vllm = None if args.no_vllm else vllm_tier()
    print(f"offload tier, {blocks} blocks, {count} requests of {KEYS_PER_REQUEST} keys; requests per second "
          f"(best of {repeats})" + ("" if vllm else "; vLLM not compared"))
    print(f"{'policy':<6} {'workload':<8} {'kvspec':>12} {'vLLM':>12} {'kvspec/vLLM':>12}")
    for policy in ("lru", "arc"):
        mine = measure(ImplTier, policy, blocks, work, repeats)
        theirs = measure(vllm, policy, blocks, work, repeats) if vllm else {}
        for name, rate in mine.items():
            other = theirs.get(name)
            ratio = f"{rate / other:.2f}x" if other else "-"
            print(f"{policy:<6} {name:<8} {rate:>12,.0f} {other or float('nan'):>12,.0f} {ratio:>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
