"""The ``kvspec`` command.

``kvspec conform --target impl`` runs the conformance machines against a
target -- the pool machine over several pool layouts, the scheduler-like
manager machine over model layouts -- and prints one line per layout; a
failing layout's minimal run is printed step by step and saved as a trace.
``kvspec replay TRACE.json`` runs a saved trace again, against the target
that produced it or another, and shows the step where it diverges.
``kvspec vectors generate --out DIR`` writes the spec's behaviour as
language-neutral JSON vectors (docs/VECTORS.md); ``kvspec vectors check DIR
--target T`` replays them against a target.

Exit codes: 0 conforms, 1 a rule was broken (or the target diverged from
the spec), 2 usage or environment error (one line, no traceback), 3
(``conform``) nothing broke but some layout was not searched -- its turn
never came within the budget, or it ran fewer operations than its scope's
floor -- so the run is no pass for it (``--allow-unsearched``: exit 0), 4
interrupted (SIGINT or SIGTERM) before a verdict: ``conform`` still writes
its reports with what it searched, and exits 1 if it had found a failure.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvspec import __version__
from kvspec.conformance.findings import AVOIDABLE, COMPONENTS, Finding, known_findings
from kvspec.conformance.gate import (
    FirstFailure,
    GateOptions,
    Listener,
    run_gate,
)
from kvspec.conformance.machines.catalogue import CATALOGUE
from kvspec.conformance.machines.machinery import unnamed_failure
from kvspec.conformance.report import BUDGET_SPENT, FAIL_FAST, STEERED, TOO_FEW, LayoutResult
from kvspec.conformance.runner import (
    BLOCK_SCOPES,
    LEVELS,
    SCOPES,
    machine_for,
    model_layout_names,
    quiet_loggers,
    replay,
)
from kvspec.conformance.settings import PROFILES
from kvspec.conformance.trace import Trace, TraceError
from kvspec.conformance.vectors import content_view
from kvspec.conformance.vectors.codec import CHAPTERS, check, targets_for
from kvspec.conformance.vectors.corpus import SIZES, generate
from kvspec.conformance.vllm.compat import REFERENCE_RELEASE
from kvspec.errors import SetupError, TargetImportError
from kvspec.spec import releases

UsageError = SetupError  # what the command reports in one line, exit 2
INTERRUPTED_EXIT = 4  # SIGINT or SIGTERM stopped the command before its verdict


class ConformPrinter(Listener):
    """``kvspec conform``'s lines: the header, a line per layout as it
    finishes, a failure the moment it is found -- in full the first time
    its cause is seen, in a line after that (one bug on sixteen layouts is
    one minimal run to read, not sixteen).  Module-level, so that worker
    processes can print first failures too."""

    def __init__(self) -> None:
        self.shown: dict[str, str] = {}  # a cause printed in full -> the layout it was printed for

    def begin(self, options: GateOptions, steered: tuple[Finding, ...], avoid: frozenset[str]) -> None:
        if options.cross_release_of:
            print(f"warning: the vLLM under test is {options.cross_release_of}, judged by the rules of vLLM "
                  f"{options.release} (--cross-release)")
        header = f"kvspec conform: target={options.target} level={options.level} profile={options.profile}"
        if options.budget:
            header += f" budget={options.budget:g}s"
        print(header + (f" seed={options.seed}" if options.seed is not None else ""))
        if warning := releases.as_release(options.release or None).warning():
            print(warning)
        if options.findings_of not in (None, options.target):
            print(f"target {options.target} runs {options.findings_of}'s code: {options.findings_of}'s known findings "
                  "apply to it (docs/findings.md)")
        if options.against:
            print(f"in lockstep with the upstream {options.against} instead of the spec (pool and manager scope): "
                  "every difference is the target's change")
        if steered:
            print(f"steering around known findings {', '.join(f.id for f in steered)} (docs/findings.md)")
        for component in dict.fromkeys(f.component for f in options.inherited):
            ids = ", ".join(f.id for f in options.inherited if f.component == component)
            print(f"steering around {COMPONENTS[component]}'s known findings {ids}: {options.target} runs under "
                  f"{COMPONENTS[component]} and does not replace it; a failure that {COMPONENTS[component]} "
                  "shows with its own block manager too is reported as its, not the target's (--strict counts "
                  "both)")
        if avoid:
            print(f"the machines do not send: {'; '.join(sorted(avoid))}")
        print(f"{'scope':<8} {'layout':<24} {'operations':>10} {'seconds':>8}  result", flush=True)

    def first_failure(self, f: FirstFailure) -> None:
        label = f" (looks like known finding {f.known}; replaying it decides whose it is)" if f.known else ""
        print(f"{f.scope:<8} {f.layout:<24} first failing check at {f.seconds:.1f} s{label}: {f.broken} -- "
              f"shrinking; the run as found ({f.steps} steps): {f.path}", flush=True)

    def layout_done(self, r: LayoutResult) -> None:
        if r.skipped is not None:  # steered around, or the budget or --fail-fast ended the run before its turn
            shown = {BUDGET_SPENT: "not searched (the budget is spent)",
                     FAIL_FAST: "not searched (--fail-fast: stopped at a failure)"}.get(
                r.skipped, f"skipped ({r.skipped.removeprefix(STEERED)})")
            operations, seconds = "-", "-"  # it did not run, or (below the floor) ran too little to count
            if r.skipped.startswith(TOO_FEW):
                shown, operations, seconds = f"not searched ({r.skipped})", r.operations, f"{r.seconds:.1f}"
            print(f"{r.scope:<8} {r.layout:<24} {operations:>10} {seconds:>8}  {shown}", flush=True)
            return
        reached = f"  ({r.distinct_states} distinct states)" if r.conforms and r.distinct_states else ""
        verdict = r.verdict()
        if not r.conforms and (first := self.shown.setdefault(r.cause, f"{r.scope}/{r.layout}")) != \
                f"{r.scope}/{r.layout}":
            verdict = f"FAILED: {r.cause}, as {first} above" + (f" -- saved: {r.trace_file}" if r.trace_file else "")
        print(f"{r.scope:<8} {r.layout:<24} {r.operations:>10} {r.seconds:>8.1f}  {verdict}{reached}", flush=True)


def conform(args: argparse.Namespace) -> int:
    options = GateOptions(
        target=args.target, scope=args.scope, level=args.level, layouts=args.layout, profile=args.profile,
        examples=args.examples, budget=args.budget, seed=args.seed, known_findings=args.known_findings,
        strict=args.strict,
        avoid=args.avoid or [], database=args.database, fail_fast=args.fail_fast, workers=args.workers,
        shard=args.shard, release=args.release, cross_release=args.cross_release, against=args.against,
        report_dir=args.report_dir,
        trace_dir=args.trace_dir, progress=args.progress if args.progress is not None else sys.stderr.isatty(),
        coverage=args.coverage,
        command=" ".join(["kvspec", *map(shlex.quote, args.argv)]), started=args.started)
    report = run_gate(options, ConformPrinter())
    failures = len(report.failures)
    print()
    print("\n".join(report.rule_table(report.checked)))
    print()
    if report.coverage is not None:
        c = report.coverage
        print(f"spec branches taken: {c['taken']} of {c['branches']}")
        if c["never_met"]:
            print(f"rules never past their guards (no state they judge arose): {', '.join(c['never_met'])}")
        print()
    for finding, layouts in report.known_groups().items():
        steer = "" if args.known_findings else " (--known-findings steers around it)"
        print(f"looks like known finding {finding}\n    on {len(layouts)} layout(s): {', '.join(layouts)}{steer}")
    for r in report.others_failures:
        print(f"not {args.target}'s: {r.scope}/{r.layout} -- {r.known_label} ({r.trace_file})")
    if causes := report.causes():
        print(f"{len(causes)} cause(s):")
        for cause, results in causes.items():
            clearest = results[0]
            print(f"  {cause}: {len(results)} layout(s) ({', '.join(f'{r.scope}/{r.layout}' for r in results)}); "
                  f"clearest: {clearest.scope}/{clearest.layout}" + (f", {clearest.trace_file}"
                                                                     if clearest.trace_file else ""))
    unsearched = report.unsearched
    if report.interrupted:
        print(f"interrupted by {report.interrupted}: the report holds the {len(report.results) - len(unsearched)} "
              f"layout(s) done and any failure found so far; {len(unsearched)} not searched")
    if failures:
        print(f"{failures} layout(s) failed")
    elif unsearched and not report.interrupted:
        print(f"nothing broke, but {len(unsearched)} of {len(report.results)} layout(s) were not searched: "
              f"{', '.join(f'{r.scope}/{r.layout}' for r in unsearched)} -- no pass for them"
              + ("" if args.allow_unsearched else " (exit 3; --allow-unsearched accepts it)"))
    else:
        print("all layouts conform")
    for path in report.written:
        print(f"wrote {path}")
    if failures:
        return 1
    if report.interrupted:
        return INTERRUPTED_EXIT
    return 3 if unsearched and not args.allow_unsearched else 0


def _workers(text: str) -> int:
    """``--workers N`` or ``auto`` (the cores this process may run on)."""
    if text == "auto":
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of processes or 'auto', got {text!r}") from None


def replay_command(args: argparse.Namespace) -> int:
    try:
        trace = Trace.load(args.trace)
    except TraceError as error:
        raise UsageError(str(error)) from None
    target = args.target or trace.target
    if not target:
        raise UsageError(f"trace {args.trace} names no target; give one with --target")
    if args.budget <= 0:
        raise UsageError(f"--budget must be a positive number of seconds, got {args.budget:g}")
    level = args.level or trace.level
    if args.expect_failure and not trace.failure:
        raise UsageError(f"--expect-failure: trace {args.trace} records no failure to expect")
    quiet_loggers()
    recorded = ""
    if trace.failure:
        recorded = f"; recorded failure at step {trace.failure.get('step')}: " + (
            ", ".join(trace.failure.get("rules") or []) or unnamed_failure(trace.failure.get("message", "")))
    upstream = f", in lockstep with the upstream {trace.against}" if trace.against else ""
    print(f"kvspec replay: {args.trace}: {trace.scope} layout {trace.layout}, {len(trace.steps)} steps, "
          f"recorded against {trace.target or '?'} at {trace.level}{upstream}{recorded}")
    print(f"replaying against target={target} level={level}")
    machine_for(trace.scope, trace.layout, target, level)  # usage errors before any step runs

    def show(i: int, step) -> None:
        if not args.quiet:
            print(f"step {i} {step.rule}: ok")
            for op in step.operations:
                print(f"    {op}")

    try:
        outcome = replay(trace, target, level, on_step=show, seconds=args.budget)
    except TraceError as error:
        raise UsageError(f"trace {args.trace} does not fit the {trace.scope} machine: {error}") from None
    if outcome.conforms:
        print(f"{target} conforms at {level}: {outcome.message}")
        if trace.failure:
            print(f"the recorded failure did NOT reproduce (recorded at step {trace.failure.get('step')})"
                  + ("" if args.expect_failure else "; --expect-failure makes that exit 1"))
            return 1 if args.expect_failure else 0
        return 0
    steps = outcome.trace.steps
    print(f"step {outcome.diverged_at} {steps[-1].rule if steps else '?'}: DIVERGED")
    for op in steps[-1].operations if steps else []:
        print(f"    {op}")
    for line in outcome.message.splitlines():
        print(f"  {line}")
    print(f"{target} diverges at step {outcome.diverged_at} of {outcome.steps}")
    if trace.failure:
        recorded = trace.failure.get("step")
        if outcome.diverged_at == recorded:
            print("the recorded failure reproduced, at the same step")
            return 0 if args.expect_failure else 1
        print(f"it fails differently from the recording: at step {outcome.diverged_at}, recorded at step {recorded}")
    return 1


def show_command(args: argparse.Namespace) -> int:
    """``kvspec show``: the pool after every step of a trace, as text and SVG."""
    from kvspec.conformance.show import film, svg, text

    try:
        trace = Trace.load(args.trace)
    except TraceError as error:
        raise UsageError(str(error)) from None
    target = args.target or trace.target or "spec"
    level = args.level or trace.level or "L3"
    machine_for(trace.scope, trace.layout, target, level)  # usage errors before any step runs
    quiet_loggers()
    try:
        frames = film(trace, target, level)
    except TraceError as error:
        raise UsageError(f"trace {args.trace} does not fit the {trace.scope} machine: {error}") from None
    title = f"{args.trace}: {trace.scope} {trace.layout} against {target} at {level}"
    print(title)
    print("\n".join(text(frames, color=sys.stdout.isatty())))
    if args.svg:
        Path(args.svg).write_text(svg(frames, title))
        print(f"wrote {args.svg}")
    return 0


def kernels_command(args: argparse.Namespace) -> int:
    """The kernel stage: a target's block tables through real kernels."""
    from kvspec.conformance.kernel_stage import KernelOptions, plan_kernel_stage

    options = KernelOptions(target=args.target, models=args.model or ["all"], scale=args.scale, layers=args.layers,
                            kernels=None if args.kernels is None else
                            [k.strip() for k in args.kernels.split(",") if k.strip()], device=args.device,
                            dtype=args.dtype, profile=args.profile, examples=args.examples, seed=args.seed,
                            worker=args.worker, budget=args.budget, report_dir=args.report_dir,
                            known_findings=args.known_findings,
                            command=" ".join(["kvspec", *map(shlex.quote, args.argv)]))
    plan = plan_kernel_stage(options)  # usage errors before the header
    failures = 0

    def show(setup, result) -> None:
        nonlocal failures
        verdict = "ok" if result.passed else "FAILED"
        print(f"{setup.name:<28} {result.totals['steps']:>7} {result.checks:>8} {result.seconds:>8.1f}  {verdict}",
              flush=True)
        if not result.passed:
            failures += 1
            print(f"    {type(result.failure).__name__}: {result.failure}")
            for line in result.example:
                print(f"      {line}")

    print(f"kvspec kernels: target={options.target} worker={options.chosen_worker()} scale={options.scale} "
          f"layers={options.layers} "
          f"kernels={','.join(options.kernels)} device={options.device} dtype={options.dtype} "
          f"profile={options.profile}")
    if options.known_findings:
        steered = ", ".join(f.id for f in plan.steered)
        print(f"steering around known findings {steered} (docs/findings.md)" if steered else
              "known findings: the kernel machine sends none of their inputs here (docs/findings.md)")
    for setup in plan.setups:
        if line := plan.runner_line(setup.name):
            print(f"runner {setup.name}: {line}")
    print(f"{'layout':<28} {'steps':>7} {'checks':>8} {'seconds':>8}  result", flush=True)
    for name, why in plan.skipped.items():
        print(f"{name:<28} {0:>7} {0:>8} {0:>8.1f}  skipped ({why})")
    results = plan.run(on_result=show)
    print()
    nothing_ran = not plan.searched() and any(why.startswith("runner ") for why in plan.skipped.values())
    if nothing_ran:  # an environment that cannot run any model's runner: no verdict, no pass
        print("no layout could run: each model's runner cannot run here (see the skips above)")
    else:
        print("every layout passed every check" if not failures else f"{failures} layout(s) failed")
    if options.report_dir:
        from kvspec.conformance.kernel_stage import stage_report
        from kvspec.conformance.report import write_reports

        for path in write_reports(stage_report(plan, results), options.report_dir):
            print(f"wrote {path}")
    return 1 if failures else 2 if nothing_ran else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvspec",
        description="Check a KV-cache block manager against the executable specification of vLLM v1's block "
        f"manager (reference: vLLM {REFERENCE_RELEASE}).",
        epilog="Exit codes: 0 conforms, 1 a rule broke or the target diverged from the spec, 2 usage or "
        "environment error, 3 (conform) nothing broke but some layout was not searched, 4 interrupted (SIGINT or "
        "SIGTERM; what was found so far is reported).  The specification: "
        "spec/README.md; the vectors' format: docs/VECTORS.md.",
    )
    parser.add_argument("--version", action="version",
                        version=f"kvspec {__version__} (reference: vLLM {REFERENCE_RELEASE})")
    sub = parser.add_subparsers(dest="command", required=True)
    _conform_command_line(sub)
    _fuzz_command_line(sub)
    _replay_command_line(sub)
    _show_command_line(sub)
    _kernels_command_line(sub)
    _mutate_command_line(sub)
    _vectors_command_line(sub)
    # Listed for `kvspec --help` only: main() hands `prove` its arguments before parsing.
    sub.add_parser(
        "prove", add_help=False,
        help="prove the CrossHair obligations over the pool model and impl's own code (kvspec prove --help)",
    )
    return parser


