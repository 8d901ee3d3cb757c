"""Engines of other designs, judged at cache scope (spec chapter 10).

Each module adapts one engine's own classes -- imported from the engine as
installed, never re-modelled -- to :class:`~kvspec.spec.engines.CacheTarget`,
calling them in the order the engine's scheduler does:

- ``lmdeploy``: LMDeploy's PyTorch-engine scheduler, block manager and block trie;
- ``sglang``: SGLang's radix cache, its token and page allocators and its requests;
- ``faults``: faults planted in each engine's own code, to show its gate bites.

``docs/engines.md`` maps each engine's state onto the content view, rule
by rule.  Install an engine with ``tools/install_engine.sh``.
"""

from __future__ import annotations

import importlib
from typing import Any

from kvspec.errors import SetupError
from kvspec.spec.engines import CacheLayout

MODULES = {"sglang": "kvspec.conformance.engines.sglang", "lmdeploy": "kvspec.conformance.engines.lmdeploy"}


class TickingClock:
    """An engine's LRU clock, made repeatable.  LMDeploy stamps a block's
    last access with ``time.perf_counter()`` (kept as whole seconds, ties
    broken by memory addresses), SGLang a node's with ``time.monotonic()``:
    which leaf ``evict`` takes changed from run to run, and a failing run
    could not be replayed.  A target gives the engine's module this clock
    instead of ``time``, one tick per reading: the same least-recently-used
    order, repeatable.  Only the policy's timing changes, not the engine's code."""

    def __init__(self) -> None:
        self.now = 0

    def perf_counter(self) -> int:
        self.now += 1
        return self.now

    monotonic = time = perf_counter


def _module(engine: str) -> Any:
    if engine not in MODULES:
        raise SetupError(f"no engine {engine!r}: use one of {sorted(MODULES)}")
    return importlib.import_module(MODULES[engine])


def require(engine: str) -> None:
    """The engine must import here; else one line saying how to install it."""
    problem = _module(engine).problem()
    if problem is not None:
        raise SetupError(f"the {engine} target needs {engine} importable in this Python ({problem}); "
                         f"install it with tools/install_engine.sh {engine} and run kvspec from that environment")


def target(engine: str, layout: CacheLayout) -> Any:
    """The engine's cache-scope target for ``layout``."""
    return _module(engine).target(layout)


def unsupported(engine: str, layout: CacheLayout) -> str | None:
    """Why the engine has no configuration like ``layout`` (``None``: it has)."""
    return _module(engine).unsupported(layout)
