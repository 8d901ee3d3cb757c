"""Run the CrossHair proof obligations and say, for each, what CrossHair found.

An **obligation** is one ``post:`` line of a function with a PEP 316
contract.  For every contracted function this runner starts one
``crosshair check --analysis_kind=PEP316 --report_all`` process with explicit
per-condition and per-path time limits, reads CrossHair's one-line verdicts
(``FILE:LINE: info|error: MESSAGE``) and gives each obligation one status:

==============================  ==============================================  =========
status                          CrossHair said                                  counts as
==============================  ==============================================  =========
confirmed over all paths        ``info: Confirmed over all paths.``             a proof
counterexample                  ``error: ... when calling f(...)`` -- the        a failure
                                postcondition returned False (or raised, or the
                                function raised) for the inputs shown
not confirmed in budget         ``info: Not confirmed.`` -- no counterexample   a failure
                                within the budget, but not every path was
                                explored -- or the process ran past its
                                wall-clock limit
precondition unsatisfiable      ``info: Unable to meet precondition`` -- no     a failure
                                input satisfied ``pre:``, so *nothing* was
                                checked (CrossHair still exits 0!)
error                           anything else: a condition that does not        a failure
                                parse, a module that does not import, no
                                verdict at all for the line
==============================  ==============================================  =========

Only "confirmed over all paths" is a pass -- except for a function whose
docstring says ``search-only: REASON``: there "not confirmed in budget" is
accepted (and shown with the reason); a counterexample still fails.
CrossHair's exit code is not trusted: it is 0 for "Not confirmed" and for
"Unable to meet precondition".

Besides ``pre:``/``post:``, a contract may carry lines CrossHair ignores:
``budget: SECONDS`` (per condition; default ``--per-condition-timeout``),
``covers: NAME, NAME`` (the production code it is about, for the table)
and ``search-only: REASON``.  A ``post:`` line ends with ``# rule, rule``:
the rules of ``docs/rules.md`` it protects.

The default run proves :mod:`kvspec.proofs.pool_model` (a model of the
pool) and the obligations over impl's own code (:data:`IMPL_MODULES`);
``--planted`` also requires every planted bug to be caught: each bug of
:mod:`kvspec.proofs.pool_model_buggy` by a counterexample on the rule it
breaks, and, for every obligation over impl, the mutation of impl's code in
:mod:`kvspec.proofs.impl_faults` by any counterexample.  ``--target`` checks
other modules or files instead.  Exit status: 0 when every obligation is
confirmed (and every planted bug caught), 1 otherwise, 2 on a usage error.
``kvspec prove`` is the same command.

Usage::

    python -m kvspec.proofs.run                    # prove everything
    python -m kvspec.proofs.run --planted          # ... and catch the planted bugs
    python -m kvspec.proofs.run --only free_block --per-condition-timeout 60
    python -m kvspec.proofs.run --target path/to/module.py --json report.json
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

MODEL_MODULE = "kvspec.proofs.pool_model"
IMPL_MODULES = ("kvspec.proofs.impl_windows", "kvspec.proofs.impl_pool", "kvspec.proofs.impl_managers")
"""Obligations over impl's production code: its window and hash arithmetic,
the block pool over operation sequences, the managers and coordinators."""
DEFAULT_TARGETS = (MODEL_MODULE, *IMPL_MODULES)
PLANTED_MODULE = "kvspec.proofs.pool_model_buggy"
FAULTS_MODULE = "kvspec.proofs.impl_faults"

DEFAULT_PER_CONDITION_TIMEOUT = 30.0
"""Seconds CrossHair may spend on one postcondition unless its function
states a ``budget:``.  Every obligation of the pool model is confirmed in
well under 5 s; the limit only bounds a run whose model has grown too big to
prove."""

DEFAULT_PER_PATH_TIMEOUT = 10.0
"""CPU seconds CrossHair may spend on one execution path (milliseconds here)."""


class Status(StrEnum):
    """What CrossHair established about one obligation."""

    CONFIRMED = "confirmed over all paths"
    COUNTEREXAMPLE = "counterexample"
    TIMED_OUT = "not confirmed in budget"
    PRE_UNSAT = "precondition unsatisfiable"
    ERROR = "error"


# --- finding the obligations -----------------------------------------------------

_CONDITION_RE = re.compile(r"^\s*(?P<kind>pre|post)(?:\[[^\]]*\])?:\s*(?P<expr>.*?)\s*$")
_META_RE = re.compile(r"^\s*(?P<key>budget|covers|search-only):\s*(?P<value>.*?)\s*$")
"""Lines CrossHair ignores and the runner reads: ``budget: 60`` (CPU seconds
per condition), ``covers: BlockPool.free_blocks`` (the production code the
obligation is about; repeatable) and ``search-only: REASON`` (the obligation
cannot be confirmed over all paths, for the reason given: only a
counterexample fails it)."""
_TAG_RE = re.compile(r"^(?P<expr>.*?)\s+#\s*(?P<tag>[A-Za-z][\w\-, ]*?)\s*$")


@dataclass(frozen=True)
class Obligation:
    """One ``post:`` line: the condition CrossHair must prove."""

    function: str
    line: int
    rule: str
    condition: str

    @property
    def rules(self) -> tuple[str, ...]:
        """The rule names of the tag (``# rule-a, rule-b``)."""
        return tuple(r.strip() for r in self.rule.split(",") if r.strip())


@dataclass(frozen=True)
class Contract:
    """A contracted function: where it is, its preconditions, its obligations."""

    function: str
    first_line: int
    last_line: int
    params: int
    pre: tuple[tuple[int, str], ...]
    obligations: tuple[Obligation, ...]
    budget: float | None = None
    covers: tuple[str, ...] = ()
    search_only: str | None = None

    def contract_lines(self) -> list[str]:
        """The ``pre:`` and ``post:`` lines as text, in order (used to check
        that a planted bug carries its model's contract unchanged)."""
        return [f"pre: {expr}" for _, expr in self.pre] + [
            f"post: {o.condition}  # {o.rule}" if o.rule else f"post: {o.condition}" for o in self.obligations
        ]


def find_contracts(path: str | os.PathLike) -> dict[str, Contract]:
    """Every top-level function in ``path`` whose docstring has ``post:`` lines.

    Read from the source with :mod:`ast` (nothing is imported), so the line
    numbers are the ones CrossHair reports.  A trailing ``# rule-name`` on a
    ``post:`` line names the rule; without one the rule is ``""``.
    """
    text = Path(path).read_text()
    lines = text.splitlines()
    contracts: dict[str, Contract] = {}
    for node in ast.parse(text).body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.body:
            continue
        doc = node.body[0]
        if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)):
            continue
        pre: list[tuple[int, str]] = []
        posts: list[Obligation] = []
        meta: dict[str, list[str]] = {}
        for lineno in range(doc.lineno, (doc.end_lineno or doc.lineno) + 1):
            text_line = lines[lineno - 1].replace('"""', "").replace("'''", "")
            if (m := _META_RE.match(text_line)) is not None:
                meta.setdefault(m["key"], []).append(m["value"])
                continue
            m = _CONDITION_RE.match(text_line)
            if not m:
                continue
            expr, rule = m["expr"], ""
            tagged = _TAG_RE.match(expr)
            if tagged:
                expr, rule = tagged["expr"], tagged["tag"]
            if m["kind"] == "pre":
                pre.append((lineno, expr))
            else:
                posts.append(Obligation(node.name, lineno, rule, expr))
        if posts:
            a = node.args
            contracts[node.name] = Contract(
                function=node.name,
                first_line=node.lineno,
                last_line=node.end_lineno or node.lineno,
                params=len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs),
                pre=tuple(pre),
                obligations=tuple(posts),
                budget=_budget(meta.get("budget", []), node.name),
                covers=tuple(c for line in meta.get("covers", []) for c in line.split(", ") if c),
                search_only=" ".join(meta["search-only"]) if "search-only" in meta else None,
            )
    return contracts


