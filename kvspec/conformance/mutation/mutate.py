"""``kvspec mutate``: the gate measured against the mutant catalogue.

For each mutant of :mod:`kvspec.conformance.mutation.mutants` and each level, a fresh
Python process applies the mutant to the target's classes and runs the
pull-request gate (:func:`kvspec.conformance.gate.run_gate`, as
``kvspec conform --target T --level L --budget B --fail-fast
--known-findings`` runs it) -- then reports whether the mutant was killed
(a layout failed other than as a known finding), the rules that caught it,
the time to the first failing check (the moment the gate shows red) and to
the verdict (the failing layout's minimal run), all counted from the
command's start as the gate counts its budget.

Each run gets a process of its own so that no patch outlives its mutant and
a mutant that hangs the target is stopped from outside
(:data:`HARD_TIMEOUT_GRACE` past the budget) and reported as such.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvspec.conformance.mutation.mutants import MUTANTS_BY_NAME, Family, applied, for_family

HARD_TIMEOUT_GRACE = 60.0  # seconds past the budget before a mutant's process is killed


@dataclass
class MutantRun:
    """One mutant against one target at one level."""

    mutant: str
    bug_class: str
    target: str
    level: str
    killed: bool = False
    caught_by: list[str] = field(default_factory=list)  # rules; spec-equivalence; crash; hang
    layout: str | None = None  # the layout that failed
    first_failure: float | None = None  # seconds from the start to the first failing check
    verdict: float | None = None  # seconds from the start to the failing layout's verdict
    seconds: float = 0.0  # the whole run
    survived_because: str | None = None  # the catalogue's reason a level cannot see it, if any
    error: str | None = None  # the run could not be made (not a kill)


def run_one(name: str, target: str, level: str, budget: float, seed: int | None) -> MutantRun:
    """Apply mutant ``name`` to ``target``'s classes and run the gate once
    (in this process)."""
    mutant = MUTANTS_BY_NAME[name]
    run = MutantRun(name, mutant.bug_class, target, level)
    family = Family(target)  # imports the target's modules before the clock starts
    from kvspec.conformance.gate import GateOptions, run_gate
    from kvspec.errors import SetupError

    with tempfile.TemporaryDirectory() as trace_dir, applied(mutant, family):
        options = GateOptions(target=target, level=level, budget=budget, seed=seed, fail_fast=True, minimise=False,
                              known_findings=True, trace_dir=trace_dir,
                              command=f"kvspec mutate --mutant {name} --target {target} --level {level}")
        try:
            report = run_gate(options)
        except SetupError as error:
            run.error = f"the gate refused to run: {error}"
            return run
        finally:
            run.seconds = round(time.perf_counter() - options.started, 2)
    for layout in report.results:
        if layout.conforms or layout.known_finding:
            continue
        run.killed, run.layout = True, f"{layout.scope}/{layout.layout}"
        run.caught_by = layout.rules or [_kind_of(layout.details)]
        run.first_failure, run.verdict = layout.first_failure_at, layout.finished
        break
    if not run.killed and level == "L1":
        run.survived_because = mutant.l1
    return run


def _kind_of(details: list[str]) -> str:
    """What caught a failure that names no rule: a hang, an error where only
    a clean refusal may be (clean-refusal), the lockstep comparison, or an
    exception the machine itself ran into (crash)."""
    text = " ".join(details)
    if "did not return" in text or "hangs" in text:
        return "hang"
    if "crashed with" in text or "a refusal must raise" in text:
        return "clean-refusal"
    if "divergence from the spec" in text:
        return "spec-equivalence"
    return "crash"


def _in_subprocess(name: str, target: str, level: str, budget: float, seed: int | None) -> MutantRun:
    """:func:`run_one` in a fresh interpreter, killed if it overruns."""
    mutant = MUTANTS_BY_NAME[name]
    command = [sys.executable, "-m", "kvspec.conformance.mutation.mutate", name, target, level, f"{budget:g}",
               "" if seed is None else str(seed)]
    env = dict(os.environ, PYTHONHASHSEED=os.environ.get("PYTHONHASHSEED", "0"))
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=budget + HARD_TIMEOUT_GRACE, env=env)
    except subprocess.TimeoutExpired:
        return MutantRun(name, mutant.bug_class, target, level, killed=True, caught_by=["hang"],
                         seconds=round(time.perf_counter() - start, 2),
                         error=f"the gate did not end {HARD_TIMEOUT_GRACE:g} s after its budget; killed")
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return MutantRun(name, mutant.bug_class, target, level, error=f"the mutant's run failed: {tail}")
    return MutantRun(**json.loads(lines[-1]))


@dataclass
class MutationReport:
    target: str
    budget: float
    seed: int | None
    runs: list[MutantRun] = field(default_factory=list)
    # The search engine's release: the same gate finds more or less with another (docs/MUTATION.md).
    hypothesis: str = field(default_factory=lambda: importlib.metadata.version("hypothesis"))

    def levels(self) -> list[str]:
        return sorted({r.level for r in self.runs})

    def summary(self, level: str) -> dict[str, object]:
        runs = [r for r in self.runs if r.level == level and (r.error is None or r.killed)]
        killed = [r for r in runs if r.killed]
        firsts = [r.first_failure for r in killed if r.first_failure is not None]
        verdicts = [r.verdict for r in killed if r.verdict is not None]
        return {
            "level": level, "mutants": len(runs), "killed": len(killed),
            "score": round(100 * len(killed) / len(runs), 1) if runs else 0.0,
            "median_first_failure": round(statistics.median(firsts), 1) if firsts else None,
            "median_verdict": round(statistics.median(verdicts), 1) if verdicts else None,
            "errors": [f"{r.mutant}: {r.error}" for r in self.runs if r.level == level and r.error and not r.killed],
        }

    def markdown(self) -> str:
        lines = [f"# Mutation report: target {self.target}, budget {self.budget:g} s"
                 + (f", seed {self.seed}" if self.seed is not None else "") + f", Hypothesis {self.hypothesis}", "",
                 "| level | mutants | killed | score | median s to first failing check | median s to verdict |",
                 "|---|---|---|---|---|---|"]
        for level in self.levels():
            s = self.summary(level)
            lines.append(f"| {level} | {s['mutants']} | {s['killed']} | {s['score']} % | "
                         f"{s['median_first_failure']} | {s['median_verdict']} |")
        lines += ["", "| mutant | bug class | level | result | caught by | layout | first failing check s | "
                  "verdict s |", "|---|---|---|---|---|---|---|---|"]
        for r in self.runs:
            result = "killed" if r.killed else ("error" if r.error else "survived")
            note = r.error or r.survived_because or ""
            lines.append(f"| {r.mutant} | {r.bug_class} | {r.level} | {result} | {', '.join(r.caught_by) or note} | "
                         f"{r.layout or '-'} | {r.first_failure if r.first_failure is not None else '-'} | "
                         f"{r.verdict if r.verdict is not None else '-'} |")
        return "\n".join(lines) + "\n"

    def write(self, directory: str | Path) -> list[Path]:
        """mutation.json and mutation.md in ``directory``; their paths."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        (out / "mutation.json").write_text(json.dumps(self.to_json(), indent=1) + "\n")
        (out / "mutation.md").write_text(self.markdown())
        return [out / "mutation.json", out / "mutation.md"]

    def to_json(self) -> dict:
        return {"target": self.target, "budget": self.budget, "seed": self.seed, "hypothesis": self.hypothesis,
                "summary": [self.summary(level) for level in self.levels()],
                "runs": [asdict(r) for r in self.runs]}


