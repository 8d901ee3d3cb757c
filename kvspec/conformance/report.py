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
    results: list[LayoutResult] = field(default_factory=list)

    @property
    def conforms(self) -> bool:
        return all(r.conforms for r in self.results)

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