def _budget(values: list[str], function: str) -> float | None:
    if not values:
        return None
    try:
        budget = float(values[-1].removesuffix("s").strip())
    except ValueError:
        raise ValueError(f"{function}: budget must be a number of seconds, got {values[-1]!r}") from None
    if budget <= 0:
        raise ValueError(f"{function}: budget must be positive, got {budget:g}")
    return budget


def module_path(module: str) -> Path:
    """The source file of ``module``, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise FileNotFoundError(f"no Python source for module {module!r}")
    return Path(spec.origin)


# --- running CrossHair -----------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """One obligation and what CrossHair established about it."""

    obligation: Obligation
    status: Status
    detail: str = ""

    @property
    def confirmed(self) -> bool:
        return self.status is Status.CONFIRMED


@dataclass
class FunctionResult:
    """One ``crosshair check`` run: every obligation of one function."""

    target: str
    path: str
    function: str
    verdicts: list[Verdict]
    seconds: float
    returncode: int | None
    messages: list[str] = field(default_factory=list)
    """CrossHair output that belongs to no ``post:`` line (an exception in the
    body, an unsatisfiable precondition, an import error, stderr)."""
    budget: float = DEFAULT_PER_CONDITION_TIMEOUT
    covers: tuple[str, ...] = ()
    search_only: str | None = None

    @property
    def name(self) -> str:
        """``module.function``, or ``path:function`` for a file target."""
        return self.target if not self.target.startswith(self.path) else f"{self.path}:{self.function}"

    @property
    def confirmed(self) -> bool:
        """Every obligation confirmed over all paths (and there is at least one)."""
        return bool(self.verdicts) and all(v.confirmed for v in self.verdicts)

    @property
    def passed(self) -> bool:
        """Confirmed -- or, for a search-only function, at least not refuted:
        no counterexample, no error, a satisfiable precondition."""
        if self.search_only is None:
            return self.confirmed
        return bool(self.verdicts) and all(v.status in (Status.CONFIRMED, Status.TIMED_OUT) for v in self.verdicts)

    @property
    def result(self) -> str:
        """One word for the table: the worst status, or "search-only"."""
        for status in (Status.ERROR, Status.PRE_UNSAT, Status.COUNTEREXAMPLE, Status.TIMED_OUT):
            if any(v.status is status for v in self.verdicts):
                if status is Status.TIMED_OUT and self.search_only is not None:
                    return f"search-only ({self.search_only})"
                return status.value
        return Status.CONFIRMED.value if self.verdicts else Status.ERROR.value

    def counterexamples(self, rule: str | None = None) -> list[Verdict]:
        return [
            v
            for v in self.verdicts
            if v.status is Status.COUNTEREXAMPLE and (rule is None or v.obligation.rule == rule)
        ]


_MESSAGE_RE = re.compile(r"^(?P<path>.+?):(?P<line>\d+): (?P<level>info|error): (?P<message>.*)$")


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def parse_crosshair_output(
    stdout: str, path: str | os.PathLike, contract: Contract
) -> tuple[dict[int, tuple[Status, str]], list[str]]:
    """Split CrossHair's ``--report_all`` output for one function into
    verdicts by line number and messages that belong to no ``post:`` line.

    A message's status: "Confirmed over all paths." -> confirmed; "Not
    confirmed." -> timed out; "Unable to meet precondition..." -> unable to
    meet precondition; an ``error`` naming a call (``... when calling
    f(...)``) -> counterexample; any other ``error`` -> error.
    """
    by_line: dict[int, tuple[Status, str]] = {}
    other: list[str] = []
    last_line: int | None = None
    for raw in stdout.splitlines():
        m = _MESSAGE_RE.match(raw)
        if not m:
            if not raw.strip():
                continue
            if last_line is not None and last_line in by_line:  # a message spanning lines
                status, detail = by_line[last_line]
                by_line[last_line] = (status, f"{detail}\n{raw}")
            else:
                other.append(raw)
            continue
        message = m["message"].strip()
        if m["level"] == "info":
            if message.startswith("Confirmed over all paths"):
                status = Status.CONFIRMED
            elif message.startswith("Not confirmed"):
                status = Status.TIMED_OUT
            elif message.startswith("Unable to meet precondition"):
                status = Status.PRE_UNSAT
            else:
                status = Status.ERROR
        else:
            status = Status.COUNTEREXAMPLE if " when calling " in message else Status.ERROR
        line = int(m["line"])
        if _same_file(m["path"], str(path)):
            if line in by_line and by_line[line][0] is not status:
                # keep the worse of two verdicts for one line
                if by_line[line][0] is Status.CONFIRMED:
                    by_line[line] = (status, message)
            else:
                by_line[line] = (status, message)
            last_line = line
        else:
            other.append(raw)
            last_line = None
    return by_line, other


def _verdicts(
    contract: Contract, by_line: dict[int, tuple[Status, str]], other: list[str], timed_out: bool
) -> tuple[list[Verdict], list[str]]:
    """Give every obligation of ``contract`` a verdict.

    A ``post:`` line CrossHair reported on gets that report.  A line it said
    nothing about inherits what CrossHair said elsewhere in the run (one run
    checks one function): a
    counterexample raised in the body, "Unable to meet precondition" on a
    ``pre:`` line, or a parse error; failing all of those it is "timed out"
    if the process hit its wall-clock limit, else an error ("no verdict").
    """
    post_lines = {o.line for o in contract.obligations}
    stray = [(line, status, detail) for line, (status, detail) in sorted(by_line.items()) if line not in post_lines]
    messages = [f"line {line}: {status.value}: {detail}" for line, status, detail in stray] + other
    fallback: tuple[Status, str] | None = None
    for wanted in (Status.COUNTEREXAMPLE, Status.PRE_UNSAT, Status.ERROR, Status.TIMED_OUT):
        hit = next(
            ((status, f"line {line}: {detail}") for line, status, detail in stray if status is wanted),
            None,
        )
        if hit:
            fallback = hit
            break
    if fallback is None and timed_out:
        fallback = (Status.TIMED_OUT, "crosshair ran past its wall-clock limit")
    if fallback is None:
        tail = "; ".join(other[-3:]) if other else "crosshair reported nothing for this line"
        fallback = (Status.ERROR, f"no verdict: {tail}")
    verdicts = []
    for o in contract.obligations:
        status, detail = by_line.get(o.line, fallback)
        verdicts.append(Verdict(o, status, detail))
    return verdicts, messages


def crosshair_command(target: str, per_condition_timeout: float, per_path_timeout: float) -> list[str]:
    """The ``crosshair check`` command line for one target."""
    return [
        sys.executable,
        "-m",
        "crosshair",
        "check",
        "--analysis_kind=PEP316",
        "--report_all",
        f"--per_condition_timeout={per_condition_timeout:g}",
        f"--per_path_timeout={per_path_timeout:g}",
        target,
    ]


def crosshair_env() -> dict[str, str]:
    """The environment of a ``crosshair check``: without Hypothesis's
    third-party plugins.  CrossHair imports Hypothesis mid-analysis
    (``crosshair.inputgen``), which loads every installed ``hypothesis``
    entry point -- trio's, which HypoFuzz brings, runs ``ldconfig -p`` as it
    imports, and CrossHair's audit wall refuses that subprocess: every
    obligation then ends in an error, not a verdict."""
    return {**os.environ, "HYPOTHESIS_NO_PLUGINS": "1"}


def check_function(
    path: str | os.PathLike,
    contract: Contract,
    module: str | None = None,
    *,
    per_condition_timeout: float = DEFAULT_PER_CONDITION_TIMEOUT,
    per_path_timeout: float = DEFAULT_PER_PATH_TIMEOUT,
    wall_timeout: float | None = None,
) -> FunctionResult:
    """Run CrossHair on one contracted function and classify each obligation.

    ``module`` names the function by import path (``module.function``);
    without it CrossHair loads ``path`` itself (``path:line``).  The process
    is killed after ``wall_timeout`` seconds (by default, enough for every
    condition to use its whole CPU budget twice over).
    """
    target = f"{module}.{contract.function}" if module else f"{os.fspath(path)}:{contract.first_line}"
    if contract.budget is not None:
        per_condition_timeout = contract.budget
    if wall_timeout is None:
        wall_timeout = 60 + 2 * per_condition_timeout * (len(contract.obligations) + 1)
    command = crosshair_command(target, per_condition_timeout, per_path_timeout)
    start = time.perf_counter()
    timed_out = False
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=wall_timeout, env=crosshair_env())
        stdout, stderr, returncode = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        timed_out = True
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        returncode = None
    seconds = time.perf_counter() - start
    by_line, other = parse_crosshair_output(stdout, path, contract)
    other += [line for line in stderr.splitlines() if line.strip()][-20:]
    verdicts, messages = _verdicts(contract, by_line, other, timed_out)
    return FunctionResult(
        target=target,
        path=os.fspath(path),
        function=contract.function,
        verdicts=verdicts,
        seconds=seconds,
        returncode=returncode,
        messages=messages,
        budget=per_condition_timeout,
        covers=contract.covers,
        search_only=contract.search_only,
    )


@dataclass(frozen=True)
class Target:
    """Where obligations live: a module (by import name) or a source file."""

    path: Path
    module: str | None = None
    functions: tuple[str, ...] | None = None

    @classmethod
    def parse(cls, text: str) -> Target:
        """``pkg.module``, ``pkg.module.function``, ``file.py`` or ``file.py:function``."""
        file_part, _, fn = text.partition(":") if ".py:" in text else (text, "", "")
        if file_part.endswith(".py"):
            return cls(Path(file_part).resolve(), None, (fn,) if fn else None)
        try:
            return cls(module_path(text), text, None)
        except (FileNotFoundError, ModuleNotFoundError, ValueError):
            module, _, fn = text.rpartition(".")
            if not module:
                raise
            return cls(module_path(module), module, (fn,))

    def contracts(self) -> list[Contract]:
        found = find_contracts(self.path)
        if self.functions is None:
            return list(found.values())
        missing = [f for f in self.functions if f not in found]
        if missing:
            raise LookupError(f"no contracted function {missing} in {self.path}")
        return [found[f] for f in self.functions]


def check_targets(
    jobs: Iterable[tuple[Target, Contract]],
    *,
    per_condition_timeout: float = DEFAULT_PER_CONDITION_TIMEOUT,
    per_path_timeout: float = DEFAULT_PER_PATH_TIMEOUT,
    workers: int | None = None,
) -> list[FunctionResult]:
    """Check many functions, ``workers`` CrossHair processes at a time.

    Functions with the largest budgets (then the most parameters) go first,
    so the slowest proof does not start last.  Results come back in the
    order given.
    """
    jobs = list(jobs)
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs) or 1))
    order = sorted(range(len(jobs)), key=lambda i: (-(jobs[i][1].budget or 0), -jobs[i][1].params))
    results: list[FunctionResult | None] = [None] * len(jobs)

    def one(i: int) -> None:
        target, contract = jobs[i]
        results[i] = check_function(
            target.path,
            contract,
            target.module,
            per_condition_timeout=per_condition_timeout,
            per_path_timeout=per_path_timeout,
        )

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, order))
    return [r for r in results if r is not None]


# --- the report --------------------------------------------------------------------


@dataclass
class PlantedResult:
    """One planted bug: a model bug (it must break ``rule``) or a mutation of
    impl's code (``rule`` empty: any counterexample refutes it)."""

    bug: str
    imitates: str
    rule: str
    result: FunctionResult
    why: str = ""

    @property
    def caught(self) -> bool:
        return bool(self.result.counterexamples(self.rule or None))


