"""Planted bugs: proof that the obligations in :mod:`~kvspec.proofs.pool_model` have teeth.

A proof that passes tells you little until you have seen it fail.  Each
function here is one transition of the pool model with **one deliberate,
plausible mistake**, under *exactly the same contract* as the correct
transition (``tests/test_proofs.py`` checks that the ``pre:``/``post:`` lines
are identical).  CrossHair must produce a counterexample for each, on an
obligation tagged with the rule the mistake breaks -- :data:`PLANTED_BUGS`
names it.  ``python -m kvspec.proofs.run --planted`` checks that it does.

=====================================  =======================  ===============================
planted bug                            rule that must catch it  the mistake
=====================================  =======================  ===============================
``free_block_decrements_twice``        ref-conservation         a held block loses two refs
``allocate_block_keeps_stale_hash``    hash-map-consistency     a reused cached block keeps its key
``allocate_block_lowest_free_id``      null-exclusion           "first block with ref 0" is block 0
``free_block_cached_to_head``          free-order               every freed block goes to the head
``touch_block_leaves_block_queued``    free-queue-consistency   a hit stays in the free queue
``free_pair_one_at_a_time``            free-order               a batch freed as single frees
=====================================  =======================  ===============================
"""

from __future__ import annotations

from kvspec.proofs.pool_model import (  # noqa: F401 (the contracts use these names)
    NULL,
    NUM_BLOCKS,
    REAL_BLOCKS,
    Allocation,
    Block,
    Pool,
    _release,
    _with_block,
    free_queue_consistency,
    freed,
    hashed,
    null_exclusion,
    others_unchanged,
    queue,
    queued,
    ref,
    ref_conservation,
    releases,
    stamps_ordered,
    wf,
)

PLANTED_BUGS: dict[str, tuple[str, str]] = {
    # planted bug: (the correct transition it imitates, the rule that must catch it)
    "free_block_decrements_twice": ("free_block", "ref-conservation"),
    "allocate_block_keeps_stale_hash": ("allocate_block", "hash-map-consistency"),
    "allocate_block_lowest_free_id": ("allocate_block", "null-exclusion"),
    "free_block_cached_to_head": ("free_block", "free-order"),
    "touch_block_leaves_block_queued": ("touch_block", "free-queue-consistency"),
    "free_pair_one_at_a_time": ("free_pair", "free-order"),
}


def free_block_decrements_twice(pool: Pool, b: int) -> Pool:
    """Bug: a block held more than once loses two references per free.

    pre: wf(pool)
    pre: 0 <= b < NUM_BLOCKS
    pre: b == NULL or ref(pool, b) >= 1
    post: ref_conservation(__return__)  # ref-conservation
    post: free_queue_consistency(__return__)  # free-queue-consistency
    post: null_exclusion(__return__)  # null-exclusion
    post: stamps_ordered(__return__)  # queue-representation
    post: b == NULL or ref(__return__, b) == ref(pool, b) - 1  # ref-conservation
    post: b != NULL or __return__ == pool  # null-exclusion
    post: not releases(pool, b) or hashed(pool, b) or queue(__return__) == (b,) + queue(pool)  # free-order
    post: not releases(pool, b) or not hashed(pool, b) or queue(__return__) == queue(pool) + (b,)  # free-order
    post: releases(pool, b) or queue(__return__) == queue(pool)  # free-order
    post: hashed(__return__, b) == hashed(pool, b)  # hash-map-consistency
    post: others_unchanged(pool, __return__, b)  # frame
    """
    if b == NULL:
        return pool
    block = pool.blocks[b]
    if block.ref > 1:
        return _with_block(pool, b, block._replace(ref=block.ref - 2), pool.clock)  # BUG: - 2
    stamp = pool.clock if block.hashed else -pool.clock
    return _with_block(pool, b, Block(0, block.hashed, stamp), pool.clock + 1)


def allocate_block_keeps_stale_hash(pool: Pool) -> Allocation:
    """Bug: a cached block taken for reuse keeps its old hash key, so a
    later request could "hit" content that is about to be overwritten.

    pre: wf(pool)
    pre: queue(pool) != ()
    post: ref_conservation(__return__.pool)  # ref-conservation
    post: free_queue_consistency(__return__.pool)  # free-queue-consistency
    post: null_exclusion(__return__.pool)  # null-exclusion
    post: stamps_ordered(__return__.pool)  # queue-representation
    post: __return__.block != NULL  # null-exclusion
    post: __return__.block == queue(pool)[0]  # free-order
    post: queue(__return__.pool) == queue(pool)[1:]  # free-order
    post: ref(__return__.pool, __return__.block) == 1  # ref-conservation
    post: not hashed(__return__.pool, __return__.block)  # hash-map-consistency
    post: others_unchanged(pool, __return__.pool, __return__.block)  # frame
    """
    head = NULL
    for b in REAL_BLOCKS:
        if queued(pool, b) and (head == NULL or pool.blocks[b].at < pool.blocks[head].at):
            head = b
    stale = hashed(pool, head)  # BUG: should be False (evict before reuse)
    return Allocation(head, _with_block(pool, head, Block(1, stale, 0), pool.clock))


