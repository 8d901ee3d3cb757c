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

from kvspec.conformance.layouts import MANAGER_LAYOUTS
from kvspec.conformance.manager_machine import manager_machine
from kvspec.conformance.manager_targets import ImplManagerTarget
from kvspec.conformance.pool_machine import LAYOUTS, ConformanceError, pool_machine
from kvspec.conformance.settings import PROFILES
from kvspec.conformance.spec_manager_target import SpecManagerTarget
from kvspec.conformance.targets import POOL_TARGETS, VllmApiPoolTarget

MANAGER_TARGETS: dict[str, Callable[..., Any]] = {"impl": ImplManagerTarget, "spec": SpecManagerTarget}


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


def _run(machine: Any, profile: Any, overrides: dict[str, Any]) -> str:
    """Run one machine; the verdict line (with the minimal failing sequence
    that Hypothesis attaches as notes, on failure)."""
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    try:
        run_state_machine_as_test(machine, settings=settings(profile, **overrides))
        return "conforms"
    except ConformanceError as error:
        lines = str(error).splitlines() + list(getattr(error, "__notes__", []))
        return "FAILED\n" + "\n".join("    " + line for line in lines)


def conform(args: argparse.Namespace) -> int:
    if args.examples is not None and args.examples <= 0:
        raise UsageError(f"--examples must be positive, got {args.examples}")
    levels = ["pool", "manager"] if args.level == "all" else [args.level]
    plan = [(level, name) for level in levels for name in _layouts(level, args.layout)]
    if not plan:
        raise UsageError(f"no layout named {args.layout} at level {args.level}")
    machines = {level: _machine_factory(level, args) for level in levels}
    profile = PROFILES[args.profile]
    overrides = {"max_examples": args.examples} if args.examples else {}
    logging.getLogger("kvspec").setLevel(logging.ERROR)

    print(f"kvspec conform: target={args.target} profile={args.profile}")
    print(f"{'level':<8} {'layout':<24} {'operations':>10} {'seconds':>8}  result")
    failures = 0
    for level, name in plan:
        machine = machines[level](name)
        start = time.perf_counter()
        verdict = _run(machine, profile, overrides)
        failures += verdict != "conforms"
        print(f"{level:<8} {name:<24} {machine.steps_run:>10} {time.perf_counter() - start:>8.1f}  {verdict}")
    print("all layouts conform" if not failures else f"{failures} layout(s) failed")
    return 1 if failures else 0


def _layouts(level: str, wanted: list[str] | None) -> list[str]:
    known = LAYOUTS if level == "pool" else MANAGER_LAYOUTS
    if not wanted:
        return list(known)
    return [name for name in wanted if name in known]


def _machine_factory(level: str, args: argparse.Namespace) -> Callable[[str], Any]:
    """layout name -> a machine class checking the target at this level."""
    lockstep = not args.rules_only
    if level == "pool":
        factory = resolve_target(args.target, POOL_TARGETS)
        return lambda name: pool_machine(factory, LAYOUTS[name], lockstep=lockstep)
    factory = resolve_target(args.target, MANAGER_TARGETS)
    spec = SpecManagerTarget if lockstep else None
    return lambda name: manager_machine(factory, MANAGER_LAYOUTS[name], spec_factory=spec)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvspec", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("conform", help="check a target against the specification")
    run.add_argument("--target", default="impl", help="impl, spec, or module:factory (default impl)")
    run.add_argument(
        "--level", default="all", choices=["pool", "manager", "all"],
        help="pool: the block pool alone; manager: the KVCacheManager with a scheduler (default all)",
    )
    run.add_argument(
        "--layout", action="append",
        help=f"pool: {', '.join(LAYOUTS)}; manager: {', '.join(MANAGER_LAYOUTS)} (repeatable; default all)",
    )
    run.add_argument("--profile", default="ci", choices=sorted(PROFILES), help="Hypothesis profile (default ci)")
    run.add_argument("--examples", type=int, help="examples per layout (overrides the profile)")
    run.add_argument(
        "--rules-only", action="store_true",
        help="check the rules only, not equality with the spec (for pools with other policies)",
    )
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
