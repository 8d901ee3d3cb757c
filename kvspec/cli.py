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
the spec), 2 usage or environment error (one line, no traceback).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import re
import shlex
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

from kvspec import __version__
from kvspec.conformance.findings import AVOIDABLE, is_avoidable, known_findings, matching_finding
from kvspec.conformance.machines.machinery import ConformanceError
from kvspec.conformance.report import LayoutResult
from kvspec.conformance.runner import (
    LEVELS,
    SCOPES,
    Progress,
    Search,
    SetupError,
    check_target,
    is_layout,
    layout_names,
    machine_for,
    model_layout_names,
    replay,
    resolve_target,
    rules_checked,
    run_layout,
)
from kvspec.conformance.settings import PROFILES, manager_settings
from kvspec.conformance.trace import Trace, TraceError, trace_file_name
from kvspec.conformance.vectors.codec import HASH_SEED, check
from kvspec.conformance.vectors.corpus import SIZES, generate
from kvspec.spec.catalogue import RULES

UsageError = SetupError  # what the command reports in one line, exit 2

BUDGET_SPENT = "the budget was spent"  # why a layout was not searched
FAIL_FAST = "--fail-fast: the run stopped at the first failure"
STEERED = "steered around "  # + the findings (or --avoid) a skipped layout was steered around for
WORKER_GRACE = 5.0  # seconds past the budget before a worker that has not answered is stopped


class _Announcer:
    """Says at once that a layout has failed -- the failing rule and the run
    as it happened, saved next to where the minimal run will go -- so that a
    red gate shows in seconds, not after the shrinker is done."""

    def __init__(self, target: str, level: str, trace_dir: Path, start: float):
        self.target, self.level, self.trace_dir, self.start = target, level, trace_dir, start

    def __call__(self, scope: str, layout: str):
        def first_failure(trace, error) -> None:
            seconds = time.perf_counter() - self.start  # into the run, as the budget counts
            trace.target, trace.level = self.target, self.level
            path = trace.save(self.trace_dir / trace_file_name(scope, layout).replace(".json", ".unshrunk.json"))
            known = matching_finding(self.target, scope, layout, trace)
            if isinstance(error, ConformanceError):
                rules = ", ".join(sorted({v.rule for v in error.violations})) or "divergence from the spec"
            else:  # the target raised where no refusal is possible
                rules = f"{type(error).__name__}: {error}"
            label = f" (looks like known finding {known.id})" if known else ""
            print(f"{scope:<8} {layout:<24} first failing check at {seconds:.1f} s{label}: {rules} -- shrinking; "
                  f"the run as found ({len(trace.steps)} steps): {path}", flush=True)

        return first_failure


class _FailFast:
    """``--fail-fast``: the run stops at the first layout that fails other
    than as a known finding of the target."""

    def __init__(self, enabled: bool):
        self.enabled, self.stopped = enabled, False

    def see(self, result: LayoutResult) -> None:
        if self.enabled and not result.conforms and result.known_finding is None:
            self.stopped = True


