"""Machine-readable results of a conformance run: JSON, Markdown, JUnit XML.

One :class:`LayoutResult` per (scope, layout) run; :func:`write_reports`
writes ``report.json`` (everything), ``report.md`` (a summary a pull request
can show) and ``junit.xml`` (one test case per layout, a failure per broken
layout, for CI systems) into a directory.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvspec.conformance.findings import COMPONENTS
from kvspec.conformance.machines.machinery import DIVERGENCE, unnamed_failure
from kvspec.conformance.trace import Trace

BUDGET_SPENT = "the budget was spent"  # why a layout was not searched
FAIL_FAST = "--fail-fast: the run stopped at the first failure"
STEERED = "steered around "  # + the findings (or --avoid) a skipped layout was steered around for
TOO_FEW = "too few operations: "  # + how many ran and the scope's floor
INTERRUPTED = "the run was interrupted (SIGINT or SIGTERM) before its turn ended"

OPERATION_FLOOR = {"pool": 25, "manager": 25, "scheduler": 10, "kernels": 1}
"""Per scope, the fewest operations a layout's search must run for the run
to say anything about it: about a quarter of one example of the pool and
manager machines (up to 100 operations each), and of the scheduler
machine's (arrivals, steps and aborts, each step a whole engine step); one
step of the kernel stage (a whole forward pass).  A search that ran fewer
-- a budget eaten by loading the target, a slice cut short -- reports the
layout *not searched*, never *conforms*."""


def below_floor(scope: str, operations: int) -> str | None:
    """Why a search of ``operations`` at ``scope`` counts for nothing (the
    skip reason, :data:`TOO_FEW` first), or ``None`` when it reached the floor."""
    floor = OPERATION_FLOOR.get(scope, 0)
    return f"{TOO_FEW}{operations} ran, the floor at {scope} scope is {floor}" if operations < floor else None


@dataclass
class LayoutResult:
    scope: str
    layout: str
    operations: int
    seconds: float
    conforms: bool
    rules: list[str] = field(default_factory=list)  # the rules broken, by name
    details: list[str] = field(default_factory=list)  # the violations or the divergence
    examples: int = 0  # machine runs, shrinking included
    seed: int | None = None
    trace: Trace | None = field(default=None, repr=False)  # the minimal failing run
    trace_file: str | None = None  # where that trace was saved
    shrinking_stopped: bool = False  # the budget ran out while shrinking: the trace is not minimal
    known_finding: str | None = None  # "F1: ..." when the failure looks like a known finding of the target
    skipped: str | None = None  # why the layout was not searched (steered around, budget spent)
    # When (seconds from the command's start; the runner leaves clock readings
    # that the command converts): the layout's search began, a check first
    # failed (the gate is red from then on), and its result was final.
    began: float | None = None
    first_failure_at: float | None = None
    first_failure_example: int | None = None  # the search's run (1-based) that failed first: 1 when a
    # failure saved in the example database replays at once
    finished: float | None = None
    distinct_states: int = 0  # abstract states the search reached (CheckingMachine.cover)
    minimised_from: int | None = None  # the steps of Hypothesis's failing run, when replays cut it shorter
    owner: str | None = None  # a failure that is not the target's: the component it is (findings.COMPONENTS)
    parameters: str = ""  # a failing layout's groups, block sizes, windows, pool (runner.describe_layout)
    labelled: bool = False  # known_finding and owner are said (by the worker that ran it, or the gate)
    runner: str = ""  # the kernel stage with vLLM's worker: the model runner vLLM picks, and the one driven

    def failed(self, strict: bool = False) -> bool:
        """Whether this layout fails the target: it broke, and the failure
        is the target's own -- not that of a component it runs on and does
        not replace (``owner``), unless ``strict`` counts those too."""
        return not self.conforms and (strict or self.owner is None)

    @property
    def cause(self) -> str:
        """What broke and where -- the rules broken (or the kind of
        divergence) and the operation the failing step ended in, "free-order
        after free_blocks": the key failures are grouped by, one bug showing
        on many layouts being one cause."""
        what = ", ".join(self.rules) or unnamed_failure(" ".join(self.details))
        operation = failing_operation(self.trace)
        return f"{what} after {operation}" if operation else what

    def clarity(self) -> tuple[int, int]:
        """How readily a failure is diagnosed, smaller first: a rule's
        verdict before a bare divergence, then the shorter run."""
        return (0 if self.rules else 1, len(self.trace.steps) if self.trace is not None else 1 << 30)

    @property
    def known_label(self) -> str:
        """How a report names the known finding or the component a failure
        is, ``""`` where it is neither: "known finding F1", "vLLM's
        scheduler: known finding S2, not the target's"."""
        known = f"known finding {self.known_finding.split(':')[0]}" if self.known_finding else ""
        if self.owner is None:
            return known
        return f"{COMPONENTS[self.owner]}: {known or 'fails with its own block manager too'}, not the target's"

    @property
    def unsearched(self) -> bool:
        """The run says nothing about this layout: its turn never came (the
        budget, --fail-fast) or its search ran fewer operations than the
        floor.  A layout steered around a known finding, one the target or
        release does not have, or one where a release delta the spec does not
        model shows, is skipped on purpose, not unsearched."""
        return self.skipped is not None and (self.skipped in (BUDGET_SPENT, FAIL_FAST, INTERRUPTED)
                                             or self.skipped.startswith(TOO_FEW))

    def verdict(self) -> str:
        """The layout's result as the command prints it: ``conforms``, or
        what broke, the failing run step by step, where it is saved, the seed."""
        if self.conforms:
            return "conforms"
        label = self.known_label
        known = f" ({label})" if self.owner else f" (looks like {label})" if label else ""
        lines = [("failed" if self.owner else "FAILED") + known,
                 *([f"    layout: {self.parameters}"] if self.parameters else []),
                 *("    " + line for line in self.details)]
        if self.shrinking_stopped:
            lines += ["    shrinking stopped at the budget: the run below is the smallest found in time"]
        if self.minimised_from is not None and self.trace is not None:
            lines += [f"    cut from {self.minimised_from} to {len(self.trace.steps)} steps by replaying it with steps "
                      "left out (the same failure)"]
        if self.trace is not None:
            lines += ["    minimal failing run:", *("      " + line for line in self.trace.readable())]
            if self.trace_file:
                lines += [f"    saved: {self.trace_file}  (kvspec replay {self.trace_file})"]
        if self.seed is not None:
            lines += [f"    seed: {self.seed}"]
        return "\n".join(lines)

    def to_json(self) -> dict:
        out = asdict(self)
        out.pop("trace")
        out["steps"] = self.trace.readable() if self.trace else []
        return out