def _conform_command_line(sub: Any) -> None:
    """``kvspec conform``'s arguments."""
    run = sub.add_parser("conform", help="check a target against the specification")
    run.add_argument("--target", default="impl",
                     help="impl, spec, vllm, sglang, lmdeploy, or module:factory (default impl)")
    run.add_argument(
        "--scope", default="all", choices=["pool", "manager", "scheduler", "cache", "offload", "all"],
        help="pool: the block pool alone; manager: the KVCacheManager driven as a scheduler drives it; "
        "scheduler: vLLM's own scheduler over the target (vllm, or impl through the drop-in; needs vLLM); "
        "cache: any engine's prefix cache and allocator through its content view (spec chapter 10: sglang, "
        "lmdeploy, impl, spec); offload: an offloading tier, vLLM's OffloadingManager API (spec chapter 11: spec, "
        "impl, vllm, module:factory); all: each of them the target has (default; offload for impl and spec, "
        "by name for vllm; sglang and lmdeploy: cache)",
    )
    run.add_argument(
        "--level", default="L3", choices=sorted(LEVELS),
        help="L1 safety rules; L2 + optimal hits; L3 + identical observations to the spec (default L3)",
    )
    run.add_argument(
        "--layout", action="append",
        help="; ".join(f"{scope}: {', '.join(CATALOGUE[scope])}" for scope in SCOPES)  # no spec built to list them
        + f"; real models (manager): {', '.join(model_layout_names())}, or 'models' for all of them "
        "(repeatable; default: every layout of the scopes run, not the models)",
    )
    run.add_argument("--profile", default="ci", choices=sorted(PROFILES), help="Hypothesis profile (default ci)")
    size = run.add_mutually_exclusive_group()
    size.add_argument("--examples", type=int, help="examples per layout (overrides the profile)")
    size.add_argument("--budget", type=float, metavar="SECONDS",
                      help="search for this many seconds in all, shrinking included: the layouts take turns in "
                      "rounds of growing slices, more for those still reaching new states (with --workers N: "
                      "N processes, each taking its share of the layouts in rounds)")
    run.add_argument("--seed", type=int, help="make the search repeatable (a budgeted run prints its seed)")
    run.add_argument("--known-findings", action="store_true",
                     help="steer around the inputs of the target's known findings (docs/findings.md) "
                     "and search the rest")
    run.add_argument("--strict", action="store_true",
                     help="also send the inputs of the known findings of components the target runs on and does "
                     "not replace (impl under vLLM's scheduler: vLLM's scheduler's findings), and count every "
                     "failure against the target, whoever's it is")
    run.add_argument("--avoid", action="append", metavar="INPUT",
                     help="an input the machines must not send (repeatable): " + "; ".join(
                         f"{name} ({what})" for name, what in AVOIDABLE.items()))
    run.add_argument("--database", metavar="DIR|URL",
                     help="keep Hypothesis's failing examples here and replay them first next time: a directory "
                     "(persist it between CI runs), or a Redis server, redis://HOST:PORT/N, shared by every shard "
                     "and machine that reaches it (needs kvspec[redis])")
    run.add_argument("--fail-fast", "-x", action="store_true",
                     help="stop at the first layout that fails (other than as a known finding): the gate's "
                     "verdict as soon as it is known")
    run.add_argument("--allow-unsearched", action="store_true",
                     help="exit 0, not 3, when nothing broke but some layout was not searched (its turn never "
                     "came within the budget, or it ran fewer operations than its scope's floor)")
    run.add_argument("--workers", "-n", type=_workers, default=1, metavar="N",
                     help="search in N processes at once; 'auto': one per core this process may use "
                     "(default 1)")
    run.add_argument("--shard", metavar="I/N",
                     help="run only the I-th of N round-robin shares of the layouts (one CI machine each)")
    run.add_argument("--release", metavar="X.Y.Z",
                     help="judge by the rules of vLLM release X.Y.Z (spec/README.md, chapter Releases; default: "
                     "the installed vLLM's for --target vllm, else the base release); a release newer than "
                     "every known one is judged by the newest known one's, with a warning")
    run.add_argument("--cross-release", action="store_true",
                     help="with --target vllm: judge the installed vLLM by the rules of --release X although it is "
                     "another release (refused without this flag; said on the first line and in the report)")
    run.add_argument("--against", metavar="UPSTREAM",
                     help="run the target in lockstep with an upstream vLLM instead of the spec, at pool and "
                     "manager scope: vllm==X.Y.Z (that release, installed alone under ~/.cache/kvspec) or the "
                     "python of another environment with vLLM; every difference is the target's change "
                     "(docs/vllm.md: Gate your vLLM fork)")
    run.add_argument("--report-dir", help="write report.json, report.md and junit.xml here")
    run.add_argument("--trace-dir",
                     help="save each failing layout's minimal run here (default: REPORT_DIR/traces with "
                     "--report-dir, else kvspec-traces)")
    run.add_argument("--coverage", action="store_true",
                     help="measure what the run exercised of the spec (its branches; per rule, its predicates "
                     "evaluated and past their guards) into the report; needs coverage.py, slows the search")
    run.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="a progress bar on stderr (default: when stderr is a terminal)")
    run.set_defaults(func=conform)