@dataclass
class Report:
    """Everything one run established."""

    proofs: list[FunctionResult]
    planted: list[PlantedResult]
    per_condition_timeout: float
    per_path_timeout: float
    seconds: float

    @property
    def ok(self) -> bool:
        """Every obligation confirmed (or, search-only, not refuted), every
        planted bug caught."""
        return (
            bool(self.proofs or self.planted)
            and all(r.passed for r in self.proofs)
            and all(p.caught for p in self.planted)
        )

    def table(self) -> str:
        """One row per contracted function: obligation, rules, the code it is
        about, result, seconds (a Markdown table)."""
        rows = ["| obligation | rules | covers | result | seconds |", "|---|---|---|---|---|"]
        for r in self.proofs:
            rules = sorted({rule for v in r.verdicts for rule in v.obligation.rules})
            covers = ", ".join(f"`{c}`" for c in r.covers) or "model"
            n_ok = sum(v.confirmed for v in r.verdicts)
            result = r.result if r.result != Status.CONFIRMED.value else f"{n_ok}/{len(r.verdicts)} confirmed"
            rows.append(f"| `{r.function}` | {', '.join(rules) or '-'} | {covers} | {result} | {r.seconds:.1f} |")
        return "\n".join(rows)

    def render(self, verbose: bool = False) -> str:
        out = [
            f"CrossHair proof obligations (--per_condition_timeout={self.per_condition_timeout:g} unless a "
            f"function states its budget; --per_path_timeout={self.per_path_timeout:g})",
            "",
            self.table(),
        ]
        for r in self.proofs:
            if r.confirmed and not verbose:
                continue
            out.append(f"\n{r.name}  [{r.result}, {r.seconds:.1f} s of budget {r.budget:g} s per condition]")
            out += [_verdict_line(v) for v in r.verdicts if verbose or not v.confirmed]
            if not r.confirmed:
                out += _unshown_messages(r)
        for p in self.planted:
            mark = "caught" if p.caught else "NOT CAUGHT"
            must = f"must break {p.rule}" if p.rule else "must be refuted"
            what = f" -- {p.why}" if p.why else ""
            out.append(f"\nplanted bug {p.bug} (imitates {p.imitates}; {must}){what}: {mark}  "
                       f"[{p.result.seconds:.1f} s]")
            shown = p.result.counterexamples(p.rule or None)[:1] if not verbose else p.result.verdicts
            out += [_verdict_line(v) for v in shown]
            if not p.caught:
                out += [_verdict_line(v) for v in p.result.verdicts]
                out += _unshown_messages(p.result)
        n = sum(len(r.verdicts) for r in self.proofs)
        n_ok = sum(v.confirmed for r in self.proofs for v in r.verdicts)
        summary = f"\n{n_ok}/{n} obligations confirmed over all paths"
        search_only = [r for r in self.proofs if r.search_only is not None]
        if search_only:
            summary += f" ({len(search_only)} search-only functions)"
        if self.planted:
            summary += f"; {sum(p.caught for p in self.planted)}/{len(self.planted)} planted bugs caught"
        summary += f"; {self.seconds:.1f} s -- {'OK' if self.ok else 'FAILED'}"
        out.append(summary)
        return "\n".join(out)

    def to_json(self) -> dict:
        def fn(r: FunctionResult) -> dict:
            return {
                "name": r.name,
                "target": r.target,
                "function": r.function,
                "path": r.path,
                "covers": list(r.covers),
                "budget": r.budget,
                "search_only": r.search_only,
                "result": r.result,
                "seconds": round(r.seconds, 3),
                "returncode": r.returncode,
                "confirmed": r.confirmed,
                "obligations": [
                    {
                        "line": v.obligation.line,
                        "rule": v.obligation.rule,
                        "condition": v.obligation.condition,
                        "status": v.status.value,
                        "detail": v.detail,
                    }
                    for v in r.verdicts
                ],
                "messages": r.messages,
            }

        return {
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "per_condition_timeout": self.per_condition_timeout,
            "per_path_timeout": self.per_path_timeout,
            "proofs": [fn(r) for r in self.proofs],
            "planted": [
                {"bug": p.bug, "imitates": p.imitates, "rule": p.rule, "why": p.why, "caught": p.caught,
                 **fn(p.result)}
                for p in self.planted
            ],
        }