@dataclass
class RunReport:
    target: str
    level: str
    profile: str
    seed: int | None = None
    steered_around: list[str] = field(default_factory=list)  # known findings whose inputs were not sent
    inherited: list[str] = field(default_factory=list)  # ... those of components the target runs on
    strict: bool = False  # failures of components the target runs on count against it
    checked: dict[str, list[str]] = field(default_factory=dict)  # scope -> the rules checked
    results: list[LayoutResult] = field(default_factory=list)
    command: str = ""  # the command line, as typed
    versions: dict[str, str] = field(default_factory=dict)  # kvspec, the target, Python, Hypothesis
    written: list[Path] = field(default_factory=list)  # the report files, once written
    coverage: dict | None = None  # --coverage: what the run exercised of the spec (kvspec.conformance.spec_coverage)
    command_name: str = "conform"  # the kvspec command the report is of: conform, or kernels (no level)
    against: str | None = None  # the upstream the target ran in lockstep with (--against), as it names itself
    interrupted: str | None = None  # the signal that stopped the run before its end (SIGINT, SIGTERM)

    @property
    def searched(self) -> list[LayoutResult]:
        return [r for r in self.results if r.skipped is None]

    @property
    def failures(self) -> list[LayoutResult]:
        """The layouts that fail the target (:meth:`LayoutResult.failed`)."""
        return [r for r in self.results if r.failed(self.strict)]

    @property
    def others_failures(self) -> list[LayoutResult]:
        """Failures of components the target runs on, not counted against it."""
        return [r for r in self.results if not r.conforms and not r.failed(self.strict)]

    @property
    def conforms(self) -> bool:
        return not self.failures

    @property
    def unsearched(self) -> list[LayoutResult]:
        """The layouts the run says nothing about (:attr:`LayoutResult.unsearched`)."""
        return [r for r in self.results if r.unsearched]

    @property
    def verdict(self) -> str:
        """``conforms``, ``does NOT conform``, or -- nothing broke, but some
        layout was not searched -- ``was NOT fully searched``: a run that
        did not search a layout never reads as a pass for it."""
        if not self.conforms:
            return "does NOT conform" + (f" (interrupted by {self.interrupted})" if self.interrupted else "")
        if self.interrupted:
            return f"was INTERRUPTED by {self.interrupted} ({len(self.unsearched)} of {len(self.results)} layouts " \
                   "not searched)"
        if self.unsearched:
            return f"was NOT fully searched ({len(self.unsearched)} of {len(self.results)} layouts not searched)"
        return "conforms"

    def causes(self) -> dict[str, list[LayoutResult]]:
        """The target's failures grouped by cause (:attr:`LayoutResult.cause`),
        each group's clearest failure first, the groups whose cause names a
        rule first, then the largest."""
        groups: dict[str, list[LayoutResult]] = {}
        for r in self.failures:
            groups.setdefault(r.cause, []).append(r)
        _fold_divergences(groups)
        ordered = sorted(groups.values(), key=lambda rs: (min(r.clarity() for r in rs)[0], -len(rs)))
        return {min(rs, key=LayoutResult.clarity).cause: sorted(rs, key=LayoutResult.clarity) for rs in ordered}

    def known_groups(self) -> dict[str, list[str]]:
        """Failures that look like known findings: finding -> layouts."""
        groups: dict[str, list[str]] = {}
        for r in self.results:
            if r.failed(self.strict) and r.known_finding:
                groups.setdefault(r.known_finding, []).append(f"{r.scope}/{r.layout}")
        return groups

    def rule_summary(self, checked: dict[str, list[str]]) -> list[tuple[str, int, list[str]]]:
        """Per rule: on how many layouts it was checked and where it broke.
        ``checked`` maps a scope to its rules; a failure that names no rule
        (a divergence) counts against ``spec-equivalence`` at L3, else
        ``clean-refusal``."""
        out = []
        every = sorted({rule for rules in checked.values() for rule in rules})
        for rule in every:
            layouts = [r for r in self.searched if rule in checked.get(r.scope, [])]
            broken = [f"{r.scope}/{r.layout}" for r in layouts if rule in self._broken_rules(r)]
            out.append((rule, len(layouts), broken))
        return out

    def _broken_rules(self, r: LayoutResult) -> list[str]:
        if not r.failed(self.strict) or r.rules:
            return r.rules
        if self.against and unnamed_failure(" ".join(r.details)) == DIVERGENCE["upstream"]:
            return ["upstream-equivalence"]
        return ["spec-equivalence" if self.level == "L3" else "clean-refusal"]

    def rule_table(self, checked: dict[str, list[str]]) -> list[str]:
        """The rule x layout summary as text lines."""
        lines = [f"{'rule':<24} {'layouts':>7}  broken in"]
        for rule, n, broken in self.rule_summary(checked):
            lines.append(f"{rule:<24} {n:>7}  {', '.join(broken) or '-'}")
        return lines

    def to_markdown(self) -> str:
        """A report fit for a pull-request comment: the verdict, how it was
        run, one row per layout, the rules, and each failure folded."""
        verdict = self.verdict
        versions = ", ".join(f"{k} {v}" for k, v in self.versions.items())
        lines = [
            f"## kvspec {self.command_name}: `{self.target}` {verdict}" + (f" at {self.level}" if self.level else ""),
            "",
            *([f"`{self.command}`", ""] if self.command else []),
            f"Profile `{self.profile}`" + (f", seed {self.seed}" if self.seed is not None else "")
            + f"; {sum(r.operations for r in self.results)} operations checked"
            + (f"; {versions}" if versions else "") + ".",
            "",
            *self._steered_markdown(),
            *self._others_markdown(),
            *([f"In lockstep with the upstream **{self.against}** instead of the spec (pool and manager scope): "
               "every difference is the target's change.", ""] if self.against else []),
        ]
        for finding, layouts in self.known_groups().items():
            lines += [f"Known finding **{finding}**: {len(layouts)} layout(s) ({', '.join(layouts)}).", ""]
        if causes := self.causes():
            lines += [f"**{len(causes)} cause(s)** of {len(self.failures)} failing layout(s), each shown once below "
                      "by its clearest run:", "",
                      *(f"- `{cause}`: {len(rs)} layout(s) ({', '.join(f'{r.scope}/{r.layout}' for r in rs)})"
                        for cause, rs in causes.items()), ""]
        skipped = [r for r in self.results if r.skipped is not None]
        folded = skipped if len(skipped) > FOLD_OVER else []
        lines += ["| scope | layout | operations | states reached | seconds | result |", "|---|---|---:|---:|---:|---|"]
        for r in self.results:
            if folded and r.skipped is not None:
                continue
            result = _result_text(r)
            if r.first_failure_at is not None:
                result += f" (red at {r.first_failure_at:.1f} s)"
            lines.append(f"| {r.scope} | {r.layout} | {r.operations} | {r.distinct_states or '-'} | {r.seconds:.1f} "
                         f"| {result} |")
        if folded:
            reasons: dict[str, list[str]] = {}
            for r in folded:
                reasons.setdefault(_result_text(r), []).append(f"{r.scope}/{r.layout}")
            lines += ["", f"<details><summary>{len(folded)} more layouts, not searched or skipped</summary>", "",
                      *(f"- {why}: {', '.join(layouts)}" for why, layouts in reasons.items()), "", "</details>"]
        if runners := [r for r in self.results if r.runner]:
            lines += ["", "Model runners (vLLM's own choice for each model on a CUDA GPU, and the one driven):", "",
                      *(f"- {r.layout}: {r.runner}" for r in runners)]
        if self.checked:
            lines += ["", "<details><summary>Rules checked</summary>", "",
                      "| rule | layouts checked | broken in |", "|---|---:|---|"]
            for rule, n, broken in self.rule_summary(self.checked):
                lines.append(f"| {rule} | {n} | {', '.join(broken) or '-'} |")
            lines += ["", "</details>"]
        if self.coverage is not None:
            from kvspec.conformance.spec_coverage import markdown

            lines += markdown(self.coverage)
        lines += self._causes_markdown()
        return _cut("\n".join(lines) + "\n", MARKDOWN_LIMIT)

    def _causes_markdown(self) -> list[str]:
        """One folded section per cause: its clearest failure in full (the
        details, the run), the other layouts it shows on by name and trace;
        failures of components the target runs on after them, as theirs."""
        lines = []
        for results in [*self.causes().values(), *([r] for r in self.others_failures)]:
            first, others = results[0], results[1:]
            more = f" and {len(others)} more layout(s)" if others else ""
            lines += ["", f"<details><summary>{first.scope} / {first.layout}{more}: {_result_text(first)}</summary>",
                      "", *([f"Layout: {first.parameters}", ""] if first.parameters else []),
                      "```", *first.details[:DETAIL_LINES], "```"]
            if first.shrinking_stopped:
                lines += ["", "Shrinking stopped at the budget: the run below is the smallest found in time."]
            if first.trace:
                replay = f"`kvspec replay {first.trace_file}`" if first.trace_file else "the saved trace"
                lines += ["", f"Failing run ({replay}):", "", "```", *first.trace.readable(), "```"]
            if others:
                lines += ["", "The same cause on: " + ", ".join(
                    f"{r.scope}/{r.layout}" + (f" (`{r.trace_file}`)" if r.trace_file else "") for r in others)]
            lines += ["", "</details>"]
        return lines

    def _others_markdown(self) -> list[str]:
        """The findings of components the target runs on (steered around),
        and failures that replaying on vLLM's own block manager showed are
        that component's: a section of their own, not the target's verdict."""
        lines = []
        if self.inherited:
            lines += [f"Not the target's (components it runs on and does not replace; `--strict` sends their "
                      f"inputs): steered around {'; '.join(self.inherited)}.", ""]
        for r in self.others_failures:
            lines += [f"**{r.scope}/{r.layout}**: {r.known_label} -- {', '.join(r.rules) or 'a divergence'} "
                      f"(`kvspec replay {r.trace_file}`).", ""]
        return lines

    def _steered_markdown(self) -> list[str]:
        """The known findings steered around: a line, or -- more than a few
        -- a folded list (a vLLM run steers around sixteen, titles and all)."""
        if not self.steered_around:
            return []
        if len(self.steered_around) <= 3:
            return [f"Steered around known findings (docs/findings.md): {'; '.join(self.steered_around)}.", ""]
        ids = ", ".join(s.split(":")[0] for s in self.steered_around)
        return [f"<details><summary>Steered around {len(self.steered_around)} known findings (docs/findings.md): "
                f"{ids}</summary>", "", *(f"- {s}" for s in self.steered_around), "", "</details>", ""]

    def to_junit(self) -> str:
        """One test suite per scope, one test case per layout: a failure
        names its rules, a layout not searched is ``<skipped/>``."""
        suites = ET.Element("testsuites", name=f"kvspec {self.command_name} {self.target} {self.level}".strip())
        for scope in dict.fromkeys(r.scope for r in self.results):
            results = [r for r in self.results if r.scope == scope]
            suite = ET.SubElement(
                suites, "testsuite", name=f"kvspec.{scope}", tests=str(len(results)),
                failures=str(sum(r.failed(self.strict) for r in results)), errors="0",
                skipped=str(sum(r.skipped is not None or (not r.conforms and not r.failed(self.strict))
                                for r in results)),
                time=f"{sum(r.seconds for r in results):.3f}",
            )
            for r in results:
                case = ET.SubElement(suite, "testcase", classname=f"kvspec.{scope}", name=r.layout,
                                     time=f"{r.seconds:.3f}")
                if r.skipped is not None:
                    ET.SubElement(case, "skipped", message=r.skipped)
                elif not r.conforms and not r.failed(self.strict):
                    ET.SubElement(case, "skipped", message=r.known_label)
                elif not r.conforms:
                    failure = ET.SubElement(case, "failure", message=_result_text(r))
                    failure.text = "\n".join(r.details + (r.trace.readable() if r.trace else []))
        return ET.tostring(suites, encoding="unicode")