def _fuzz_command_line(sub: Any) -> None:
    """``kvspec fuzz``'s arguments."""
    fz = sub.add_parser("fuzz", help="a long campaign on HypoFuzz: every core, a dashboard, a shared database")
    fz.add_argument("--target", default="impl", help="impl, spec, vllm, or module:factory (default impl)")
    fz.add_argument("--scope", default="all", choices=["pool", "manager", "scheduler", "cache", "offload", "all"],
                    help="as for conform (default all: every scope the target has)")
    fz.add_argument("--layout", action="append", help="only this layout (repeatable; default: every layout)")
    fz.add_argument("--level", default="L3", choices=sorted(LEVELS), help="L1, L2 or L3 (default L3)")
    fz.add_argument("--workers", "-n", type=_workers, default=2, metavar="N",
                    help="HypoFuzz's processes ('auto': one per core; default 2)")
    fz.add_argument("--database", metavar="DIR|URL", default=".kvspec-fuzz/examples",
                    help="the example database the campaign saves its failures in, and `kvspec conform "
                    "--database` replays them from: a directory (default .kvspec-fuzz/examples), or "
                    "redis://HOST:PORT/N shared by every machine of the campaign")
    fz.add_argument("--seconds", type=float, help="stop after this many seconds (default: run until Ctrl-C)")
    fz.add_argument("--known-findings", action="store_true",
                    help="steer around the target's known findings (docs/findings.md), as conform does")
    fz.add_argument("--dashboard", action=argparse.BooleanOptionalAction, default=True,
                    help="serve HypoFuzz's live dashboard (default: yes)")
    fz.add_argument("--port", type=int, default=9999, help="the dashboard's port (default 9999)")
    fz.set_defaults(func=fuzz)


