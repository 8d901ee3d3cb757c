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

``--against REV`` compares two versions of kvspec instead, side by side in
one sitting: REV (a commit, branch or tag, checked out into a temporary git
worktree) and this tree.  Each measurement is ``kvspec conform --target
impl --scope S --workers 1 --budget B --seed N --no-progress`` in a fresh
process of this Python, run for REV and for this tree in turn (``--repeat``
times, alternating, so that a machine's drift between sittings falls on
both alike); a process runs the tree it is given because a
``sitecustomize`` put first on its ``PYTHONPATH`` imports ``kvspec`` (and
``kvspec.spec``, ``kvspec.impl``, ... as that tree's ``pyproject.toml``
maps them) from that tree, whatever kvspec the Python has installed -- and
hands the same to the processes it starts.  It prints each scope's checked
operations per run for both and their ratio.  ``--mutants`` also runs the
mutant catalogue (``kvspec mutate --target impl --level L1 --level L3
--budget M --seed N``) in both trees and prints the mutants killed at each
level: the fault-finding power the speed must not cost.  ``--examples N``
sizes every run by examples instead: both trees then make the same search
(the same examples, so the same operations -- a difference is printed, layout
by layout, and means the change altered what the gate sends or judges), and
the rate is operations over the seconds the gate itself counted searching::

    python benchmarks/exploration.py --against main --scope manager --scope pool --budget 30 --repeat 2 --mutants
    python benchmarks/exploration.py --against main --scope manager --scope pool --examples 20
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
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


ROOT = Path(__file__).resolve().parent.parent

SITECUSTOMIZE = """
# Written by benchmarks/exploration.py --against: import kvspec from the tree $KVSPEC_BENCH_TREE.
import importlib.machinery, importlib.util, os, sys, tomllib

def _install():
    root = os.environ.get("KVSPEC_BENCH_TREE")
    if not root:
        return
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        dirs = tomllib.load(f).get("tool", {}).get("setuptools", {}).get("package-dir", {"kvspec": "kvspec"})

    class Tree:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name not in dirs:
                return None  # a subpackage not mapped: found in its parent's folder, which is this tree's
            folder = os.path.join(root, dirs[name])
            init = os.path.join(folder, "__init__.py")
            if os.path.exists(init):
                return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[folder])
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [folder]
            return spec

    sys.meta_path.insert(0, Tree)

_install()
"""


def _tree_env(tree: Path, boot: Path) -> dict[str, str]:
    """The environment of a process that runs kvspec from ``tree``."""
    path = os.pathsep.join([str(boot), *filter(None, [os.environ.get("PYTHONPATH")])])
    return dict(os.environ, KVSPEC_BENCH_TREE=str(tree), PYTHONPATH=path, PYTHONHASHSEED="0")


def _kvspec(tree: Path, boot: Path, args: list[str], timeout: float) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", "import sys; from kvspec.cli import main; sys.exit(main(sys.argv[1:]))", *args]
    return subprocess.run(command, env=_tree_env(tree, boot), cwd=tree, capture_output=True, text=True,
                          timeout=timeout)


def _conform_operations(tree: Path, boot: Path, scope: str, budget: float, seed: int, where: Path) -> int:
    """Checked operations of one budgeted gate run against impl (one worker) by the kvspec in ``tree``."""
    report = where / "report"
    done = _kvspec(tree, boot, ["conform", "--target", "impl", "--scope", scope, "--workers", "1", "--budget",
                                f"{budget:g}", "--seed", str(seed), "--no-progress", "--report-dir", str(report)],
                   budget + 300)
    if done.returncode not in (0, 3):  # 3: a budget too short to reach every layout, which counts all the same
        raise SystemExit(f"{tree}: kvspec conform --scope {scope} exited {done.returncode} (impl must conform):\n"
                         f"{done.stdout[-800:]}{done.stderr[-800:]}")
    results = json.loads((report / "report.json").read_text())["results"]
    return sum(r["operations"] for r in results)


def _fixed_search(tree: Path, boot: Path, scope: str, examples: int, seed: int, where: Path) -> dict:
    """A gate run sized by examples (``--examples N --seed S``: the same
    examples, whatever the speed): each layout's operations, verdict,
    states reached and failing rules, and the seconds the gate counted
    searching (its own clock, the process's start left out)."""
    report = where / "report"
    done = _kvspec(tree, boot, ["conform", "--target", "impl", "--scope", scope, "--workers", "1", "--examples",
                                str(examples), "--seed", str(seed), "--no-progress", "--report-dir", str(report)],
                   3600)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{tree}: kvspec conform --scope {scope} --examples {examples} exited {done.returncode}:"
                         f"\n{done.stdout[-800:]}{done.stderr[-800:]}")
    results = json.loads((report / "report.json").read_text())["results"]
    return {"layouts": {r["layout"]: [r["operations"], r["conforms"], r.get("distinct_states"),
                                      sorted(r.get("rules", []))] for r in results},
            "operations": sum(r["operations"] for r in results), "seconds": sum(r["seconds"] for r in results)}


def _kill_rate(tree: Path, boot: Path, budget: float, seed: int, where: Path) -> dict[str, tuple[int, int, list]]:
    """``kvspec mutate --target impl`` by the kvspec in ``tree``: (killed, mutants, survivors) per level."""
    done = _kvspec(tree, boot, ["mutate", "--target", "impl", "--level", "L1", "--level", "L3", "--budget",
                                f"{budget:g}", "--seed", str(seed), "--report-dir", str(where)], None)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{tree}: kvspec mutate exited {done.returncode}:\n{done.stderr[-800:]}")
    report = json.loads((where / "mutation.json").read_text())
    return {s["level"]: (s["killed"], s["mutants"], sorted(r["mutant"] for r in report["runs"]
                                                            if r["level"] == s["level"] and not r["killed"]))
            for s in report["summary"]}


