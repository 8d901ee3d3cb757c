"""The version matrix: every known finding replayed, and the scheduler
machine run, against each vLLM release from 0.25.1 to the newest.

    .venv-vllm/bin/python tools/version_matrix.py                      # every release on PyPI >= 0.25.1
    .venv-vllm/bin/python tools/version_matrix.py --versions 0.25.1,newest --markdown reports/matrix.md

Each release is installed on its own (``pip install --no-deps --target``,
cached under ``~/.cache/kvspec/vllm-versions/``) and imported in front of
the interpreter's own packages -- the venv of ``tools/install_vllm.sh``
supplies the import-time dependencies; the imports later releases added
(fastapi, starlette, opentelemetry-api, partial_json_parser, einops) go in a
directory beside them.  vLLM itself is never stubbed.  In each release,
:mod:`kvspec.conformance.vllm.version_probe` replays the manager-scope findings
(F1-F7) and the scheduler-scope ones (S1-S3) and runs the scheduler
machine on every scheduler layout; with ``--conform``, ``kvspec conform
--target vllm --known-findings`` runs too: at L3 (the ci profile, 240 s on
every core, seed 1) on the reference release and the newest known to the
spec -- the two the project is judged on -- and ``--profile quick --level
L1`` on the others.  The result is a
table (release x finding) in Markdown and JSON; docs/findings.md carries
the one measured for the findings' write-ups.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.version import Version

from kvspec.conformance.vllm import upstream
from kvspec.spec.releases import BASE, KNOWN

OLDEST = Version(BASE)


def released_versions(python: str) -> list[str]:
    """Every final vLLM release on the index from 0.25.1 on, oldest first."""
    out = subprocess.run([python, "-m", "pip", "index", "versions", "vllm"], capture_output=True, text=True,
                         check=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("Available versions:"))
    versions = [Version(v.strip()) for v in line.split(":", 1)[1].split(",")]
    return [str(v) for v in sorted(v for v in versions if v >= OLDEST and not v.is_prerelease)]


def install(python: str, version: str) -> Path:
    """vLLM ``version`` alone in its own directory (re-used when present):
    the same cache ``kvspec conform --against vllm==X`` uses."""
    return upstream.install(version, python)


def conform_options(version: str) -> list[str]:
    """How ``--conform`` judges ``version``: L3 on the reference release and
    the newest the spec knows, quick L1 elsewhere."""
    if version in (BASE, KNOWN[-1]):
        return ["--level", "L3", "--budget", "240", "--workers", "auto", "--seed", "1"]
    return ["--profile", "quick", "--level", "L1"]


def probe(python: str, version: str, target: Path, examples: int, conform: bool, out_dir: Path) -> dict:
    """The findings replayed and the scheduler machine run on one installed release."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": os.pathsep.join(upstream.release_path(target))}
    result_file = out_dir / f"probe-{version}.json"
    start = time.monotonic()
    run = subprocess.run([python, "-m", "kvspec.conformance.vllm.version_probe", "--json", str(result_file),
                          "--examples", str(examples)], env=env, capture_output=True, text=True, timeout=1800)
    if run.returncode != 0 or not result_file.exists():
        return {"vllm": version, "error": (run.stdout + run.stderr)[-1500:]}
    result = json.loads(result_file.read_text())
    if result.get("vllm") != version:
        result["error"] = f"imported vLLM {result.get('vllm')}, not {version}"
    if conform:
        report = out_dir / f"conform-{version}"
        options = conform_options(version)
        run = subprocess.run([python, "-m", "kvspec.cli", "conform", "--target", "vllm", "--known-findings",
                              *options, "--no-progress", "--report-dir", str(report),
                              "--trace-dir", str(report / "traces")],
                             env=env, capture_output=True, text=True, timeout=3600)
        result["conform"] = {"exit": run.returncode, "level": options[options.index("--level") + 1],
                             "failed_layouts": failed_layouts(report / "report.json")}
    result["seconds"] = round(time.monotonic() - start, 1)
    return result