def _replay_command_line(sub: Any) -> None:
    """``kvspec replay``'s arguments."""
    rep = sub.add_parser("replay", help="replay a saved trace and show where a target diverges")
    rep.add_argument("trace", help="a trace file saved by kvspec conform")
    rep.add_argument("--target", help="impl, spec, vllm, or module:factory (default: the trace's target)")
    rep.add_argument("--level", choices=sorted(LEVELS), help="default: the trace's level")
    rep.add_argument("--quiet", action="store_true", help="print only the diverging step and the verdict")
    rep.add_argument("--expect-failure", action="store_true",
                     help="the trace's recorded failure is expected: exit 0 when the replay fails as recorded, 1 "
                     "when it does not (a finding that must still show, a planted fault that must stay caught)")
    rep.add_argument("--budget", type=float, default=300.0, metavar="SECONDS",
                     help="stop a target that has not finished the replay by then: it hangs (default 300)")
    rep.set_defaults(func=replay_command)


def _show_command_line(sub: Any) -> None:
    """``kvspec show``'s arguments."""
    show = sub.add_parser("show", help="draw the pool after every step of a trace (text, and SVG with --svg)")
    show.add_argument("trace", help="a trace file saved by kvspec conform")
    show.add_argument("--target", help="impl, spec, vllm, or module:factory (default: the trace's target)")
    show.add_argument("--level", choices=sorted(LEVELS), help="default: the trace's level")
    show.add_argument("--svg", metavar="FILE", help="also write the picture as SVG")
    show.set_defaults(func=show_command)