def _unshown_messages(r: FunctionResult) -> list[str]:
    """CrossHair's other output for ``r``, less what the verdicts already quote."""
    shown = "\n".join(v.detail for v in r.verdicts)
    return [f"    | {m}" for m in r.messages if m.split(": ", 2)[-1] not in shown]


def _verdict_line(v: Verdict) -> str:
    o = v.obligation
    line = f"  {v.status.value:<28} line {o.line:<4} {o.rule or '-':<24} {o.condition}"
    if not v.confirmed and v.detail:
        line += f"\n      {v.detail}"
    return line


def planted_bugs(module: str = PLANTED_MODULE) -> dict[str, tuple[str, str]]:
    """``{bug function: (model function it imitates, rule that must catch it)}``."""
    return dict(importlib.import_module(module).PLANTED_BUGS)


def impl_faults(module: str = FAULTS_MODULE) -> dict[str, Any]:
    """``{obligation over impl: the Mutation of impl's code it must refute}``."""
    return dict(importlib.import_module(module).IMPL_FAULTS)


def mutant_file(directory: Path, obligation_module: str, function: str, mutation: Any) -> Path:
    """A copy of ``obligation_module`` whose first lines apply ``mutation``
    (CrossHair then checks ``function`` of it against the mutated code)."""
    source = module_path(obligation_module).read_text()
    future = "from __future__ import annotations\n"
    head, found, rest = source.partition(future)
    # The preamble goes after any __future__ import (which must stay first), before the rest.
    text = head + found + mutation.preamble() + rest if found else mutation.preamble() + source
    path = directory / f"mutant_{function}.py"
    path.write_text(text)
    return path


