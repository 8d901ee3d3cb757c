"""The block pool as a fixed-size model, with proof obligations for CrossHair.

:mod:`kvspec.spec.pool` states the pool's rules over lists and dicts of any
size.  CrossHair can *prove* a contract -- report "Confirmed over all paths"
-- only when every input has a fixed shape, so this module restates the same
rules over a pool of exactly four blocks held in immutable tuples, and gives
every operation a PEP 316 contract (``pre:`` / ``post:`` lines in its
docstring) that ``crosshair check --analysis_kind=PEP316`` verifies for
*every* well-formed state, not just the ones a test happens to reach.

State
-----
A :class:`Pool` is four :class:`Block` records and a ``clock``.  Block 0 is
the null block; blocks 1, 2 and 3 are real.  Each block has

- ``ref`` -- its reference count (how many slots hold it);
- ``hashed`` -- whether it carries a hash key, i.e. is *cached*.  The model
  tracks only whether a key is present, not which one: the hash table and
  cache hits are the subject of later obligations;
- ``at`` -- its **freed-at stamp**: 0 while the block is out of the free
  queue, otherwise a non-zero signed integer that fixes its place in it.

The free queue is not stored as a list.  It is *derived*: the free queue is
the blocks with a non-zero stamp, in increasing order of stamp
(:func:`queue`).  The ``clock`` is larger than the magnitude of every stamp
in use, so

- putting a block at the **head** gives it the stamp ``-clock`` (smaller than
  every stamp in the queue), and
- putting a block at the **tail** gives it the stamp ``+clock`` (larger than
  every stamp in the queue),

and the clock then moves on.  Head insertions therefore get ever more
negative stamps and tail insertions ever more positive ones.  Taking a block
out of the queue (allocation, a touch) resets its stamp to 0 and leaves every
other stamp -- and so the order of the rest of the queue -- alone.  A fresh
pool stamps blocks 1, 2, 3 with 1, 2, 3: the queue in id order, as
``SpecBlockPool.__init__`` builds it.

Rules
-----
:func:`wf` (well-formed) is the conjunction of four predicates, each the
fixed-size form of a rule from the catalogue in ``docs/rules.md``:

- :func:`ref_conservation` -- no reference count is negative;
- :func:`free_queue_consistency` -- a block is in the free queue exactly when
  its reference count is 0 and it is not the null block;
- :func:`null_exclusion` -- the null block is never queued, never hashed, and
  its count stays at rest (the spec never maintains it; vLLM lets it drift,
  which the conformance rules tolerate separately);
- :func:`stamps_ordered` -- the representation invariant that makes the
  derived queue a queue: stamps in use are distinct and smaller in magnitude
  than the clock.

Every transition requires ``wf`` and its postconditions state each of the
four again for the result, plus the rules particular to that operation:
*free-order* (allocation takes the head; a freed block without a hash goes to
the head, one with a hash to the tail), *hash-map-consistency* (an allocated
block carries no hash; eviction drops it; freeing and touching keep it), the
per-operation half of *ref-conservation* (allocation sets the count to 1, a
free drops it by one, a touch adds one), and a *frame* condition (no other
block's count or hash changes).

Each ``post:`` line ends with ``# rule-name``; :mod:`kvspec.proofs.run`
reports one verdict per line under that name.

Correspondence with the spec
----------------------------
=====================================  ======================================
this model                             :class:`kvspec.spec.pool.SpecBlockPool`
=====================================  ======================================
:func:`initial_pool`                   ``SpecBlockPool(4)``
:func:`allocate_block`                 ``get_new_blocks(1)``
:func:`free_block`                     ``free_blocks([b])``
:func:`free_pair`                      ``free_blocks([a, b])``, ``a != b``
:func:`touch_block`                    ``touch([b])``
:func:`evict_block`                    ``evict_blocks([b])``
:func:`cache_block`                    ``cache_full_blocks`` of one held block
=====================================  ======================================

The proofs cover every well-formed state, of any counts and stamps.  That
the model *is* the spec is checked by testing, not proved:
``tests/test_proofs.py`` runs all 304 states reachable with counts up to 2
side by side with the spec, applies every operation to each, and checks that
the two agree on every count, hash flag and the free queue, and that the
model's ``pre:`` lines allow exactly the operations the spec accepts.

Writing for CrossHair
---------------------
Three habits keep every proof here to seconds (measured with CrossHair
0.0.112 on one core):

- **fixed shape** -- tuples of :class:`typing.NamedTuple` records, never a
  list or dict of symbolic length (CrossHair never confirms those);
- **formulas, not branches** -- the rule predicates join clauses with ``&``
  and ``|``: on symbolic booleans ``and`` / ``or`` / ``all()`` fork an
  execution path per clause, while ``&`` hands the solver one formula
  (:func:`free_block`'s eleven obligations: 12 s with ``and``, 5 s with
  ``&``);
- **no contracts below a proof** -- CrossHair also checks the contract of
  every contracted function the code under proof calls, so shared steps
  (:func:`_release`) carry none (:func:`free_pair`: 160 s calling
  :func:`free_block`, 25 s calling :func:`_release`).

What remains is the sorting in :func:`queue`: :func:`free_pair`, two
symbolic block ids with a queue compared before and after, is the slowest
proof (about 30 s for its eight obligations; the others take 0.2-6 s).

Run the proofs with ``python -m kvspec.proofs.run``.
"""