def _kernels_command_line(sub: Any) -> None:
    """``kvspec kernels``'s arguments."""
    ker = sub.add_parser("kernels", help="run block tables through attention and Mamba kernels (the kernel stage)")
    ker.add_argument("--target", default="impl", help="impl, vllm, or module:factory (a manager target; default impl)")
    ker.add_argument("--model", action="append",
                     help="an architecture of kvspec.models (llama-3-8b, gemma-3, ...), 'all' (default; with vLLM's "
                     "worker, nemotron-h-8b at its real block sizes first: the kernel-block split), or a manager "
                     "conformance layout (repeatable)")
    ker.add_argument("--scale", default="tiny",
                     help="tiny (2-token blocks: every boundary within 32 tokens), small (real block sizes and "
                     "windows, small layers) or gpu (real heads and head sizes, bf16); default tiny")
    ker.add_argument("--layers", type=int, default=2,
                     help="layers per group, each with its own K/V or state behind the group's one block table, laid "
                     "out as the worker plans the KV-cache tensors (default 2)")
    ker.add_argument("--kernels",
                     help="comma-separated: reference, flex, vllm (vLLM's Triton kernels); default reference,flex, "
                     "and reference,flex,vllm with --target vllm")
    ker.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ker.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ker.add_argument("--profile", default="ci", choices=sorted(PROFILES), help="Hypothesis profile (default ci)")
    ker.add_argument("--examples", type=int, help="examples per layout (overrides the profile)")
    ker.add_argument("--seed", type=int, help="a random search with this seed (default: the profile's)")
    ker.add_argument("--budget", type=float, metavar="SECONDS",
                     help="search for SECONDS in all, the models sharing them, instead of a number of examples")
    ker.add_argument("--report-dir", help="write report.json, report.md and junit.xml here (as conform does)")
    ker.add_argument("--known-findings", action="store_true",
                     help="steer around the target's known findings (docs/findings.md), as conform does: a manager "
                     "layout that reproduces one is not searched")
    ker.add_argument("--worker", choices=["kvspec", "vllm"],
                     help="whose block tables, slot mapping and cache writes the kernels read: vllm (vLLM's own "
                     "MultiGroupBlockTable and triton_reshape_and_cache_flash, checked against kvspec's tables; "
                     "the default with --target vllm) or kvspec (its model of vLLM's worker; the default otherwise)")
    ker.set_defaults(func=kernels_command)


