"""The ``kvspec`` command.

``kvspec conform --target impl`` runs the conformance machines against a
target -- the pool machine over several pool layouts, the scheduler-like
manager machine over model layouts -- and prints one line per layout.  Exit codes:
0 conforms, 1 a rule was broken (or the target diverged from the spec),
2 usage or environment error (one line, no traceback).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import settings

from kvspec.conformance.layouts import MANAGER_LAYOUTS
from kvspec.conformance.machinery import ConformanceError
from kvspec.conformance.manager_machine import manager_machine
from kvspec.conformance.manager_targets import ImplManagerTarget
from kvspec.conformance.pool_machine import LAYOUTS, pool_machine
from kvspec.conformance.report import LayoutResult, RunReport, write_reports
from kvspec.conformance.settings import PROFILES, manager_settings
from kvspec.conformance.spec_manager_target import SpecManagerTarget
from kvspec.conformance.targets import POOL_TARGETS, VllmApiPoolTarget


def _require_vllm() -> None:
    try:
        import vllm.v1.core.block_pool  # noqa: F401
    except Exception as error:  # ImportError, or a broken install
        raise UsageError(
            f"the vllm target needs vLLM 0.25.1 importable in this Python ({type(error).__name__}: {error}); "
            "install it with tools/install_vllm.sh and run kvspec from that environment"
        ) from None


def vllm_pool(num_blocks: int, enable_caching: bool, hash_block_size: int, events: bool) -> VllmApiPoolTarget:
    from vllm.v1.core.block_pool import BlockPool

    return VllmApiPoolTarget(BlockPool(num_blocks, enable_caching, hash_block_size, events))


def vllm_manager(*args: Any) -> Any:
    from kvspec.conformance.manager_targets import VllmManagerTarget

    return VllmManagerTarget(*args)


MANAGER_TARGETS: dict[str, Callable[..., Any]] = {
    "impl": ImplManagerTarget,
    "spec": SpecManagerTarget,
    "vllm": vllm_manager,
}
POOL_TARGETS = {**POOL_TARGETS, "vllm": vllm_pool}


class UsageError(Exception):
    """A mistake in the command line or the environment (exit 2)."""


def resolve_target(name: str, known: dict[str, Callable[..., Any]]) -> Callable[..., Any]:
    """``impl``, ``spec``, or ``module:factory``.  At pool level the factory
    takes ``(num_blocks, enable_caching, hash_block_size,
    enable_kv_cache_events)`` and returns a :class:`PoolTarget` or a pool with
    vLLM's BlockPool API; at manager level it takes a layout's
    ``target_args()`` and returns a :class:`ManagerTarget`."""
    if name in known:
        return known[name]
    if ":" not in name:
        raise UsageError(f"unknown target {name!r}: use one of {sorted(known)} or module:factory")
    module_name, _, attr = name.partition(":")
    if os.getcwd() not in sys.path:  # like `python -m`: modules next to the user resolve
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise UsageError(f"cannot import target module {module_name!r}: {error}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UsageError(f"module {module_name!r} has no callable {attr!r}")

    def make(*args: Any) -> Any:
        target = factory(*args)
        return target if hasattr(target, "snapshot") else VllmApiPoolTarget(target)

    make.__name__ = attr
    return make


def _run(scope: str, name: str, machine: Any, profile: settings, overrides: dict[str, Any]) -> LayoutResult:
    """Run one machine; on failure keep the broken rules, the divergence and
    the minimal failing sequence Hypothesis attaches as notes."""
    from hypothesis.stateful import run_state_machine_as_test

    start = time.perf_counter()
    try:
        run_state_machine_as_test(machine, settings=settings(profile, **overrides))
        rules: list[str] = []
        details: list[str] = []
    except ConformanceError as error:
        rules = sorted({v.rule for v in error.violations})
        details = str(error).splitlines() + list(getattr(error, "__notes__", []))
    seconds = time.perf_counter() - start
    return LayoutResult(scope, name, machine.steps_run, seconds, not details, rules, details)


def conform(args: argparse.Namespace) -> int:
    if args.target == "vllm":
        _require_vllm()
    if args.examples is not None and args.examples <= 0:
        raise UsageError(f"--examples must be positive, got {args.examples}")
    scopes = ["pool", "manager"] if args.scope == "all" else [args.scope]
    plan = [(scope, name) for scope in scopes for name in _layouts(scope, args.layout)]
    if not plan:
        raise UsageError(f"no layout named {args.layout} in scope {args.scope}")
    machines = {scope: _machine_factory(scope, args) for scope in scopes}
    profiles = {"pool": PROFILES[args.profile], "manager": manager_settings(args.profile)}
    overrides = {"max_examples": args.examples} if args.examples else {}
    for noisy in ("kvspec", "vllm"):
        logging.getLogger(noisy).setLevel(logging.ERROR)

    print(f"kvspec conform: target={args.target} level={args.level} profile={args.profile}")
    print(f"{'scope':<8} {'layout':<24} {'operations':>10} {'seconds':>8}  result")
    report = RunReport(args.target, args.level, args.profile)
    for scope, name in plan:
        r = _run(scope, name, machines[scope](name), profiles[scope], overrides)
        report.results.append(r)
        verdict = "conforms" if r.conforms else "FAILED\n" + "\n".join("    " + line for line in r.details)
        print(f"{scope:<8} {name:<24} {r.operations:>10} {r.seconds:>8.1f}  {verdict}", flush=True)
    failures = sum(not r.conforms for r in report.results)
    print("all layouts conform" if not failures else f"{failures} layout(s) failed")
    if args.report_dir:
        for path in write_reports(report, args.report_dir):
            print(f"wrote {path}")
    return 1 if failures else 0


def _layouts(scope: str, wanted: list[str] | None) -> list[str]:
    known = LAYOUTS if scope == "pool" else MANAGER_LAYOUTS
    if not wanted:
        return list(known)
    return [name for name in wanted if name in known]


LEVELS: dict[str, frozenset[str]] = {
    # rules a level does not ask for; L3 also compares every observation with the spec
    "L1": frozenset({"hit-optimality", "free-order"}),
    "L2": frozenset({"free-order"}),
    "L3": frozenset(),
}


def _machine_factory(scope: str, args: argparse.Namespace) -> Callable[[str], Any]:
    """layout name -> a machine class checking the target in this scope."""
    lockstep = args.level == "L3"
    ignore = LEVELS[args.level]
    if scope == "pool":
        factory = resolve_target(args.target, POOL_TARGETS)
        return lambda name: pool_machine(factory, LAYOUTS[name], lockstep=lockstep, ignore_rules=ignore)
    factory = resolve_target(args.target, MANAGER_TARGETS)
    spec = SpecManagerTarget if lockstep else None
    return lambda name: manager_machine(factory, MANAGER_LAYOUTS[name], spec_factory=spec, ignore_rules=ignore)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvspec", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("conform", help="check a target against the specification")
    run.add_argument("--target", default="impl", help="impl, spec, vllm, or module:factory (default impl)")
    run.add_argument(
        "--scope", default="all", choices=["pool", "manager", "all"],
        help="pool: the block pool alone; manager: the KVCacheManager with a scheduler (default all)",
    )
    run.add_argument(
        "--level", default="L3", choices=sorted(LEVELS),
        help="L1 safety rules; L2 + optimal hits; L3 + identical observations to the spec (default L3)",
    )
    run.add_argument(
        "--layout", action="append",
        help=f"pool: {', '.join(LAYOUTS)}; manager: {', '.join(MANAGER_LAYOUTS)} (repeatable; default all)",
    )
    run.add_argument("--profile", default="ci", choices=sorted(PROFILES), help="Hypothesis profile (default ci)")
    run.add_argument("--examples", type=int, help="examples per layout (overrides the profile)")
    run.add_argument("--report-dir", help="write report.json, report.md and junit.xml here")
    run.set_defaults(func=conform)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UsageError as error:
        print(f"kvspec: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvspec: interrupted", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
