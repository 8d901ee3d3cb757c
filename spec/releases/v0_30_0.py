"""vLLM 0.30.0: what its block manager changed from 0.29.0 (chapter 9 of spec/README.md).

Its deltas (:data:`DELTAS`, in chapter 9's order), each with its prose
(``change``), the rules whose reading changes, its status and where it shows.
The switches that follow a modelled delta read ``Release.has(key)`` where
the rule is.
"""

from __future__ import annotations

from kvspec.spec.releases.base import OUTSIDE, Delta

RELEASE = "0.30.0"
PREVIOUS = "0.29.0"

DELTAS: tuple[Delta, ...] = (
    Delta(
        RELEASE, "eagle-replay-boundaries",
        "In a model a drafter reads (use_eagle, or a group marked as the drafter's), the positions where a "
        "replay of a prompt of P tokens resumes -- which sparse retention keeps in every sliding-window and "
        "Mamba group -- are each one scheduler block A lower: max(R - A, 0) for a resend of the prompt "
        "(R = (P - 1) // A * A) and max(E - A, 0) for a longer sibling (E = P // A * A); the two differ on a "
        "block-aligned prompt.  The base keeps P - 1 alone.  Without a drafter, or without a retention "
        "interval, nothing changes.",
        rules=("hit-optimality",)),
    Delta(
        RELEASE, "mamba-retire-across-gaps",
        "A Mamba group in align mode frees every state block before the window, tail first in one free call, "
        "past the null entries prefill leaves between states; the base stops at the first null entry, so a "
        "state below a gap stayed held until the request ended (or until the previous-state release reached "
        "it).",
        rules=("ref-conservation", "free-order")),
    Delta(
        RELEASE, "session-id",
        "Requests carry a session_id, which the pool reads into the BlockStored events it emits.  The "
        "interface's requests have no session; a target on this release is driven with session_id unset "
        "and events are compared without it.",
        status=OUTSIDE),
)
"""What 0.30.0 changed, in the order chapter 9 lists it."""