def _mutate_command_line(sub: Any) -> None:
    """``kvspec mutate``'s arguments."""
    mut = sub.add_parser("mutate", help="measure the gate: run it against named mutants of impl or vLLM")
    mut.add_argument("--target", default="impl", choices=["impl", "vllm"], help="whose classes to mutate")
    mut.add_argument("--level", action="append", choices=sorted(LEVELS), help="repeatable (default L1 and L3)")
    mut.add_argument("--budget", type=float, default=60.0, help="the gate's --budget for each run (default 60)")
    mut.add_argument("--mutant", action="append", metavar="NAME", help="only these mutants (repeatable)")
    mut.add_argument("--jobs", "-j", type=int, default=1, help="runs at once, one process each (default 1)")
    mut.add_argument("--seed", type=int, help="the gate's --seed (default: a random search per run)")
    mut.add_argument("--report-dir", help="write mutation.json and mutation.md here")
    mut.add_argument("--list", action="store_true", help="list the catalogue and exit")
    mut.set_defaults(func=mutate_command)


def _vectors_command_line(sub: Any) -> None:
    """``kvspec vectors``'s arguments."""
    vec = sub.add_parser("vectors", help="language-neutral conformance vectors: generate them, check a target")
    vsub = vec.add_subparsers(dest="vectors_command", required=True)
    gen = vsub.add_parser("generate", help="derive the vectors corpus from the spec")
    gen.add_argument("--out", required=True, help="the directory to write (created; existing vectors are replaced)")
    gen.add_argument("--size", default="ci", choices=sorted(SIZES),
                     help="how many machine walks per layout: cases none (what vectors/ holds), quick 2 per "
                     "manager layout, ci 8 (the default), long 15")
    gen.add_argument("--release", metavar="X.Y.Z",
                     help="the spec of vLLM release X.Y.Z (spec/README.md, chapter 9; default: the base release), "
                     "recorded in every vector so that a check judges by it")
    gen.set_defaults(func=vectors_generate)
    chk = vsub.add_parser("check", help="replay a vectors corpus against a target")
    chk.add_argument("dir", help="a directory of vectors (or one vector file)")
    chk.add_argument("--target", default="impl", help="impl, spec, vllm, or module:factory (default impl)")
    chk.add_argument("--scope", default="all", choices=["pool", "manager", "offload", "all"],
                     help="the vectors to replay (default all: pool, manager and the offload tier's; a "
                     "module:factory target serves one scope)")
    chk.add_argument("--known-findings", action="store_true",
                     help="a vector exercising one of the target's known findings may diverge")
    chk.add_argument("--verbose", action="store_true", help="one line per vector, not only the failures")
    chk.set_defaults(func=vectors_check)


