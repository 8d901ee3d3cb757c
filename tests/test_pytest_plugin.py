"""The pytest plugin, as a project would use it: a test module with one
conformance_suite line, run by pytest in a directory of its own."""

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

SUITE = '''
from kvspec.pytest_plugin import conformance_suite

test_impl = conformance_suite("impl", scope="pool", layouts=["tiny-pool", "two-groups"], examples=3)
test_broken = conformance_suite("brk:make", scope="pool", layouts=["tiny-pool"], examples=100)
test_from_the_command_line = conformance_suite(scope="pool", layouts=["caching-off"], examples=3)
'''


# The project's own conftest bounds Hypothesis's shrinking (the failure only has to read as kvspec's steps,
# which the trace minimiser makes short after it): 5 s, not the gate's two minutes.
CONFTEST = '''
import pytest
from kvspec.conformance.runner import shrinking_limited_to


@pytest.fixture(autouse=True)
def brief_shrinking():
    with shrinking_limited_to(5):
        yield
'''


def run(tmp_path, *args):
    (tmp_path / "test_kvspec.py").write_text(SUITE)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "brk.py").write_text("from broken_pools import DoubleDecrement, target\n"
                                     "make = target(DoubleDecrement)\n")
    env_path = f"{tmp_path}:{TESTS}"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-p", "no:benchmark", "-q", "test_kvspec.py", *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"})


def test_a_project_runs_one_test_per_layout_and_reads_failures_as_kvspec_steps(tmp_path):
    result = run(tmp_path)
    out = result.stdout
    assert result.returncode == 1, out
    assert "3 passed" in out or "2 passed" in out, out
    assert "1 failed" in out and "test_broken[pool/tiny-pool]" in out, out
    assert "minimal failing run:" in out and "step 1:" in out  # kvspec's steps ...
    assert "Falsifying example" not in out and "state.admit(" not in out  # ... not Hypothesis's draws
    assert (tmp_path / "kvspec-traces" / "pool-tiny-pool.json").is_file()
    assert "skipped" in out  # test_from_the_command_line without --kvspec-target


def test_the_command_line_fills_in_the_target_and_k_chooses_layouts(tmp_path):
    result = run(tmp_path, "--kvspec-target", "impl", "-k", "from_the_command_line")
    assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout
    result = run(tmp_path, "-m", "kvspec", "-k", "two-groups")
    assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout


EXACT_SUITE = '''
from kvspec.pytest_plugin import conformance_suite

test_pools = conformance_suite("impl", scope="pool", layouts=["tiny-pool", "two-groups"], examples=3)
test_budgeted = conformance_suite("impl", scope="manager", layouts=["full", "full+swa"], budget=1)
test_vllm = conformance_suite("vllm", scope="manager", layouts=["full+mamba-align-drafts"], examples=3)
'''


def run_suite(tmp_path, suite, *args):
    (tmp_path / "test_exact.py").write_text(suite)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-p", "no:benchmark", "-q", "-rs", "test_exact.py", *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": f"{tmp_path}:{TESTS}", "PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0"})


def test_kvspec_layout_chooses_exactly_where_k_matches_substrings_and_a_budget_sizes_the_search(tmp_path):
    """-k full matches full and full+swa; --kvspec-layout full is full alone
    (issue 27).  A suite with budget=1 searches each layout for a second."""
    result = run_suite(tmp_path, EXACT_SUITE, "-k", "test_budgeted and full")
    assert "2 passed" in result.stdout, result.stdout
    result = run_suite(tmp_path, EXACT_SUITE, "-k", "test_budgeted", "--kvspec-layout", "full", "--durations=0")
    assert result.returncode == 0 and "1 passed" in result.stdout and "--kvspec-layout full" in result.stdout, \
        result.stdout
    (timed,) = [line for line in result.stdout.splitlines() if "call" in line and "manager/full]" in line]
    assert 0.9 <= float(timed.split("s")[0]) < 30, timed  # about the budget: searched for a second, no more


def test_known_findings_steer_from_the_command_line(tmp_path):
    import importlib.util

    import pytest

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("the vllm target needs vLLM (tools/install_vllm.sh)")
    result = run_suite(tmp_path, EXACT_SUITE, "-k", "test_vllm", "--kvspec-known-findings")
    assert "1 skipped" in result.stdout and "steered around known finding F8" in result.stdout, result.stdout


def test_an_unknown_layout_is_an_error_not_a_run_of_skips(tmp_path):
    """A typo in --kvspec-layout, or in a suite's layouts, must not pass as a
    run in which every layout was skipped (issue 52): pytest stops with a
    usage error naming the layout, or the suite's module fails to collect."""
    result = run_suite(tmp_path, EXACT_SUITE, "--kvspec-layout", "ful")
    assert result.returncode == 4 and "--kvspec-layout: no layout named ful" in result.stderr, result.stderr
    result = run_suite(tmp_path, EXACT_SUITE.replace('layouts=["full", "full+swa"]', 'layouts=["full+sw"]'))
    assert result.returncode == 2 and "conformance_suite: no layout named full+sw" in result.stdout, result.stdout
