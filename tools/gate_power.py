"""How strong is the 8-second pool gate?  Every broken pool of
``tests/broken_pools.py`` (one planted bug per rule, plus a free list that
loops), each against ``kvspec conform --scope pool --budget 8`` for several
seeds, one process per run -- the command a user runs, with the Hypothesis
that is installed.

Prints, per broken pool, how many seeds caught it and the median time to
the first failing check and to the verdict, and the Hypothesis version; with
``--json`` writes every run.  ``--jobs 2`` runs two at once (both cores: the
budgets are wall clock, so more jobs than cores would starve them).

    python tools/gate_power.py --seeds 10 --jobs 2 --json reports/gate-power.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BROKEN = ["CyclicFreeList", "DoubleDecrement", "NullEnqueued", "StaleHash", "ReversedFreeOrder",
          "RefusalThatChanges", "ResetWhileInUse", "SilentEviction", "TouchKeepsQueued",
          "TableWithoutBlockHash", "FirstGroupForAll"]
TARGETS = "import broken_pools\n" + "".join(f"{n} = broken_pools.target(broken_pools.{n})\n" for n in BROKEN)


def run(pool: str, seed: int, budget: float, layout: str | None, where: Path) -> dict:
    report = where / f"{pool}-{seed}"
    argv = [sys.executable, "-m", "kvspec.cli", "conform", "--target", f"gate_power_targets:{pool}", "--scope",
            "pool", "--budget", str(budget), "--seed", str(seed), "--no-progress", "--report-dir", str(report)]
    if layout:
        argv += ["--layout", layout]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(where), str(ROOT / "tests")]))
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=budget + 120)
    wall = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"{pool} seed {seed}: the gate exited {done.returncode}: {done.stderr.strip()[-400:]}")
    layouts = json.loads((report / "report.json").read_text())["results"]
    failed = [r for r in layouts if not r["conforms"]]
    first = min((r["first_failure_at"] for r in failed if r.get("first_failure_at") is not None), default=None)
    verdict = min((r["finished"] for r in failed if r.get("finished") is not None), default=None)
    return {"pool": pool, "seed": seed, "caught": done.returncode == 1, "first_failure": first, "verdict": verdict,
            "wall": round(wall, 2), "operations": sum(r["operations"] for r in layouts),
            "rules": sorted({rule for r in failed for rule in r.get("rules", [])})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="seeds 1..N for each broken pool (default 10)")
    parser.add_argument("--budget", type=float, default=8.0, help="the gate's --budget in seconds (default 8)")
    parser.add_argument("--layout", help="one pool layout (default: every pool layout)")
    parser.add_argument("--pool", action="append", choices=BROKEN, help="only these broken pools")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", help="write every run here")
    args = parser.parse_args(argv)
    import hypothesis

    pools = args.pool or BROKEN
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        (where / "gate_power_targets.py").write_text(TARGETS)
        jobs = [(p, s) for p in pools for s in range(1, args.seeds + 1)]
        with ThreadPoolExecutor(args.jobs) as ex:
            runs = list(ex.map(lambda job: run(*job, args.budget, args.layout, where), jobs))
    print(f"Hypothesis {hypothesis.__version__}, --budget {args.budget:g}, {args.layout or 'every pool layout'}, "
          f"seeds 1-{args.seeds}")
    print(f"{'broken pool':24} {'caught':>7} {'median s to red':>16} {'median s to verdict':>20}")
    weakest = args.seeds
    for pool in pools:
        mine = [r for r in runs if r["pool"] == pool]
        caught = [r for r in mine if r["caught"]]
        weakest = min(weakest, len(caught))

        def median(key, caught=caught):
            values = [r[key] for r in caught if r[key] is not None]
            return f"{statistics.median(values):.1f}" if values else "-"

        print(f"{pool:24} {len(caught):>3}/{len(mine):<3} {median('first_failure'):>16} {median('verdict'):>20}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"hypothesis": hypothesis.__version__, "budget": args.budget,
                                               "layout": args.layout, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