def conform(args: argparse.Namespace) -> int:
    if args.examples is not None and args.examples <= 0:
        raise UsageError(f"--examples must be positive, got {args.examples}")
    if args.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {args.workers}")
    if args.budget is not None and args.budget <= 0:
        raise UsageError(f"--budget must be a positive number of seconds, got {args.budget:g}")
    for name in args.avoid or ():
        if not is_avoidable(name, layout_names("pool") + layout_names("manager") + model_layout_names()):
            raise UsageError(f"--avoid {name!r}: not an input the machines know; choose from {sorted(AVOIDABLE)}")
    scopes = list(SCOPES) if args.scope == "all" else [args.scope]
    plan = [(scope, name) for scope in scopes for name in _layouts(scope, args.layout)]
    if not plan:
        raise UsageError(f"no layout named {', '.join(args.layout)} in scope {args.scope}")
    if args.shard:
        shard, shards = _shard(args.shard)
        plan = plan[shard - 1::shards]  # round robin: each shard gets pool and manager layouts alike
        if not plan:
            raise UsageError(f"--shard {args.shard}: only {shard - 1} layout(s) to share, shard {shard} has none")
    for scope in scopes:
        check_target(args.target, scope)  # an unusable target stops the run before it starts
    _quiet_loggers()
    profiles = _profiles(args.profile)
    progress = Progress() if _show_progress(args) else None
    steered = known_findings(args.target) if args.known_findings else ()
    avoid = frozenset(f.avoid for f in steered if f.avoid) | frozenset(args.avoid or ())
    start = args.started  # the budget counts from the command's start: loading the target is part of the run
    deadline = start + args.budget if args.budget else None  # the whole run, shrinking included

    from kvspec.conformance.report import RunReport, write_reports

    report = RunReport(args.target, args.level, args.profile, seed=args.seed,
                       steered_around=[f"{f.id}: {f.title}" for f in steered],
                       checked={scope: rules_checked(scope, args.level) for scope in scopes},
                       command=" ".join(["kvspec", *map(shlex.quote, args.argv)]), versions=_versions(args.target))
    if args.trace_dir:
        trace_dir = Path(args.trace_dir)
    else:
        trace_dir = Path(args.report_dir) / "traces" if args.report_dir else Path("kvspec-traces")
    header = f"kvspec conform: target={args.target} level={args.level} profile={args.profile}"
    if args.budget:
        header += f" budget={args.budget:g}s"
    print(header + (f" seed={args.seed}" if args.seed is not None else ""))
    if steered:
        print(f"steering around known findings {', '.join(f.id for f in steered)} (docs/findings.md)")
    if avoid:
        print(f"the machines do not send: {'; '.join(sorted(avoid))}")
    print(f"{'scope':<8} {'layout':<24} {'operations':>10} {'seconds':>8}  result", flush=True)
    def finish(r: LayoutResult) -> None:
        """Save a failing layout's trace, label it, print its line."""
        report.results.append(r)
        r.finished = round(time.perf_counter() - start, 3)
        if r.began is not None:
            r.began = round(r.began - start, 3)
        if r.first_failure_at is not None:
            r.first_failure_at = round(r.first_failure_at - start, 3)
        if r.skipped is not None:  # steered around, or the budget or --fail-fast ended the run before its turn
            shown = {BUDGET_SPENT: "not searched (the budget is spent)",
                     FAIL_FAST: "not searched (--fail-fast: stopped at a failure)"}.get(
                r.skipped, f"skipped ({r.skipped.removeprefix(STEERED)})")
            print(f"{r.scope:<8} {r.layout:<24} {'-':>10} {'-':>8}  {shown}", flush=True)
            return
        if r.trace is not None:
            r.trace.target, r.trace.level = args.target, args.level
            r.trace_file = str(r.trace.save(trace_dir / trace_file_name(r.scope, r.layout)))
            known = matching_finding(args.target, r.scope, r.layout, r.trace)
            r.known_finding = f"{known.id}: {known.title}" if known else None
        reached = f"  ({r.distinct_states} distinct states)" if r.conforms and r.distinct_states else ""
        print(f"{r.scope:<8} {r.layout:<24} {r.operations:>10} {r.seconds:>8.1f}  {r.verdict()}{reached}", flush=True)

    todo = []
    for scope, name in plan:
        if f"layout:{name}" in avoid:
            why = ", ".join(f.id for f in steered if f.avoid == f"layout:{name}") or "--avoid"
            finish(LayoutResult(scope, name, 0, 0.0, True, skipped=STEERED + why))
        else:
            todo.append((scope, name))
    announce = _Announcer(args.target, args.level, trace_dir, start)
    stop = _FailFast(args.fail_fast)
    if args.workers > 1:
        _search_in_parallel(args, todo, profiles, avoid, deadline, finish, announce, stop)
        order = {key: i for i, key in enumerate(plan)}
        report.results.sort(key=lambda r: order[(r.scope, r.layout)])  # the report in plan order
    elif deadline is not None:
        _search_in_rounds(args, todo, profiles, avoid, deadline, finish, announce, stop, progress)
        order = {key: i for i, key in enumerate(plan)}
        report.results.sort(key=lambda r: order[(r.scope, r.layout)])
    else:
        for i, (scope, name) in enumerate(todo, 1):
            if stop.stopped:
                finish(LayoutResult(scope, name, 0, 0.0, True, skipped=FAIL_FAST))
                continue
            if progress:
                progress.position = (i, len(todo), start, deadline)
            r = _search_one(scope, name, args.target, args.level, avoid, profiles[scope], args.examples,
                            None, None, args.seed, args.database, progress, announce)
            finish(r)
            stop.see(r)
    failures = sum(not r.conforms for r in report.results)
    print()
    print("\n".join(report.rule_table(report.checked)))
    print()
    for finding, layouts in report.known_groups().items():
        print(f"known finding {finding}\n    on {len(layouts)} layout(s): {', '.join(layouts)}"
              " (--known-findings steers around it)")
    print("all layouts conform" if not failures else f"{failures} layout(s) failed")
    if args.report_dir:
        for path in write_reports(report, args.report_dir):
            print(f"wrote {path}")
    return 1 if failures else 0


