"""CrossHair obligations over impl's ``BlockPool``: every bounded operation
sequence keeps every pool rule and matches the spec pool step for step.

The bench (:class:`Bench`) is a real :class:`kvspec.impl.BlockPool` of five
blocks (the null block and four others) and the spec's
:class:`~kvspec.spec.pool.SpecBlockPool` of the same size, driven together
by two requests, A and B, whose first two blocks hold the same tokens (so
one can hit the other's blocks).  Every pool call is checked the way the
conformance machine checks it (:mod:`kvspec.conformance.machines.pool`): the
step rules and the state rules of :mod:`kvspec.spec.rules` against impl's
snapshots, the KV events against the hash table, and impl's result, refusal,
state and events against the spec's (:func:`divergence`).  Each
obligation returns the names of the rules that broke -- ``spec-equivalence``
for a divergence -- and its one ``post:`` line says there are none.

Each obligation function is a *prefix* of two moves, each one of the eight
fixed :data:`MOVES` (admissions, finishes, a window release, an eviction, a
reset), followed by the operation under test with symbolic arguments:
CrossHair explores every move pair and every argument in the ``pre:``
bounds, so "confirmed over all paths" means *every* sequence of that shape
keeps every rule.  Four blocks are enough for each kind of state a rule
distinguishes: free without a hash, free with one (evictable), held once,
held twice (a hit), a hash carried by two blocks, the pool exhausted.

``tests/test_proofs.py`` plants a wrong ``BlockPool`` method for each
obligation (:mod:`kvspec.proofs.impl_faults`) and requires a counterexample.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kvspec.conformance.machines.machinery import call, divergence
from kvspec.conformance.machines.pool import step_violations
from kvspec.conformance.targets.pool import ImplPoolTarget
from kvspec.hashing import get_request_block_hasher
from kvspec.proofs.tracing import concrete, untraced
from kvspec.request import Request
from kvspec.spec.interface import NULL_BLOCK_ID
from kvspec.spec.pool import SpecBlockPool
from kvspec.spec.rules import EventMirror, Step

NUM_BLOCKS = 5
"""The null block and four blocks to share."""

_HASHER = get_request_block_hasher(1)
REQUESTS = (
    Request("A", [7, 8, 1], block_hasher=_HASHER),
    Request("B", [7, 8, 2], block_hasher=_HASHER),
)
"""Blocks of one token; A and B share their first two blocks' content."""


class Bench:
    """impl's pool and the spec's, in lockstep, and what each request holds."""

    def __init__(self) -> None:
        self.impl = ImplPoolTarget(NUM_BLOCKS, True, 1, True)
        self.spec = SpecBlockPool(NUM_BLOCKS, True, 1, True)
        self.held: list[list[int]] = [[], []]
        self.num_cached = [0, 0]
        self.ledger: Counter[int] = Counter()
        self.mirror = EventMirror()
        self.broken: set[str] = set()

    def apply(self, op: str, *args: Any) -> tuple[Any, BaseException | None]:
        """Apply one pool operation to both pools; record every rule it breaks."""
        with untraced():
            before = self.impl.snapshot()
        result, error = call(getattr(self.impl, op), args)  # the code under proof, traced
        args, result, error, events = concrete((args, result, error, self.impl.take_events()))
        with untraced():
            self._check(op, args, before, result, error, events)
        return result, error

    def _check(self, op: str, args: tuple[Any, ...], before: Any, result: Any, error: Any, events: list[Any]) -> None:
        after = self.impl.snapshot()
        if error is not None and not isinstance(error, (ValueError, TypeError)):
            self.broken.add("refusal-kind")
        step = Step(op, args, before, after, result, error)
        self.broken.update(v.rule for v in step_violations(step, events, self.ledger, self.mirror))
        spec_result, spec_error = call(getattr(self.spec, op), args)
        spec_outcome = (spec_result, spec_error, self.spec.snapshot(), self.spec.take_events())
        if divergence(op, (result, error, after, events), spec_outcome):
            self.broken.add("spec-equivalence")

    # --- what a request does -----------------------------------------------------------

    def take_hits(self, r: int) -> None:
        """A request that holds nothing takes its cached prefix, a touch per hit."""
        if self.held[r]:
            return
        for block_hash in REQUESTS[r].block_hashes:
            found, _ = self.apply("get_cached_block", block_hash, [0])
            if found is None:
                break
            self.apply("touch", found)
            self.held[r] += found
        self.num_cached[r] = len(self.held[r])

    def allocate(self, r: int, n: int) -> None:
        new, error = self.apply("get_new_blocks", n)
        if error is None:
            self.held[r] += new

    def cache(self, r: int, mask: list[bool] | None) -> None:
        """Cache the request's blocks not cached yet (through ``mask``)."""
        start, end = self.num_cached[r], min(len(self.held[r]), REQUESTS[r].num_tokens)
        if start >= end:
            return
        if mask is not None:
            mask = mask[: end - start]
        _, error = self.apply("cache_full_blocks", REQUESTS[r], list(self.held[r]), start, end, 1, 0, mask)
        if error is None:
            self.num_cached[r] = end

    def admit(self, r: int) -> None:
        """Hits, then new blocks for the rest, then cache them all."""
        if self.held[r]:
            return
        self.take_hits(r)
        missing = REQUESTS[r].num_tokens - len(self.held[r])
        if missing > self.impl.get_num_free_blocks():
            self.finish(r, True)
            return
        self.allocate(r, missing)
        self.cache(r, None)

    def finish(self, r: int, tail_first: bool) -> None:
        blocks = self.held[r][::-1] if tail_first else self.held[r]
        self.held[r], self.num_cached[r] = [], 0
        self.apply("free_blocks", blocks)

    def release_first(self, r: int) -> None:
        """The request's oldest real block leaves its window: freed, its
        slot keeps the null block."""
        for i, b in enumerate(self.held[r]):
            if b != NULL_BLOCK_ID:
                self.held[r][i] = NULL_BLOCK_ID
                self.apply("free_blocks", [b])
                return

    def outcome(self) -> tuple[str, ...]:
        """The rules broken so far, and ``ref-conservation`` if draining every
        request does not leave every block free."""
        for r in (0, 1):
            self.finish(r, True)
        if self.impl.get_num_free_blocks() != NUM_BLOCKS - 1:
            self.broken.add("ref-conservation")
        return tuple(sorted(self.broken))


