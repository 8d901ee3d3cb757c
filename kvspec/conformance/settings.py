"""Hypothesis profiles for conformance runs.

- ``ci`` (default): derandomized, so a pull request's result depends only on
  its code; sized so the pool machine runs well over 20,000 operations in a
  couple of minutes on a 2-core machine.
- ``long``: random seeds, many more examples, failures saved to a directory
  example database (``.hypothesis/examples``) so they replay next time.
- ``quick``: a smoke run for local edits.

Choose with ``HYPOTHESIS_PROFILE=long`` (tests) or ``--profile`` (CLI).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase
from hypothesis.stateful import run_state_machine_as_test

_COMMON = dict(
    # No explain phase: after shrinking, Hypothesis would replay the failure
    # many more times to say which of its draws matter -- kvspec reports the
    # failing run itself (the trace), and those replays only delay the verdict.
    phases=tuple(phase for phase in Phase if phase is not Phase.explain),
    deadline=None,
    print_blob=True,
    report_multiple_bugs=False,  # one failure per layout: the first found, shrunk
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)

PROFILES = {
    "ci": settings(derandomize=True, database=None, max_examples=250, stateful_step_count=100, **_COMMON),
    "long": settings(
        database=DirectoryBasedExampleDatabase(".hypothesis/examples"),
        max_examples=5000,
        stateful_step_count=200,
        **_COMMON,
    ),
    "quick": settings(derandomize=True, database=None, max_examples=20, stateful_step_count=50, **_COMMON),
}

for _name, _profile in PROFILES.items():
    settings.register_profile(_name, _profile)


# Examples per layout for each machine: a manager-machine example runs about
# four times as many operations as a pool-machine one (each scheduler step
# touches several requests), so it needs fewer for the same coverage.
MANAGER_EXAMPLES = {"ci": 200, "long": 2000, "quick": 10}


# The kernel stage: an example is up to 20 engine steps, each through real kernels and every check.
KERNEL_EXAMPLES = {"ci": 50, "long": 400, "quick": 5}


def kernel_settings(name: str | None = None, *, examples: int | None = None) -> settings:
    """The profile ``name`` sized for the kernel stage (``examples`` overrides)."""
    name = name or os.environ.get("HYPOTHESIS_PROFILE", "ci")
    return settings(load_profile(name), max_examples=examples or KERNEL_EXAMPLES[name], stateful_step_count=20,
                    suppress_health_check=list(HealthCheck))


# The scheduler machine: an example is up to 40 engine steps of vLLM's scheduler (a few ms each).
SCHEDULER_EXAMPLES = {"ci": 60, "long": 600, "quick": 10}


def scheduler_settings(name: str | None = None) -> settings:
    """The profile ``name`` sized for the scheduler machine."""
    name = name or os.environ.get("HYPOTHESIS_PROFILE", "ci")
    return settings(load_profile(name), max_examples=SCHEDULER_EXAMPLES[name], stateful_step_count=40)


def manager_settings(name: str | None = None) -> settings:
    """The profile ``name`` sized for the request-level machine."""
    name = name or os.environ.get("HYPOTHESIS_PROFILE", "ci")
    return settings(load_profile(name), max_examples=MANAGER_EXAMPLES[name])


# The offload machine: a tier of a few blocks and ten keys; an operation costs microseconds, an example of 50 of
# them reaches a full tier, evictions and loads in flight many times over.
OFFLOAD_EXAMPLES = {"ci": 60, "long": 1000, "quick": 10}


def offload_settings(name: str | None = None) -> settings:
    """The profile ``name`` sized for the offload machine (spec chapter 11)."""
    name = name or os.environ.get("HYPOTHESIS_PROFILE", "ci")
    return settings(load_profile(name), max_examples=OFFLOAD_EXAMPLES[name], stateful_step_count=50)


def load_profile(name: str | None = None) -> settings:
    """Load profile ``name`` (default: ``$HYPOTHESIS_PROFILE`` or ``ci``)."""
    name = name or os.environ.get("HYPOTHESIS_PROFILE", "ci")
    if name not in PROFILES:
        raise ValueError(f"unknown Hypothesis profile {name!r}; choose one of {sorted(PROFILES)}")
    settings.load_profile(name)
    return PROFILES[name]


def scope_settings(scope: str, name: str | None = None) -> settings:
    """The profile ``name`` sized for the machine of ``scope``.  Built in
    each process that searches: a settings object does not survive pickling
    to a worker (its "not set" markers come back as other objects, and
    Hypothesis then takes ``database`` for a database)."""
    if scope == "pool":
        return load_profile(name)
    if scope == "offload":
        return offload_settings(name)
    return manager_settings(name) if scope == "manager" else scheduler_settings(name)


def run_machine(machine: Any, run_settings: settings) -> None:
    """Run a state machine as Hypothesis's ``run_state_machine_as_test``
    does, with examples that depend only on the seed, the strategies and
    the target's answers -- every search of kvspec runs through here."""
    with examples_independent_of_imports():
        run_state_machine_as_test(machine, settings=run_settings)


@contextmanager
def examples_independent_of_imports() -> Iterator[None]:
    """Hypothesis (from 6.131, HypothesisWorks/hypothesis#4356) draws about
    one integer or string in twenty from the literals of every *local*
    module in ``sys.modules`` -- for kvspec, its own modules (vLLM's, in
    site-packages, never count).  A derandomized search then generates
    other examples after an import: the same ``kvspec conform --seed 1``
    gave a scheduler fault at 296 examples in a fresh process, at 378 after
    an in-process gate run, and not within 100 in CI.  kvspec's literals
    are no hint about a target's bugs, so a search draws from Hypothesis's
    own constants only.  This reaches into Hypothesis's internals (the
    pool, and the cache of it); where they are absent it changes nothing
    (tests/test_settings.py says whether the pin is needed)."""
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.conjecture.providers import Constants
        pool, cache = providers._get_local_constants, providers.CONSTANTS_CACHE
    except (ImportError, AttributeError):
        yield
        return
    none = Constants()
    cache.cache.clear()  # it holds the pool as drawn before; cleared again after, for the next reader
    providers._get_local_constants = lambda: none
    try:
        yield
    finally:
        providers._get_local_constants = pool
        cache.cache.clear()


REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
REDIS_KEY_PREFIX = b"kvspec-examples"


class DatabaseError(ValueError):
    """An example database that cannot be used (kvspec.conformance.runner
    reports it as a setup error: one line, exit 2)."""


def example_database(where: str | None) -> ExampleDatabase | None:
    """Hypothesis's example database for ``--database``: a Redis server by
    URL (``redis://HOST:PORT/N``, ``rediss://...``, ``unix:///path?db=N``) --
    shared by every shard and every machine that reaches it, so each run
    replays first what any run found -- or a local directory (any other
    value).  A Redis server that cannot be reached raises
    :class:`DatabaseError` here, before any search."""
    if not where:
        return None
    if not where.startswith(REDIS_SCHEMES):
        return DirectoryBasedExampleDatabase(where)
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError as error:
        raise DatabaseError(f"--database {where}: a Redis database needs the redis package "
                            f"(pip install 'kvspec[redis]'): {error}") from None
    try:
        client = redis.Redis.from_url(where, socket_connect_timeout=5)
        client.ping()
    except (redis.RedisError, ValueError, OSError) as error:
        raise DatabaseError(f"--database {where}: cannot reach the Redis server ({type(error).__name__}: "
                            f"{error}); give a reachable URL, or a directory for a local database") from None
    return RedisExampleDatabase(client, key_prefix=REDIS_KEY_PREFIX)