FIRST_SLICE = (0.25, 2.0)  # seconds: the bounds of a layout's first slice under a budget
SHRINK_SECONDS = 15.0  # under a budget, how long a failure found in a slice may shrink at most
QUIET_WEIGHT = 0.25  # a layout whose last slice reached no new state gets this share of a slice


def _search_in_rounds(args, todo, profiles, avoid, deadline, finish, announce, stop, progress) -> None:
    """A budgeted search in one process: the layouts take turns in rounds of
    slices instead of one long turn each, so a bug any layout shows within
    its first second is found within the first round, however many layouts
    come before it.  Slices double every round; a layout whose last slice
    reached no new abstract state (CheckingMachine.cover) gets a quarter
    slice, so the budget moves to layouts still finding new ground.  A
    failure shrinks for at most SHRINK_SECONDS (less when the budget ends
    sooner) and then its layout is done; the others go on."""
    machines = {key: machine_for(*key, args.target, args.level, avoid) for key in todo}
    base = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    spent = dict.fromkeys(todo, 0.0)
    began: dict[tuple[str, str], float] = {}
    weight = dict.fromkeys(todo, 1.0)
    open_layouts = list(todo)
    first_slice = min(max((deadline - time.perf_counter()) / (4 * max(1, len(todo))), FIRST_SLICE[0]),
                      FIRST_SLICE[1])
    slice_no = 0
    for round_no in itertools.count():
        if not open_layouts or stop.stopped or time.perf_counter() >= deadline:
            break
        for i, key in enumerate(sorted(open_layouts, key=lambda k: (-weight[k], spent[k])), 1):
            now = time.perf_counter()
            if now >= deadline or stop.stopped:
                break
            scope, name = key
            machine = machines[key]
            seconds = min(first_slice * 2 ** round_no * weight[key], deadline - now)
            reached = machine.states_reached()
            search = Search(profiles[scope], seconds=seconds, seed=base + 1000 * slice_no, swarm=True,
                            batch=25 if scope == "pool" else 10, database=args.database,
                            deadline=min(deadline, now + seconds + SHRINK_SECONDS),
                            on_first_failure=announce(scope, name))
            slice_no += 1
            if progress:
                progress.position = (i, len(open_layouts), args.started, deadline)
            r = run_layout(machine, search, progress)
            began.setdefault(key, r.began)
            spent[key] += r.seconds
            weight[key] = 1.0 if machine.states_reached() > reached else QUIET_WEIGHT
            if not r.conforms:
                r.seconds, r.began, r.seed = spent[key], began[key], base
                open_layouts.remove(key)
                finish(r)
                stop.see(r)
    for key in todo:
        if key in open_layouts:
            machine = machines[key]
            scope, name = key
            if key not in began:  # its turn never came
                finish(LayoutResult(scope, name, 0, 0.0, True, skipped=FAIL_FAST if stop.stopped else BUDGET_SPENT))
                continue
            r = LayoutResult(scope, name, machine.steps_run, spent[key], True, examples=machine.examples_run,
                             seed=base, began=began.get(key),
                             distinct_states=machine.states_reached())
            finish(r)


