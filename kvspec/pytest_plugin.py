"""kvspec inside a project's own test suite.

A project checks its block manager with one line in a test module::

    # tests/test_kvspec.py
    from kvspec.pytest_plugin import conformance_suite

    test_conformance = conformance_suite("mypkg.kvcache:make_pool", scope="pool", level="L1")

That is one pytest test per layout (ids ``pool/two-groups``,
``manager/full+swa``, ...), each marked ``kvspec`` with its scope and
layout, so ``-k two-groups`` or ``-m kvspec`` choose among them and
pytest-xdist spreads them over processes.  ``-k`` matches substrings
(``-k full`` is every layout with ``full`` in its name);
``--kvspec-layout NAME`` (repeatable) chooses layouts by exact name.  A failing layout fails with what
``kvspec conform`` prints -- the broken rules, the minimal failing run step
by step, where its trace is saved -- not with Hypothesis's raw draws.

The plugin (registered as ``kvspec`` with pytest) adds options that a suite
left without arguments takes: ``--kvspec-target``, ``--kvspec-scope``,
``--kvspec-level``, ``--kvspec-profile`` and ``--kvspec-trace-dir``::

    test_conformance = conformance_suite()          # pytest --kvspec-target mypkg.kvcache:make_pool

and two that size and steer every suite's search:

- ``known_findings_avoided=True`` (or ``--kvspec-known-findings``): steer
  around the target's known findings, as ``kvspec conform
  --known-findings`` does -- a layout that is one of them is skipped,
  naming it (a suite over vLLM is red on F1-F4 and F9 otherwise);
- ``budget=SECONDS`` (or ``--kvspec-budget SECONDS``): each layout searches
  for that long instead of a number of examples.

A layout's search that ran fewer operations than its scope's floor fails
("not searched"): no check, no pass.  kvspec's and vLLM's loggers are kept
at ERROR while a layout runs (vLLM warns at every prefix-cache reset the
machines ask for).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvspec.conformance.findings import inherited_findings, inputs_to_avoid, known_findings
from kvspec.conformance.report import below_floor
from kvspec.conformance.runner import (
    SCOPES,
    Search,
    SetupError,
    default_release,
    findings_target,
    layout_names,
    machine_for,
    quiet_loggers,
    run_layout,
    scopes_for,
)
from kvspec.conformance.settings import PROFILES, scope_settings
from kvspec.conformance.trace import trace_file_name
from kvspec.spec.catalogue import LEVELS

OPTIONS = {"target": None, "scope": "all", "level": "L3", "profile": "ci", "trace_dir": "kvspec-traces",
           "known_findings": False, "budget": None, "layout": None, "database": None}
_CONFIG: Any = None  # the running pytest's config: fuzz_targets() reads --kvspec-* from it at collection


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("kvspec", "kvspec conformance (kvspec.pytest_plugin.conformance_suite)")
    group.addoption("--kvspec-target", help="the target a conformance_suite() without one checks (module:factory)")
    group.addoption("--kvspec-scope", choices=[*SCOPES, "all"],
                    help="pool, manager, scheduler or all (default all: the scopes the target has)")
    group.addoption("--kvspec-level", choices=sorted(LEVELS), help="L1, L2 or L3 (default L3)")
    group.addoption("--kvspec-profile", choices=sorted(PROFILES), help="Hypothesis profile of the search (default ci)")
    group.addoption("--kvspec-trace-dir", help="where failing runs are saved (default kvspec-traces)")
    group.addoption("--kvspec-known-findings", action="store_true", default=None,
                    help="steer around the target's known findings (docs/findings.md), as kvspec conform does")
    group.addoption("--kvspec-budget", type=float, metavar="SECONDS",
                    help="search each layout for SECONDS instead of a number of examples")
    group.addoption("--kvspec-layout", action="append", metavar="NAME",
                    help="run only the layout NAME (exact; repeatable) -- -k matches substrings")
    group.addoption("--kvspec-database", metavar="DIR|URL",
                    help="the example database fuzz_targets() share (a directory, or redis://HOST:PORT/N)")


def pytest_configure(config: Any) -> None:
    global _CONFIG
    _CONFIG = config
    config.addinivalue_line("markers", "kvspec(scope, layout): a kvspec conformance test of one layout")
    unknown = _unknown_layouts(config.getoption("kvspec_layout", None) or [])
    if unknown:  # a typo must not pass as a run in which every layout was skipped
        raise pytest.UsageError(f"--kvspec-layout: no layout named {', '.join(unknown)} "
                                f"(known: {', '.join(_every_layout())})")


def _every_layout() -> list[str]:
    return list(dict.fromkeys(name for scope in SCOPES for name in layout_names(scope)))


def _unknown_layouts(names: list[str]) -> list[str]:
    """The names in ``names`` that are no layout of any scope (nor a model's)."""
    known = set(_every_layout())
    return [name for name in names if name not in known and not name.startswith("model:")]


def _option(config: Any, name: str, given: Any) -> Any:
    if given is not None:
        return given
    value = config.getoption(f"kvspec_{name}", None) if config is not None else None
    return OPTIONS[name] if value is None else value


def conformance_suite(target: str | None = None, *, scope: str | None = None, level: str | None = None,
                      layouts: list[str] | None = None, examples: int | None = None, profile: str | None = None,
                      known_findings_avoided: bool | None = None, budget: float | None = None) -> Any:
    """A pytest test function over the layouts of ``scope`` (or ``layouts``),
    each checking ``target`` at ``level``.  Arguments left out come from the
    command line (``--kvspec-*``), then the defaults: scope ``all``, level
    ``L3``, profile ``ci``.  ``known_findings_avoided``: steer around the
    target's known findings (as ``kvspec conform --known-findings``).
    ``budget``: seconds of search per layout (instead of ``examples``)."""
    if examples is not None and budget is not None:
        raise ValueError("conformance_suite: examples and budget size the search two ways; give one")
    if budget is not None and budget <= 0:
        raise ValueError(f"conformance_suite: budget must be a positive number of seconds, got {budget}")
    if unknown := _unknown_layouts(layouts or []):
        raise ValueError(f"conformance_suite: no layout named {', '.join(unknown)} "
                         f"(known: {', '.join(_every_layout())})")
    scopes = SCOPES if scope in (None, "all") else (scope,)
    cases = [(s, name) for s in scopes for name in (layouts or layout_names(s)) if name in layout_names(s) or
             name.startswith("model:")]
    params = [pytest.param(s, name, id=f"{s}/{name}", marks=pytest.mark.kvspec(scope=s, layout=name))
              for s, name in cases]

    @pytest.mark.parametrize("kvspec_scope, kvspec_layout", params)
    def test_conformance(kvspec_scope: str, kvspec_layout: str, request: Any) -> None:
        config = request.config
        exact = _option(config, "layout", None)
        if exact and kvspec_layout not in exact:
            pytest.skip(f"--kvspec-layout {' '.join(exact)}")
        chosen = _option(config, "scope", scope)
        if chosen != "all" and chosen != kvspec_scope:
            pytest.skip(f"--kvspec-scope {chosen}")
        name = _option(config, "target", target)
        if not name:
            pytest.skip("no target: give conformance_suite(target) or --kvspec-target module:factory")
        if chosen == "all" and kvspec_scope not in scopes_for(name):
            pytest.skip(f"target {name} has no {kvspec_scope} scope (vLLM's scheduler: targets vllm, or impl "
                        "where vLLM is installed)")
        chosen_level, chosen_profile = _option(config, "level", level), _option(config, "profile", profile)
        scopes = (kvspec_scope,)
        whose = findings_target(name, kvspec_scope)  # a factory of vLLM's classes inherits vLLM's findings
        avoid = inputs_to_avoid(whose, scopes) if _option(config, "known_findings", known_findings_avoided) \
            else frozenset()
        avoid |= {f.avoid for f in inherited_findings(name, scopes)}  # vLLM's scheduler's, under it: not the target's
        if f"layout:{kvspec_layout}" in avoid:
            ids = ", ".join(f.id for f in known_findings(whose, scopes) if f.avoid == f"layout:{kvspec_layout}")
            pytest.skip(f"steered around known finding {ids}")
        settings = scope_settings(kvspec_scope, chosen_profile)
        try:
            # a factory of vLLM's classes is judged as vLLM is: by the installed release's rules
            machine = machine_for(kvspec_scope, kvspec_layout, name, chosen_level, avoid,
                                  release=default_release(whose, kvspec_scope) if whose != name else None)
        except SetupError as error:
            pytest.fail(f"kvspec: {error}", pytrace=False)
        seconds = _option(config, "budget", budget) if examples is None else None
        quiet_loggers()
        result = run_layout(machine, Search(settings, examples=None if seconds else examples, seconds=seconds))
        if not result.conforms:
            if result.trace is not None:
                result.trace.target, result.trace.level = name, chosen_level
                path = Path(_option(config, "trace_dir", None)) / trace_file_name(kvspec_scope, kvspec_layout)
                result.trace_file = str(result.trace.save(path))
            pytest.fail(f"{name} on {kvspec_scope}/{kvspec_layout} at {chosen_level}: {result.verdict()}",
                        pytrace=False)
        if (why := below_floor(kvspec_scope, result.operations)) is not None:  # no check, no pass
            pytest.fail(f"{name} on {kvspec_scope}/{kvspec_layout}: not searched -- {why}", pytrace=False)

    return test_conformance


def fuzz_targets(target: str | None = None, *, scope: str | None = None, level: str | None = None,
                 layouts: list[str] | None = None, profile: str | None = None,
                 database: str | None = None) -> dict[str, type]:
    """The machines as tests that HypoFuzz (``hypothesis fuzz``, ``kvspec
    fuzz``) fuzzes: one ``unittest.TestCase`` per layout of ``scope`` (or
    ``layouts``), each a Hypothesis state machine test checking ``target`` at
    ``level``.  A test module takes them into its namespace::

        globals().update(fuzz_targets())      # hypothesis fuzz -- --kvspec-target mypkg.kvcache:make_pool

    Arguments left out come from the command line (``--kvspec-*``), then the
    defaults, as for :func:`conformance_suite`.  Each test keys the example
    database as the gate does for its layout: a failure a campaign saves in
    ``database`` (``--kvspec-database``: a directory or ``redis://...``;
    default ``.kvspec-fuzz/examples``) is replayed by ``kvspec conform --target T --database SAME``.  Its steps
    are the ``ci`` profile's (or ``profile``'s), so that the gate's replay
    runs as long a run as the campaign did; the search is HypoFuzz's own.
    Layouts the target lacks, or that are one of its known findings with
    ``--kvspec-known-findings``, come as skipped tests, naming why."""
    from hypothesis import settings as hypothesis_settings

    from kvspec.conformance.runner import hypothesis_factory
    from kvspec.conformance.settings import example_database
    from kvspec.fuzz import DEFAULT_DATABASE, hypofuzz_compat

    hypofuzz_compat()
    quiet_loggers()
    config = _CONFIG
    name = _option(config, "target", target)
    chosen_scope, chosen_level = _option(config, "scope", scope), _option(config, "level", level)
    chosen_profile = _option(config, "profile", profile)
    exact = layouts or _option(config, "layout", None)
    where = _option(config, "database", database) or DEFAULT_DATABASE  # HypoFuzz needs one
    scopes = [s for s in (SCOPES if chosen_scope == "all" else (chosen_scope,))
              if not name or chosen_scope != "all" or s in scopes_for(name)]
    cases = [(s, n) for s in scopes for n in (exact or layout_names(s)) if n in layout_names(s)]
    sized = {s: scope_settings(s, chosen_profile) for s in scopes}  # loads the profile: the database comes after
    db = example_database(where)
    if db is not None:  # HypoFuzz fuzzes only tests whose database is the default one
        hypothesis_settings.register_profile("kvspec-fuzz", hypothesis_settings(hypothesis_settings.default,
                                                                                database=db, derandomize=False))
        hypothesis_settings.load_profile("kvspec-fuzz")
    db = hypothesis_settings.default.database
    tests: dict[str, type] = {}
    for s, layout in cases:
        cls_name = "TestFuzz_" + f"{s}_{layout}".replace("-", "_").replace("+", "_").replace(":", "_")
        tests[cls_name] = _fuzz_test(cls_name, name, s, layout, chosen_level,
                                     hypothesis_settings(sized[s], database=db, derandomize=False),
                                     _option(config, "known_findings", None), hypothesis_factory)
    return tests


def _fuzz_test(cls_name: str, name: str | None, scope: str, layout: str, level: str, run_settings: Any,
               known: bool, factory: Any) -> type:
    """One layout's machine as a ``unittest.TestCase`` in HypoFuzz's form
    (``runTest._hypothesis_state_machine_class``), or a skipped one, why."""
    import unittest

    from hypothesis.stateful import get_state_machine_test

    why, machine = None, None
    if not name:
        why = "no target: give fuzz_targets(target) or --kvspec-target module:factory"
    else:
        whose = findings_target(name, scope)
        avoid = inputs_to_avoid(whose, (scope,)) if known else frozenset()
        avoid |= {f.avoid for f in inherited_findings(name, (scope,))}
        if f"layout:{layout}" in avoid:
            why = "steered around known finding " + ", ".join(
                f.id for f in known_findings(whose, (scope,)) if f.avoid == f"layout:{layout}")
        else:
            try:
                machine = machine_for(scope, layout, name, level, avoid,
                                      release=default_release(whose, scope) if whose != name else None)
            except SetupError as error:
                why = f"kvspec: {error}"
    make = factory(machine) if machine is not None else None

    def runTest(self: Any) -> None:
        quiet_loggers()
        get_state_machine_test(make, settings=self.settings)()

    runTest.is_hypothesis_test = True  # type: ignore[attr-defined]
    runTest._hypothesis_state_machine_class = make  # type: ignore[attr-defined]
    cls = type(cls_name, (unittest.TestCase,), {"settings": run_settings, "runTest": runTest, "kvspec_scope": scope,
                                                "kvspec_layout": layout, "kvspec_machine": machine})
    cls = pytest.mark.kvspec(scope=scope, layout=layout)(cls)
    return pytest.mark.skip(reason=why)(cls) if why is not None else cls
