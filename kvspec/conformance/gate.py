"""The gate: ``kvspec conform`` as a library.

:func:`run_gate` takes :class:`GateOptions` -- the target, the level, the
layouts, how long to search -- and returns the :class:`RunReport`: one
:class:`LayoutResult` per layout of the plan, in plan order.  Between the two
it does what a pull-request gate needs:

* **the plan**: every layout of the chosen scopes (or those asked for), this
  machine's round-robin share of them under ``shard``;
* **steering**: with ``known_findings`` the machines do not send the inputs
  of the target's known findings (``kvspec.conformance.findings``), and a
  failure that looks like one is labelled, not counted as new;
* **budget rounds**: under ``budget`` the layouts take turns in slices that
  double every round, more for those still reaching new states, so that a
  bug any layout shows early is found in the first round;
* **workers**: ``workers > 1`` searches in that many processes, with a
  watchdog that fails the layouts of a worker stuck past the budget; under
  a budget one worker is a process too (forked, so the target's patches and
  the caller's state go with it), for the same watchdog;
* **fail-fast**: the run stops at the first failure that is not a known
  finding;
* **reports**: each failing layout's minimal run saved as a trace, and
  report.json/report.md/junit.xml written to ``report_dir``.

What happens along the way is told to a :class:`Listener` (the CLI's prints
lines; the default stays quiet).  A bad option raises
:class:`~kvspec.errors.SetupError` before anything runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import itertools
import os
import platform
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvspec import __version__
from kvspec.conformance import spec_coverage
from kvspec.conformance.findings import (
    AVOIDABLE,
    COMPONENTS,
    Finding,
    inherited_findings,
    is_avoidable,
    known_findings,
    matching_finding,
)
from kvspec.conformance.machines.machinery import ConformanceError, unnamed_failure
from kvspec.conformance.report import (
    BUDGET_SPENT,
    FAIL_FAST,
    INTERRUPTED,
    STEERED,
    LayoutResult,
    RunReport,
    below_floor,
    unwritable,
    write_reports,
)
from kvspec.conformance.runner import (
    BLOCK_SCOPES,
    HANGS,
    SCOPES,
    Progress,
    Search,
    Target,
    compared,
    is_layout,
    layout_names,
    layout_unsupported,
    machine_for,
    model_layout_names,
    quiet_loggers,
    resolve,
    run_layout,
    scopes_for,
    upstream,
)
from kvspec.conformance.runner import replay as replay_trace
from kvspec.conformance.settings import PROFILES, DatabaseError, example_database, scope_settings
from kvspec.conformance.trace import Trace, trace_file_name
from kvspec.dropin_releases import impl_deltas
from kvspec.errors import SetupError, TargetImportError
from kvspec.spec import releases
from kvspec.spec.catalogue import RULES, TIER_RULES

KNOWN_RULES = {**RULES, **TIER_RULES}  # every rule a run may break: the block manager's and a tier's

WORKER_GRACE = 5.0  # seconds past the budget before a worker that has not answered is stopped
FIRST_SLICE = (0.25, 2.0)  # seconds: the bounds of a layout's first slice under a budget
SHRINK_SECONDS = 15.0  # under a budget, how long a failure found in a slice may shrink at most
SHRINK_SHARE = 0.25  # ... and all of a process's failures together, shrinking and minimising, this share of it
SHRINK_FLOOR = 1.0  # seconds a failure may shrink when the share is spent (its run as found is saved anyway)
QUIET_WEIGHT = 0.25  # a layout whose last slice reached no new state gets this share of a slice


@dataclass
class GateOptions:
    """One gate run; the fields are ``kvspec conform``'s options.  An input:
    :func:`run_gate` never writes it; the fields it settles (the seed of a
    budgeted run, the release judged, whose findings apply) are filled in
    the run's own copy, which the listener and the workers are given."""

    target: str = "impl"  # impl, spec, vllm or module:factory
    scope: str = "all"  # pool, manager, scheduler or all (the scheduler where the target has one: scopes_for)
    level: str = "L3"
    layouts: list[str] | None = None  # None: every built-in layout; "models" stands for every model layout
    profile: str = "ci"
    examples: int | None = None  # examples per layout (overrides the profile) ...
    budget: float | None = None  # ... or seconds for the whole run, shrinking included
    seed: int | None = None
    known_findings: bool = False
    strict: bool = False  # send the inputs of findings of components the target runs on, and count them
    avoid: list[str] = field(default_factory=list)
    database: str | None = None
    fail_fast: bool = False
    workers: int = 1
    shard: str | None = None  # "I/N"
    release: str | None = None  # the vLLM release whose rules judge (None: the installed vLLM's, or the base)
    cross_release: bool = False  # judge an installed vLLM by the rules of another release (--release), on purpose
    cross_release_of: str | None = None  # the installed release so judged (in run_gate's copy)
    against: str | None = None  # an upstream vLLM to run in lockstep with instead of the spec (vllm==X, a python)
    report_dir: str | None = None
    trace_dir: str | None = None
    progress: bool = False  # a progress bar on stderr
    coverage: bool = False  # measure what the run exercises of the spec (kvspec.conformance.spec_coverage)
    coverage_dir: str | None = None  # where each process's measurement goes (in run_gate's copy)
    findings_of: str | None = None  # whose known findings apply (in run_gate's copy: runner.Target.findings_of)
    inherited: tuple[Any, ...] = ()  # the findings of components the target runs on, steered (in run_gate's copy)
    minimise: bool = True  # cut a failing layout's run by replay (kvspec mutate needs the verdict only)
    command: str = "kvspec conform"  # recorded in the report
    started: float = field(default_factory=time.perf_counter)  # the budget counts from here

    def traces(self) -> Path:
        """Where failing layouts' traces are saved."""
        if self.trace_dir:
            return Path(self.trace_dir)
        return Path(self.report_dir) / "traces" if self.report_dir else Path("kvspec-traces")