def failed_layouts(report: Path) -> list[str]:
    """``scope/layout (rules or error)`` for each layout a conform run failed,
    read from its report.json (none where the run wrote none)."""
    if not report.exists():
        return []
    failed = []
    for r in json.loads(report.read_text())["results"]:
        if not r["conforms"] and r.get("owner") is None:
            why = ", ".join(r["rules"]) or (r["details"][0].split(":")[0] if r["details"] else "?")
            failed.append(f"{r['scope']}/{r['layout']} ({why})")
    return failed


def markdown(results: list[dict]) -> str:
    finding_ids = sorted({k for r in results for k in r.get("manager_findings", {})})
    finding_ids += sorted({k for r in results for k in r.get("scheduler_findings", {})})
    layouts = sorted({k for r in results for k in r.get("scheduler_search", {})})
    head = ["vLLM", *finding_ids, *(f"search: {name}" for name in layouts)]
    if any("conform" in r for r in results):
        head.append("conform (level): failing layouts")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        if "error" in r and "manager_findings" not in r:
            lines.append(f"| {r['vllm']} | " + " | ".join(["error"] * (len(head) - 1)) + " |")
            continue
        cells = [r["vllm"]]
        for fid in finding_ids:
            cell = r.get("manager_findings", {}).get(fid) or r.get("scheduler_findings", {}).get(fid) or {}
            cells.append(cell.get("status", "?"))
        for name in layouts:
            cell = r.get("scheduler_search", {}).get(name, {})
            status = cell.get("status", "?")
            if status == "finds":
                status = "finds: " + cell["detail"].split(":")[0]
            cells.append(status)
        if "conform" in r:
            c = r["conform"]
            verdict = "none" if c["exit"] == 0 else "; ".join(c["failed_layouts"]) or f"exit {c['exit']}"
            cells.append(f"{c.get('level', 'L1')}: {verdict}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--versions", default="all",
                        help="comma-separated releases; 'newest' and 'all' (every release >= 0.25.1) expand")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter whose packages supply vLLM's dependencies (tools/install_vllm.sh's)")
    parser.add_argument("--examples", type=int, default=30, help="scheduler-machine examples per layout")
    parser.add_argument("--conform", action="store_true",
                        help="also run kvspec conform per release (L3 on the reference and the newest known, quick "
                        "L1 elsewhere)")
    parser.add_argument("--jobs", "-j", type=int, default=1, help="releases probed at once (default 1)")
    parser.add_argument("--out-dir", type=Path, default=Path("reports/version-matrix"))
    parser.add_argument("--markdown", type=Path, help="write the table here too")
    args = parser.parse_args(argv)

    released = released_versions(args.python)
    versions: list[str] = []
    for item in args.versions.split(","):
        item = item.strip()
        if item == "all":
            versions += released
        elif item == "newest":
            versions.append(released[-1])
        elif item:
            if Version(item) < OLDEST:
                parser.error(f"version {item} predates {OLDEST}, the reference kvspec is written against")
            versions.append(item)
    versions = sorted(set(versions), key=Version)

    args.out_dir.mkdir(parents=True, exist_ok=True)
    targets = {}
    for version in versions:  # one at a time: the releases share the later-imports directory
        print(f"[version-matrix] installing vLLM {version} ...", flush=True)
        targets[version] = install(args.python, version)

    def run(version: str) -> dict:
        result = probe(args.python, version, targets[version], args.examples, args.conform, args.out_dir)
        print(f"[version-matrix] vLLM {version}: {result.get('seconds', '?')} s"
              + (f" ERROR {result['error'][-300:]}" if "error" in result else ""), flush=True)
        return result

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:  # each probe is its own process
        results = list(pool.map(run, versions))
    (args.out_dir / "matrix.json").write_text(json.dumps(results, indent=2))
    table = markdown(results)
    (args.out_dir / "matrix.md").write_text(table)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(table)
    print(table)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