from __future__ import annotations

from typing import NamedTuple

NULL = 0
"""The null block's id."""

NUM_BLOCKS = 4
"""Blocks 0 (null), 1, 2, 3."""

REAL_BLOCKS = (1, 2, 3)
"""The blocks that can be handed out, queued and hashed."""


class Block(NamedTuple):
    """One block: reference count, whether it is cached, freed-at stamp."""

    ref: int
    hashed: bool
    at: int


class Pool(NamedTuple):
    """Four blocks (block 0 is the null block) and the stamp clock."""

    blocks: tuple[Block, Block, Block, Block]
    clock: int


class Allocation(NamedTuple):
    """What :func:`allocate_block` returns: the block taken and the new pool."""

    block: int
    pool: Pool


# --- observations ------------------------------------------------------------


def ref(pool: Pool, b: int) -> int:
    """Block ``b``'s reference count."""
    return pool.blocks[b].ref


def hashed(pool: Pool, b: int) -> bool:
    """Whether block ``b`` carries a hash key."""
    return pool.blocks[b].hashed


def queued(pool: Pool, b: int) -> bool:
    """Whether block ``b`` is in the free queue (has a stamp)."""
    return pool.blocks[b].at != 0


def queue(pool: Pool) -> tuple[int, ...]:
    """The free queue, head first: queued blocks in increasing stamp order."""
    return tuple(sorted((b for b in REAL_BLOCKS if queued(pool, b)), key=lambda b: pool.blocks[b].at))


def releases(pool: Pool, b: int) -> bool:
    """Whether dropping one reference from ``b`` frees it (puts it in the queue)."""
    return b != NULL and ref(pool, b) == 1


def others_unchanged(before: Pool, after: Pool, *changed: int) -> bool:
    """Frame: every block not in ``changed`` keeps its count and hash flag.
    (A formula, not ``all(... if x not in changed)``: see "Writing for
    CrossHair" above.)"""
    same = True
    for x in range(NUM_BLOCKS):
        exempt = False
        for c in changed:
            exempt = exempt | (x == c)
        keeps = (ref(after, x) == ref(before, x)) & (hashed(after, x) == hashed(before, x))
        same = same & (exempt | keeps)
    return same


# --- the rules (wf is their conjunction; each is one formula, not branches) ------


def ref_conservation(pool: Pool) -> bool:
    """ref-conservation, pool-wide half: no reference count is negative.
    (The other half -- each operation moves a count by exactly one, or sets
    it to 1 on allocation -- is stated by each transition.)"""
    b0, b1, b2, b3 = pool.blocks
    return (b0.ref >= 0) & (b1.ref >= 0) & (b2.ref >= 0) & (b3.ref >= 0)


