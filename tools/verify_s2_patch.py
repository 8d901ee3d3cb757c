"""Check the candidate fix for S2 (docs/findings/S2-fix.patch) on a vLLM release.

    .venv-vllm/bin/python tools/verify_s2_patch.py                  # vLLM 0.34.0, 120 s of search each way
    .venv-vllm/bin/python tools/verify_s2_patch.py --release 0.34.0 --budget 240

The release is installed on its own (as tools/version_matrix.py does, and
cached with it); a copy of it gets the patch (``patch -p1``).  On the
release as shipped and on the patched copy, this runs:

1. the standalone report, docs/findings/repro/S2_failed_load_served_after_abort.py
   (vLLM alone: every failure policy, both schedulers, an abort between
   steps and while the step runs) -- expected to exit 1 as shipped and 0
   patched;
2. the gate's scheduler scope on the layouts ``full`` (recompute policy) and
   ``full-fail`` (vLLM's default policy), at L1 *without* --known-findings,
   so that aborts of requests whose load failed are generated -- expected
   to fail as shipped and to conform patched.

Exit status 0 when every result is the expected one.  The patch is written
against 0.34.0's ``vllm/v1/core/sched/scheduler.py``; another release may
not take it (``patch`` says so, and this exits 2).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATCH = ROOT / "docs" / "findings" / "S2-fix.patch"
REPORT = ROOT / "docs" / "findings" / "repro" / "S2_failed_load_served_after_abort.py"
from kvspec.conformance.vllm import upstream  # noqa: E402


def run(label: str, command: list[str], vllm_dir: Path, timeout: float) -> int:
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": os.pathsep.join(upstream.release_path(vllm_dir))}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith(("BUG:", "ok:", "scheduler ", "all layouts",
                                                                           "1 layout", "2 layout"))]
    print(f"  {label}: exit {done.returncode}")
    for line in lines:
        print(f"    {line}")
    return done.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", default="0.34.0", help="the vLLM release to patch (default 0.34.0)")
    parser.add_argument("--budget", type=float, default=120, help="seconds of gate search per run (default 120)")
    args = parser.parse_args(argv)
    if shutil.which("patch") is None:
        print("verify_s2_patch: needs the patch program", file=sys.stderr)
        return 2
    shipped = upstream.install(args.release)
    expected = {"shipped": 1, "patched": 0}
    failures = 0
    with tempfile.TemporaryDirectory(prefix="kvspec-s2-") as tmp:
        patched = Path(tmp)
        shutil.copytree(shipped / "vllm", patched / "vllm", ignore=shutil.ignore_patterns("__pycache__"))
        applied = subprocess.run(["patch", "-p1", "-s", "-d", str(patched), "-i", str(PATCH)],
                                 capture_output=True, text=True)
        if applied.returncode != 0:
            print(f"verify_s2_patch: {PATCH.name} does not apply to vLLM {args.release}: "
                  f"{(applied.stdout + applied.stderr).strip()}", file=sys.stderr)
            return 2
        for name, vllm_dir in (("shipped", shipped), ("patched", patched)):
            print(f"vLLM {args.release} {name}:")
            report = run("standalone report", [sys.executable, str(REPORT)], vllm_dir, 600)
            gate = run("gate, scheduler scope", [
                sys.executable, "-m", "kvspec.cli", "conform", "--target", "vllm", "--scope", "scheduler",
                "--layout", "full", "--layout", "full-fail", "--level", "L1", "--budget", str(args.budget),
                "--workers", "2", "--seed", "1", "--no-progress", "--trace-dir", str(Path(tmp) / f"traces-{name}")],
                vllm_dir, args.budget * 4 + 600)
            for what, code in (("standalone report", report), ("gate", gate)):
                if code != expected[name]:
                    failures += 1
                    print(f"  UNEXPECTED: the {what} exited {code} on the {name} release (expected "
                          f"{expected[name]})")
    print("the patch fixes S2 as measured" if not failures else f"{failures} unexpected result(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
