"""The ``kvspec`` command: exit codes, one-line errors, the table."""

import subprocess
import sys

import pytest

from kvspec.cli import main


@pytest.mark.parametrize(
    "argv, message",
    [
        (["conform", "--target", "nope"], "unknown target 'nope'"),
        (["conform", "--target", "no_such_module:make"], "cannot import target module 'no_such_module'"),
        (["conform", "--target", "kvspec.cli:no_such_factory"], "has no callable 'no_such_factory'"),
        (["conform", "--examples", "0"], "--examples must be positive"),
        (["conform", "--layout", "no-such-layout"], "no layout named"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_conforming_target_exits_0(capsys):
    code = main(["conform", "--profile", "quick", "--layout", "tiny-pool", "--layout", "full", "--examples", "5"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "pool     tiny-pool" in out and "manager  full" in out and "all layouts conform" in out


def test_a_broken_pool_exits_1_naming_the_rule(capsys):
    argv = ["conform", "--target", "broken_pools:StaleHash", "--scope", "pool", "--layout", "tiny-pool",
            "--profile", "quick", "--level", "L1"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "hash-map-consistency" in out and "Falsifying example" in out


def test_the_installed_command_runs():
    done = subprocess.run(
        [sys.executable, "-m", "kvspec.cli", "conform", "--target", "nope"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr


def test_vllm_target_without_vllm_is_a_usage_error(capsys):
    try:
        import vllm  # noqa: F401

        pytest.skip("vLLM is installed here")
    except ImportError:
        pass
    assert main(["conform", "--target", "vllm"]) == 2
    assert "install it with tools/install_vllm.sh" in capsys.readouterr().err


def test_another_policy_conforms_at_l1_and_fails_l3(capsys):
    base = ["conform", "--target", "examples.mru_pool:make", "--scope", "pool", "--layout", "two-groups",
            "--profile", "quick"]
    assert main([*base, "--level", "L1"]) == 0, capsys.readouterr().out
    capsys.readouterr()
    assert main([*base, "--level", "L3"]) == 1
    out = capsys.readouterr().out
    assert "free-order" in out or "divergence from the spec" in out


def test_reports_are_written(tmp_path, capsys):
    import json
    import xml.etree.ElementTree as ET

    argv = ["conform", "--target", "broken_pools:StaleHash", "--scope", "pool", "--layout", "tiny-pool",
            "--layout", "two-groups", "--profile", "quick", "--level", "L1", "--report-dir", str(tmp_path)]
    assert main(argv) == 1
    capsys.readouterr()
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["conforms"] is False and report["level"] == "L1"
    assert {r["layout"] for r in report["results"]} == {"tiny-pool", "two-groups"}
    assert any("hash-map-consistency" in r["rules"] for r in report["results"])
    suite = ET.fromstring((tmp_path / "junit.xml").read_text())
    assert suite.get("tests") == "2" and int(suite.get("failures")) >= 1
    assert "does NOT conform at L1" in (tmp_path / "report.md").read_text()
