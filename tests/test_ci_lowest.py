"""CI tests both ends of every declared version range: .ci/run installs the
newest versions pyproject.toml allows into a fresh virtual environment, and
once more with .ci/lowest-versions.txt as constraints.  The constraints must
be exactly the lowest versions the ranges declare, or that job tests
something no user installs."""

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def declared() -> dict[str, Version]:
    """What `pip install -e ".[dev]"` resolves first-hand: each name and the
    lowest version its range admits (a ``>=`` bound or an ``==`` pin)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lowest = {}
    for text in project["dependencies"] + project["optional-dependencies"]["dev"]:
        requirement = Requirement(text)
        if requirement.name == "torch":  # every install names its build: see .ci/lowest-versions.txt
            continue
        bounds = [s.version for s in requirement.specifier if s.operator in (">=", "==")]
        assert len(bounds) == 1, f"{text}: a range CI can test needs one lower bound (>= or ==)"
        lowest[canonicalize_name(requirement.name)] = Version(bounds[0])
    return lowest


def constrained() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / ".ci" / "lowest-versions.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            assert spec.operator == "==", f"{line}: a constraint here pins one version"
            pins[canonicalize_name(requirement.name)] = Version(spec.version)
    return pins


def test_the_lowest_versions_job_pins_every_declared_lower_bound():
    assert constrained() == declared()


def test_ci_installs_into_a_fresh_environment_and_runs_the_readme_commands():
    """The README's first two commands, as written, in .ci/run -- run in a
    virtual environment .ci/run creates, not in the machine's Python."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```", 2)[1].strip().splitlines()
    install_and_conform, tests = block[0], block[1]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "-m venv" in ci and "lowest-versions.txt" in ci
    for command in (*install_and_conform.split(" && "), tests):
        assert command in ci, f"the README's {command!r} is not what CI runs"


def test_torch_is_never_pinned_where_an_engine_environment_adds_kvspec():
    """vLLM's CUDA environment pins its own torch: kvspec's requirements take
    whatever torch is there (from the oldest a supported vLLM pins), and only
    the CPU install commands name a build."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for extra, texts in {"runtime": project["dependencies"], **project["optional-dependencies"]}.items():
        for text in texts:
            requirement = Requirement(text)
            if requirement.name == "torch":
                assert str(requirement.specifier) == ">=2.11", f"{extra}: {text}"
    readme = (ROOT / "README.md").read_text()
    assert "torch==2.13.0" in readme.split("```", 2)[1]