def free_queue_consistency(pool: Pool) -> bool:
    """free-queue-consistency: a block is queued iff its count is 0 and it is
    not the null block.  (At most once, and free count == queue length, hold
    by construction: the queue is derived from one stamp per block.)"""
    b0, b1, b2, b3 = pool.blocks
    return (
        (b0.at == 0)
        & ((b1.at != 0) == (b1.ref == 0))
        & ((b2.at != 0) == (b2.ref == 0))
        & ((b3.at != 0) == (b3.ref == 0))
    )


def null_exclusion(pool: Pool) -> bool:
    """null-exclusion: the null block has no stamp (it is never queued), no
    hash, and a count at rest."""
    b0 = pool.blocks[NULL]
    return (b0.ref == 0) & (b0.hashed == False) & (b0.at == 0)  # noqa: E712 (a formula, not a branch)


def stamps_ordered(pool: Pool) -> bool:
    """The queue representation: the clock is positive, every stamp lies
    strictly between ``-clock`` and ``clock``, and no two queued blocks share
    a stamp (so the queue order is total)."""
    c = pool.clock
    a0, a1, a2, a3 = (block.at for block in pool.blocks)
    return (
        (c >= 1)
        & _within(a0, c)
        & _within(a1, c)
        & _within(a2, c)
        & _within(a3, c)
        & ((a1 == 0) | ((a1 != a2) & (a1 != a3)))
        & ((a2 == 0) | (a2 != a3))
    )


def _within(stamp: int, clock: int) -> bool:
    """``-clock < stamp < clock``, as one formula."""
    return (-clock < stamp) & (stamp < clock)


def wf(pool: Pool) -> bool:
    """Well-formed: all four rules above hold."""
    return ref_conservation(pool) & free_queue_consistency(pool) & null_exclusion(pool) & stamps_ordered(pool)


def _with_block(pool: Pool, b: int, block: Block, clock: int) -> Pool:
    """``pool`` with block ``b`` replaced and the clock set."""
    return Pool(
        tuple(block if x == b else pool.blocks[x] for x in range(NUM_BLOCKS)),  # type: ignore[arg-type]
        clock,
    )


# --- transitions ------------------------------------------------------------------


def initial_pool() -> Pool:
    """A fresh pool: every real block free, in id order, with no hash.

    post: wf(__return__)  # well-formed
    post: queue(__return__) == (1, 2, 3)  # free-order
    post: not any(hashed(__return__, b) for b in REAL_BLOCKS)  # hash-map-consistency
    """
    free = tuple(Block(0, False, b) for b in REAL_BLOCKS)
    return Pool((Block(0, False, 0),) + free, NUM_BLOCKS)  # type: ignore[arg-type]


def allocate_block(pool: Pool) -> Allocation:
    """Take one block from the head of the free queue (``get_new_blocks(1)``).

    Requires a non-empty queue.  The block taken is the head -- the block
    with the smallest stamp -- and it leaves the queue; the rest of the queue
    keeps its order.  The block now has one reference and no hash: a cached
    block being reused is evicted first.  The null block is never taken,
    because it is never queued.

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
    return Allocation(head, _with_block(pool, head, Block(1, False, 0), pool.clock))


def _release(pool: Pool, b: int) -> Pool:
    """Drop one reference from ``b``; at 0, queue it by its hash flag.

    The step :func:`free_block` and :func:`free_pair` share.  It carries no
    contract of its own (see "Writing for CrossHair" above).
    """
    if b == NULL:
        return pool
    block = pool.blocks[b]
    if block.ref > 1:
        return _with_block(pool, b, block._replace(ref=block.ref - 1), pool.clock)
    stamp = pool.clock if block.hashed else -pool.clock  # tail if cached, head if not
    return _with_block(pool, b, Block(0, block.hashed, stamp), pool.clock + 1)


def free_block(pool: Pool, b: int) -> Pool:
    """Drop one reference from block ``b`` (``free_blocks([b])``).

    Requires that ``b`` is held (freeing more often than a block is held
    would make its count negative) unless it is the null block, which is
    skipped.  When the last reference goes, the block joins the free queue:
    at the **head** if it has no hash (it can never be a cache hit, so it is
    the first to reuse), at the **tail** if it has one (cached blocks are
    evicted least recently used first).  It keeps its hash either way.

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
    return _release(pool, b)