def _search_in_parallel(args, todo, profiles, avoid, deadline, finish, announce, stop) -> None:
    """``--workers N``: the layouts in N processes at once.  Sized by
    examples, each layout is a task of its own, its line printed as it
    finishes.  Under a budget each worker searches a round-robin share of the
    layouts in rounds, as one process does (:func:`_search_in_rounds`), and
    its layouts are printed when it is done (a failure is announced at once);
    a watchdog stops every worker still running :data:`WORKER_GRACE` seconds
    past the budget -- a target stuck where no signal reaches (a C loop, a
    deadlock) fails its layouts instead of holding the run."""
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    pool = ProcessPoolExecutor(max_workers=args.workers)
    if deadline is None:  # sized by examples: one task per layout
        pending = {pool.submit(_search_in_worker, scope, name, args.target, args.level, avoid, args.profile,
                               args.examples, None, None, args.seed, args.database, announce): [(scope, name)]
                   for scope, name in todo}
    else:  # under a budget: each worker takes its round-robin share of the layouts in rounds
        pending = {pool.submit(_rounds_in_worker, args, todo[i::args.workers], avoid, deadline,
                               announce): todo[i::args.workers]
                   for i in range(min(args.workers, len(todo)))}
    try:
        while pending:
            timeout = None if deadline is None else max(0.0, deadline + WORKER_GRACE - time.perf_counter())
            done, _ = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
            if not done:  # the watchdog: the budget and its grace are over
                for scope, name in sorted(key for keys in pending.values() for key in keys):
                    finish(LayoutResult(scope, name, 0, 0.0, False, details=[
                        f"the worker searching this layout had not finished {WORKER_GRACE:g} s after the budget "
                        "ran out and was stopped: the target hangs where no alarm reaches it"]))
                return
            for future in done:
                keys = pending.pop(future)
                try:
                    results = future.result()
                except Exception as error:  # the worker died (a crash in native code) or could not pickle
                    results = [LayoutResult(scope, name, 0, 0.0, False,
                                            details=[f"the worker searching this layout died: {error!r}"])
                               for scope, name in keys]
                for result in results:
                    finish(result)
                    stop.see(result)
            if stop.stopped:
                for scope, name in sorted(key for keys in pending.values() for key in keys):
                    finish(LayoutResult(scope, name, 0, 0.0, True, skipped=FAIL_FAST))
                return
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        if pending:
            import multiprocessing

            for child in multiprocessing.active_children():  # the workers still searching or stuck
                child.terminate()


def _search_in_worker(scope, name, target, level, avoid, profile_name, examples, share, deadline, seed, database,
                      announce=None) -> list[LayoutResult]:
    """One layout's search in a worker process (see _search_in_parallel)."""
    _quiet_loggers()
    profile = _profiles(profile_name)[scope]
    if deadline is not None and deadline <= time.perf_counter():
        return [LayoutResult(scope, name, 0, 0.0, True, skipped=BUDGET_SPENT)]
    return [_search_one(scope, name, target, level, avoid, profile, examples, share, deadline, seed, database,
                        announce=announce)]


def _rounds_in_worker(args, todo, avoid, deadline, announce) -> list[LayoutResult]:
    """A budgeted search of some of the layouts, in rounds, in a worker
    process (see _search_in_parallel): its results, for the parent to print."""
    _quiet_loggers()
    profiles = _profiles(args.profile)
    results: list[LayoutResult] = []
    _search_in_rounds(args, todo, profiles, avoid, deadline, results.append, announce, _FailFast(args.fail_fast),
                      None)
    return results


def _search_one(scope, name, target, level, avoid, profile, examples, share, cap, seed, database, progress=None,
                announce=None):
    """One layout's search.  Under a budget (``share`` seconds) a failure may
    shrink for a second share, and never past ``cap``."""
    layout_deadline = None if share is None else min(time.perf_counter() + 2 * share, cap)
    search = Search(profile, examples=examples, seconds=share, seed=seed, batch=25 if scope == "pool" else 10,
                    deadline=layout_deadline, database=database, swarm=share is not None,
                    on_first_failure=announce(scope, name) if announce else None)
    r = run_layout(machine_for(scope, name, target, level, avoid), search, progress)
    r.seed = search.seed
    return r


