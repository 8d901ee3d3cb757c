"""What fragmentation costs a decode kernel: the attention kernel's achieved
memory bandwidth on block tables that kvspec's KV-cache manager produced
under a serving workload, against the same requests on contiguous tables.

A serving loop (kvspec.impl's ``KVCacheManager``, full attention, Llama-3-8B's
KV shape: 8 KV heads of 128, bf16, 16-token blocks) admits requests of 1-3k
tokens behind a shared system prompt and finishes them at random until the
pool has churned; then a decode batch of the longest running requests is
taken with its block tables.  The same context lengths laid out on
consecutive blocks are the contiguous case.  Each table is timed with the
decode kernel -- vLLM's ``unified_attention`` where vLLM is installed, else
compiled ``flex_attention`` -- on device-resident inputs, the kernel alone
(CUDA events around each launch, median of repeats), and the bandwidth is
the K/V bytes the batch reads per second.  ``--smoke`` runs short requests
in a small pool, so its tables are fragmented too (their share of adjacent
blocks is printed and recorded).

    python benchmarks/kernel_bandwidth.py --out results/       # on a GPU
    python benchmarks/kernel_bandwidth.py --smoke --out DIR     # a tiny CPU run (checks the script)

Writes ``kernel-bandwidth.json`` and, where matplotlib imports,
``kernel-bandwidth.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from kvspec.hashing import get_request_block_hasher
from kvspec.impl import KVCacheManager
from kvspec.kv_cache_interface import FullAttentionSpec
from kvspec.models import kernels as K
from kvspec.request import Request
from kvspec.spec.layout import Layout


def churn(num_blocks: int, block_size: int, steps: int, seed: int, prompt: tuple[int, int] = (500, 2500),
          system_len: int = 512) -> tuple[list[list[int]], list[int]]:
    """Run a serving loop; the block tables and context lengths of the
    running requests at the end (longest first).  Prompts of ``prompt``
    tokens, after the first 0, half or all ``system_len`` tokens of a shared
    system prompt."""
    rng = random.Random(seed)
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=8, head_size=128, dtype="bfloat16")
    layout = Layout((spec,), num_blocks=num_blocks, max_model_len=4096)
    manager = KVCacheManager(layout.kv_cache_config(), layout.max_model_len, block_size, block_size)
    hasher = get_request_block_hasher(block_size)
    system = [rng.randrange(1000) for _ in range(system_len)]
    running: list[Request] = []
    for step in range(steps):
        if running and rng.random() < 0.3:
            done = running.pop(rng.randrange(len(running)))
            manager.free(done)
        tokens = system[: rng.choice([0, system_len // 2, system_len])] + \
            [rng.randrange(1000) for _ in range(rng.randint(*prompt))]
        request = Request(f"r{step}", tokens, block_hasher=hasher)
        blocks, hit = manager.get_computed_blocks(request)
        if manager.allocate_slots(request, request.num_tokens - hit, hit, blocks) is not None:
            request.num_computed_tokens = request.num_tokens
            running.append(request)
        for r in running:  # everyone decodes a token
            r.append_output_token_ids(rng.randrange(1000))
            if manager.allocate_slots(r, 1) is not None:
                r.num_computed_tokens += 1
    running.sort(key=lambda r: -r.num_computed_tokens)
    tables = [list(manager.get_block_ids(r.request_id)[0]) for r in running]
    return tables, [r.num_computed_tokens for r in running]


def adjacency(tables: list[list[int]]) -> float:
    """Share of consecutive logical blocks that are consecutive physical blocks."""
    pairs = [(a, b) for t in tables for a, b in zip(t, t[1:], strict=False)]
    return sum(b == a + 1 for a, b in pairs) / max(1, len(pairs))


def decode_kernel(device: str):
    """The decode kernel and how to prepare it: vLLM's ``unified_attention``
    where vLLM is installed, else flex_attention (compiled on a GPU)."""
    from kvspec.models.vllm_kernels import prepare_vllm_unified_attention, vllm_kernels_available

    if vllm_kernels_available() is None:
        return "vllm unified_attention", prepare_vllm_unified_attention
    if device == "cuda":
        return "flex_attention (compiled)", lambda batch: K.prepare_flex_attention_paged(batch, compiled=True)
    return "flex_attention (eager)", K.prepare_flex_attention_paged


def time_kernel(run, repeats: int, device: str) -> float:
    """Median seconds per call of ``run`` -- the kernel alone: its inputs
    are on the device and its output stays there (a prepared kernel).  On
    a GPU, CUDA events around each launch."""
    run()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            run()
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for kernel-bandwidth.json / .png")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (checks the script runs)")
    parser.add_argument("--batch", type=int, help="requests in the decode batch (default 64; 8 with --smoke)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    if device == "cpu" and "triton" not in sys.modules:  # vLLM's kernel on a CPU: Triton's interpreter
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    if device == "cpu" and not args.smoke:
        print("no CUDA device: run on a GPU, or pass --smoke for a tiny CPU run", file=sys.stderr)
        return 2
    block_size, dtype = 16, (torch.bfloat16 if device == "cuda" else torch.float32)
    if args.smoke:  # short requests in a small pool: as much churn, and fragmentation, at a CPU's size
        num_blocks, kv_heads, head, heads = 256, 2, 16, 4
        tables, lens = churn(num_blocks, block_size, 300, args.seed, prompt=(10, 40), system_len=16)
    else:
        num_blocks, kv_heads, head, heads = 32768, 8, 128, 32
        tables, lens = churn(num_blocks, block_size, 400, args.seed)
    batch_size = args.batch or (8 if args.smoke else 64)
    tables, lens = tables[:batch_size], lens[:batch_size]
    width = max(len(t) for t in tables)
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    query = torch.randn(len(lens), heads, head, generator=gen)
    contiguous, next_block = [], 1
    for t in tables:
        contiguous.append(list(range(next_block, next_block + len(t))))
        next_block += len(t)
    pages = max(num_blocks, next_block)  # the contiguous layout may need more pages than the pool had
    key = torch.randn(pages, block_size, kv_heads, head, generator=gen).to(device=device, dtype=dtype)
    value = torch.randn(pages, block_size, kv_heads, head, generator=gen).to(device=device, dtype=dtype)
    name, prepare = decode_kernel(device)
    results = {}
    for label, rows in (("kvspec manager", tables), ("contiguous", contiguous)):
        table = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int32, device=device)
        batch = K.AttentionBatch(query, list(range(len(lens) + 1)), lens, table, key, value, block_size, head ** -0.5)
        seconds = time_kernel(prepare(batch), args.repeats, device)
        kv_bytes = sum(lens) * kv_heads * head * 2 * key.element_size()
        results[label] = {"seconds": seconds, "bytes": kv_bytes, "GB/s": kv_bytes / seconds / 1e9,
                          "adjacent_blocks": adjacency(rows)}
    ratio = results["kvspec manager"]["GB/s"] / results["contiguous"]["GB/s"]
    record = {
        "kernel": name, "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        "batch": len(lens), "mean_context": statistics.mean(lens), "num_blocks": num_blocks, "block_size": block_size,
        "kv_heads": kv_heads, "head_size": head, "query_heads": heads, "dtype": str(dtype), "results": results,
        "fragmented_over_contiguous": ratio, "torch": torch.__version__, "smoke": args.smoke,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernel-bandwidth.json").write_text(json.dumps(record, indent=2))
    for label, r in results.items():
        print(f"{label:<16} {r['GB/s']:9.1f} GB/s  ({r['seconds'] * 1e6:8.1f} us, "
              f"{r['adjacent_blocks']:.0%} of neighbouring blocks adjacent)")
    print(f"{name}: fragmented / contiguous bandwidth = {ratio:.3f}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return 0
    fig, ax = plt.subplots(figsize=(5, 3))
    labels = list(results)
    ax.bar(labels, [results[k]["GB/s"] for k in labels], color=["tab:blue", "tab:gray"])
    ax.set_ylabel("achieved bandwidth (GB/s)")
    ax.set_title(f"{name}, batch {len(lens)}, mean context {statistics.mean(lens):.0f}")
    fig.tight_layout()
    fig.savefig(out / "kernel-bandwidth.png", dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