def vectors_generate(args: argparse.Namespace) -> int:
    """``kvspec vectors generate``: the corpus, and what it exercises."""
    out = Path(args.out)
    try:
        release = releases.judged(args.release).known if args.release else None
    except ValueError as error:
        raise UsageError(f"--release: {error}") from None
    try:
        corpus = generate(out, args.size, release=release)
    except ValueError as error:
        raise UsageError(f"--out: {error}") from None
    operations = sum(f["steps"] for f in corpus.files)
    print(f"{len(corpus.files)} vectors, {operations} operations, written to {out}"
          + (f" (the spec of vLLM {release})" if release else ""))
    print(f"rules exercised: {len(corpus.rules)} of {len(corpus.all_rules)}"
          + (f" (none exercise {', '.join(corpus.unexercised)})" if corpus.unexercised else ""))
    unread = corpus.unread_chapters
    print(f"chapters of spec/README.md needed: {len(CHAPTERS) - len(unread)} of {len(CHAPTERS)}"
          + (f" (none needs {', '.join(unread)})" if unread else ""))
    if corpus.coverage:
        c = corpus.coverage
        print(f"spec branches exercised: {c['taken']} of {c['branches']} ({100 * c['taken'] / c['branches']:.0f}%)")
    else:
        print("spec branches: not measured (install coverage.py)")
    return 0


def vectors_check(args: argparse.Namespace) -> int:
    """``kvspec vectors check``: replay every vector; exit 1 on any difference or unreadable file."""
    root = Path(args.dir)
    if not root.exists():
        raise UsageError(f"no such vectors directory or file: {root}")
    scopes = [*BLOCK_SCOPES, "offload"] if args.scope == "all" else [args.scope]
    factories = targets_for(args.target, scopes)
    known = frozenset(f.id for f in known_findings(args.target, scopes)) if args.known_findings else frozenset()
    quiet_loggers()

    def show(path: Path, problems: list[str], expected: list[str]) -> None:
        name = path.relative_to(root) if root.is_dir() else path
        if expected:
            print(f"known {name} ({', '.join(expected)})")
        elif problems:
            print(f"FAIL {name}")
            for line in problems[:3]:
                print(f"     {line}")
        elif args.verbose:
            print(f"ok   {name}")

    report = check(root, factories, known, on_file=show)
    for why in report.unreadable.values():
        print(f"UNREADABLE {why}")
    replayed = len(report.files) - len(report.unreadable) - len(report.skipped)
    print(f"{replayed} vectors replayed against {args.target}: {len(report.differences)} differ, "
          f"{len(report.known)} diverge as known findings, {len(report.unreadable)} unreadable"
          + (f", {len(report.skipped)} of another scope not replayed" if report.skipped else ""))
    if not report.files:
        print(f"no vector files under {root}")
    views = root / content_view.FILE if root.is_dir() else None
    view_problems: list[str] = []
    if views is not None and views.exists():  # chapter 10's cases judge the rules' predicates, not a target
        view_problems = content_view.check(views)
        for line in view_problems:
            print(f"FAIL {line}")
        cases = len(views.read_text().splitlines())
        print(f"{cases} content-view cases replayed against the spec's chapter 10 predicates: "
              f"{len(view_problems)} differ")
    return 0 if report.ok and not view_problems else 1


