"""Operations per hour: one HypoFuzz worker against the gate's search, on one layout.

    python tools/fuzz_rate.py --target impl --scope pool --layout two-groups --seconds 60

Runs, one after the other in this process, (1) HypoFuzz's fuzz target for the
layout as a ``kvspec fuzz`` worker runs it (collected by
kvspec.pytest_plugin.fuzz_targets, inputs by FuzzTarget.run_one: coverage
tracing, mutation, its database writes), and (2) the gate's budgeted search
(runner.run_layout, as ``kvspec conform --budget``), each for --seconds, and
prints each one's checked operations (the machine's own count) and inputs per
hour.  A campaign on N workers runs about N times the first figure, with the
cores to spare.  Needs HypoFuzz (pip install 'kvspec[fuzz]')."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from kvspec import fuzz as campaign


def hypofuzz_rate(target: str, scope: str, layout: str, seconds: float, database: str) -> tuple[int, int, float]:
    from hypofuzz import detection
    from hypofuzz.collection import collect_tests

    campaign.hypofuzz_compat()
    detection._in_hypofuzz_run = True
    with tempfile.TemporaryDirectory() as tmp:
        command = campaign.campaign_command(Path(tmp), target, scope, [layout], database=database)
        (fuzz_target,) = collect_tests(command[command.index("--") + 1:]).fuzz_targets
        machine = fuzz_target.pytest_item.cls.kvspec_machine
        fuzz_target._enter_fixtures()
        start = time.perf_counter()
        while time.perf_counter() - start < seconds and not fuzz_target.has_found_failure:
            fuzz_target.run_one()
        spent = time.perf_counter() - start
        fuzz_target._exit_fixtures()
    return machine.steps_run, machine.examples_run, spent


def gate_rate(target: str, scope: str, layout: str, seconds: float) -> tuple[int, int, float]:
    from kvspec.conformance.runner import Search, machine_for, quiet_loggers, run_layout
    from kvspec.conformance.settings import scope_settings

    quiet_loggers()
    machine = machine_for(scope, layout, target, "L3")
    result = run_layout(machine, Search(scope_settings(scope, "ci"), seconds=seconds, seed=1, swarm=True))
    return result.operations, result.examples, result.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="impl")
    parser.add_argument("--scope", default="pool")
    parser.add_argument("--layout", default="two-groups")
    parser.add_argument("--seconds", type=float, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as db:
        rows = [("HypoFuzz worker", *hypofuzz_rate(args.target, args.scope, args.layout, args.seconds, db)),
                ("gate (--budget)", *gate_rate(args.target, args.scope, args.layout, args.seconds))]
    print(f"{args.target} {args.scope}/{args.layout}, {args.seconds:g} s each, one process:")
    for name, operations, inputs, spent in rows:
        print(f"  {name:<16} {operations:>9,} operations {inputs:>7,} inputs in {spent:5.1f} s: "
              f"{3600 * operations / spent:>12,.0f} operations/hour, {3600 * inputs / spent:>9,.0f} inputs/hour")


if __name__ == "__main__":
    main()
