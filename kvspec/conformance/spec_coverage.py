"""What a gate run exercised of the spec: ``kvspec conform --coverage``.

A run that conforms says nothing about the states it never reached.  With
``--coverage`` every process of the run (the workers too) measures
``spec/`` with coverage.py, branch coverage on, and the report gains:

- **spec branches**: per file of ``spec/``, the branches taken of those
  there are -- the rules (``rules.py``, ``request_rules.py``), the content
  model and, at L3, the spec model the target runs in lockstep with;
- **rules**: for each rule of the catalogue, its predicates (the functions
  registered for it in :mod:`kvspec.spec.rules` and
  :mod:`kvspec.spec.request_rules`), how many of them were evaluated, how
  many *got past their guards* -- the opening ``if ...: return []`` lines
  that say the state holds nothing for the rule to judge (no shadow, no
  requests, no Mamba group) -- and their statements run.  A rule none of
  whose predicates got past its guards never met a state it judges: the
  run's verdict on it is vacuous, whatever it says.

Measuring costs time (coverage.py traces every line of ``spec/``): a
budgeted run with ``--coverage`` searches less in its budget than one
without.  coverage.py is a dev dependency (``pip install coverage``).
"""

from __future__ import annotations

import ast
import inspect
import os
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any


class CoverageUnavailable(ValueError):
    """coverage.py is not installed."""


def start(data_dir: str) -> Any:
    """Measure ``spec/`` in this process until :func:`stop`; the data goes
    to a file of its own under ``data_dir`` (one per process)."""
    try:
        import coverage
    except ImportError:
        raise CoverageUnavailable("--coverage needs coverage.py (pip install coverage)") from None
    measure = coverage.Coverage(branch=True, source=[str(_spec_dir())], data_file=os.path.join(data_dir, ".coverage"),
                                data_suffix=True)
    measure.start()
    return measure


def stop(measure: Any) -> None:
    measure.stop()
    measure.save()


def report(data_dir: str) -> dict[str, Any]:
    """Every process's data under ``data_dir``, combined: the spec's
    branches per file and the rules table (see the module's docstring)."""
    import coverage

    combined = coverage.Coverage(branch=True, source=[str(_spec_dir())],
                                 data_file=os.path.join(data_dir, ".coverage"))
    combined.combine([data_dir], keep=False)
    data = combined.get_data()
    executed = {os.path.realpath(path): set(data.lines(path) or ()) for path in data.measured_files()}
    out = per_file(combined)
    out["rules"] = {name: _rule_coverage(fns, executed) for name, fns in sorted(predicates().items())}
    out["never_met"] = sorted(name for name, r in out["rules"].items() if r["evaluated"] and not r["past_guards"])
    out["never_evaluated"] = sorted(name for name, r in out["rules"].items() if not r["evaluated"])
    return out


def per_file(measure: Any) -> dict[str, Any]:
    """A finished measurement's numbers: per file of ``spec/``, its branches
    and those taken, its statements and the lines missed; and the totals."""
    files: dict[str, Any] = {}
    for path in sorted(measure.get_data().measured_files()):
        analysis = measure._analyze(path)  # coverage.py's public report API prints; this returns numbers
        numbers = analysis.numbers
        files[Path(path).name] = {"branches": numbers.n_branches,
                                  "taken": numbers.n_branches - numbers.n_missing_branches,
                                  "lines": numbers.n_statements, "missed_lines": sorted(analysis.missing)}
    return {"files": files, "branches": sum(f["branches"] for f in files.values()),
            "taken": sum(f["taken"] for f in files.values())}


def predicates() -> dict[str, list[Callable[..., Any]]]:
    """The functions that state each rule, by rule name."""
    from kvspec.spec import request_rules, rules

    found: dict[str, list[Callable[..., Any]]] = {}
    for name, fn in rules.STATE_RULES.items():
        found.setdefault(name, []).append(fn)
    for table in (rules.STEP_RULES, request_rules.REQUEST_STATE_RULES, request_rules.REQUEST_STEP_RULES):
        for name, fns in table.items():
            found.setdefault(name, []).extend(fns)
    return found


def _rule_coverage(fns: list[Callable[..., Any]], executed: dict[str, set[int]]) -> dict[str, Any]:
    evaluated = past = run = total = 0
    idle = []  # the predicates never past their guards (or never evaluated), by name
    for fn in fns:
        body, guards_end = _statements(fn)
        ran = executed.get(os.path.realpath(inspect.getsourcefile(fn)), set()) & body
        total += len(body)
        run += len(ran)
        evaluated += bool(ran)
        got_past = any(line > guards_end for line in ran)
        past += got_past
        if not got_past:
            idle.append(f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}")
    return {"predicates": len(fns), "evaluated": evaluated, "past_guards": past, "statements": total,
            "statements_run": run, "idle_predicates": idle}


def _statements(fn: Callable[..., Any]) -> tuple[set[int], int]:
    """The lines of ``fn``'s statements (absolute), and the last line of
    its opening guards: the docstring and the ``if ...: return ...`` /
    ``if ...: continue`` statements before anything else."""
    lines, first = inspect.getsourcelines(fn)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    (function,) = tree.body
    offset = first - 1
    docstring = ast.get_docstring(function) is not None and function.body[0]
    body = {node.lineno + offset for node in ast.walk(function)
            if isinstance(node, ast.stmt) and node is not function and node is not docstring}
    guards_end = function.body[0].lineno + offset - 1
    for statement in function.body:
        guard = isinstance(statement, ast.If) and not statement.orelse and all(
            isinstance(s, (ast.Return, ast.Continue)) for s in statement.body)
        if not (statement is docstring or guard):
            break
        guards_end = statement.end_lineno + offset
    return body, guards_end


def _spec_dir() -> Path:
    from kvspec import spec

    return Path(spec.__file__).resolve().parent


def markdown(coverage: dict[str, Any]) -> list[str]:
    """The coverage section of report.md."""
    lines = ["", "## What the run exercised of the spec", "",
             f"Spec branches taken: {coverage['taken']} of {coverage['branches']} "
             f"({_percent(coverage['taken'], coverage['branches'])}).", "",
             "| rule | predicates | evaluated | past their guards | statements run |", "|---|---|---|---|---|"]
    for name, r in coverage["rules"].items():
        lines.append(f"| {name} | {r['predicates']} | {r['evaluated']} | {r['past_guards']} | "
                     f"{r['statements_run']}/{r['statements']} |")
    idle = [p for r in coverage["rules"].values() for p in r["idle_predicates"]]
    if idle:
        lines += ["", "Predicates never past their guards: " + ", ".join(f"`{p}`" for p in idle) + "."]
    if coverage["never_met"]:
        lines += ["", "Never met a state they judge (evaluated, never past their guards): "
                  + ", ".join(coverage["never_met"]) + "."]
    if coverage["never_evaluated"]:
        lines += ["", "Not evaluated at this scope and level: " + ", ".join(coverage["never_evaluated"]) + "."]
    lines += ["", "| spec file | branches taken |", "|---|---|"]
    lines += [f"| {name} | {f['taken']}/{f['branches']} |" for name, f in coverage["files"].items()]
    return lines


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f} %" if whole else "-"