def mutate(target: str, levels: list[str], budget: float, names: list[str] | None = None, jobs: int = 1,
           seed: int | None = None, on_run=None) -> MutationReport:
    """Run the gate against every mutant (or those ``names``) at each level."""
    chosen = check_mutation(target, budget, jobs, names)
    report = MutationReport(target, budget, seed)
    work = [(name, level) for name in chosen for level in levels]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(_in_subprocess, name, target, level, budget, seed) for name, level in work]
        for future in futures:
            run = future.result()
            report.runs.append(run)
            if on_run:
                on_run(run)
    return report


def check_mutation(target: str, budget: float, jobs: int, names: list[str] | None) -> list[str]:
    """The mutants to run, the arguments checked first (ValueError, or
    SetupError when the target cannot run here)."""
    if budget <= 0:
        raise ValueError(f"--budget must be a positive number of seconds, got {budget:g}")
    if jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {jobs}")
    if target == "vllm":
        from kvspec.conformance.runner import check_target

        check_target("vllm", "manager")
    chosen = [m.name for m in for_family(target)] if not names else names
    unknown = [n for n in chosen if n not in MUTANTS_BY_NAME]
    if unknown:
        raise ValueError(f"no mutant named {', '.join(unknown)}: see kvspec mutate --list")
    wrong = [n for n in chosen if target not in MUTANTS_BY_NAME[n].families]
    if wrong:
        raise ValueError(f"mutant(s) {', '.join(wrong)} do not apply to {target}")
    return chosen


def main(argv: list[str]) -> int:
    """``python -m kvspec.conformance.mutation.mutate NAME TARGET LEVEL BUDGET [SEED]``:
    one run, its result as one JSON line."""
    name, target, level, budget, seed = argv
    run = run_one(name, target, level, float(budget), int(seed) if seed else None)
    print(json.dumps(asdict(run)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
