"""What one vLLM release does, measured from inside an interpreter that
imports it: run by ``tools/version_matrix.py`` once per release.

``python -m kvspec.conformance.vllm.version_probe --json OUT [--examples N]``
writes, for the installed vLLM: every known finding replayed (the
manager-scope traces (F1-F8) through ``kvspec replay``, the scheduler-scope
traces S1-S3 through :mod:`kvspec.conformance.vllm.scheduler_findings`, each under
vLLM's ``Scheduler`` and again under its ``AsyncScheduler``) and the
scheduler machine's search on each scheduler layout (N examples per
layout, derandomized, steered around the known findings as
``--known-findings`` steers): the first rule it breaks, or "clean".
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from typing import Any


def _manager_findings() -> dict[str, dict[str, Any]]:
    from kvspec.conformance.findings import FINDINGS
    from kvspec.conformance.runner import replay
    from kvspec.conformance.trace import Trace
    from kvspec.conformance.vllm import installed
    from kvspec.spec.releases import version_key

    out = {}
    for finding in FINDINGS:
        if finding.target != "vllm" or finding.scope not in ("pool", "manager"):  # the offload tier's API moved
            continue
        if version_key(installed.version()) < version_key(finding.releases[0]):
            out[finding.id] = {"status": "n/a", "detail": f"{finding.id} is a finding of {finding.releases[0]} on"}
            continue
        try:
            trace = Trace.load(finding.trace_path)
            outcome = replay(trace, "vllm", trace.level)
            if outcome.diverged_at is None:
                status = "holds"
            elif outcome.diverged_at == trace.failure["step"] and set(outcome.rules) == set(finding.rules):
                status = "reproduces"
            else:
                status = "differs"  # breaks at another step or another rule: read the detail
            out[finding.id] = {"status": status, "detail": outcome.message[:300]}
        except Exception as error:  # an API this release changed: the trace cannot run as recorded
            out[finding.id] = {"status": "n/a", "detail": f"{type(error).__name__}: {error}"[:300]}
    return out


def _scheduler_findings() -> dict[str, dict[str, Any]]:
    from kvspec.conformance.vllm.scheduler_findings import SCHEDULER_FINDINGS, replay

    out = {}
    for finding in SCHEDULER_FINDINGS.values():  # under vLLM's Scheduler, then its AsyncScheduler
        for label, async_scheduling in ((finding.id, False), (f"{finding.id} (async)", True)):
            status, detail = replay(finding, async_scheduling=async_scheduling)
            out[label] = {"status": status, "detail": detail[:300]}
    return out


def _search(examples: int) -> dict[str, dict[str, Any]]:
    from kvspec.conformance.findings import inputs_to_avoid
    from kvspec.conformance.machines.scheduler import (
        DRAFTS_PER_STEP,
        LOAD_MODES,
        SCHEDULER_LAYOUTS,
        SchedulerHarness,
        engine_of,
        search,
    )

    # Steered around the known scheduler findings (S1-S3), which their traces replay above: the search looks
    # for what is not known yet (and does not spend minutes shrinking S2 again in every release).
    avoid = inputs_to_avoid("vllm", ["scheduler"])
    out = {}
    for name, layout in SCHEDULER_LAYOUTS.items():
        start = time.monotonic()
        try:  # a layout or drafting mode the release cannot build or run is not searched
            harness = SchedulerHarness(layout, num_draft_tokens=DRAFTS_PER_STEP if layout.use_eagle else 0,
                                       engine=engine_of(name))
            harness.arrive([1] * 40, max_tokens=3)
            harness.step(), harness.step()
        except Exception as error:
            out[name] = {"status": "n/a", "detail": f"{type(error).__name__}: {error}"[:300], "seconds": 0.0}
            continue
        try:
            failure = search(layout, LOAD_MODES, examples, engine=engine_of(name), avoid=avoid)
        except Exception as error:  # the machine itself could not run
            failure = f"{type(error).__name__}: {error}"
        if failure is None:
            status, detail = "clean", f"{examples} examples"
        else:
            status, detail = "finds", failure.strip().splitlines()[0] if failure.strip() else "AssertionError"
        out[name] = {"status": status, "detail": detail[:300], "seconds": round(time.monotonic() - start, 1)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, help="where to write the result")
    parser.add_argument("--examples", type=int, default=30, help="scheduler-machine examples per layout")
    args = parser.parse_args(argv)
    import vllm

    from kvspec.conformance.runner import require_vllm

    require_vllm()  # the release's hash format, the shared hash root
    result: dict[str, Any] = {"vllm": vllm.__version__}
    for part, fn in (("manager_findings", _manager_findings), ("scheduler_findings", _scheduler_findings),
                     ("scheduler_search", lambda: _search(args.examples))):
        try:
            result[part] = fn()
        except Exception:
            result[part] = {"error": traceback.format_exc()[-600:]}
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