MARKDOWN_LIMIT = 60_000
"""report.md's length at most: a pull-request comment takes 65,536 characters."""

DETAIL_LINES = 40
"""A failure's details shown in report.md at most (all of them in report.json)."""

FOLD_OVER = 5
"""More skipped layouts than this (a --fail-fast run, a spent budget, many
steered around) are listed folded under the table, grouped by reason: the
report a pull request shows leads with what was searched."""


def _result_text(r: LayoutResult) -> str:
    if r.skipped is not None:
        return f"skipped ({r.skipped})"
    if r.conforms:
        return "conforms"
    text = ("failed" if r.owner else "FAILED") + ": " + (", ".join(r.rules) or unnamed_failure(" ".join(r.details)))
    return text + (f" ({r.known_label})" if r.known_label else "")


#: Operations another runs as a step of its own: ``allocate_slots`` first
#: releases what left the window, exactly as ``remove_skipped_blocks`` does
#: (spec chapter 2, :meth:`kvspec.spec.manager.KVCacheManager.allocate_slots`),
#: so one window bug shows after either.
RUNS_AS_A_STEP = {"allocate_slots": ("remove_skipped_blocks",)}


def _related(a: str | None, b: str | None) -> bool:
    """Whether a bug seen after operation ``a`` may be the one seen after
    ``b``: the same operation, or one runs the other as a step."""
    return a == b or b in RUNS_AS_A_STEP.get(a or "", ()) or a in RUNS_AS_A_STEP.get(b or "", ())