@dataclass
class FirstFailure:
    """A layout's first failing check, before shrinking: what the gate
    knows seconds into the run."""

    scope: str
    layout: str
    seconds: float  # into the run, as the budget counts
    broken: str  # the rules broken, the divergence, or the exception the target raised
    steps: int
    path: Path  # the run as found, saved
    known: str | None  # the id of the known finding it looks like


class Listener:
    """What the gate tells as it runs.  The default tells nothing.  Every
    call is made in the calling process: what worker processes find is
    relayed to it (:class:`_Relay`)."""

    def begin(self, options: GateOptions, steered: tuple[Finding, ...], avoid: frozenset[str]) -> None:
        """The plan is made and the search starts."""

    def first_failure(self, failure: FirstFailure) -> None:
        """A layout failed a check; its shrinking starts."""

    def layout_done(self, result: LayoutResult) -> None:
        """A layout is done: searched, failed or skipped."""


def run_gate(options: GateOptions, listener: Listener | None = None) -> RunReport:
    """Search every layout of the plan and return the report (written to
    ``options.report_dir`` too, its paths in ``report.written``).  ``options``
    is an input, never written: what the run settles (its seed, whose
    findings apply, the release judged) goes into the run's own copy, made
    once before the search, which the listener and the workers read."""
    listener = listener or Listener()
    try:
        options, target, plan = plan_run(options)
    except TargetImportError as error:
        return _import_failure(options, error, listener)
    seed = options.seed
    if options.budget and seed is None:  # a budgeted search is random: its seed is chosen here, and told
        seed = int.from_bytes(os.urandom(4), "big")
    quiet_loggers()
    scopes = list(dict.fromkeys(scope for scope, _ in plan))
    findings_of = target.findings_of(scopes)
    steered = known_findings(findings_of, scopes, release_of(options)) if options.known_findings else ()
    if options.known_findings and options.against and findings_of != "vllm":
        # the upstream's own findings would read as the target's differences from it
        upstream = known_findings("vllm", [s for s in scopes if s in BLOCK_SCOPES], release_of(options))
        steered += tuple(f for f in upstream if f not in steered)
    inherited = () if options.strict else inherited_findings(options.target, scopes)
    options = dataclasses.replace(options, seed=seed, findings_of=findings_of, inherited=inherited)
    avoid = frozenset(f.avoid for f in (*steered, *inherited) if f.avoid) | frozenset(options.avoid)
    deadline = options.started + options.budget if options.budget else None
    report = RunReport(options.target, options.level, options.profile, seed=options.seed,
                       steered_around=[f"{f.id}: {f.title}" for f in steered],
                       inherited=[f"{COMPONENTS[f.component]}: {f.id}: {f.title}" for f in inherited],
                       strict=options.strict,
                       checked={scope: compared(scope, options.level, options.against) for scope in scopes},
                       command=options.command, versions=versions(options.findings_of, scopes, release_of(options)),
                       against=_upstream(options))
    if options.cross_release_of:
        report.versions["judged across releases"] = f"vLLM {options.cross_release_of} by the rules of " \
                                                    f"{options.release} (--cross-release)"
    _check_budget_covers_loading(options, deadline)
    listener.begin(options, steered, avoid)
    found = _FirstFailures(listener)
    with _measured(options) as measure, _interrupts_delivered():
        try:
            _search(dataclasses.replace(options, coverage_dir=measure.get("dir")), target, plan, steered, avoid,
                    deadline, report, found)
        except KeyboardInterrupt as stop:
            if type(stop) not in (KeyboardInterrupt, Terminated):
                raise  # the budget's or the harness's own stop (machinery.BudgetSpent, HarnessFault), no interrupt
            report.interrupted = "SIGTERM" if isinstance(stop, Terminated) else "SIGINT"
            _keep_what_was_found(report, plan, found.failures)
    _keep_failures_cut_short(report, found.failures, options, deadline)
    report.coverage = measure.get("report")
    order = {key: i for i, key in enumerate(plan)}
    report.results.sort(key=lambda r: order[(r.scope, r.layout)])  # the report in plan order
    if options.report_dir:
        report.written = write_reports(report, options.report_dir)
    return report


def _import_failure(options: GateOptions, error: TargetImportError, listener: Listener) -> RunReport:
    """The report of a target that is installed but does not import: one
    failure, named by the error and the line that raised it, and the
    reports written -- a red gate for the change that broke the import."""
    report = RunReport(options.target, options.level, options.profile, command=options.command,
                       versions={"kvspec": __version__, "Python": platform.python_version()})
    failed = LayoutResult("import", options.target, 0, 0.0, False, details=[str(error)], labelled=True)
    report.results.append(failed)
    listener.layout_done(failed)
    if options.report_dir:
        report.written = write_reports(report, options.report_dir)
    return report


class Terminated(KeyboardInterrupt):  # noqa: N818 (a signal, as KeyboardInterrupt is: no failure of the target)
    """SIGTERM arrived (a CI job cancelled, a timeout): the run stops where
    it is and reports what it found, as for SIGINT.

    A KeyboardInterrupt, as machinery.BudgetSpent is, because Hypothesis
    lets only those through untouched: any other exception raised part-way
    through a test case it has run a longer form of before ends that case
    (``data.freeze()``), and the tree of cases it keeps calls that
    inconsistent data generation -- ``FlakyStrategyDefinition`` replaces the
    signal, the layout ends as flaky, and the run goes on searching (seen
    once in CI on Hypothesis 6.150; reproduced on 6.150 and 6.170 by
    ``tests/test_gate.py::test_a_signal_part_way_through_a_case_hypothesis_ran_before_reaches_the_gate``)."""


