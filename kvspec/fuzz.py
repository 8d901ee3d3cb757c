"""``kvspec fuzz``: a long campaign on HypoFuzz.

HypoFuzz (``pip install 'kvspec[fuzz]'``) runs Hypothesis tests as an
adaptive, coverage-guided campaign on N processes, with a live dashboard.
The tests it fuzzes here are the gate's machines, one per layout, as
:func:`kvspec.pytest_plugin.fuzz_targets` collects them; each keys the
example database as the gate's search does for its layout, so a failure the
campaign saves in ``--database`` is replayed by ``kvspec conform --target T
--database SAME`` -- with the gate's verdict, minimal run, trace and rules.

The campaign runs ``hypothesis fuzz`` in a process group of its own, on a
two-line test module written to a temporary directory (with an empty
``pytest.ini``, so that no project's pytest configuration applies to it),
from the caller's working directory (a ``module:factory`` there imports).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvspec.errors import SetupError

INTERRUPTED = 4  # as the other commands exit when interrupted (kvspec.cli.INTERRUPTED_EXIT)
INSTALL_HINT = "pip install 'kvspec[fuzz]'"
DEFAULT_DATABASE = ".kvspec-fuzz/examples"
TEST_MODULE = '''"""kvspec's machines for HypoFuzz: the target and layouts come from --kvspec-*."""
from kvspec.pytest_plugin import fuzz_targets

