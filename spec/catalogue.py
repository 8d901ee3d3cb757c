"""The rule catalogue: the rules of kvspec, by name, in prose.

This is the normative list.  Each name appears in the predicates that state
the rule (:mod:`kvspec.spec.rules` over a pool, :mod:`kvspec.spec.request_rules`
over requests), in every refusal kvspec's own code raises for it
(:class:`kvspec.errors.RuleError`), in every violation a conformance run
reports, and in every conformance vector's list of the rules it exercises.
``spec/README.md`` walks through them chapter by chapter.
"""

from __future__ import annotations

RULES: dict[str, str] = {
    "ref-conservation": (
        "Every non-null block's reference count equals the number of (request, group) slots that hold it; "
        "it is never negative."
    ),
    "free-queue-consistency": (
        "A block is in the free queue exactly when its reference count is 0 and it is not the null block, at "
        "most once; the free count equals the queue's length."
    ),
    "null-exclusion": (
        "The null block (id 0) is never handed out, never queued, never hashed or cached, never evicted; its "
        "reference count is not maintained."
    ),
    "no-aliasing": (
        "A physical block sits in at most one (request, group) slot, unless it is shared through a taken "
        "cache hit of identical content; the common prefix reported for cascade attention is one every request "
        "holding a table shares."
    ),
    "hash-map-consistency": (
        "The hash table and each block's keys agree; a block carries at most one key of its own, and partial "
        "entries (prefixes ending inside it) only beside one; a block taken from the free queue for reuse "
        "loses every key first; the events, replayed, give the table, and each stored event names its blocks' "
        "parent, tokens, adapter and extra keys as the request that filled them."
    ),
    "content-soundness": (
        "A block holds what its key names -- the tokens of the whole prefix and the extra keys (LoRA, "
        "multimodal inputs, cache salt, prompt embeddings) -- and every token a request counts as computed "
        "holds its own KV (or, for a state-space group, the state after it, read only once the step that "
        "writes it is over); a block is released only once "
        "no future query reads it, and no later than the first allocation after which none does.  The "
        "blocks the worker zeroes before a step are exactly those taken fresh since the last step, and what a "
        "KV connector saves of a finished request is the blocks of the tokens it computed."
    ),
    "tenant-isolation": (
        "Requests with different cache salts or LoRA adapters never share a block."
    ),
    "no-eviction-in-use": (
        "Allocation never evicts a block that is held, nor a hit of the same allocation not yet taken: every "
        "group's hits are taken before any group allocates."
    ),
    "hit-soundness": (
        "A hit is no longer than what every group can serve, a multiple of the scheduler block size, never "
        "the whole request (at most num_tokens - 1), and each group's hit blocks cover exactly the hit; the "
        "EAGLE drop is applied once."
    ),
    "hit-optimality": (
        "The hit is the longest aligned length that every group can serve."
    ),
    "allocation-accounting": (
        "The blocks an allocation pulls from the pool are the number it estimated, and every token it may "
        "write (computed, new and lookahead) has a slot in every attention group; a refused or impossible "
        "operation changes nothing (an allocation may first release the request's out-of-window blocks); the "
        "usage reported is the share of usable blocks not free, the prefix-cache stats count the lookups made, "
        "and a metrics collector hears of every block taken, hit, evicted and reset."
    ),
    "free-order": (
        "Freed blocks return tail first within each group; blocks without a key are reused before cached "
        "ones, and cached ones least recently used first."
    ),
    "reset": (
        "Resetting the prefix cache succeeds only when no block but the null block is in use, and then "
        "leaves no key anywhere."
    ),
    "block-size-coherence": (
        "A group of block size B names its blocks with hashes of hash_block_size H, B a multiple of H, and "
        "converts between tokens and blocks with its own B."
    ),
}
"""Every rule's name and statement, in the order the chapters introduce them."""

LEVELS: dict[str, frozenset[str]] = {
    "L1": frozenset({"hit-optimality", "free-order"}),
    "L2": frozenset({"free-order"}),
    "L3": frozenset(),
}
"""The conformance levels, by the rules each does *not* ask for.  L1
(safety): every rule but the two policy rules; any engine should pass.  L2:
L1 and optimal hits.  L3 (equivalence): every rule, and every observation --
block ids, free order, hit lengths, events -- equal to the spec's; for
drop-in replacements of vLLM's classes."""

TIER_RULES: dict[str, str] = {
    "tier-content-soundness": (
        "A lookup answers HIT only for a key whose store completed successfully and was not evicted since, "
        "HIT_PENDING only while its store is in flight: a failed or pending store is never served; the tier holds "
        "each such key in the block its store wrote, one key a block, and a load reads that block."
    ),
    "tier-ref-conservation": (
        "A tier block's reference count equals the number of loads in flight on it; a block whose store is in "
        "flight is marked not ready."
    ),
    "tier-eviction": (
        "A tier block is evictable exactly when its store completed and its reference count is 0; a store "
        "evicts only evictable blocks not among the keys it was asked to store, no more than it lacks free "
        "blocks for, and gives up (changing nothing) only when too few are evictable."
    ),
    "tier-events": (
        "The stored and removed events describe the tier exactly, in order: one stored event per completed "
        "store naming the keys it made readable, one removed event per eviction naming the keys evicted."
    ),
    "tier-policy": (
        "The keys a store evicts are the ones the tier's policy picks: least recently used first (LRU), or "
        "ARC's choice between its recent and frequent lists (T1's oldest while T1 is at least its target, else "
        "T2's, else T1's)."
    ),
}
"""The rules of an offloading tier (chapter 11, :mod:`kvspec.spec.tiers`):
they judge a different object -- an ``OffloadingManager``, not a block
pool -- so they are kept apart from :data:`RULES` and its vectors."""

TIER_LEVELS: dict[str, frozenset[str]] = {
    "L1": frozenset({"tier-policy"}),
    "L2": frozenset(),
    "L3": frozenset(),
}
"""The rules each level does not ask for at offload scope: L1 every rule
but the policy; L2 the policy too (against the spec model's evictions); L3
every observation -- answers, block ids, the policy's order, events --
equal to the spec model's."""