def run(
    targets: Sequence[str | Target] = DEFAULT_TARGETS,
    *,
    planted: bool = False,
    only: Sequence[str] | None = None,
    per_condition_timeout: float = DEFAULT_PER_CONDITION_TIMEOUT,
    per_path_timeout: float = DEFAULT_PER_PATH_TIMEOUT,
    workers: int | None = None,
) -> Report:
    """Prove every obligation of ``targets`` and, with ``planted``, check that
    every planted bug is caught: the model's bugs, and a mutation of impl's
    code for every obligation over impl among the targets.  ``only`` keeps
    the functions (and planted bugs, or the bugs imitating them) with these
    names."""
    start = time.perf_counter()
    jobs: list[tuple[Target, Contract]] = []
    impl_obligations: list[tuple[str, Contract]] = []
    for t in targets:
        target = t if isinstance(t, Target) else Target.parse(t)
        for c in target.contracts():
            if only and c.function not in only:
                continue
            jobs.append((target, c))
            if target.module in IMPL_MODULES:
                impl_obligations.append((target.module, c))
    bugs: list[tuple[str, str, str, str]] = []
    with tempfile.TemporaryDirectory(prefix="kvspec-mutants-") as scratch:
        if planted:
            buggy = Target(module_path(PLANTED_MODULE), PLANTED_MODULE)
            found = find_contracts(buggy.path)
            for bug, (imitates, rule) in planted_bugs().items():
                if only and bug not in only and imitates not in only:
                    continue
                bugs.append((bug, imitates, rule, ""))
                jobs.append((buggy, found[bug]))
            faults = impl_faults()
            for module, contract in impl_obligations:
                mutation = faults.get(contract.function)
                if mutation is None:
                    raise LookupError(f"no planted fault for the impl obligation {contract.function} "
                                      f"({FAULTS_MODULE}.IMPL_FAULTS)")
                path = mutant_file(Path(scratch), module, contract.function, mutation)
                bugs.append((f"{mutation.qualname} mutated", contract.function, "", mutation.why))
                jobs.append((Target(path), find_contracts(path)[contract.function]))
        results = check_targets(
            jobs,
            per_condition_timeout=per_condition_timeout,
            per_path_timeout=per_path_timeout,
            workers=workers,
        )
    n_proofs = len(results) - len(bugs)
    return Report(
        proofs=results[:n_proofs],
        planted=[
            PlantedResult(bug, imitates, rule, result, why)
            for (bug, imitates, rule, why), result in zip(bugs, results[n_proofs:], strict=True)
        ],
        per_condition_timeout=per_condition_timeout,
        per_path_timeout=per_path_timeout,
        seconds=time.perf_counter() - start,
    )