def allocate_block_lowest_free_id(pool: Pool) -> Allocation:
    """Bug: "take the first block nobody holds" -- ignoring the queue order
    and forgetting that the null block's count is 0 too.

    pre: wf(pool)
    pre: queue(pool) != ()
    post: ref_conservation(__return__.pool)  # ref-conservation
    post: free_queue_consistency(__return__.pool)  # free-queue-consistency
    post: null_exclusion(__return__.pool)  # null-exclusion
    post: stamps_ordered(__return__.pool)  # queue-representation
    post: __return__.block != NULL  # null-exclusion
    post: __return__.block == queue(pool)[0]  # free-order
    post: queue(__return__.pool) == queue(pool)[1:]  # free-order
    post: ref(__return__.pool, __return__.block) == 1  # ref-conservation
    post: not hashed(__return__.pool, __return__.block)  # hash-map-consistency
    post: others_unchanged(pool, __return__.pool, __return__.block)  # frame
    """
    head = next(b for b in range(NUM_BLOCKS) if ref(pool, b) == 0)  # BUG: block 0 qualifies
    return Allocation(head, _with_block(pool, head, Block(1, False, 0), pool.clock))


def free_block_cached_to_head(pool: Pool, b: int) -> Pool:
    """Bug: every freed block goes to the head, so the cache is evicted
    most recently used first.

    pre: wf(pool)
    pre: 0 <= b < NUM_BLOCKS
    pre: b == NULL or ref(pool, b) >= 1
    post: ref_conservation(__return__)  # ref-conservation
    post: free_queue_consistency(__return__)  # free-queue-consistency
    post: null_exclusion(__return__)  # null-exclusion
    post: stamps_ordered(__return__)  # queue-representation
    post: b == NULL or ref(__return__, b) == ref(pool, b) - 1  # ref-conservation
    post: b != NULL or __return__ == pool  # null-exclusion
    post: not releases(pool, b) or hashed(pool, b) or queue(__return__) == (b,) + queue(pool)  # free-order
    post: not releases(pool, b) or not hashed(pool, b) or queue(__return__) == queue(pool) + (b,)  # free-order
    post: releases(pool, b) or queue(__return__) == queue(pool)  # free-order
    post: hashed(__return__, b) == hashed(pool, b)  # hash-map-consistency
    post: others_unchanged(pool, __return__, b)  # frame
    """
    if b == NULL:
        return pool
    block = pool.blocks[b]
    if block.ref > 1:
        return _with_block(pool, b, block._replace(ref=block.ref - 1), pool.clock)
    stamp = -pool.clock  # BUG: a cached block belongs at the tail
    return _with_block(pool, b, Block(0, block.hashed, stamp), pool.clock + 1)


def touch_block_leaves_block_queued(pool: Pool, b: int) -> Pool:
    """Bug: a cache hit on a free block adds the reference but leaves the
    block in the free queue, where the next allocation can take it.

    pre: wf(pool)
    pre: 0 <= b < NUM_BLOCKS
    post: ref_conservation(__return__)  # ref-conservation
    post: free_queue_consistency(__return__)  # free-queue-consistency
    post: null_exclusion(__return__)  # null-exclusion
    post: stamps_ordered(__return__)  # queue-representation
    post: b == NULL or ref(__return__, b) == ref(pool, b) + 1  # ref-conservation
    post: b != NULL or __return__ == pool  # null-exclusion
    post: queue(__return__) == tuple(x for x in queue(pool) if x != b)  # free-order
    post: hashed(__return__, b) == hashed(pool, b)  # hash-map-consistency
    post: others_unchanged(pool, __return__, b)  # frame
    """
    if b == NULL:
        return pool
    block = pool.blocks[b]
    return _with_block(pool, b, block._replace(ref=block.ref + 1), pool.clock)  # BUG: keeps its stamp


def free_pair_one_at_a_time(pool: Pool, a: int, b: int) -> Pool:
    """Bug: a batch freed as two single frees -- two plain blocks end up at
    the head in reverse order.

    pre: wf(pool)
    pre: 0 <= a < NUM_BLOCKS and 0 <= b < NUM_BLOCKS and a != b
    pre: a == NULL or ref(pool, a) >= 1
    pre: b == NULL or ref(pool, b) >= 1
    post: ref_conservation(__return__)  # ref-conservation
    post: free_queue_consistency(__return__)  # free-queue-consistency
    post: null_exclusion(__return__)  # null-exclusion
    post: stamps_ordered(__return__)  # queue-representation
    post: queue(__return__) == freed(pool, (a, b), False) + queue(pool) + freed(pool, (a, b), True)  # free-order
    post: all(x == NULL or ref(__return__, x) == ref(pool, x) - 1 for x in (a, b))  # ref-conservation
    post: all(hashed(__return__, x) == hashed(pool, x) for x in (a, b))  # hash-map-consistency
    post: others_unchanged(pool, __return__, a, b)  # frame
    """
    return _release(_release(pool, a), b)  # BUG: plain blocks must keep the given order