@contextlib.contextmanager
def _interrupts_delivered() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` in this process,
    as SIGINT raises ``KeyboardInterrupt``, and neither is ever lost.

    A signal's exception is raised at whatever the main thread is running,
    and where that is a gc callback or a ``__del__`` Python prints "Exception
    ignored in ..." and goes on: Hypothesis times the garbage collector with
    a gc callback, and 2 of 12 SIGINTs sent while a failure shrank were
    swallowed there (Hypothesis 6.150, a loaded machine): the run searched
    on.  Such a swallowed interrupt is delivered again, at once,
    where it can be raised.  (The main thread only: elsewhere a signal
    handler cannot be set.)"""
    import _thread
    import signal
    import sys
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise Terminated()

    def unraisable(event: Any) -> None:
        if type(event.exc_value) is KeyboardInterrupt:  # not BudgetSpent or HarnessFault: those are no signal
            threading.Timer(0.01, _thread.interrupt_main, (signal.SIGINT,)).start()
        elif isinstance(event.exc_value, Terminated):
            threading.Timer(0.01, _thread.interrupt_main, (signal.SIGTERM,)).start()
        else:
            hook(event)

    previous, hook = signal.signal(signal.SIGTERM, stop), sys.unraisablehook
    sys.unraisablehook = unraisable
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        sys.unraisablehook = hook


class _FirstFailures(Listener):
    """The caller's listener, and what it was told of first failures: the
    failures an interrupted run still reports, shrunk or not."""

    def __init__(self, listener: Listener):
        self.listener, self.failures = listener, {}

    def begin(self, *args: Any) -> None:
        self.listener.begin(*args)

    def first_failure(self, failure: FirstFailure) -> None:
        self.failures[(failure.scope, failure.layout)] = failure
        self.listener.first_failure(failure)

    def layout_done(self, result: LayoutResult) -> None:
        self.listener.layout_done(result)


def _keep_what_was_found(report: RunReport, plan: list[tuple[str, str]],
                         failures: dict[tuple[str, str], FirstFailure]) -> None:
    """An interrupted run's report: every layout it finished as it was, a
    layout whose first failure was found but not yet shrunk as that failure
    (:func:`_as_found`), the rest :data:`INTERRUPTED` -- not searched."""
    done = {(r.scope, r.layout) for r in report.results}
    for key in plan:
        if key not in done:
            found = failures.get(key)
            report.results.append(_as_found(found, "the run was interrupted") if found else
                                  LayoutResult(*key, 0, 0.0, True, skipped=INTERRUPTED))


def _keep_failures_cut_short(report: RunReport, failures: dict[tuple[str, str], FirstFailure],
                             options: GateOptions, deadline: float | None) -> None:
    """After ``--fail-fast`` stopped the run: a layout whose search had
    already failed when the stop came keeps that failure, as found and
    labelled -- the clearest failure of a run may be the one still
    shrinking when another finished first."""
    for i, r in enumerate(report.results):
        if r.skipped == FAIL_FAST and (found := failures.get((r.scope, r.layout))) is not None:
            report.results[i] = _as_found(found, "--fail-fast stopped the run")
            label(report.results[i], options, deadline)


def _as_found(f: FirstFailure, why: str) -> LayoutResult:
    """A layout's failure as it was first found (its run saved then), for a
    run that stopped before the failure was shrunk."""
    trace = Trace.load(f.path) if f.path.exists() else None
    return LayoutResult(
        f.scope, f.layout, f.steps, f.seconds, False,
        rules=[rule for rule in f.broken.split(", ") if rule in KNOWN_RULES],
        details=[f.broken, f"{why} before this failure was shrunk: the run below is as found"],
        trace=trace, trace_file=str(f.path), shrinking_stopped=True, first_failure_at=round(f.seconds, 3))


def _upstream(options: GateOptions) -> str | None:
    """The upstream the target runs in lockstep with (``--against``), started
    here -- before the budget counts what loading took -- and named as it
    names itself: its vLLM release, and the source tree over it if any."""
    if not options.against:
        return None
    hello = upstream(options.against).hello
    return f"vLLM {hello['vllm']}" + (f" ({hello['source']})" if hello.get("source") else "") + \
        f", as --against {options.against}"


def _check_budget_covers_loading(options: GateOptions, deadline: float | None) -> None:
    """A budget already spent before the search could start -- loading the
    target (importing vLLM takes seconds) and planning ate it -- is a usage
    error naming how long that took, not a run of unsearched layouts."""
    if deadline is None:
        return
    now = time.perf_counter()
    if now >= deadline:
        loading = now - options.started
        raise SetupError(f"--budget {options.budget:g} s cannot cover loading the target: getting {options.target} "
                         f"ready took {loading:.1f} s, leaving nothing to search; give a budget of at least "
                         f"{int(loading) + 10} s")


@contextlib.contextmanager
def _measured(options: GateOptions) -> Iterator[dict[str, Any]]:
    """With ``options.coverage``: every process of the run measures the
    spec into one directory (this one here, the workers in :func:`_worker`),
    named in the dict yielded (``dir``), where the combined report is left (``report``)."""
    out: dict[str, Any] = {}
    if not options.coverage:
        yield out
        return
    with tempfile.TemporaryDirectory(prefix="kvspec-coverage-") as data_dir:
        out["dir"] = data_dir  # the workers' (GateOptions.coverage_dir of the run's copy)
        measure = spec_coverage.start(data_dir)
        try:
            yield out
        finally:
            spec_coverage.stop(measure)
        out["report"] = spec_coverage.report(data_dir)


def _search(options: GateOptions, target: Target, plan: list[tuple[str, str]], steered: tuple[Finding, ...],
            avoid: frozenset[str], deadline: float | None, report: RunReport, listener: Listener) -> None:
    run = _Run(options, target, avoid, deadline, report, listener)
    todo = []
    for scope, name in plan:
        if f"layout:{name}" in avoid:
            why = ", ".join(f.id for f in steered if f.avoid == f"layout:{name}") or "--avoid"
            run.finish(LayoutResult(scope, name, 0, 0.0, True, skipped=STEERED + why))
        elif (why := layout_unsupported(options.target, scope, name, release_of(options),
                                        target.factory(scope))) is not None:
            run.finish(LayoutResult(scope, name, 0, 0.0, True, skipped=why))
        else:
            todo.append((scope, name))
    if options.workers > 1 or (deadline is not None and todo and _can_fork()):
        # Under a budget even one worker is a process of its own: a target stuck where no alarm reaches
        # (a native loop) is stopped by the watchdog instead of holding the run.
        _search_in_parallel(run, todo)
    elif deadline is not None:
        _search_in_rounds(run, todo, Progress() if options.progress else None)
    else:
        _search_each(run, todo, Progress() if options.progress else None)


def make_plan(options: GateOptions) -> list[tuple[str, str]]:
    """The (scope, layout) pairs to search, the options checked first: a
    bad option or an unusable target raises ``SetupError`` before any
    search."""
    return plan_run(options)[2]


def plan_run(options: GateOptions) -> tuple[GateOptions, Target, list[tuple[str, str]]]:
    """The run's own copy of ``options`` (the release judged recorded in
    it: :func:`judge_by`), the target, resolved once
    (:func:`~kvspec.conformance.runner.resolve`), and the plan
    (:func:`make_plan`)."""
    options = dataclasses.replace(options)
    if options.examples is not None and options.examples <= 0:
        raise SetupError(f"--examples must be positive, got {options.examples}")
    if options.workers < 1:
        raise SetupError(f"--workers must be at least 1, got {options.workers}")
    if options.budget is not None and options.budget <= 0:
        raise SetupError(f"--budget must be a positive number of seconds, got {options.budget:g}")
    if options.examples is not None and options.budget is not None:
        raise SetupError("--examples and --budget size the search two ways: give one")
    if options.coverage and importlib.util.find_spec("coverage") is None:
        raise SetupError("--coverage needs coverage.py in this Python (pip install coverage)")
    if options.profile not in PROFILES:
        raise SetupError(f"no Hypothesis profile {options.profile!r}; choose one of {sorted(PROFILES)}")
    if options.scope not in (*SCOPES, "all"):
        raise SetupError(f"no scope {options.scope!r}; choose one of {', '.join(SCOPES)} or all")
    for flag, directory in (("--report-dir", options.report_dir), ("--trace-dir", options.traces())):
        if directory is not None and (problem := unwritable(flag, Path(directory))) is not None:
            raise SetupError(problem)
    for name in options.avoid:
        if not is_avoidable(name, [n for scope in SCOPES for n in layout_names(scope)] + model_layout_names()):
            raise SetupError(f"--avoid {name!r}: not an input the machines know; choose from {sorted(AVOIDABLE)}")
    scopes = scopes_for(options.target) if options.scope == "all" else [options.scope]
    if options.against and not set(scopes) & set(BLOCK_SCOPES):
        raise SetupError("--against runs the target in lockstep with its upstream at pool and manager scope; the "
                         "scheduler scope has no lockstep: use --scope pool, manager or all")
    asked = {scope: _asked(scope, options.layouts) for scope in scopes} if options.layouts else None
    if asked is not None:  # only the scopes of the layouts asked for (if none: the error below names them all)
        scopes = [scope for scope in scopes if asked[scope]] or scopes
    target = resolve(options.target, scopes)  # an unusable target stops the run before it starts
    release = judge_by(options)  # before the layouts: a later release has layouts of its own
    plan = [(scope, name) for scope in scopes
            for name in (asked[scope] if asked is not None else layout_names(scope, release))]
    unknown = [name for name in options.layouts or [] if name != "models" and all(n != name for _, n in plan)]
    if unknown or not plan:
        known = "; ".join(f"{scope}: {', '.join(layout_names(scope))}" for scope in scopes)
        raise SetupError(f"no layout named {', '.join(unknown or options.layouts or [])} in scope {options.scope} "
                         f"({known}; or models, model:<name>)")
    try:
        example_database(options.database)  # a Redis server that cannot be reached stops the run here
    except DatabaseError as error:
        raise SetupError(str(error)) from None
    if options.shard:
        shard, shards = parse_shard(options.shard)
        plan = plan[shard - 1::shards]  # round robin: each shard gets pool and manager layouts alike
        if not plan:
            raise SetupError(f"--shard {options.shard}: only {shard - 1} layout(s) to share, shard {shard} has none")
    return options, target, plan


def _stamp(trace: Trace, options: GateOptions) -> None:
    """Record in ``trace`` how the run was made: target, level, the release
    judged and the upstream run in lockstep with (a replay runs the same)."""
    trace.target, trace.level, trace.release = options.target, options.level, _recorded_release(options)
    trace.against = options.against or ""


def _recorded_release(options: GateOptions) -> str:
    """What a trace records of the release judged: nothing for the base (traces stay as they were)."""
    return "" if release_of(options).is_base else options.release or ""


def release_of(options: GateOptions) -> releases.Release:
    """The release this run judges by, once :func:`judge_by` resolved it
    (``options.release``; before that, or without one, the reference)."""
    return releases.as_release(options.release or None)


def judge_by(options: GateOptions) -> releases.Release:
    """The release whose rules judge this run, resolved once, here, and
    written to ``options.release`` -- everything the run builds is given it
    from there (the workers too): ``--release`` when given, else the
    installed vLLM's for the vllm target, else the base release -- impl and
    the spec are the base's API."""
    _check_release_is_installed(options)
    try:
        if options.release:
            release = releases.judged(options.release)
        elif options.target == "vllm":
            from kvspec.conformance.vllm import installed

            release = releases.judged(installed.version())
        else:
            release = releases.REFERENCE
    except ValueError as error:
        raise SetupError(f"--release: {error}") from None
    if options.target == "impl":
        try:
            impl_deltas(release)
        except ValueError as error:
            raise SetupError(str(error)) from None
    options.release = release.version  # the workers judge by the same
    return release


def _check_release_is_installed(options: GateOptions) -> None:
    """``--release X`` judges vLLM by X's rules; with another release of
    vLLM installed that is a judgement of one release by another's rules,
    which a run makes only when asked (``cross_release``) -- and says so.
    Releases the spec judges by the same rules (a fork's dev version over
    the release it is based on) are no mismatch."""
    if not options.release or options.target != "vllm":
        return
    from kvspec.conformance.vllm import installed as installed_vllm

    installed = installed_vllm.version()  # importable: the target's check made sure (runner.require_vllm)
    try:
        same = releases.judged(options.release).known == releases.judged(installed).known
    except ValueError as error:
        raise SetupError(f"--release: {error}") from None
    if same:
        return
    if not options.cross_release:
        raise SetupError(f"--release {options.release} judges by vLLM {options.release}'s rules, but the vLLM under "
                         f"test is {installed}: run it from an environment with vLLM {options.release} "
                         f"(VLLM_VERSION={options.release} tools/install_vllm.sh), or add --cross-release to judge "
                         f"{installed} by {options.release}'s rules on purpose")
    options.cross_release_of = installed


def parse_shard(text: str) -> tuple[int, int]:
    """``I/N`` -> (I, N), 1 <= I <= N."""
    match = re.fullmatch(r"(\d+)/(\d+)", text)
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        raise SetupError(f"--shard takes I/N with 1 <= I <= N (this machine's share of the layouts), got {text!r}")
    return int(match[1]), int(match[2])


def versions(target: str, scopes: list[str] = (),
             release: releases.Release = releases.REFERENCE) -> dict[str, str]:
    """What a report needs to be reproduced: kvspec's version, the target's
    (vLLM's, when it is the target or its scheduler runs), Python's, Hypothesis's."""
    import hypothesis

    found = {"kvspec": __version__}
    if target == "vllm" or "scheduler" in scopes:
        from kvspec.conformance.vllm import installed

        found["vLLM"] = installed.version()
        if (source := installed.overlay()) is not None:
            found["vLLM source"] = source  # a fork or main over the release's wheel
    found["release judged"] = release.known
    found["Python"] = platform.python_version()
    found["Hypothesis"] = hypothesis.__version__
    return found


def _asked(scope: str, wanted: list[str]) -> list[str]:
    """The layouts of ``scope`` among those asked for (``--layout``, in any
    release: one the release judged lacks is skipped with the reason);
    ``models`` stands for every ``model:<name>`` layout."""
    names = [m for name in wanted for m in (model_layout_names() if name == "models" else [name])]
    return [name for name in dict.fromkeys(names) if is_layout(scope, name)]


def _profiles(name: str) -> dict[str, object]:
    """Each scope's Hypothesis settings for the profile ``name``."""
    return {scope: scope_settings(scope, name) for scope in SCOPES}


class _Run:
    """One gate run's shared state: the options, what the machines avoid,
    the deadline, the report it fills and the fail-fast switch."""

    def __init__(self, options: GateOptions, target: Target, avoid: frozenset[str], deadline: float | None,
                 report: RunReport | None, listener: Listener):
        self.options, self.target, self.avoid, self.deadline = options, target, avoid, deadline
        self.report, self.listener = report, listener
        self.stopped = False  # --fail-fast saw a failure
        self.collected: list[LayoutResult] = []  # in a worker: the results, for the parent to finish
        # Under a budget, what is left of this process's share for making failures small: one bug that
        # many layouts show must not spend the budget shrinking it again and again while layouts wait.
        self.shrink_left = SHRINK_SHARE * options.budget if options.budget else None

    def shrink_seconds(self, most: float) -> float:
        """How long the next failure may shrink (or be minimised): ``most``,
        within what is left of the run's share (:data:`SHRINK_SHARE`), never
        under :data:`SHRINK_FLOOR`."""
        return most if self.shrink_left is None else min(most, max(SHRINK_FLOOR, self.shrink_left))

    def shrunk(self, seconds: float) -> None:
        """``seconds`` were spent making a failure small."""
        if self.shrink_left is not None:
            self.shrink_left -= max(0.0, seconds)

    def announce(self, scope: str, layout: str) -> Callable[[Trace, BaseException], None]:
        return _Announcer(self.options, self.listener, scope, layout)

    def minimise(self, r: LayoutResult) -> None:
        """Cut a failing layout's run to the steps it needs (:func:`minimise`),
        in what is left of the budget (at most MINIMISE_SECONDS)."""
        if not self.options.minimise or r.skipped is not None or r.conforms or r.trace is None or \
                r.minimised_from is not None:
            return
        if not r.shrinking_stopped and len(r.trace.steps) <= MINIMISE_OVER:
            return  # Hypothesis finished shrinking to a short run: replays would not cut it further, only cost
        seconds = MINIMISE_SECONDS if self.deadline is None else \
            min(self.shrink_seconds(MINIMISE_SECONDS), self.deadline - time.perf_counter())
        if seconds < 0.5:
            return
        _stamp(r.trace, self.options)  # each replay runs with the run's upstream and rules
        start = time.perf_counter()
        cut = minimise(r.trace, self.target.factory(r.scope), self.options.level, seconds=seconds)
        self.shrunk(time.perf_counter() - start)
        if cut is not None and len(cut.trace.steps) < len(r.trace.steps):
            r.minimised_from, r.trace, r.details = len(r.trace.steps), cut.trace, cut.message.splitlines()

    def finish(self, r: LayoutResult) -> None:
        """Record a layout's result: times from the run's start, a failing
        layout's trace minimised, saved and labelled; the listener told."""
        self.minimise(r)
        if self.report is None:  # a worker: the parent finishes it (labelled here too, for fail-fast)
            if r.trace is not None:
                _stamp(r.trace, self.options)  # the label reads how the run was made (--against)
            label(r, self.options, self.deadline)
            self.collected.append(r)
            return
        o = self.options
        if r.skipped is None and r.conforms:  # a pass needs a search
            r.skipped = below_floor(r.scope, r.operations)
        self.report.results.append(r)
        r.finished = round(time.perf_counter() - o.started, 3)
        if r.began is not None:
            r.began = round(r.began - o.started, 3)
        if r.first_failure_at is not None:
            r.first_failure_at = round(r.first_failure_at - o.started, 3)
        if r.skipped is None and r.trace is not None:
            _stamp(r.trace, o)
            r.trace_file = str(r.trace.save(o.traces() / trace_file_name(r.scope, r.layout)))
            label(r, self.options, self.deadline)
        self.listener.layout_done(r)
        self.see(r)

    def see(self, r: LayoutResult) -> None:
        if self.options.fail_fast and r.failed(self.options.strict) and r.known_finding is None and \
                r.skipped is None:
            self.stopped = True


def label(r: LayoutResult, options: GateOptions, deadline: float | None) -> None:
    """Say whose a failing layout's failure is: the known finding it fits
    (component, layout and rules: :func:`matching_finding`), and -- under a
    scheduler the target does not replace -- the component it belongs to
    when it is not the target's (:func:`attribute`).  Once per result: a
    worker's label stands in its parent."""
    if r.skipped is not None or r.trace is None or r.conforms or r.labelled:
        return
    known = matching_finding(options.findings_of, r.scope, r.layout, r.trace)
    r.known_finding = f"{known.id}: {known.title}" if known else None
    r.owner = attribute(r, options, deadline)
    r.labelled = True


ATTRIBUTION_SECONDS = 30.0  # at most, replaying a failure on vLLM's own block manager to attribute it


def attribute(r: LayoutResult, options: GateOptions, deadline: float | None) -> str | None:
    """The component a failing layout's failure belongs to when it is not
    the target's (a key of :data:`~kvspec.conformance.findings.COMPONENTS`),
    else ``None``.  Only a block manager judged under vLLM's scheduler can
    fail for another component's fault: its minimal run is replayed with
    vLLM's own block manager in its place, and where that fails too, on the
    same rules, the failure is vLLM's scheduler's -- whatever it looks like.
    A replay that passes, fails otherwise or cannot finish leaves the
    failure the target's: never green for the target's own bug."""
    if r.scope != "scheduler" or options.target == "vllm":
        return None
    from kvspec import dropin

    if dropin.installed():  # the replay would run the target again, not vLLM's block manager
        return None
    seconds = ATTRIBUTION_SECONDS if deadline is None else \
        min(ATTRIBUTION_SECONDS, max(SHRINK_FLOOR, deadline - time.perf_counter()))
    try:
        outcome = replay_trace(r.trace, "vllm", options.level, seconds=seconds)
    except (SetupError, ConformanceError, ValueError, TypeError):  # the trace does not fit vLLM's (a release gap)
        return None
    if outcome.conforms or HANGS in outcome.message or set(outcome.rules) != set(r.rules):
        return None
    return "vllm-scheduler"


class _Announcer:
    """Tells at once that a layout has failed -- the failing rule and the run
    as it happened, saved next to where the minimal run will go -- so that a
    red gate shows in seconds, not after the shrinker is done."""

    def __init__(self, options: GateOptions, listener: Listener, scope: str, layout: str):
        self.options, self.listener, self.scope, self.layout = options, listener, scope, layout

    def __call__(self, trace: Trace, error: BaseException) -> None:
        o = self.options
        seconds = time.perf_counter() - o.started
        _stamp(trace, o)
        path = trace.save(o.traces() / trace_file_name(self.scope, self.layout).replace(".json", ".unshrunk.json"))
        known = matching_finding(o.findings_of, self.scope, self.layout, trace)
        if isinstance(error, ConformanceError):
            broken = ", ".join(sorted({v.rule for v in error.violations})) or unnamed_failure(str(error))
        else:  # the target raised where no refusal is possible
            broken = f"{type(error).__name__}: {error}"
        self.listener.first_failure(FirstFailure(self.scope, self.layout, seconds, broken, len(trace.steps), path,
                                                 known.id if known else None))


def _search_each(run: _Run, todo: list[tuple[str, str]], progress: Progress | None) -> None:
    """Sized by examples, in one process: each layout's search in turn."""
    o = run.options
    profiles = _profiles(o.profile)
    for i, (scope, name) in enumerate(todo, 1):
        if run.stopped:
            run.finish(LayoutResult(scope, name, 0, 0.0, True, skipped=FAIL_FAST))
            continue
        if progress:
            progress.position = (i, len(todo), o.started, None)
        run.finish(_search_one(run, scope, name, profiles[scope], progress))


def _search_one(run: _Run, scope: str, name: str, profile: object, progress: Progress | None = None) -> LayoutResult:
    """One layout's search, sized by examples."""
    o = run.options
    search = Search(profile, examples=o.examples, seed=o.seed, batch=25 if scope == "pool" else 10,
                    database=o.database, on_first_failure=run.announce(scope, name))
    r = run_layout(machine_for(scope, name, o.target, o.level, run.avoid, o.against, release_of(o), checked=True,
                               factory=run.target.factory(scope)), search, progress)
    r.seed = search.seed
    return r


def _search_in_rounds(run: _Run, todo: list[tuple[str, str]], progress: Progress | None) -> None:
    """A budgeted search in one process: the layouts take turns in rounds of
    slices instead of one long turn each, so a bug any layout shows within
    its first second is found within the first round, however many layouts
    come before it.  Slices double every round; a layout whose last slice
    reached no new abstract state (CheckingMachine.cover) gets a quarter
    slice, so the budget moves to layouts still finding new ground.  A
    failure shrinks for at most SHRINK_SECONDS (less when the budget ends
    sooner, or when the run's failures have used their share of it,
    SHRINK_SHARE) and then its layout is done; the others go on."""
    o, deadline = run.options, run.deadline
    profiles = _profiles(o.profile)
    machines = {(scope, name): machine_for(scope, name, o.target, o.level, run.avoid, o.against, release_of(o),
                                           checked=True, factory=run.target.factory(scope)) for scope, name in todo}
    base = o.seed if o.seed is not None else int.from_bytes(os.urandom(4), "big")
    spent = dict.fromkeys(todo, 0.0)
    began: dict[tuple[str, str], float] = {}
    weight = dict.fromkeys(todo, 1.0)
    open_layouts = list(todo)
    first_slice = min(max((deadline - time.perf_counter()) / (4 * max(1, len(todo))), FIRST_SLICE[0]),
                      FIRST_SLICE[1])
    slice_no = 0
    for round_no in itertools.count():
        if not open_layouts or run.stopped or time.perf_counter() >= deadline:
            break
        for i, key in enumerate(sorted(open_layouts, key=lambda k: (-weight[k], spent[k])), 1):
            now = time.perf_counter()
            if now >= deadline or run.stopped:
                break
            scope, name = key
            machine = machines[key]
            seconds = min(first_slice * 2 ** round_no * weight[key], deadline - now)
            reached = machine.log.states_reached()
            search = Search(profiles[scope], seconds=seconds, seed=base + 1000 * slice_no, swarm=True,
                            batch=25 if scope == "pool" else 10, database=o.database,
                            deadline=min(deadline, now + seconds + run.shrink_seconds(SHRINK_SECONDS)),
                            on_first_failure=run.announce(scope, name))
            slice_no += 1
            if progress:
                progress.position = (i, len(open_layouts), o.started, deadline)
            r = run_layout(machine, search, progress)
            began.setdefault(key, r.began)
            spent[key] += r.seconds
            weight[key] = 1.0 if machine.log.states_reached() > reached else QUIET_WEIGHT
            if not r.conforms:
                run.shrunk(time.perf_counter() - (now + seconds))  # past its slice: shrinking
                r.seconds, r.began, r.seed = spent[key], began[key], base
                open_layouts.remove(key)
                run.finish(r)
                if run.report is None:  # a worker: fail-fast judged here too, on the label finish gave it
                    run.see(r)
    for key in todo:
        if key in open_layouts:
            machine = machines[key]
            scope, name = key
            if key not in began or machine.log.steps_run == 0 or run.stopped:
                # its turn never came, ended before one operation, or --fail-fast cut its search short
                run.finish(LayoutResult(scope, name, 0, 0.0, True,
                                        skipped=FAIL_FAST if run.stopped else BUDGET_SPENT))
                continue
            log = machine.log
            run.finish(LayoutResult(scope, name, log.steps_run, spent[key], True, examples=log.examples_run,
                                    seed=base, began=began.get(key), distinct_states=log.states_reached()))


def _search_in_parallel(run: _Run, todo: list[tuple[str, str]]) -> None:
    """The layouts in ``workers`` processes at once.  Sized by examples,
    each layout is a task of its own, finished as it ends.  Under a budget
    each worker searches a round-robin share of the layouts in rounds, as one
    process does (:func:`_search_in_rounds`), and its layouts are finished
    when it is done; a watchdog stops every worker still running
    :data:`WORKER_GRACE` seconds past the budget -- a target stuck where no
    signal reaches (a C loop, a deadlock) fails its layouts instead of
    holding the run.  What a worker tells as it goes (a first failure, the
    progress bar's lines) is relayed to this process, so that the listener
    and this process's stderr see it, however they are captured."""
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    o, deadline = run.options, run.deadline
    context = _fork_context()
    relay = _Relay(context)
    pool = ProcessPoolExecutor(max_workers=o.workers, mp_context=context, initializer=_Relay.install,
                               initargs=(relay,))
    if deadline is None:  # sized by examples: one task per layout
        pending = {pool.submit(_worker, o, run.target, [key], run.avoid, None): [key] for key in todo}
    else:  # under a budget: each worker takes its round-robin share of the layouts in rounds
        shares = [todo[i::o.workers] for i in range(min(o.workers, len(todo)))]
        pending = {pool.submit(_worker, o, run.target, share, run.avoid, deadline): share for share in shares}
    try:
        while pending:
            done, _ = wait(pending, timeout=RELAY_INTERVAL, return_when=FIRST_COMPLETED)
            relay.deliver(run.listener)
            if not done and deadline is not None and time.perf_counter() > deadline + WORKER_GRACE:
                # the watchdog: the budget and its grace are over
                for scope, name in sorted(key for keys in pending.values() for key in keys):
                    run.finish(LayoutResult(scope, name, 0, 0.0, False, details=[
                        f"the worker searching this layout had not finished {WORKER_GRACE:g} s after the budget "
                        "ran out and was stopped: the target hangs where no alarm reaches it"]))
                return
            for future in done:
                keys = pending.pop(future)
                try:
                    results = future.result()
                except SetupError:  # kvspec's harness failed in the worker: a usage/environment error
                    raise
                except Exception as error:  # the worker died (a crash in native code) or could not pickle
                    results = [LayoutResult(scope, name, 0, 0.0, False,
                                            details=[f"the worker searching this layout died: {error!r}"])
                               for scope, name in keys]
                relay.deliver(run.listener)  # what it told before it finished, first
                for result in results:
                    run.finish(result)
            if run.stopped:
                for scope, name in sorted(key for keys in pending.values() for key in keys):
                    run.finish(LayoutResult(scope, name, 0, 0.0, True, skipped=FAIL_FAST))
                return
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        if pending:
            import multiprocessing

            for child in multiprocessing.active_children():  # the workers still searching or stuck
                child.terminate()
        relay.deliver(run.listener)


RELAY_INTERVAL = 0.2  # seconds: how often the parent passes on what its workers told


class _Relay(Listener):
    """What a worker process tells, carried to the parent over a queue:
    first failures (for the parent's listener) and text for stderr (the
    progress bar).  The parent makes one before the workers start; each
    worker installs it (:meth:`install`) and tells it; the parent
    :meth:`deliver` s."""

    current: _Relay | None = None  # in a worker: where to tell

    def __init__(self, context: object | None):
        import multiprocessing

        self.queue = (context or multiprocessing).SimpleQueue()

    @staticmethod
    def install(relay: _Relay) -> None:
        _Relay.current = relay

    def first_failure(self, failure: FirstFailure) -> None:
        self.queue.put(("first_failure", failure))

    def write(self, text: str) -> None:  # the progress bar's stream
        self.queue.put(("stderr", text))

    def flush(self) -> None:
        pass

    def deliver(self, listener: Listener) -> None:
        """Pass on everything told so far (in the parent)."""
        import sys

        while not self.queue.empty():
            kind, what = self.queue.get()
            if kind == "first_failure":
                listener.first_failure(what)
            else:
                sys.stderr.write(what)
                sys.stderr.flush()


def _worker(options: GateOptions, target: Target, todo: list[tuple[str, str]], avoid: frozenset[str],
            deadline: float | None) -> list[LayoutResult]:
    """Some layouts' search in a worker process (see _search_in_parallel):
    their results, for the parent to finish.  The only worker of a budgeted
    run draws the progress bar the sequential search would (relayed)."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's handler came with the fork: its stop ends us
    quiet_loggers()
    measure = spec_coverage.start(options.coverage_dir) if options.coverage_dir else None
    try:
        return _work(options, target, todo, avoid, deadline)
    finally:
        if measure is not None:
            spec_coverage.stop(measure)


def _work(options: GateOptions, target: Target, todo: list[tuple[str, str]], avoid: frozenset[str],
          deadline: float | None) -> list[LayoutResult]:
    relay = _Relay.current or Listener()
    run = _Run(options, target, avoid, deadline, None, relay)
    if deadline is None:
        (scope, name), = todo
        return [_search_one(run, scope, name, _profiles(options.profile)[scope])]
    progress = Progress(stream=relay) if options.progress and options.workers == 1 and _Relay.current else None
    _search_in_rounds(run, todo, progress)
    return run.collected


def _fork_context() -> object | None:
    """The ``fork`` start method where the platform has it: a worker
    inherits the caller's process as it is -- a mutant's patches, a test's
    monkeypatches, vLLM already imported -- whatever Python's default
    (``forkserver`` from 3.14) would start."""
    import multiprocessing

    return multiprocessing.get_context("fork") if _can_fork() else None


def _can_fork() -> bool:
    import multiprocessing

    return "fork" in multiprocessing.get_all_start_methods()


# --- the failing run, cut to the steps it needs ------------------------------------------------------------
#
# Delta debugging over a saved trace, after Hypothesis's shrinker.
#
# Hypothesis shrinks the *draws* of a failing run, and a budget often stops
# it early: a bug that three operations reproduce can come out as a run of a
# hundred steps ("shrinking stopped at the budget").  A trace, though, can be
# replayed with any of its steps left out (:func:`kvspec.conformance.runner.replay`
# feeds each step's recorded decisions to a fresh machine), so the steps
# themselves can be cut: :func:`minimise` removes chunks of steps, halving
# the chunks when no removal keeps the failure (Zeller's ddmin, complements
# only), and keeps a cut only where the replay still fails **the same way**
# -- the same rules broken, or, for a failure that names none (a divergence
# from the spec, an exception out of the target), again one that names none
# and is no step the trace cannot give (a recorded decision that no longer
# fits: that is the cut's fault, not the target's).  It never trades the
# failure it started from for another.
#
# It runs in a time limit (replays against a slow target add up), and what
# it returns is always a failing trace: the input itself when nothing could
# be cut in time.


MINIMISE_OVER = 12
"""A failing run Hypothesis finished shrinking is cut by replay only when it
is longer than this many steps; one whose shrinking the budget stopped,
always."""

MINIMISE_SECONDS = 10.0
"""The longest a layout's failing run is minimised after the search (less
when the run's budget ends sooner)."""

LEFT_THE_PATH = ("the target left the recorded path", "conforms up to the end of the trace")
"""How a replay reads that ends because the cut trace does not fit (a
decision with nothing to decide, a rule that cannot run): no failure."""


@dataclasses.dataclass
class Minimised:
    trace: Trace  # the shortest failing trace found, its failure recorded as the replay saw it
    message: str  # the replay's account of that failure
    replays: int  # how many replays the search ran


def minimise(trace: Trace, target: str | Callable[..., Any], level: str, *, seconds: float = MINIMISE_SECONDS,
             replay: Callable[..., Any] | None = None) -> Minimised | None:
    """``trace`` (a failing run) with every step it can do without, within
    ``seconds``; ``None`` when the trace does not fail on replay in the
    first place (then there is nothing to keep)."""
    replay = replay or replay_trace
    if HANGS in (trace.failure or {}).get("message", "") or any(
            "did not return" in op for step in trace.steps for op in step.operations):
        return None  # each replay would wait out its time in the call that never returns
    deadline = time.perf_counter() + seconds
    wanted = sorted((trace.failure or {}).get("rules") or [])
    replays = 0

    def attempt(steps: list[Any]) -> Any | None:
        """The replay's outcome when ``steps`` fail as ``trace`` did, else None."""
        nonlocal replays
        left = deadline - time.perf_counter()
        if left <= 0:
            return None
        replays += 1
        candidate = dataclasses.replace(trace, steps=steps, failure=None)
        outcome = replay(candidate, target, level, seconds=left)
        if outcome.conforms or sorted(outcome.rules) != wanted or outcome.message.startswith(LEFT_THE_PATH):
            return None
        return None if HANGS in outcome.message else outcome  # the time ran out inside the replay: no verdict

    steps = [s for s in trace.steps if s.rule != "teardown"]
    best = attempt(steps)
    if best is None:
        return None
    steps = _through_failure(steps, best)
    chunks = 2
    while len(steps) >= 2 and time.perf_counter() < deadline:
        size = -(-len(steps) // chunks)
        for start in range(0, len(steps), size):
            if steps[start].rule == "init":  # the machine's own opening, not a decision
                continue
            cut = steps[:start] + steps[start + size:]
            if cut and (outcome := attempt(cut)) is not None:
                steps, best = _through_failure(cut, outcome), outcome
                chunks = max(chunks - 1, 2)
                break
        else:
            if chunks >= len(steps):
                break
            chunks = min(len(steps), 2 * chunks)
    found = best.trace
    found = dataclasses.replace(trace, steps=list(found.steps), failure=found.failure)
    if found.failure is None:
        found.record_failure(wanted, best.message)
    return Minimised(found, best.message, replays)


def _through_failure(steps: list[Any], outcome: Any) -> list[Any]:
    """``steps`` up to the one the replay failed at (a failure in teardown keeps them all)."""
    return steps[:outcome.diverged_at] if outcome.diverged_at <= len(steps) else steps