def mutate_command(args: argparse.Namespace) -> int:
    """``kvspec mutate``: the gate against the mutant catalogue."""
    from kvspec.conformance.mutation.mutants import MUTANTS
    from kvspec.conformance.mutation.mutate import check_mutation, mutate

    if args.list:
        for m in MUTANTS:
            print(f"{m.name:<28} {m.bug_class:<40} {'/'.join(m.families):<10} {m.what}")
        return 0
    levels = args.level or ["L1", "L3"]
    try:
        names = check_mutation(args.target, args.budget, args.jobs, args.mutant)
    except ValueError as error:
        raise UsageError(str(error)) from None
    print(f"kvspec mutate: target={args.target} levels={','.join(levels)} budget={args.budget:g}s "
          f"mutants={len(names)} jobs={args.jobs}", flush=True)
    print(f"{'mutant':<28} {'level':<5} {'result':<9} {'first fail s':>12} {'verdict s':>9}  caught by", flush=True)

    def show(run) -> None:
        result = "killed" if run.killed else ("ERROR" if run.error else "survived")
        first = "-" if run.first_failure is None else f"{run.first_failure:.1f}"
        verdict = "-" if run.verdict is None else f"{run.verdict:.1f}"
        how = ", ".join(run.caught_by) + (f" ({run.layout})" if run.layout else "") if run.killed else \
            (run.error or run.survived_because or "")
        print(f"{run.mutant:<28} {run.level:<5} {result:<9} {first:>12} {verdict:>9}  {how}", flush=True)

    report = mutate(args.target, levels, args.budget, names, args.jobs, args.seed, on_run=show)
    print()
    for level in report.levels():
        s = report.summary(level)
        print(f"{level}: {s['killed']}/{s['mutants']} killed ({s['score']} %), median {s['median_first_failure']} s "
              f"to the first failing check, {s['median_verdict']} s to the verdict")
    if args.report_dir:
        print(f"wrote {' and '.join(map(str, report.write(args.report_dir)))}")
    return 0 if all(r.error is None for r in report.runs) else 1


def fuzz(args: argparse.Namespace) -> int:
    """``kvspec fuzz``: a HypoFuzz campaign over the machines (kvspec.fuzz)."""
    from kvspec import fuzz as campaign
    from kvspec.conformance.runner import check_layout, is_layout, resolve, scopes_for
    from kvspec.conformance.settings import DatabaseError, example_database

    if (why := campaign.hypofuzz_missing()) is not None:
        raise UsageError(why)
    if args.seconds is not None and args.seconds <= 0:
        raise UsageError(f"--seconds must be positive, got {args.seconds:g}")
    scopes = scopes_for(args.target) if args.scope == "all" else [args.scope]
    for layout in args.layout or []:
        if not any(is_layout(s, layout) for s in scopes):
            check_layout(scopes[0], layout)  # names the scope's layouts
    resolve(args.target, scopes)  # an unusable target stops the campaign before it starts, in one line
    try:
        example_database(args.database)  # a Redis server that cannot be reached: here, not in every worker
    except DatabaseError as error:
        raise UsageError(str(error)) from None
    if args.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {args.workers}")
    return campaign.run_campaign(args.target, args.scope, args.layout, args.level, args.workers, args.database,
                                 args.seconds, args.dashboard, args.port, args.known_findings)


def prove_command(argv: list[str]) -> int:
    """``kvspec prove``: :mod:`kvspec.proofs.run` under the kvspec command
    (its own options, so ``main`` hands it the arguments unparsed)."""
    from kvspec.proofs.run import main as prove_main

    return prove_main(argv, prog="kvspec prove")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["prove"]:
        return prove_command(argv[1:])
    started = time.perf_counter()
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv, args.started = argv, started
    try:
        return args.func(args)
    except UsageError as error:
        print(f"kvspec: error: {error}", file=sys.stderr)
        return 2
    except TargetImportError as error:  # outside conform's gate (replay, vectors): one line, the target's failure
        print(f"kvspec: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("kvspec: interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT
    except BrokenPipeError:  # the reader went away (`kvspec conform | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
