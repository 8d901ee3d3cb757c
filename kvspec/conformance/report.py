"""Machine-readable results of a conformance run: JSON, Markdown, JUnit XML.

One :class:`LayoutResult` per (scope, layout) run; :func:`write_reports`
writes ``report.json`` (everything), ``report.md`` (a summary a pull request
can show) and ``junit.xml`` (one test case per layout, a failure per broken
layout, for CI systems) into a directory.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvspec.conformance.trace import Trace


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
    checked: dict[str, list[str]] = field(default_factory=dict)  # scope -> the rules checked
    results: list[LayoutResult] = field(default_factory=list)

    @property
    def conforms(self) -> bool:
        return all(r.conforms for r in self.results)

    def rule_summary(self, checked: dict[str, list[str]]) -> list[tuple[str, int, list[str]]]:
        """Per rule: on how many layouts it was checked and where it broke.
        ``checked`` maps a scope to its rules; a failure that names no rule
        (a divergence) counts against ``spec-equivalence`` at L3, else
        ``clean-refusal``."""
        out = []
        every = sorted({rule for rules in checked.values() for rule in rules})
        for rule in every:
            layouts = [r for r in self.results if rule in checked.get(r.scope, [])]
            broken = [f"{r.scope}/{r.layout}" for r in layouts if rule in self._broken_rules(r)]
            out.append((rule, len(layouts), broken))
        return out

    def _broken_rules(self, r: LayoutResult) -> list[str]:
        if r.conforms or r.rules:
            return r.rules
        return ["spec-equivalence" if self.level == "L3" else "clean-refusal"]

    def rule_table(self, checked: dict[str, list[str]]) -> list[str]:
        """The rule x layout summary as text lines."""
        lines = [f"{'rule':<24} {'layouts':>7}  broken in"]
        for rule, n, broken in self.rule_summary(checked):
            lines.append(f"{rule:<24} {n:>7}  {', '.join(broken) or '-'}")
        return lines

    def to_markdown(self) -> str:
        verdict = "conforms" if self.conforms else "does NOT conform"
        lines = [
            f"# kvspec conform: `{self.target}` {verdict} at {self.level}",
            "",
            f"Profile `{self.profile}`; {sum(r.operations for r in self.results)} operations checked.",
            "",
            *([f"Steered around known findings (docs/findings.md): {'; '.join(self.steered_around)}.", ""]
              if self.steered_around else []),
            "| scope | layout | operations | seconds | result |",
            "|---|---|---:|---:|---|",
        ]
        for r in self.results:
            result = "conforms" if r.conforms else "FAILED: " + (", ".join(r.rules) or "divergence from the spec")
            lines.append(f"| {r.scope} | {r.layout} | {r.operations} | {r.seconds:.1f} | {result} |")
        if self.checked:
            lines += ["", "| rule | layouts checked | broken in |", "|---|---:|---|"]
            for rule, n, broken in self.rule_summary(self.checked):
                lines.append(f"| {rule} | {n} | {', '.join(broken) or '-'} |")
        for r in self.results:
            if not r.conforms:
                lines += ["", f"## {r.scope} / {r.layout}", "", "```", *r.details, "```"]
                if r.trace:
                    replay = f"`kvspec replay {r.trace_file}`" if r.trace_file else "the saved trace"
                    lines += ["", f"Minimal failing run ({replay}):", "", "```", *r.trace.readable(), "```"]
        return "\n".join(lines) + "\n"

    def to_junit(self) -> str:
        failures = sum(not r.conforms for r in self.results)
        suite = ET.Element(
            "testsuite", name=f"kvspec conform {self.target} {self.level}",
            tests=str(len(self.results)), failures=str(failures), errors="0",
            time=f"{sum(r.seconds for r in self.results):.3f}",
        )
        for r in self.results:
            case = ET.SubElement(
                suite, "testcase", classname=f"kvspec.{r.scope}", name=r.layout, time=f"{r.seconds:.3f}"
            )
            if not r.conforms:
                failure = ET.SubElement(case, "failure", message=", ".join(r.rules) or "divergence from the spec")
                failure.text = "\n".join(r.details + (r.trace.readable() if r.trace else []))
        return ET.tostring(suite, encoding="unicode")


def write_reports(report: RunReport, directory: str | Path) -> list[Path]:
    """Write report.json, report.md and junit.xml; return their paths."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "report.json": json.dumps(
            {
                "target": report.target, "level": report.level, "profile": report.profile, "seed": report.seed,
                "steered_around": report.steered_around,
                "rules": [{"rule": rule, "layouts_checked": n, "broken_in": broken}
                          for rule, n, broken in report.rule_summary(report.checked)],
                "conforms": report.conforms, "results": [r.to_json() for r in report.results],
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
