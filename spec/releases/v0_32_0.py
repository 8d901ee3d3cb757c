"""vLLM 0.32.0: what its block manager changed from 0.31.0 (chapter 9 of spec/README.md).

Its deltas (:data:`DELTAS`, in chapter 9's order), each with its prose
(``change``), the rules whose reading changes, its status and where it shows.
The switches that follow a modelled delta read ``Release.has(key)`` where
the rule is.
"""

from __future__ import annotations

from kvspec.spec.releases.base import Delta

RELEASE = "0.32.0"
PREVIOUS = "0.31.0"

DELTAS: tuple[Delta, ...] = (
    Delta(
        RELEASE, "eagle-lookahead-hashes",
        "In a hybrid model, an EAGLE group's search past the candidate hit may reach the end of the request's "
        "last full hash block, not only num_tokens - 1: on a block-aligned prompt the last block, whose hash "
        "the request has, proves the block before it, so the hit keeps one block more than the base's.",
        rules=("hit-soundness", "hit-optimality")),
    Delta(
        RELEASE, "partial-tail-resend-boundary",
        "The partial tail entry's boundary is the last hash boundary within the prompt less its last token -- "
        "the longest hit a resend of the prompt can use -- except in an EAGLE group, whose search reads the "
        "whole prompt; a block-aligned prompt's tail may thus be registered one hash block earlier.",
        rules=("hash-map-consistency",)),
    Delta(
        RELEASE, "partial-entries-at-boundaries",
        "BlockPool.cache_partial_block accepts any positive multiple of the hash block size, in a block whose "
        "size is a multiple of it: an entry at a block boundary, or in a block of one hash block, is keyed by the "
        "request's hash there as any entry is (nothing changes when the block already holds that key, as its own "
        "key or a further one).  The base refuses everything but a boundary strictly inside a block larger than "
        "the hash block.",
        rules=("hash-map-consistency",)),
    Delta(
        RELEASE, "mamba-boundary-remarked",
        "A Mamba group in align mode, asked to cache a request's first n tokens where n is the prompt's last "
        "reusable state boundary -- (P - 1) // H * H, or with use_eagle P // H * H - H (at least 0), for a "
        "prompt of P tokens and hash blocks of H -- keys the block holding that state at n (a partial entry, "
        "delta partial-entries-at-boundaries; the key it already holds, in the layouts served) and counts it "
        "cached this step, whether or not it was cached before.  So while the request computes the tokens past "
        "that boundary, every step marks the state again, and a sibling whose hit ends on it is refused a slot "
        "in that step (chapter 5: a hit on a state cached this step waits).  vLLM's scheduler reaches it: with "
        "requests behind a shared prompt it admits the first and stops at the second.",
        rules=("hit-optimality",)),
)
"""What 0.32.0 changed, in the order chapter 9 lists it."""