def _fold_divergences(groups: dict[str, list[LayoutResult]]) -> None:
    """Fold what one bug shows as several causes.  At L3 the lockstep with
    the spec sees a bug at the operation it happens, often before any rule
    can -- on one layout the rule's verdict, on another the divergence; and
    a bug in a step shows after that operation and after the one running it.
    So a group of bare divergences goes into the one group that names a rule
    after the same operation, or, failing that, after an operation related
    to it (:data:`RUNS_AS_A_STEP`), where there is exactly one; and a group
    naming the same rules as another after an operation that runs its own
    as a step goes into that one."""
    def operation(cause: str) -> str | None:
        return failing_operation(groups[cause][0].trace)

    named = [c for c, rs in groups.items() if rs[0].rules]
    for inner in named:
        outer = [c for c in named if c != inner and c in groups and groups[c][0].rules == groups[inner][0].rules
                 and operation(inner) in RUNS_AS_A_STEP.get(operation(c) or "", ())]
        if len(outer) == 1:
            groups[outer[0]] += groups.pop(inner)
    named = [c for c in named if c in groups]
    for cause in [c for c, rs in groups.items() if not rs[0].rules]:
        into = [c for c in named if operation(c) == operation(cause)] or \
            [c for c in named if _related(operation(c), operation(cause))]
        if len(into) == 1:
            groups[into[0]] += groups.pop(cause)