def free_pair(pool: Pool, a: int, b: int) -> Pool:
    """Free two different blocks in one call (``free_blocks([a, b])``).

    This is the order rule for a batch.  Of the blocks that reach count 0,
    those without a hash go to the head *in the given order* -- ``a`` ahead
    of ``b`` ahead of the old queue -- and those with a hash go to the tail,
    also in the given order.  (Callers free a request's blocks tail block
    first, so the last block of a prefix, the least likely to be shared, is
    reused first.)  The null block is skipped, and each block keeps its hash.

    Freeing the two one call at a time would put two plain blocks at the
    head in the *reverse* order; so the batch is ``b`` then ``a`` when both
    go to the head, and ``a`` then ``b`` otherwise.  The postcondition
    states the order the spec's way, over lists, and CrossHair proves the
    two agree.  (One block freed twice in one call, ``a == b``, is left out
    to keep this proof fast; :func:`free_block` twice covers its counts.)

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
    both_to_head = releases(pool, a) and releases(pool, b) and not hashed(pool, a) and not hashed(pool, b)
    if both_to_head:
        return _release(_release(pool, b), a)
    return _release(_release(pool, a), b)


def freed(pool: Pool, ids: tuple[int, ...], with_hash: bool) -> tuple[int, ...]:
    """The spec's view of a batch free: the blocks of ``ids``, in the given
    order, that the batch puts in the queue, keeping those whose hash flag is
    ``with_hash``."""
    return tuple(x for x in ids if releases(pool, x) and hashed(pool, x) == with_hash)


def touch_block(pool: Pool, b: int) -> Pool:
    """Take a cache hit on block ``b``: add one reference (``touch([b])``).

    A block that was free leaves the free queue (the rest keeps its order);
    it keeps its hash -- that is the point of a hit.  The null block is
    skipped.

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
    return _with_block(pool, b, Block(block.ref + 1, block.hashed, 0), pool.clock)


def evict_block(pool: Pool, b: int) -> Pool:
    """Forget block ``b``'s cached content (``evict_blocks([b])``).

    The hash goes; the reference count and the block's place in the free
    queue (if it is free) stay.  Evicting a block without a hash, or the
    null block, changes nothing.

    pre: wf(pool)
    pre: 0 <= b < NUM_BLOCKS
    post: ref_conservation(__return__)  # ref-conservation
    post: free_queue_consistency(__return__)  # free-queue-consistency
    post: null_exclusion(__return__)  # null-exclusion
    post: stamps_ordered(__return__)  # queue-representation
    post: not hashed(__return__, b)  # hash-map-consistency
    post: hashed(pool, b) or __return__ == pool  # hash-map-consistency
    post: ref(__return__, b) == ref(pool, b)  # ref-conservation
    post: queue(__return__) == queue(pool)  # free-order
    post: others_unchanged(pool, __return__, b)  # frame
    """
    if not hashed(pool, b):
        return pool
    return _with_block(pool, b, pool.blocks[b]._replace(hashed=False), pool.clock)


def cache_block(pool: Pool, b: int) -> Pool:
    """Make held block ``b`` a cache hit: give it a hash key (one block of
    ``cache_full_blocks``).

    Requires that ``b`` is held and carries no hash yet (a block never has
    two keys).  Nothing else changes: a held block is not in the queue.  The
    null block is skipped.

    pre: wf(pool)
    pre: 0 <= b < NUM_BLOCKS
    pre: b == NULL or (ref(pool, b) >= 1 and not hashed(pool, b))
    post: ref_conservation(__return__)  # ref-conservation
    post: free_queue_consistency(__return__)  # free-queue-consistency
    post: null_exclusion(__return__)  # null-exclusion
    post: stamps_ordered(__return__)  # queue-representation
    post: b == NULL or hashed(__return__, b)  # hash-map-consistency
    post: b != NULL or __return__ == pool  # null-exclusion
    post: ref(__return__, b) == ref(pool, b)  # ref-conservation
    post: queue(__return__) == queue(pool)  # free-order
    post: others_unchanged(pool, __return__, b)  # frame
    """
    if b == NULL:
        return pool
    return _with_block(pool, b, pool.blocks[b]._replace(hashed=True), pool.clock)
