"""The pool benchmark runs end to end and reports a number for every operation.

Smoke test only: ``--quick`` mode (tiny iteration counts, sizes 1,000 and
10,000) in a subprocess.  Nothing here asserts on speed -- timings on shared
2-core machines are too noisy for that; ``benchmarks/pool_bench.py`` is run by
hand for real numbers.  When the interpreter can import vLLM, the side-by-side
columns are checked too.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "pool_bench.py"


def _is_rate(x: object) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_pool_bench_quick(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--sizes", "1000,10000", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())

    ops = result["compare"]["ops"]
    expected_ops = {
        "alloc+free",
        "alloc+free list",
        "alloc(evict)+rehash+free",
        "touch+free",
        "get_cached_block hit",
        "get_cached_block miss",
        "alloc(evict)+cache_full_blocks+free",
    }
    assert set(ops) == expected_ops
    compared = result["vllm"].startswith("vLLM ")
    for op, row in ops.items():
        assert _is_rate(row["kvspec"]), (op, row)
        if compared:
            assert _is_rate(row["vLLM"]) and _is_rate(row["ratio"]), (op, row)
        assert op in proc.stdout
    if not compared:
        assert "vLLM not compared" in proc.stdout

    scaling = result["scaling"]
    assert scaling["sizes"] == [1000, 10000]
    for op in expected_ops:
        by_size = scaling["ops"][op]
        for size in ("1000", "10000"):
            assert _is_rate(by_size[size]["kvspec"]), (op, size, by_size)
        assert _is_rate(by_size["ratio_largest_smallest"]["kvspec"])
    # the touch workload reaches into the queue, not only at its ends
    info = ops["touch+free"]["kvspec_info"]
    assert 0.0 < info["mean_relative_position"] < 1.0
    for key in ("python", "platform", "date"):
        assert result[key]


def test_kernel_bandwidth_smoke(tmp_path: Path) -> None:
    """The fragmentation benchmark runs end to end on tiny CPU shapes."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "kernel_bandwidth.py"), "--smoke", "--repeats", "3",
         "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    record = json.loads((tmp_path / "kernel-bandwidth.json").read_text())
    for label in ("kvspec manager", "contiguous"):
        assert _is_rate(record["results"][label]["GB/s"])
    assert _is_rate(record["fragmented_over_contiguous"]) and "fragmented / contiguous" in proc.stdout
    # The smoke's tables come from a churning pool: fragmented, unlike the contiguous case it is compared with.
    assert record["results"]["kvspec manager"]["adjacent_blocks"] < 0.5
    assert record["results"]["contiguous"]["adjacent_blocks"] == 1.0


def test_manager_bench_quick(tmp_path: Path) -> None:
    """The scheduler-level benchmark (vLLM's environment only) runs every
    workload in lockstep and reports a ratio for each."""
    pytest.importorskip("vllm")
    out = tmp_path / "manager.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "manager_bench.py"), "--quick", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert set(result["workloads"]) == {"serve full", "serve full+swa", "serve full+mamba", "serve eagle", "hash 32k",
                                        "request 32k", "own request 32k"}
    for name, row in result["workloads"].items():
        assert _is_rate(row["ratio_median"]), (name, row)
        assert name in proc.stdout
    assert result["workloads"]["serve full"]["hit_tokens"] > 0  # the shared system prompt is hit
    assert 0 < result["timer_overhead_ns"] < 1000


@pytest.mark.parametrize("args, message", [
    (["--device", "tpu"], "--device takes cuda or cpu"),
    (["--device", "cpu"], "only the dry run makes sense: add --smoke"),
    (["--frobnicate"], "unknown option --frobnicate"),
])
def test_the_gpu_stage_script_refuses_what_it_cannot_run_in_one_line(args, message, tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(ROOT / "tools" / "gpu_stage.sh"), *args, "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
