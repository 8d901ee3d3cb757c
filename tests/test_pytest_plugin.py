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


def run(tmp_path, *args):
    (tmp_path / "test_kvspec.py").write_text(SUITE)
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