def _profiles(name: str) -> dict[str, object]:
    """Each scope's Hypothesis settings for the profile ``name``.  Built in
    each process that searches: a settings object does not survive pickling
    to a worker (its "not set" markers come back as other objects, and
    Hypothesis then takes ``database`` for a database)."""
    return {"pool": PROFILES[name], "manager": manager_settings(name)}


def _workers(text: str) -> int:
    """``--workers N`` or ``auto`` (the cores this process may run on)."""
    if text == "auto":
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of processes or 'auto', got {text!r}") from None


def _shard(text: str) -> tuple[int, int]:
    """``I/N`` -> (I, N), 1 <= I <= N."""
    match = re.fullmatch(r"(\d+)/(\d+)", text)
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        raise UsageError(f"--shard takes I/N with 1 <= I <= N (this machine's share of the layouts), got {text!r}")
    return int(match[1]), int(match[2])


def _versions(target: str) -> dict[str, str]:
    """What a report needs to be reproduced: kvspec's version, the target's
    (vLLM's, when it is the target), Python's, Hypothesis's."""
    import platform

    import hypothesis

    versions = {"kvspec": __version__}
    if target == "vllm":
        import vllm

        versions["vLLM"] = vllm.__version__
    versions["Python"] = platform.python_version()
    versions["Hypothesis"] = hypothesis.__version__
    return versions


def _layouts(scope: str, wanted: list[str] | None) -> list[str]:
    """The layouts of ``scope`` the command asked for: all built-in ones by
    default; ``models`` stands for every ``model:<name>`` layout."""
    if not wanted:
        return layout_names(scope)
    names = [m for name in wanted for m in (model_layout_names() if name == "models" else [name])]
    return [name for name in dict.fromkeys(names) if is_layout(scope, name)]


def _show_progress(args: argparse.Namespace) -> bool:
    return args.progress if args.progress is not None else sys.stderr.isatty()


