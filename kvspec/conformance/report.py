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


@dataclass
class LayoutResult:
    scope: str
    layout: str
    operations: int
    seconds: float
    conforms: bool
    rules: list[str] = field(default_factory=list)  # the rules broken, by name
    details: list[str] = field(default_factory=list)  # violations, divergence, the minimal failing sequence


@dataclass
class RunReport:
    target: str
    level: str
    profile: str
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
            "| scope | layout | operations | seconds | result |",
            "|---|---|---:|---:|---|",
        ]
        for r in self.results:
            result = "conforms" if r.conforms else "FAILED: " + (", ".join(r.rules) or "divergence from the spec")
            lines.append(f"| {r.scope} | {r.layout} | {r.operations} | {r.seconds:.1f} | {result} |")
        for r in self.results:
            if not r.conforms:
                lines += ["", f"## {r.scope} / {r.layout}", "", "```", *r.details, "```"]
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
                failure.text = "\n".join(r.details)
        return ET.tostring(suite, encoding="unicode")


def write_reports(report: RunReport, directory: str | Path) -> list[Path]:
    """Write report.json, report.md and junit.xml; return their paths."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "report.json": json.dumps({**asdict(report), "conforms": report.conforms}, indent=2),
        "report.md": report.to_markdown(),
        "junit.xml": report.to_junit(),
    }
    paths = []
    for name, text in files.items():
        path = out / name
        path.write_text(text)
        paths.append(path)
    return paths
