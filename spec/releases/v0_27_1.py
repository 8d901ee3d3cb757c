"""vLLM 0.27.1: read for deltas against 0.27.0; its block manager changed
nothing the spec judges.  A release the spec knows, so that a target on it is
judged by its own name (chapter 9 of spec/README.md).
"""

from __future__ import annotations

from kvspec.spec.releases.base import Delta

RELEASE = "0.27.1"
PREVIOUS = "0.27.0"

DELTAS: tuple[Delta, ...] = ()
"""What 0.27.1 changed, in the order chapter 9 lists it."""