def _cut(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters: whole lines, a code block left
    open closed, and a note saying where the rest is."""
    if len(text) <= limit:
        return text
    note = (f"\n_Cut at {limit} characters, what a pull-request comment takes: every failure is in full in "
            "report.json and junit.xml, its run in its trace file._\n")
    kept = text[:limit - len(note) - 4].rsplit("\n", 1)[0] + "\n"
    return kept + ("```\n" if kept.count("```") % 2 else "") + note


def failing_operation(trace: Trace | None) -> str | None:
    """The name of the operation the failing step of ``trace`` ended in
    (its last call, ``free_blocks``), or the step's rule where it made none."""
    if trace is None or not trace.steps:
        return None
    step = trace.steps[min((trace.failure or {}).get("step") or len(trace.steps), len(trace.steps)) - 1]
    calls = [m[1] for op in step.operations if (m := re.match(r"\s*([A-Za-z_][\w.]*)\(", op))]
    return calls[-1] if calls else step.rule


def unwritable(flag: str, directory: Path) -> str | None:
    """Why ``directory`` (given as ``flag``) cannot take a run's reports, or
    ``None``: it is, or can be made, a directory this process writes in --
    asked before any search, so that a report directory that is a file does
    not end a long run with a traceback.  A directory that does not exist
    yet is not made here: only its nearest existing parent is asked."""
    import os

    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        what = "is a file" if existing == directory else f"cannot be made: {existing} is a file"
        return f"{flag} {directory} {what}; give a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{flag} {directory}: {existing} is not writable by this process"
    return None


def write_reports(report: RunReport, directory: str | Path) -> list[Path]:
    """Write report.json, report.md and junit.xml; return their paths."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "report.json": json.dumps(
            {
                "target": report.target, "level": report.level, "profile": report.profile, "seed": report.seed,
                "command": report.command, "versions": report.versions,
                **({"against": report.against} if report.against else {}),
                "steered_around": report.steered_around, "inherited_steered_around": report.inherited,
                "strict": report.strict, "known_findings": report.known_groups(),
                "not_the_targets": {f"{r.scope}/{r.layout}": r.known_label for r in report.others_failures},
                "rules": [{"rule": rule, "layouts_checked": n, "broken_in": broken}
                          for rule, n, broken in report.rule_summary(report.checked)],
                "conforms": report.conforms, "interrupted": report.interrupted,
                "unsearched": [f"{r.scope}/{r.layout}" for r in report.unsearched],
                "results": [r.to_json() for r in report.results],
                **({"coverage": report.coverage} if report.coverage is not None else {}),
            },
            indent=2,
        ),
        "report.md": report.to_markdown(),
        "junit.xml": report.to_junit(),
    }
    paths = []
    for name, text in files.items():
        path = out / name
        path.write_text(text)
        paths.append(path)
    return paths