MOVES = (
    lambda b: b.admit(0),
    lambda b: b.admit(1),
    lambda b: b.finish(0, True),
    lambda b: b.finish(1, False),
    lambda b: b.release_first(0),
    lambda b: b.allocate(1, 2),
    lambda b: b.apply("evict_blocks", [1]),
    lambda b: b.apply("reset_prefix_cache"),
)
"""The prefix alphabet: A or B admitted (hits, new blocks, caching), A done
(tail first), B done (head first), A's oldest block out of its window, B
takes two more blocks (evicting cached ones when the pool is short), block
1's hash evicted, the prefix cache reset."""


def _after(first: int, second: int) -> Bench:
    bench = Bench()
    MOVES[first](bench)
    MOVES[second](bench)
    return bench


def _mask(code: int, n: int) -> list[bool] | None:
    """``code`` 0: no mask; else its bits, lowest first, for ``n`` blocks."""
    return None if code == 0 else [bool(code >> i & 1) for i in range(n)]


# --- the obligations: one per operation ---------------------------------------------------------
#
# Budgets: on an idle 2-core machine each confirms in 30-95 s (measured 2026-12-07: evict 91 s, get_new_blocks
# 87 s, cache 72 s, reset 70 s, free 61 s, touch 30 s); CI runs them while other environments install, about a
# third slower, so each budget leaves that much room and more -- a budget is a limit, not the time taken.


def get_new_blocks_keeps_the_rules(first: int, second: int, n: int) -> tuple[str, ...]:
    """Allocation (by B) of any count: short pools and negative counts
    refused; hashed free blocks lose their hash when reused.

    covers: BlockPool.get_new_blocks
    budget: 180
    pre: 0 <= first < 8 and 0 <= second < 8
    pre: -1 <= n <= 4
    post: __return__ == ()  # pool-rules, spec-equivalence
    """
    bench = _after(first, second)
    bench.allocate(1, n)
    return bench.outcome()


def cache_full_blocks_keeps_the_rules(first: int, second: int, mask: int) -> tuple[str, ...]:
    """Caching (by B) through any block mask (with no blocks, B first takes
    three): only unmasked blocks gain hashes, the first holder of a hash stays
    the one served.

    covers: BlockPool.cache_full_blocks
    budget: 150
    pre: 0 <= first < 8 and 0 <= second < 8
    pre: 0 <= mask < 8
    post: __return__ == ()  # pool-rules, spec-equivalence
    """
    bench = _after(first, second)
    if not bench.held[1]:
        bench.allocate(1, 3)
    bench.cache(1, _mask(mask, 3))
    return bench.outcome()


def touch_keeps_the_rules(first: int, second: int, r: int) -> tuple[str, ...]:
    """Hits: a request takes its cached prefix, touching free cached blocks
    (out of the queue) and blocks others hold (a second reference).

    covers: BlockPool.get_cached_block, BlockPool.touch
    budget: 60
    pre: 0 <= first < 8 and 0 <= second < 8
    pre: 0 <= r < 2
    post: __return__ == ()  # pool-rules, spec-equivalence
    """
    bench = _after(first, second)
    bench.take_hits(r)
    return bench.outcome()


def free_blocks_keeps_the_rules(first: int, second: int, r: int, how: int) -> tuple[str, ...]:
    """Freeing tail first, head first, or a block nobody holds (refused, unchanged).

    covers: BlockPool.free_blocks
    budget: 150
    pre: 0 <= first < 8 and 0 <= second < 8
    pre: 0 <= r < 2
    pre: 0 <= how < 3
    post: __return__ == ()  # pool-rules, spec-equivalence
    """
    bench = _after(first, second)
    if how < 2:
        bench.finish(r, how == 0)
    else:
        unheld = [b for b in range(1, NUM_BLOCKS) if b not in bench.held[0] + bench.held[1]]
        if unheld:
            bench.apply("free_blocks", unheld[:1])
    return bench.outcome()


def evict_blocks_keeps_the_rules(first: int, second: int, block: int) -> tuple[str, ...]:
    """Eviction of any id: held or free, cached or not, the null block, or
    an id outside the pool (refused, unchanged).

    covers: BlockPool.evict_blocks
    budget: 180
    pre: 0 <= first < 8 and 0 <= second < 8
    pre: 0 <= block <= NUM_BLOCKS
    post: __return__ == ()  # pool-rules, spec-equivalence
    """
    bench = _after(first, second)
    bench.apply("evict_blocks", [block])
    return bench.outcome()


def reset_keeps_the_rules(first: int, second: int, third: int) -> tuple[str, ...]:
    """Reset after any three moves: it succeeds exactly when nothing is held
    and then leaves no hash; otherwise nothing changes.

    covers: BlockPool.reset_prefix_cache
    budget: 150
    pre: 0 <= first < 8 and 0 <= second < 8 and 0 <= third < 8
    post: __return__ == ()  # pool-rules, spec-equivalence
    """
    bench = _after(first, second)
    MOVES[third](bench)
    bench.apply("reset_prefix_cache")
    return bench.outcome()
