"""tools/overlay_vllm.py: a vLLM source tree's Python code over an installed
wheel (how a fork or vLLM main runs without a CUDA build; issue 27)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parent.parent / "tools" / "overlay_vllm.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True)


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_sources_python_replaces_the_wheels_and_its_compiled_parts_stay(tmp_path):
    site = tree(tmp_path / "site" / "vllm", {
        "__init__.py": "wheel", "_version.py": "__version__ = '0.25.1'", "_C.so": "compiled",
        "v1/core/block_pool.py": "wheel pool", "v1/core/sched/scheduler.py": "wheel scheduler"})
    fork = tree(tmp_path / "fork", {
        "vllm/__init__.py": "fork", "vllm/_version.py": "__version__ = '0.0.0.dev'", "vllm/_C.so": "stale build",
        "vllm/v1/core/block_pool.py": "fork pool", "vllm/v1/core/new_module.py": "fork only",
        "vllm/v1/core/__pycache__/block_pool.cpython-311.pyc": "cache", "csrc/kernel.cu": "not the package"})
    done = run(str(fork), str(site))
    assert done.returncode == 0 and done.stdout.startswith(f"overlaid 3 files of {fork} on {site}"), done
    assert (site / "v1/core/block_pool.py").read_text() == "fork pool"
    assert (site / "v1/core/new_module.py").read_text() == "fork only"
    assert (site / "v1/core/sched/scheduler.py").read_text() == "wheel scheduler"  # not in the source: kept
    assert (site / "_version.py").read_text() == "__version__ = '0.25.1'"  # judged as the base release
    assert (site / "_C.so").read_text() == "compiled" and not (site / "v1/core/__pycache__").exists()
    record = json.loads((site / "KVSPEC_OVERLAY.json").read_text())
    assert record["source"] == str(fork) and record["commit"] is None and record["files"] == 3


def test_a_linked_file_is_replaced_not_written_through(tmp_path):
    original = tree(tmp_path / "cache", {"block_pool.py": "release"}) / "block_pool.py"
    site = tree(tmp_path / "site" / "vllm", {"__init__.py": ""})
    (site / "block_pool.py").symlink_to(original)
    fork = tree(tmp_path / "fork", {"vllm/__init__.py": "", "vllm/block_pool.py": "fork"})
    assert run(str(fork), str(site)).returncode == 0
    assert (site / "block_pool.py").read_text() == "fork" and original.read_text() == "release"


def test_a_git_checkout_records_its_commit(tmp_path):
    fork = tree(tmp_path / "fork", {"vllm/__init__.py": "", "vllm/v1/core/block_pool.py": "fork"})
    git = ["git", "-C", str(fork), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(fork)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "fork"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    site = tree(tmp_path / "site" / "vllm", {"__init__.py": ""})
    done = run(str(fork), str(site))
    assert f"at {commit[:12]}" in done.stdout, done
    assert json.loads((site / "KVSPEC_OVERLAY.json").read_text())["commit"] == commit
    # and cloned from a git URL (file://), the same commit
    cloned = tree(tmp_path / "site2" / "vllm", {"__init__.py": ""})
    done = run(f"file://{fork}", str(cloned))
    assert done.returncode == 0 and json.loads((cloned / "KVSPEC_OVERLAY.json").read_text())["commit"] == commit


def test_what_cannot_be_overlaid_is_one_line_and_exit_2(tmp_path):
    site = tree(tmp_path / "site" / "vllm", {"__init__.py": ""})
    for args, said in (((str(tmp_path / "nothing"), str(site)), "is no vLLM source tree"),
                       ((str(tree(tmp_path / "fork", {"vllm/__init__.py": ""})), str(tmp_path / "none")),
                        "is no installed vLLM package"),
                       ((f"file://{tmp_path / 'no-repo'}", str(site)), "cannot clone")):
        done = run(*args)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and said in done.stderr, done


def test_the_sources_own_package_is_refused_and_left_whole(tmp_path):
    """Asked from inside a checkout, Python finds the checkout's vllm/ as "the
    installed package": overlaying a tree onto itself would unlink each file
    before copying it from itself.  Refused, one line, the tree untouched."""
    fork = tree(tmp_path / "fork", {"vllm/__init__.py": "X = 1\n", "vllm/v1/core/block_pool.py": "Y = 2\n"})
    done = run(str(fork), str(fork / "vllm"))
    assert done.returncode == 2 and "is the source's own vllm/ package" in done.stderr, done
    assert (fork / "vllm" / "__init__.py").read_text() == "X = 1\n"
    assert (fork / "vllm" / "v1" / "core" / "block_pool.py").read_text() == "Y = 2\n"
