#!/usr/bin/env python
"""The gate's exploration rate: checked operations per second of the default
budgeted gate against kvspec's own implementation, per scope, with the
Hypothesis that is installed -- and, with ``--profile``, where the time goes.

Usage::

    python benchmarks/exploration.py [--budget 60] [--seed 1] [--scope pool --scope manager --scope all]
        [--workers 1 --workers 2] [--profile] [--json OUT]

Each scope runs ``kvspec conform --target impl --scope S --budget B --seed N``
in this process, exactly as the command line runs it, and reads the
operations every layout checked from its report.  An operation is one call
into the target, checked: every rule after it and, at L3 (the default), the
spec in lockstep.  ``all`` is the default gate (both scopes sharing the
budget), the command a pull request runs.  Each runs in one process and
with ``--workers 2`` (both cores of the CI machine: each worker takes half
the layouts in rounds).  The rate is operations over the command's wall
time; "per 10 min" projects it.

``--profile`` runs each scope under cProfile and splits its own time by
where the code lives: Hypothesis (generating and bookkeeping: rule choice,
draws, shrinking, targeting), the spec in lockstep (spec/ less its rules),
the rules (spec/rules.py, spec/request_rules.py, spec/content.py and the
oracle), the target (impl/ and its adapters), the machines (the rest of
kvspec/), and "other": the standard library and builtins, called from all
of the above (dict and list methods, pickling the spec's state for its
all-or-nothing operations, Counter, dataclasses).  The profiler slows
everything by about a half; the shares are what it is for.

Budgets are wall-clock: run it on an otherwise idle machine, and compare
Hypothesis versions side by side in one sitting (the same command in two
environments).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

CATEGORIES = (
    ("Hypothesis", ("/hypothesis/",)),
    ("rules", ("/spec/rules.py", "/spec/request_rules.py", "/spec/content.py", "/spec/oracle.py")),
    ("spec", ("/spec/",)),
    ("target", ("/impl/", "/conformance/targets/")),
    ("machines", ("/kvspec/",)),
)


def category(filename: str) -> str:
    """Where a profiled function lives (the first matching category)."""
    path = filename.replace("\\", "/")
    for name, parts in CATEGORIES:
        if any(part in path for part in parts):
            return name
    return "other"


def run_gate(scope: str, budget: float, seed: int, profile: bool, workers: int = 1) -> dict:
    """One gate run against impl (``kvspec conform --target impl``): its
    operations, wall time and (profiled) the time by category."""
    from kvspec.conformance.gate import GateOptions
    from kvspec.conformance.gate import run_gate as gate

    with tempfile.TemporaryDirectory() as tmp:
        options = GateOptions(target="impl", scope=scope, budget=budget, seed=seed, workers=workers, trace_dir=tmp)
        profiler = cProfile.Profile() if profile else None
        if profiler:
            profiler.enable()
        report = gate(options)
        if profiler:
            profiler.disable()
        wall = time.perf_counter() - options.started
        if not report.conforms:
            raise SystemExit(f"kvspec conform --target impl --scope {scope} failed: impl must conform")
        results = report.results
    row = {"scope": scope, "workers": workers, "operations": sum(r.operations for r in results),
           "seconds": round(wall, 1), "layouts": len(results)}
    row["per_second"] = round(row["operations"] / wall)
    row["per_10_min"] = row["per_second"] * 600
    if profiler:
        stats = pstats.Stats(profiler).stats
        shares: dict[str, float] = {}
        for (filename, _, _), (_, _, tottime, _, _) in stats.items():
            shares[category(filename)] = shares.get(category(filename), 0.0) + tottime
        total = sum(shares.values()) or 1.0
        row["time_shares"] = {name: round(100 * seconds / total, 1)
                              for name, seconds in sorted(shares.items(), key=lambda kv: -kv[1])}
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per scope (default 60)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scope", action="append", choices=["pool", "manager", "all"],
                        help="scopes to run (default: pool, manager and all)")
    parser.add_argument("--workers", type=int, action="append",
                        help="processes for the gate (--workers N; repeatable, default 1 and 2: both cores)")
    parser.add_argument("--profile", action="store_true", help="split the time by where the code lives")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    import hypothesis

    workers = args.workers or ([1] if args.profile else [1, 2])  # the profiler sees one process only
    rows = [run_gate(scope, args.budget, args.seed, args.profile, n)
            for n in workers for scope in args.scope or ["pool", "manager", "all"]]
    print(f"Hypothesis {hypothesis.__version__}, Python {sys.version.split()[0]}, --budget {args.budget:g}, "
          f"--seed {args.seed}{' (profiled)' if args.profile else ''}")
    print(f"{'scope':8} {'workers':>7} {'operations':>11} {'seconds':>8} {'ops/s':>7} {'per 10 min':>11}")
    for row in rows:
        print(f"{row['scope']:8} {row['workers']:>7} {row['operations']:>11,} {row['seconds']:>8} "
              f"{row['per_second']:>7,} {row['per_10_min']:>11,}")
        if "time_shares" in row:
            print("         " + ", ".join(f"{name} {share}%" for name, share in row["time_shares"].items()))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"hypothesis": hypothesis.__version__, "budget": args.budget,
                                               "seed": args.seed, "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