def compare(against: str, scopes: list[str], budget: float, seed: int, repeat: int,
            mutants_budget: float | None, examples: int | None = None) -> dict:
    """REV against this tree, side by side (see the module's docstring)."""
    rows: dict[str, dict[str, list[int]]] = {scope: {"before": [], "after": []} for scope in scopes}
    fixed: dict[str, dict[str, dict]] = {scope: {} for scope in scopes}
    kills = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        boot = tmp_path / "boot"
        boot.mkdir()
        (boot / "sitecustomize.py").write_text(SITECUSTOMIZE)
        old = tmp_path / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), against], check=True,
                       capture_output=True)
        try:
            trees = {"before": old, "after": ROOT}
            for i in range(repeat if examples is None else 0):
                for scope in scopes:
                    for name, tree in trees.items():
                        where = tmp_path / f"{name}-{scope}-{i}"
                        rows[scope][name].append(_conform_operations(tree, boot, scope, budget, seed, where))
            for scope in scopes if examples is not None else []:
                for name, tree in trees.items():
                    fixed[scope][name] = _fixed_search(tree, boot, scope, examples, seed,
                                                       tmp_path / f"fixed-{name}-{scope}")
            if mutants_budget is not None:
                kills = {name: _kill_rate(tree, boot, mutants_budget, seed, tmp_path / f"mutants-{name}")
                         for name, tree in trees.items()}
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], capture_output=True)
    revision = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
    import hypothesis

    print(f"{against} (before) against this tree (after, {revision}{', uncommitted changes' if _dirty() else ''}); "
          f"Hypothesis {hypothesis.__version__}, Python {sys.version.split()[0]}")
    if examples is not None:
        print(f"kvspec conform --target impl --workers 1 --examples {examples} --seed {seed}: the same search in "
              "both, timed by the gate's own clock")
        print(f"{'scope':8} {'operations':>11} {'same layouts':>13} {'before s':>9} {'after s':>8} "
              f"{'before ops/s':>13} {'after ops/s':>12} {'after/before':>13}")
        for scope, both in fixed.items():
            b, a = both["before"], both["after"]
            same = "yes" if a["layouts"] == b["layouts"] else "NO"
            print(f"{scope:8} {a['operations']:>11,} {same:>13} {b['seconds']:>9.1f} {a['seconds']:>8.1f} "
                  f"{b['operations'] / b['seconds']:>13,.0f} {a['operations'] / a['seconds']:>12,.0f} "
                  f"{(a['operations'] / a['seconds']) / (b['operations'] / b['seconds']):>12.2f}x")
            if same == "NO":
                for layout in sorted(set(a["layouts"]) | set(b["layouts"])):
                    if a["layouts"].get(layout) != b["layouts"].get(layout):
                        print(f"  {layout}: before {b['layouts'].get(layout)}, after {a['layouts'].get(layout)}")
    else:
        print(f"kvspec conform --target impl --workers 1 --budget {budget:g} --seed {seed}, {repeat} run(s) each, "
              "alternating")
        print(f"{'scope':8} {'before: operations per run':>30} {'after: operations per run':>30} "
              f"{'after/before':>13}")
    for scope, both in rows.items() if examples is None else ():
        ratio = statistics.median(both["after"]) / max(1, statistics.median(both["before"]))
        print(f"{scope:8} {', '.join(f'{n:,}' for n in both['before']):>30} "
              f"{', '.join(f'{n:,}' for n in both['after']):>30} {ratio:>12.2f}x")
    if kills:
        print(f"mutants killed (kvspec mutate --target impl --budget {mutants_budget:g} --seed {seed}):")
        for level in sorted(kills["before"]):
            (kb, nb, sb), (ka, na, sa) = kills["before"][level], kills["after"].get(level, (0, 0, []))
            print(f"  {level}: before {kb}/{nb}, after {ka}/{na}" + (f"; both leave {', '.join(sb)}" if sb == sa else
                  f"; before leaves {', '.join(sb) or 'none'}, after {', '.join(sa) or 'none'}"))
    return {"against": against, "after": revision, "budget": budget, "seed": seed, "operations": rows,
            "examples": examples, "same_search": fixed,
            "mutants_killed": {name: {level: list(v) for level, v in k.items()} for name, k in kills.items()}}


def _dirty() -> bool:
    return bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip())


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
    parser.add_argument("--against", metavar="REV",
                        help="compare the kvspec of git revision REV with this tree, side by side (one worker)")
    parser.add_argument("--repeat", type=int, default=1, help="with --against: runs per scope and tree (default 1)")
    parser.add_argument("--examples", type=int, metavar="N",
                        help="with --against: size each gate run by examples instead of --budget (the same search "
                             "in both trees; prints whether every layout ran the same operations to the same "
                             "verdict, and each tree's rate by the gate's own clock)")
    parser.add_argument("--mutants", type=float, nargs="?", const=10.0, metavar="BUDGET",
                        help="with --against: the mutant catalogue's kill rate in both trees, each gate run "
                             "--budget BUDGET (default 10)")
    args = parser.parse_args(argv)
    if args.against:
        out = compare(args.against, args.scope or ["manager"], args.budget, args.seed, args.repeat, args.mutants,
                      args.examples)
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(out, indent=1))
        return [out]
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
