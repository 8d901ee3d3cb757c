"""The executable specification of vLLM v1's KV-cache block manager.

Read in this order:

1. :mod:`kvspec.hashing` -- how a block's content is named;
2. :mod:`kvspec.spec.pool` -- the block pool: state, operations, order;
3. :mod:`kvspec.spec.rules` -- the rules every pool must keep, as predicates;
4. :mod:`kvspec.spec.interface` -- what a pool must offer to be checked.
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