def _quiet_loggers() -> None:
    for noisy in ("kvspec", "vllm"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


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
    _quiet_loggers()
    recorded = ""
    if trace.failure:
        recorded = f"; recorded failure at step {trace.failure.get('step')}: " + (
            ", ".join(trace.failure.get("rules") or []) or "divergence from the spec")
    print(f"kvspec replay: {args.trace}: {trace.scope} layout {trace.layout}, {len(trace.steps)} steps, "
          f"recorded against {trace.target or '?'} at {trace.level}{recorded}")
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
        return 0
    steps = outcome.trace.steps
    print(f"step {outcome.diverged_at} {steps[-1].rule if steps else '?'}: DIVERGED")
    for op in steps[-1].operations if steps else []:
        print(f"    {op}")
    for line in outcome.message.splitlines():
        print(f"  {line}")
    print(f"{target} diverges at step {outcome.diverged_at} of {outcome.steps}")
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
    _quiet_loggers()
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
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    worker = args.worker or ("vllm" if args.target == "vllm" else "kvspec")
    if ("vllm" in kernels or worker == "vllm") and args.device == "cpu" and "triton" not in sys.modules:
        # vLLM's Triton kernels on a CPU: Triton's interpreter, chosen before Triton is imported; an
        # empty CUDA_VISIBLE_DEVICES keeps vLLM's Triton probe from disabling Triton.
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    try:
        import torch

        from kvspec.conformance.machines.kernel import run_stage
        from kvspec.models import kernels as K
        from kvspec.models.architectures import ARCHITECTURES, SCALES, setup, setup_from_layout
    except ImportError as error:
        raise UsageError(f"the kernel stage needs torch ({error}); install kvspec[kernels]") from None
    from kvspec.conformance.machines.layouts import MANAGER_LAYOUTS
    from kvspec.conformance.settings import kernel_settings

    if args.examples is not None and args.examples <= 0:
        raise UsageError(f"--examples must be positive, got {args.examples}")
    if args.scale not in SCALES:
        raise UsageError(f"unknown scale {args.scale!r}; choose one of {SCALES}")
    unknown = set(kernels) - {"reference", "flex", "vllm"}
    if unknown or "reference" not in kernels:
        raise UsageError(f"--kernels takes reference (always), flex and vllm; got {args.kernels!r}")
    problem = K.vllm_kernels_available() if "vllm" in kernels else None
    if problem is not None:
        raise UsageError(f"--kernels vllm: {problem} (run kvspec from tools/install_vllm.sh's environment)")
    if worker == "vllm":
        from kvspec.models.vllm_worker import vllm_worker_available

        problem = vllm_worker_available()
        if problem is not None:
            raise UsageError(f"--worker vllm: {problem} (run kvspec from tools/install_vllm.sh's "
                             "environment, or choose --worker kvspec)")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: torch sees no CUDA device")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    names = args.model or ["all"]
    setups = []
    for name in names:
        if name == "all":
            setups += [setup(n, args.scale) for n in ARCHITECTURES]
        elif name.removeprefix("model:") in ARCHITECTURES:
            setups.append(setup(name.removeprefix("model:"), args.scale))
        elif name in MANAGER_LAYOUTS:
            setups.append(setup_from_layout(name, MANAGER_LAYOUTS[name]))
        else:
            raise UsageError(f"no model or layout named {name!r}: use one of {sorted(ARCHITECTURES)}, all, "
                             f"or a manager layout ({', '.join(MANAGER_LAYOUTS)})")
    factory = resolve_target(args.target, "manager")
    _quiet_loggers()
    warnings.filterwarnings("ignore", "invalid value encountered", RuntimeWarning)  # Triton's interpreter, masked lanes
    run_settings = kernel_settings(args.profile, examples=args.examples)
    seeded = None
    if args.seed is not None:
        from hypothesis import seed as hypothesis_seed
        from hypothesis import settings as hypothesis_settings

        run_settings, seeded = hypothesis_settings(run_settings, derandomize=False), hypothesis_seed(args.seed)
    print(f"kvspec kernels: target={args.target} worker={worker} scale={args.scale} kernels={','.join(kernels)} "
          f"device={args.device} dtype={args.dtype} profile={args.profile}")
    print(f"{'layout':<28} {'steps':>7} {'checks':>8} {'seconds':>8}  result", flush=True)
    failures = 0
    for s in setups:
        result = run_stage(s, factory, run_settings, seeded=seeded, kernels=kernels, dtype=dtype, device=args.device,
                           worker=worker)
        verdict = "ok" if result.passed else "FAILED"
        print(f"{s.name:<28} {result.totals['steps']:>7} {result.checks:>8} {result.seconds:>8.1f}  {verdict}",
              flush=True)
        if not result.passed:
            failures += 1
            print(f"    {type(result.failure).__name__}: {result.failure}")
            for line in result.example:
                print(f"      {line}")
    print()
    print("every layout passed every check" if not failures else f"{failures} layout(s) failed")
    return 1 if failures else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvspec",
        description="Check a KV-cache block manager against the executable specification of vLLM v1's block "
        "manager (reference: vLLM 0.25.1).",
        epilog="Exit codes: 0 conforms, 1 a rule broke or the target diverged from the spec, 2 usage or "
        "environment error.  The specification: spec/README.md; the vectors' format: docs/VECTORS.md.",
    )
    parser.add_argument("--version", action="version", version=f"kvspec {__version__} (reference: vLLM 0.25.1)")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("conform", help="check a target against the specification")
    run.add_argument("--target", default="impl", help="impl, spec, vllm, or module:factory (default impl)")
    run.add_argument(
        "--scope", default="all", choices=["pool", "manager", "all"],
        help="pool: the block pool alone; manager: the KVCacheManager with a scheduler (default all)",
    )
    run.add_argument(
        "--level", default="L3", choices=sorted(LEVELS),
        help="L1 safety rules; L2 + optimal hits; L3 + identical observations to the spec (default L3)",
    )
    run.add_argument(
        "--layout", action="append",
        help=f"pool: {', '.join(layout_names('pool'))}; manager: {', '.join(layout_names('manager'))}; "
        f"real models (manager): {', '.join(model_layout_names())}, or 'models' for all of them "
        "(repeatable; default: every pool and manager layout, not the models)",
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
    run.add_argument("--avoid", action="append", metavar="INPUT",
                     help="an input the machines must not send (repeatable): " + "; ".join(
                         f"{name} ({what})" for name, what in AVOIDABLE.items()))
    run.add_argument("--database", metavar="DIR",
                     help="keep Hypothesis's failing examples here and replay them first next time "
                     "(persist it between CI runs)")
    run.add_argument("--fail-fast", "-x", action="store_true",
                     help="stop at the first layout that fails (other than as a known finding): the gate's "
                     "verdict as soon as it is known")
    run.add_argument("--workers", "-n", type=_workers, default=1, metavar="N",
                     help="search in N processes at once; 'auto': one per core this process may use "
                     "(default 1)")
    run.add_argument("--shard", metavar="I/N",
                     help="run only the I-th of N round-robin shares of the layouts (one CI machine each)")
    run.add_argument("--report-dir", help="write report.json, report.md and junit.xml here")
    run.add_argument("--trace-dir",
                     help="save each failing layout's minimal run here (default: REPORT_DIR/traces with "
                     "--report-dir, else kvspec-traces)")
    run.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="a progress bar on stderr (default: when stderr is a terminal)")
    run.set_defaults(func=conform)

    rep = sub.add_parser("replay", help="replay a saved trace and show where a target diverges")
    rep.add_argument("trace", help="a trace file saved by kvspec conform")
    rep.add_argument("--target", help="impl, spec, vllm, or module:factory (default: the trace's target)")
    rep.add_argument("--level", choices=sorted(LEVELS), help="default: the trace's level")
    rep.add_argument("--quiet", action="store_true", help="print only the diverging step and the verdict")
    rep.add_argument("--budget", type=float, default=300.0, metavar="SECONDS",
                     help="stop a target that has not finished the replay by then: it hangs (default 300)")
    rep.set_defaults(func=replay_command)

    show = sub.add_parser("show", help="draw the pool after every step of a trace (text, and SVG with --svg)")
    show.add_argument("trace", help="a trace file saved by kvspec conform")
    show.add_argument("--target", help="impl, spec, vllm, or module:factory (default: the trace's target)")
    show.add_argument("--level", choices=sorted(LEVELS), help="default: the trace's level")
    show.add_argument("--svg", metavar="FILE", help="also write the picture as SVG")
    show.set_defaults(func=show_command)

    ker = sub.add_parser("kernels", help="run block tables through attention and Mamba kernels (the kernel stage)")
    ker.add_argument("--target", default="impl", help="impl, vllm, or module:factory (a manager target; default impl)")
    ker.add_argument("--model", action="append",
                     help="an architecture of kvspec.models (llama-3-8b, gemma-3, ...), 'all' (default), or a "
                     "manager conformance layout (repeatable)")
    ker.add_argument("--scale", default="tiny",
                     help="tiny (2-token blocks: every boundary within 32 tokens), small (real block sizes and "
                     "windows, small layers) or gpu (real heads and head sizes, bf16); default tiny")
    ker.add_argument("--kernels", default="reference,flex",
                     help="comma-separated: reference, flex, vllm (vLLM's Triton kernels; default reference,flex)")
    ker.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ker.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ker.add_argument("--profile", default="ci", choices=sorted(PROFILES), help="Hypothesis profile (default ci)")
    ker.add_argument("--examples", type=int, help="examples per layout (overrides the profile)")
    ker.add_argument("--seed", type=int, help="a random search with this seed (default: the profile's)")
    ker.add_argument("--worker", choices=["kvspec", "vllm"],
                     help="whose block tables, slot mapping and cache writes the kernels read: vllm (vLLM's own "
                     "MultiGroupBlockTable and triton_reshape_and_cache_flash, checked against kvspec's tables; "
                     "the default with --target vllm) or kvspec (its model of vLLM's worker; the default otherwise)")
    ker.set_defaults(func=kernels_command)

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

    vec = sub.add_parser("vectors", help="language-neutral conformance vectors: generate them, check a target")
    vsub = vec.add_subparsers(dest="vectors_command", required=True)
    gen = vsub.add_parser("generate", help="derive the vectors corpus from the spec")
    gen.add_argument("--out", required=True, help="the directory to write (created; existing vectors are replaced)")
    gen.add_argument("--size", default="ci", choices=sorted(SIZES),
                     help="how many machine walks per layout (default ci)")
    gen.set_defaults(func=vectors_generate)
    chk = vsub.add_parser("check", help="replay a vectors corpus against a target")
    chk.add_argument("dir", help="a directory of vectors (or one vector file)")
    chk.add_argument("--target", default="impl", help="impl, spec, vllm, or module:factory (default impl)")
    chk.add_argument("--scope", default="all", choices=["pool", "manager", "all"],
                     help="the vectors to replay (default all; a module:factory target serves one scope)")
    chk.add_argument("--known-findings", action="store_true",
                     help="a vector exercising one of the target's known findings may diverge")
    chk.add_argument("--verbose", action="store_true", help="one line per vector, not only the failures")
    chk.set_defaults(func=vectors_check)

    # Listed for `kvspec --help` only: main() hands `prove` its arguments before parsing.
    sub.add_parser(
        "prove", add_help=False,
        help="prove the CrossHair obligations over the pool model and impl's own code (kvspec prove --help)",
    )
    return parser


