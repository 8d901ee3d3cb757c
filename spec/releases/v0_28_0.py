"""vLLM 0.28.0: what its block manager changed from 0.27.1 (chapter 9 of spec/README.md).

Its deltas (:data:`DELTAS`, in chapter 9's order), each with its prose
(``change``), the rules whose reading changes, its status and where it shows.
The switches that follow a modelled delta read ``Release.has(key)`` where
the rule is.
"""

from __future__ import annotations

from kvspec.spec.releases.base import Delta

RELEASE = "0.28.0"
PREVIOUS = "0.27.1"

DELTAS: tuple[Delta, ...] = (
    Delta(
        RELEASE, "free-order-restored",
        "Delta free-order-without-caching is undone: a pool with caching off again puts freed blocks at the "
        "head of the free queue, in the order freed, as the base does (no block has a hash there, so every one "
        "is reused before the blocks already free).",
        rules=("free-order",)),
    Delta(
        RELEASE, "zeroing-every-attention-group",
        "Where the worker zeroes new blocks (a model with Mamba layers), it zeroes those of every attention "
        "group -- sliding-window and chunked-local ones too -- not only full attention's.",
        rules=("content-soundness",)),
)
"""What 0.28.0 changed, in the order chapter 9 lists it."""
