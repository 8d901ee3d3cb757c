"""vLLM 0.34.0: what its block manager changed from 0.33.0 (chapter 9 of spec/README.md).

Its deltas (:data:`DELTAS`, in chapter 9's order), each with its prose
(``change``), the rules whose reading changes, its status and where it shows.
The switches that follow a modelled delta read ``Release.has(key)`` where
the rule is.
"""

from __future__ import annotations

from kvspec.spec.releases.base import OUTSIDE, Delta

RELEASE = "0.34.0"
PREVIOUS = "0.33.0"

DELTAS: tuple[Delta, ...] = (
    Delta(
        RELEASE, "prefix-cache-hit-limit",
        "A request carries a prefix-cache hit limit (prefix_cache_hit_limit) in place of skip_reading_prefix_cache: "
        "0 reads no cache (the old skip), a request asking for prompt logprobs reads only up to its first scored "
        "position (those positions' logits must be computed), None is unbounded; every lookup's hit is at most "
        "the least of num_tokens - 1, that limit and the caller's bound.  The interface's requests carry only the "
        "skip; the drop-in reads vLLM's request's limit.",
        status=OUTSIDE),
    Delta(
        RELEASE, "common-prefix-blocks-removed",
        "KVCacheManager.get_num_common_prefix_blocks, cascade attention's question, is gone; the machines no "
        "longer ask it.",
        status=OUTSIDE),
)
"""What 0.34.0 changed, in the order chapter 9 lists it."""