def shared_report(directory: Path) -> tuple[Report, bool]:
    """The full report (``run(planted=True)``), computed once for every
    process that asks in ``directory``: the first to take the directory's
    lock runs CrossHair (on every core) and saves the report; the others
    wait for the lock and read it.  Returns the report and whether this
    call computed it.  (pytest-xdist's workers share it this way, and CI
    starts it in the background before the suite -- see .ci/run.)"""
    import fcntl
    import pickle

    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "crosshair-report.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        saved = directory / "crosshair-report.pickle"
        if saved.exists():
            return pickle.loads(saved.read_bytes()), False
        report = run(planted=True)
        saved.write_bytes(pickle.dumps(report))
        return report, True


def build_parser(prog: str = "python -m kvspec.proofs.run") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Prove kvspec's CrossHair obligations; exit 0 only if every one is confirmed over all paths.",
    )
    parser.add_argument(
        "--target",
        action="append",
        metavar="MODULE|FILE.py[:FUNCTION]",
        help=f"check these instead of {', '.join(DEFAULT_TARGETS)} (repeatable)",
    )
    parser.add_argument(
        "--planted",
        action="store_true",
        help=f"also check that every planted bug ({PLANTED_MODULE}, and the mutation of impl's code in "
             f"{FAULTS_MODULE} for every obligation over impl) is caught",
    )
    parser.add_argument("--only", action="append", metavar="FUNCTION", help="only these functions")
    parser.add_argument("--per-condition-timeout", type=float, default=DEFAULT_PER_CONDITION_TIMEOUT, metavar="S",
                        help="seconds per condition for functions without a budget: line")
    parser.add_argument("--per-path-timeout", type=float, default=DEFAULT_PER_PATH_TIMEOUT, metavar="S")
    parser.add_argument("--jobs", type=int, default=None, help="CrossHair processes at once (default: one per core)")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    parser.add_argument("--markdown", metavar="FILE", help="also write the obligation table as Markdown")
    parser.add_argument("-v", "--verbose", action="store_true", help="list confirmed obligations too")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "python -m kvspec.proofs.run") -> int:
    args = build_parser(prog).parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        print(f"error: --jobs must be at least 1, got {args.jobs}", file=sys.stderr)
        return 2
    try:
        report = run(
            args.target or DEFAULT_TARGETS,
            planted=args.planted,
            only=args.only,
            per_condition_timeout=args.per_condition_timeout,
            per_path_timeout=args.per_path_timeout,
            workers=args.jobs,
        )
    except (LookupError, OSError, ValueError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not report.proofs and not report.planted:
        print("error: no contracted functions to check", file=sys.stderr)
        return 2
    print(report.render(verbose=args.verbose))
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=2) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(report.table() + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
