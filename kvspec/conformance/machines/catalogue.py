"""Every layout the conformance machines run on, by scope: the one place to
ask which layouts there are and how many (``tests/test_layers.py`` holds
every layout table of ``machines/`` to be in it).

The tables themselves stay beside what reads them -- the pool machine's
in :mod:`~kvspec.conformance.machines.pool`, the manager's in
:mod:`~kvspec.conformance.machines.layouts`, the scheduler's and the cache
scope's and the offload scope's in their machines' modules -- and the kernel stage runs real
architectures (:data:`kvspec.models.architectures.ARCHITECTURES`) and the
manager layouts.  Counts stated in the documentation are read from
:func:`counts`.
"""

from __future__ import annotations

from typing import Any

from kvspec.conformance.machines.cache import CACHE_LAYOUTS
from kvspec.conformance.machines.layouts import LATER_LAYOUTS, MANAGER_LAYOUTS
from kvspec.conformance.machines.offload import OFFLOAD_LAYOUTS
from kvspec.conformance.machines.pool import LAYOUTS
from kvspec.conformance.machines.scheduler import ENGINES, SCHEDULER_LAYOUTS
from kvspec.models.architectures import ARCHITECTURES

CATALOGUE: dict[str, dict[str, Any]] = {
    "pool": LAYOUTS,
    "manager": MANAGER_LAYOUTS,
    "scheduler": SCHEDULER_LAYOUTS,
    "cache": CACHE_LAYOUTS,
    "offload": OFFLOAD_LAYOUTS,
}
"""Each scope's built-in layouts, by name (the layouts a scope runs by default, but for :data:`LATER`)."""

LATER: dict[str, dict[str, Any]] = {"manager": LATER_LAYOUTS}
"""A scope's layouts of later releases: run where the release judged has them."""

MODELS: dict[str, Any] = ARCHITECTURES
"""The real architectures: manager layouts by ``model:<name>``, and the kernel stage's models."""


def counts() -> dict[str, int]:
    """How many layouts each scope has: its own, its later releases' and, at
    manager and kernel scope, the real architectures'; the scheduler's
    engine variants (the same groups under another engine) counted apart."""
    return {
        "pool": len(LAYOUTS),
        "manager": len(MANAGER_LAYOUTS),
        "manager (later releases)": len(LATER_LAYOUTS),
        "scheduler": len(SCHEDULER_LAYOUTS) - len(ENGINES),
        "scheduler (engine variants)": len(ENGINES),
        "cache": len(CACHE_LAYOUTS),
        "offload": len(OFFLOAD_LAYOUTS),
        "models": len(MODELS),
    }