globals().update(fuzz_targets())
'''
LAUNCH = "import sys; from kvspec.fuzz import launch; sys.exit(launch())"


def launch() -> object:
    """``hypothesis fuzz`` with :func:`hypofuzz_compat` and the hub's fix
    (:func:`_hub_waits_for_first_rounds`): the campaign's own process."""
    import hypofuzz.entrypoint  # noqa: F401 -- registers ``fuzz`` with Hypothesis's command line
    from hypothesis.extra.cli import main

    hypofuzz_compat()
    _hub_waits_for_first_rounds()
    return main()


def _hub_waits_for_first_rounds() -> None:
    """HypoFuzz's hub stops the campaign when, 60 s in, no worker has said
    which of its tests are still worth fuzzing -- which a worker says only
    after its first round of 100 inputs of one test.  A manager layout's
    round takes minutes on a loaded 2-core machine (up to 100 operations an
    input, each checked in lockstep with the spec), so a kvspec campaign
    ended after a minute, having fuzzed nothing ("Found a failing input for
    every test!").  Until a worker first reports, the hub counts all its
    tests as worth fuzzing."""
    from hypofuzz.hypofuzz import FuzzWorkerHub

    if getattr(FuzzWorkerHub, "_kvspec_patched", False):
        return
    rebalance = FuzzWorkerHub._rebalance

    def _rebalance(self: FuzzWorkerHub) -> None:
        rebalance(self)
        if not getattr(self, "_kvspec_seeded", False):  # the first call, before the workers start
            self._kvspec_seeded = True
            for state in self.shared_states:
                state["worker_state"]["valid_nodeids"] = list(self.nodeids)

    FuzzWorkerHub._rebalance = _rebalance
    FuzzWorkerHub._kvspec_patched = True


def hypofuzz_compat() -> None:
    """HypoFuzz 25.11.1 (the newest) copies a shrunk failure's explain-phase
    comments from ``ConjectureResult.slice_comments``, which Hypothesis 6.158
    removed (its explain phase keeps them elsewhere): every failure a campaign
    found then crashed its worker before it was saved.  The class gets an
    empty one -- the explain phase is off in kvspec's profiles anyway."""
    from hypothesis.internal.conjecture.data import ConjectureResult

    if not hasattr(ConjectureResult, "slice_comments"):
        ConjectureResult.slice_comments = {}  # type: ignore[attr-defined]


def hypofuzz_missing() -> str | None:
    """Why a campaign cannot start here, or None."""
    if importlib.util.find_spec("hypofuzz") is None:
        return f"kvspec fuzz runs HypoFuzz, which is not installed: {INSTALL_HINT}"
    return None


def pytest_arguments(directory: Path, target: str, scope: str, layouts: list[str] | None, level: str,
                     database: str, known_findings: bool = False) -> list[str]:
    """What ``hypothesis fuzz -- ...`` hands pytest to collect the machines."""
    args = ["-c", str(directory / "pytest.ini"), "--rootdir", str(directory), "-p", "no:cacheprovider",
            str(directory / "test_kvspec_fuzz.py"), "--kvspec-target", target, "--kvspec-scope", scope,
            "--kvspec-level", level, "--kvspec-database", database]
    for layout in layouts or []:
        args += ["--kvspec-layout", layout]
    return args + (["--kvspec-known-findings"] if known_findings else [])


def campaign_command(directory: Path, target: str, scope: str = "all", layouts: list[str] | None = None,
                     level: str = "L3", workers: int = 2, database: str = DEFAULT_DATABASE,
                     dashboard: bool = True, port: int = 9999, known_findings: bool = False) -> list[str]:
    """The ``hypothesis fuzz`` command line of a campaign (its test module in ``directory``)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "pytest.ini").write_text("[pytest]\n")
    (directory / "test_kvspec_fuzz.py").write_text(TEST_MODULE)
    return [sys.executable, "-c", LAUNCH, "fuzz", "-n", str(workers), "--port", str(port),
            *([] if dashboard else ["--no-dashboard"]), "--",
            *pytest_arguments(directory, target, scope, layouts, level, database, known_findings)]


def run_campaign(target: str, scope: str = "all", layouts: list[str] | None = None, level: str = "L3",
                 workers: int = 2, database: str = DEFAULT_DATABASE, seconds: float | None = None,
                 dashboard: bool = True, port: int = 9999, known_findings: bool = False,
                 out=None) -> int:
    """Run a campaign until ``seconds`` pass (None: until stopped, or until
    every layout has failed, when HypoFuzz stops by itself).  Returns 0 when
    the time ran out, 4 when interrupted, else HypoFuzz's exit status."""
    out = out or sys.stdout
    if (why := hypofuzz_missing()) is not None:
        raise SetupError(why)
    with tempfile.TemporaryDirectory(prefix="kvspec-fuzz-") as tmp:
        command = campaign_command(Path(tmp), target, scope, layouts, level, workers, database, dashboard, port,
                                   known_findings)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH")) if p)
        print(f"kvspec fuzz: HypoFuzz on {workers} process{'es' * (workers != 1)}, target {target}, scope {scope}, "
              f"database {database}" + (f", dashboard http://localhost:{port}" if dashboard else "")
              + (f", for {seconds:g} s" if seconds else ", until stopped (Ctrl-C)"), file=out, flush=True)
        process = subprocess.Popen(command, env=env, start_new_session=True)
        previous = signal.signal(signal.SIGTERM, _interrupt)  # a stopped kvspec fuzz stops its campaign too
        try:
            code = process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            code = 0
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM: the campaign ends, and says what it saved
            code = INTERRUPTED
        finally:
            _stop(process)
            signal.signal(signal.SIGTERM, previous)
    for line in summary(database):
        print(f"  {line}", file=out)
    print(f"kvspec fuzz: replay what it found with: kvspec conform --target {target} --scope {scope} "
          f"--database {database}", file=out, flush=True)
    return code


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def summary(database: str) -> list[str]:
    """What the campaigns saved in ``database`` say of each test: inputs run,
    seconds fuzzed (summed over the workers, from each worker's latest
    HypoFuzz report) and failures saved -- one line a test."""
    from hypofuzz.database import HypofuzzDatabase
    from hypofuzz.database.database import test_keys_key

    from kvspec.conformance.settings import example_database

    db = example_database(database)
    if db is None:
        return []
    hdb = HypofuzzDatabase(db)
    lines = []
    for key in sorted(set(db.fetch(test_keys_key))):
        latest: dict[str, object] = {}
        for report in hdb.reports.fetch(key):
            if report.worker_uuid not in latest or report.elapsed_time > latest[report.worker_uuid].elapsed_time:
                latest[report.worker_uuid] = report
        if not latest:
            continue
        inputs = sum(sum(r.status_counts.values()) for r in latest.values())
        seconds = sum(r.elapsed_time for r in latest.values())
        failures = len(list(db.fetch(key))) + len(list(db.fetch(key + b".secondary")))
        nodeid = next(iter(latest.values())).nodeid.rsplit("::", 2)[-2] if latest else key.hex()
        rate = f", {3600 * inputs / seconds:,.0f} inputs/hour" if seconds else ""
        lines.append(f"{nodeid}: {inputs:,} inputs in {seconds:,.0f} s{rate}; "
                     f"{failures} failing example(s) saved")
    return lines


def _stop(process: subprocess.Popen) -> None:
    """End the campaign's process group: SIGINT (HypoFuzz's workers save
    what they have), then SIGKILL what is left after 10 s."""
    if process.poll() is not None:
        return
    for sig, wait in ((signal.SIGINT, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.1)
        if process.poll() is not None:
            break
    try:  # the workers are in the group too: none may outlive the campaign
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
