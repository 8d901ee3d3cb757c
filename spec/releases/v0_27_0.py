"""vLLM 0.27.0: what its block manager changed from 0.26.0 (chapter 9 of spec/README.md).

Its deltas (:data:`DELTAS`, in chapter 9's order), each with its prose
(``change``), the rules whose reading changes, its status and where it shows.
The switches that follow a modelled delta read ``Release.has(key)`` where
the rule is.
"""

from __future__ import annotations

from kvspec.spec.releases.base import Delta

RELEASE = "0.27.0"
PREVIOUS = "0.26.0"

DELTAS: tuple[Delta, ...] = (
    Delta(
        RELEASE, "free-order-without-caching",
        "A pool with prefix caching off returns every freed block to the tail of the free queue, in the order "
        "freed, instead of putting blocks without a hash at the head: the block freed longest ago is reused "
        "first.  With caching on nothing changes.",
        rules=("free-order",)),
    Delta(
        RELEASE, "stats-at-admission",
        "The prefix-cache stats stop counting lookups: get_computed_blocks records nothing, and the scheduler "
        "records a request once it is admitted, with record_prefix_cache_stats(request, num_hits) -- one "
        "request, its num_tokens as queries, num_hits as hits (nothing with caching off or for a request that "
        "skips reading the cache).  A lookup whose request is not admitted is not counted.",
        rules=("allocation-accounting",)),
)
"""What 0.27.0 changed, in the order chapter 9 lists it."""
