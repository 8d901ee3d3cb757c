"""vLLM 0.33.0: what its block manager changed from 0.32.0 (chapter 9 of spec/README.md).

Its deltas (:data:`DELTAS`, in chapter 9's order), each with its prose
(``change``), the rules whose reading changes, its status and where it shows.
The switches that follow a modelled delta read ``Release.has(key)`` where
the rule is.
"""

from __future__ import annotations

from kvspec.spec.releases.base import OUTSIDE, Delta

RELEASE = "0.33.0"
PREVIOUS = "0.32.0"

DELTAS: tuple[Delta, ...] = (
    Delta(
        RELEASE, "mamba-all-removed",
        "Mamba's `all` cache mode is gone: a Mamba group with prefix caching must use `align`, and a model "
        "configured with `all` is refused.  Layouts with an `all` Mamba group do not exist in this release.",
        status=OUTSIDE),
    Delta(
        RELEASE, "lookahead-block-hashes",
        "With an EAGLE-style drafter, prefix caching on and no KV connector, vLLM hashes each block together "
        "with the L tokens after it (L = num_hash_lookahead_tokens: the drafter's KV at a block's last position "
        "read them).  The request block hasher emits a block's hash only once those tokens exist, and hashes "
        "(parent, block tokens, (E, *lookahead tokens)), E the extra keys of the block and its lookahead window "
        "(a multimodal input reaching past the block is keyed again by the next).  The manager takes L "
        "(num_hash_lookahead_tokens; the base has no such argument) and, whatever L, caches only the blocks the "
        "request has hashes for; a Stored event carries each block's lookahead tokens.  Because a hash proves "
        "the token past its block, the scheduler then turns the EAGLE block drop off (use_eagle False).",
        rules=("content-soundness", "hash-map-consistency")),
    Delta(
        RELEASE, "eagle-drop-needs-use-eagle",
        "Groups marked as the drafter's (is_eagle_group) drop the last block of a hit only when the manager is "
        "built with use_eagle; the base drops it for marked groups whatever use_eagle says (and for every group "
        "when use_eagle is set and none is marked, as before).",
        rules=("hit-optimality",)),
    Delta(
        RELEASE, "eagle-junction-peek",
        "Under a retention interval, an EAGLE group also keeps the tail before the block below a shared-prefix "
        "junction (the boundary of delta shared-prefix-boundary, less the group's block size): a sibling "
        "diverging right after the junction cannot peek at the block past it, so its hit ends a block lower.  "
        "The machines' requests carry no junction (delta shared-prefix-boundary); impl follows it for the "
        "drop-in.",
        status=OUTSIDE),
    Delta(
        RELEASE, "mamba-boundary-remark-fixed",
        "Delta mamba-boundary-remarked is undone: the boundary's block is keyed and counted cached this step "
        "only where its own key does not name that boundary yet -- never while the key it was given stays, so "
        "a running request's state no longer stalls a sibling's hit; but again where evict_blocks took the key "
        "from a block the request still holds (vLLM's scheduler evicts the blocks a KV connector failed to "
        "load), and a sibling's hit on it then waits that step.",
        rules=("hit-optimality",)),
)
"""What 0.33.0 changed, in the order chapter 9 lists it."""
