"""The executable specification of vLLM v1's KV-cache block manager.

Start at ``spec/README.md``: the normative document, chapter by chapter --
notation (:mod:`~kvspec.spec.interface`, :mod:`~kvspec.spec.layout`), the
pool (:mod:`~kvspec.spec.pool`, :mod:`~kvspec.spec.rules`), one
full-attention group (:mod:`~kvspec.spec.core`,
:mod:`~kvspec.spec.request_rules`, :mod:`~kvspec.spec.content`,
:mod:`~kvspec.spec.oracle`), then windows, several groups, Mamba, EAGLE and
external tokens as deltas (:mod:`~kvspec.spec.kinds`,
:mod:`~kvspec.spec.coordinator`, :mod:`~kvspec.spec.manager`).  An offloading tier below the pool is chapter 11
(:mod:`~kvspec.spec.tiers`).  The rule catalogue is
:mod:`~kvspec.spec.catalogue`.
"""

from kvspec.spec.interface import NULL_BLOCK_ID, Cleared, PoolSnapshot, PoolTarget, Removed, Stored
from kvspec.spec.pool import SpecBlockPool
from kvspec.spec.rules import Step, Violation, check_state, check_step

__all__ = [
    "NULL_BLOCK_ID",
    "Cleared",
    "PoolSnapshot",
    "PoolTarget",
    "Removed",
    "SpecBlockPool",
    "Step",
    "Stored",
    "Violation",
    "check_state",
    "check_step",
]
