"""Breadth for the mutant catalogue: cosmic-ray's mutation operators over
``impl/``, each mutant judged by the pull-request gate.

The catalogue (``kvspec mutate``) holds bugs chosen for their class; this
measures the gate against mutants nobody chose.  cosmic-ray generates every
mutant of ``impl/`` (about 5,000); a seeded random sample of them is run, each
by the gate ``kvspec conform --target impl --budget B --fail-fast`` in a copy
of the repository (cosmic-ray edits the files it mutates), and the outcome of
each -- killed, survived, incompetent (the mutant does not import) or timed
out -- is written with its diff for classification.

    pip install cosmic-ray            # the optional "mutation" extra
    python tools/mutation_breadth.py --sample 150 --budget 15 --out mutation-breadth.json

Survivors need a reader: many are equivalent mutants (a changed error
message, a bound that cannot be reached, an optimisation's fast path that
the slow path backs up); the rest are gaps.  ``--out`` keeps each survivor's
diff for that reading.

Once a gap is closed, ``--rerun FILE`` judges the survivors a previous run
recorded in FILE again -- each recorded diff applied to a fresh copy (by
context, so later edits around it do not matter), the same gate, the same
budget -- without drawing a new sample::

    python tools/mutation_breadth.py --rerun docs/mutation/breadth.json --out rerun.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = ("impl", "spec", "models", "proofs")  # installed as kvspec.<name> (pyproject's package-dir)


def copy_repository(work: Path) -> Path:
    """The tracked files of the repository in ``work/repo``, and a package
    directory ``work/pkg`` whose ``kvspec`` resolves there (PYTHONPATH wins
    over the editable install, so the gate imports the mutated copy)."""
    repo = work / "repo"
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in files.splitlines():
        source = ROOT / name
        if source.is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            (repo / name).write_bytes(source.read_bytes())
    package = work / "pkg" / "kvspec"
    package.mkdir(parents=True)
    for entry in (repo / "kvspec").iterdir():
        (package / entry.name).symlink_to(entry)
    for name in SUBPACKAGES:
        (package / name).symlink_to(repo / name)
    return repo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=150, help="mutants to run (default 150)")
    parser.add_argument("--budget", type=float, default=15.0, help="the gate's budget per mutant (default 15)")
    parser.add_argument("--seed", type=int, default=14, help="which sample (default 14)")
    parser.add_argument("--out", default="mutation-breadth.json", help="where to write the results")
    parser.add_argument("--rerun", type=Path, help="judge again the survivors recorded in this results file")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="kvspec-breadth-"))
    repo = copy_repository(work)
    # Run from the work directory, not the copy: a ``kvspec/`` in the working directory would shadow the
    # package directory and its subpackages would fall back to the editable install.
    gate = (f"cd {work} && PYTHONPATH={work / 'pkg'} PYTHONHASHSEED=0 timeout {args.budget + 60:g} "
            f"{sys.executable} -m kvspec.cli conform --target impl --budget {args.budget:g} --fail-fast "
            "--no-progress > /dev/null 2>&1")
    (work / "gate.sh").write_text(gate + "\n")
    check = subprocess.run([sys.executable, "-c", "import kvspec.impl; print(kvspec.impl.__file__)"], cwd=work,
                           env=dict(os.environ, PYTHONPATH=str(work / "pkg")), capture_output=True, text=True)
    if not str(Path(check.stdout.strip()).resolve()).startswith(str(repo.resolve())):
        raise SystemExit(f"the gate would not import the mutated copy ({check.stdout.strip() or check.stderr})")
    if args.rerun:
        return rerun(args.rerun, repo, work / "gate.sh", Path(args.out))
    config = work / "cosmic-ray.toml"
    config.write_text(f'[cosmic-ray]\nmodule-path = "impl"\ntimeout = {args.budget + 90:g}\nexcluded-modules = []\n'
                      f'test-command = "bash {work / "gate.sh"}"\n\n[cosmic-ray.distributor]\nname = "local"\n')
    session = work / "session.sqlite"
    subprocess.run(["cosmic-ray", "init", str(config), str(session)], cwd=repo, check=True)
    db = sqlite3.connect(session)
    jobs = [row[0] for row in db.execute("select job_id from work_items order by job_id")]
    keep = set(random.Random(args.seed).sample(jobs, min(args.sample, len(jobs))))
    for table in ("mutation_specs", "work_items"):
        db.executemany(f"delete from {table} where job_id = ?", [(j,) for j in jobs if j not in keep])
    db.commit()
    print(f"{len(jobs)} mutants of impl/; running {len(keep)} (seed {args.seed}), {args.budget:g} s each", flush=True)
    subprocess.run(["cosmic-ray", "exec", str(config), str(session)], cwd=repo, check=True,
                   env=dict(os.environ, PYTHONHASHSEED="0"))
    rows = db.execute("""select s.module_path, s.operator_name, s.start_pos_row, s.definition_name,
                                r.worker_outcome, r.test_outcome, r.diff
                         from mutation_specs s join work_results r using (job_id)""").fetchall()
    results = [dict(zip(("module", "operator", "line", "definition", "worker", "test", "diff"), row, strict=True))
               for row in rows]
    outcome: dict[str, int] = {}
    for r in results:  # cosmic-ray's outcomes: worker NORMAL/ABNORMAL/EXCEPTION, test KILLED/SURVIVED/INCOMPETENT
        key = (r["test"] or "").lower() if (r["worker"] or "").lower() == "normal" else "timeout"
        outcome[key] = outcome.get(key, 0) + 1
    killed = outcome.get("killed", 0) + outcome.get("incompetent", 0) + outcome.get("timeout", 0)
    summary = {"generated": len(jobs), "run": len(results), "outcomes": outcome,
               "score": round(100 * killed / max(1, len(results)), 1), "budget": args.budget, "seed": args.seed}
    Path(args.out).write_text(json.dumps({"summary": summary, "mutants": results}, indent=1) + "\n")
    print(json.dumps(summary))
    return 0


def rerun(recorded: Path, repo: Path, gate: Path, out: Path) -> int:
    """The survivors of ``recorded``, each applied to ``repo`` by its diff and
    judged by ``gate``; a diff that no longer applies is reported as such."""
    previous = json.loads(recorded.read_text())["mutants"]
    survivors = [m for m in previous
                 if (m["test"] or "").lower() == "survived" and (m["worker"] or "").lower() == "normal"]
    print(f"{len(survivors)} survivors of {recorded}: judging each again", flush=True)
    results = []
    for m in survivors:
        diff = m["diff"].split("--- mutation diff ---", 1)[-1].strip("\n") + "\n"
        applied = subprocess.run(["patch", "-p1", "--forward", "--silent"], cwd=repo, input=diff, text=True,
                                 capture_output=True)
        if applied.returncode:
            outcome = "stale"  # the code it mutated is gone or rewritten
        else:
            outcome = "survived" if subprocess.run(["bash", str(gate)]).returncode == 0 else "killed"
            subprocess.run(["patch", "-p1", "-R", "--silent"], cwd=repo, input=diff, text=True, check=True)
        print(f"{outcome:8} {m['module']}:{m['line']} {m['definition']} ({m['operator']})", flush=True)
        results.append({**m, "rerun": outcome})
    counts = {k: sum(r["rerun"] == k for r in results) for k in ("killed", "survived", "stale")}
    out.write_text(json.dumps({"summary": {"rerun_of": str(recorded), **counts}, "mutants": results}, indent=1) + "\n")
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
