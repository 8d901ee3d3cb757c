"""kvspec as a user installs it without a checkout: from a built wheel and
from its repository URL (issue 27: the fork's CI should not need kvspec's
source tree).  What the installed package reads at run time must be in it:
every layer, and the known findings' traces (the vectors corpus replays
them; ``kvspec vectors generate`` from a wheel once stopped on the first)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kvspec.conformance.findings import FINDINGS

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("kvspec/spec/pool.py", "kvspec/impl/block_pool.py", "kvspec/models/kernels.py",
          "kvspec/proofs/run.py", "kvspec/conformance/gate.py")


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args],
                          capture_output=True, text=True, timeout=600)


def expected() -> set[str]:
    return {*LAYERS, *(f"kvspec/finding_traces/{f.trace}" for f in FINDINGS)}


needs_git = pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout")


@needs_git
def test_the_wheel_holds_every_layer_and_every_findings_trace(tmp_path):
    """Built from the checkout's committed tree (pip clones it: nothing is
    written into the checkout, where the CI's other installs run)."""
    done = pip("wheel", "--no-deps", "-w", str(tmp_path), f"git+file://{ROOT}")
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("kvspec-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert expected() <= names, sorted(expected() - names)
    assert not any(n.startswith(("tests/", "kvspec/finding_traces/repro")) for n in names)


@needs_git
def test_installing_from_the_repository_url_gives_the_same_package(tmp_path):
    """``pip install git+URL`` -- here the checkout's own URL, file:// (its committed tree)."""
    done = pip("install", "--no-deps", "--target", str(tmp_path / "site"), f"git+file://{ROOT}")
    assert done.returncode == 0, done.stderr
    installed = {str(p.relative_to(tmp_path / "site")) for p in (tmp_path / "site" / "kvspec").rglob("*")}
    assert expected() <= installed, sorted(expected() - installed)
