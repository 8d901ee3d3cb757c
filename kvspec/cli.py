"""The ``kvspec`` command.

``kvspec conform --target impl`` runs the pool conformance machine against a
target over several pool layouts and prints one line per layout.  Exit codes:
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

from kvspec.conformance.pool_machine import LAYOUTS, ConformanceError, pool_machine
from kvspec.conformance.settings import PROFILES
from kvspec.conformance.targets import POOL_TARGETS, VllmApiPoolTarget
from kvspec.spec.interface import PoolTarget


class UsageError(Exception):
    """A mistake in the command line or the environment (exit 2)."""


def resolve_target(name: str) -> Callable[..., PoolTarget]:
    """``impl``, ``spec``, or ``module:factory`` -- a callable taking
    ``(num_blocks, enable_caching, hash_block_size, enable_kv_cache_events)``
    and returning a :class:`PoolTarget` or a pool with vLLM's BlockPool API."""
    if name in POOL_TARGETS:
        return POOL_TARGETS[name]
    if ":" not in name:
        raise UsageError(f"unknown target {name!r}: use one of {sorted(POOL_TARGETS)} or module:factory")
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

    def make(*args: Any) -> PoolTarget:
        pool = factory(*args)
        return pool if hasattr(pool, "snapshot") else VllmApiPoolTarget(pool)

    make.__name__ = attr
    return make


def conform(args: argparse.Namespace) -> int:
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    factory = resolve_target(args.target)
    layouts = args.layout or list(LAYOUTS)
    unknown = [name for name in layouts if name not in LAYOUTS]
    if unknown:
        raise UsageError(f"unknown layout(s) {unknown}: choose from {sorted(LAYOUTS)}")
    if args.examples is not None and args.examples <= 0:
        raise UsageError(f"--examples must be positive, got {args.examples}")
    profile = PROFILES[args.profile]
    overrides = {"max_examples": args.examples} if args.examples else {}
    logging.getLogger("kvspec").setLevel(logging.ERROR)

    print(f"kvspec conform: target={args.target} profile={args.profile} (pool level)")
    print(f"{'layout':<22} {'operations':>10} {'seconds':>8}  result")
    failures = 0
    for name in layouts:
        machine = pool_machine(factory, LAYOUTS[name], lockstep=not args.rules_only)
        start = time.perf_counter()
        try:
            run_state_machine_as_test(machine, settings=settings(profile, **overrides))
            verdict = "conforms"
        except ConformanceError as error:
            failures += 1
            # Hypothesis attaches the minimal failing sequence as notes.
            lines = str(error).splitlines() + list(getattr(error, "__notes__", []))
            verdict = "FAILED\n" + "\n".join("    " + line for line in lines)
        print(f"{name:<22} {machine.steps_run:>10} {time.perf_counter() - start:>8.1f}  {verdict}")
    print("all layouts conform" if not failures else f"{failures} layout(s) failed")
    return 1 if failures else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvspec", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("conform", help="check a target against the specification")
    run.add_argument("--target", default="impl", help="impl, spec, or module:factory (default impl)")
    run.add_argument("--layout", action="append", help=f"one of {', '.join(LAYOUTS)} (repeatable; default all)")
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