def vectors_generate(args: argparse.Namespace) -> int:
    """``kvspec vectors generate``: the corpus, and what it exercises."""
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a directory")
    for old in out.glob("*/**/*.json") if out.is_dir() else []:
        old.unlink()  # a vector the spec no longer yields must not linger
    corpus = generate(out, args.size)
    operations = sum(f["steps"] for f in corpus.files)
    print(f"{len(corpus.files)} vectors, {operations} operations, written to {out}")
    print(f"rules exercised: {len(corpus.rules)} of {len(RULES)}"
          + (f" (none exercise {', '.join(corpus.unexercised)})" if corpus.unexercised else ""))
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
    scopes = list(SCOPES) if args.scope == "all" else [args.scope]
    if ":" in args.target and len(scopes) > 1:
        raise UsageError("a module:factory target serves one scope: add --scope pool or --scope manager")
    if args.target == "vllm" and os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        raise UsageError(f"vectors are hashed as under PYTHONHASHSEED={HASH_SEED}, and vLLM roots its hashes "
                         f"at start-up: run with PYTHONHASHSEED={HASH_SEED}")
    factories = {scope: check_target(args.target, scope) for scope in scopes}
    known = frozenset(f.id for f in known_findings(args.target)) if args.known_findings else frozenset()
    _quiet_loggers()

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
    return 0 if report.ok else 1


