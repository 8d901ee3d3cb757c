"""How reliably does the kernel stage's random search find each planted
fault?  Every fault of ``tests/kernel_faults.py`` that the search is meant
to find, against the kernel machine for several seeds, ``--examples`` each
(no shrinking: finding is the point) -- the odds behind
``tests/test_kernel_stage.py::test_search_finds_planted_fault``, which runs
the profile's one seed.

    python tools/kernel_fault_power.py --seeds 10 --examples 60 [--fault NAME ...] [--json OUT]

Prints, per fault, how many seeds found it and whether the check that
fired was the fault's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from hypothesis import HealthCheck, Phase, seed, settings  # noqa: E402
from hypothesis.stateful import run_state_machine_as_test  # noqa: E402

from kernel_faults import FAULTS  # noqa: E402
from kvspec.conformance.machines.kernel import kernel_machine  # noqa: E402
from kvspec.models.architectures import setup  # noqa: E402
from kvspec.models.runner import KernelStageError  # noqa: E402


def found_by(fault, s: int, examples: int) -> str | None:
    """The check that fired within ``examples`` examples of seed ``s``, or None."""
    machine = kernel_machine(setup(fault.model), fault.target, engine_class=fault.engine, skip_checks=fault.disable)
    seed(s)(machine)
    try:
        run_state_machine_as_test(machine, settings=settings(
            derandomize=False, database=None, deadline=None, max_examples=examples, stateful_step_count=20,
            report_multiple_bugs=False, print_blob=False, phases=[Phase.generate],
            suppress_health_check=list(HealthCheck)))
    except KernelStageError as error:
        return error.check
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--examples", type=int, default=60)
    parser.add_argument("--fault", action="append", help="only these faults (repeatable)")
    parser.add_argument("--json", help="write every run here")
    args = parser.parse_args(argv)
    faults = [f for f in FAULTS if f.check is not None and f.search and (not args.fault or f.name in args.fault)]
    runs = []
    for fault in faults:
        start = time.perf_counter()
        checks = [found_by(fault, s, args.examples) for s in range(args.seeds)]
        hits = sum(c == fault.check for c in checks)
        print(f"{fault.name:<56} {hits:>2}/{args.seeds} found by {fault.check} "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
        runs.append({"fault": fault.name, "check": fault.check, "examples": args.examples, "found": checks})
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=2) + "\n")
    return 0 if all(sum(c == r["check"] for c in r["found"]) == args.seeds for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