def mutate_command(args: argparse.Namespace) -> int:
    """``kvspec mutate``: the gate against the mutant catalogue."""
    from kvspec.conformance.mutation.mutants import MUTANTS, for_family

    if args.list:
        for m in MUTANTS:
            print(f"{m.name:<28} {m.bug_class:<40} {'/'.join(m.families):<10} {m.what}")
        return 0
    if args.budget <= 0:
        raise UsageError(f"--budget must be a positive number of seconds, got {args.budget:g}")
    if args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    if args.target == "vllm":
        check_target("vllm", "manager")
    from kvspec.conformance.mutation.mutate import mutate

    levels = args.level or ["L1", "L3"]
    names = args.mutant or [m.name for m in for_family(args.target)]
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

    try:
        report = mutate(args.target, levels, args.budget, names, args.jobs, args.seed, on_run=show)
    except ValueError as error:
        raise UsageError(str(error)) from None
    print()
    for level in report.levels():
        s = report.summary(level)
        print(f"{level}: {s['killed']}/{s['mutants']} killed ({s['score']} %), median {s['median_first_failure']} s "
              f"to the first failing check, {s['median_verdict']} s to the verdict")
    if args.report_dir:
        out = Path(args.report_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "mutation.json").write_text(json.dumps(report.to_json(), indent=1) + "\n")
        (out / "mutation.md").write_text(report.markdown())
        print(f"wrote {out / 'mutation.json'} and {out / 'mutation.md'}")
    return 0 if all(r.error is None for r in report.runs) else 1


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
    except KeyboardInterrupt:
        print("kvspec: interrupted", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`kvspec conform | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
