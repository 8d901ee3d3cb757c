"""What every kind of group shares: the block table of each request, the
hit search's vocabulary (positions, columns, lookups), allocation from the
pool and the release of skipped blocks.  Each kind (the other modules of
:mod:`kvspec.spec.kinds`) says only where it differs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvspec.errors import RuleError
from kvspec.kv_cache_interface import KVCacheSpec, cdiv
from kvspec.spec.interface import NULL_BLOCK_ID
from kvspec.spec.pool import SpecBlockPool

NULL = NULL_BLOCK_ID

Column = tuple[int, ...]
"""The blocks cached at one position, one per member group of a lookup."""

Lookup = Callable[[int], Column | None]
"""``lookup(i)``: the cached blocks at position ``i`` (one per member group),
or ``None`` if any member group misses."""

HitPositions = list[Column | None]
"""A hit as a list of positions: a column of cached blocks, or ``None`` for
a position the group does not need (the null block)."""



def reachable_boundaries(request: Any, replay: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """The token positions a later request is known to hit, which sparse
    retention keeps: where a replay of the prompt resumes (``replay``:
    :func:`~kvspec.spec.coordinator.replay_boundaries`; by default
    ``num_prompt_tokens - 1``), and where a prefix other requests share ends
    that a sparse group had not cached, if the caller stored it on the
    request (vLLM's scheduler from 0.26, delta shared-prefix-boundary)."""
    shared = getattr(request, "shared_prefix_boundary", 0)
    positions = replay if replay is not None else (request.num_prompt_tokens - 1,)
    return (*positions, shared) if shared else positions


class OutOfBlocks(RuleError):
    """An allocation step needs more free blocks than the pool has.  The
    capacity check normally rules this out; only where vLLM's estimate falls
    short (Mamba align mode with external tokens) can it happen, and then the
    manager refuses the whole allocation."""

    def __init__(self, wanted: int, free: int):
        super().__init__("allocation-accounting", f"an allocation step needs {wanted} blocks, {free} are free")


def take_new_blocks(pool: SpecBlockPool, num_blocks: int) -> list[int]:
    """``pool.get_new_blocks``, raising :class:`OutOfBlocks` on a shortage."""
    if num_blocks > pool.get_num_free_blocks():
        raise OutOfBlocks(num_blocks, pool.get_num_free_blocks())
    return pool.get_new_blocks(num_blocks)


def aligned(num_blocks: int, block_size: int, alignment: int) -> int:
    """The largest ``n <= num_blocks`` whose ``n * block_size`` is a multiple
    of ``alignment`` (vLLM pops blocks one by one until it is)."""
    while num_blocks > 0 and num_blocks * block_size % alignment:
        num_blocks -= 1
    return num_blocks


# --- pool observations (read through the pool's public snapshot) ---------------


def hash_key(pool: SpecBlockPool, block_id: int) -> bytes | None:
    return pool.snapshot().key_of.get(block_id)


# --- one group ------------------------------------------------------------------------


class GroupManager:
    """One KV-cache group: its block tables and the rules of its attention type.

    State (per request id):

    - ``tables[rid]``: the block table (vLLM's ``req_to_blocks``);
    - ``num_cached[rid]``: how many leading positions of the table are already
      cached (or were hits).  A request that has an entry here is **running**
      in this group: it can take no more hits, and its block needs are simply
      "enough blocks for its tokens".  A request enters ``num_cached`` when it
      takes hits (:meth:`take_hits`) or first caches a full block.

    Subclasses state what their type decides: :meth:`skipped_tokens`,
    :meth:`find_hit`, :meth:`cache_mask`, :meth:`common_prefix_blocks`, and
    (Mamba, cross attention) how blocks are counted and allocated.
    """

    kind = "abstract"

    def __init__(
        self,
        spec: KVCacheSpec,
        group_id: int,
        pool: SpecBlockPool,
        enable_caching: bool,
        scheduler_block_size: int,
        max_admission_blocks: int | None = None,
    ):
        self.spec = spec
        self.group_id = group_id
        self.pool = pool
        self.enable_caching = enable_caching
        self.block_size = spec.block_size
        self.scheduler_block_size = scheduler_block_size
        self.max_admission_blocks = max_admission_blocks
        self.use_eagle = False  # set by the coordinator
        self.tables: dict[str, list[int]] = {}
        self.num_cached: dict[str, int] = {}

    # -- what the attention type decides ------------------------------------------------

    def skipped_tokens(self, num_computed_tokens: int) -> int:
        """How many leading tokens no future token attends to (default: none)."""
        return 0

    @classmethod
    def find_hit(
        cls, spec: Any, lookup: Lookup, max_length: int, drop_eagle: bool, alignment: int
    ) -> HitPositions:
        """The hit of this type: see each subclass."""
        raise NotImplementedError

    def cache_mask(self, start: int, end: int, retention: int | None, boundaries: tuple[int, ...]) -> list[bool] | None:
        """Which of the new full positions ``start .. end-1`` are worth caching
        (``None``: all of them); ``boundaries``: the token positions a later
        request is known to hit (:func:`reachable_boundaries`)."""
        return None

    def common_prefix_blocks(self, rid: str) -> int:
        """How many leading blocks every request with a table shares (cascade
        attention); only full attention answers, the others say 0."""
        return 0

    # -- reading ------------------------------------------------------------------------------

    def table(self, rid: str) -> list[int]:
        return self.tables.get(rid, [])

    def is_running(self, rid: str) -> bool:
        return rid in self.num_cached

    # -- how many blocks an allocation takes from the free queue ---------------------------

    def blocks_to_allocate(
        self,
        rid: str,
        num_tokens: int,
        hits: list[int],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        admission_cap: bool = False,
    ) -> int:
        """The blocks an allocation for ``num_tokens`` token slots will take
        from the free queue: new blocks, plus hits that are free right now
        (taking them removes them from the free queue).

        A running request needs ``cdiv(num_tokens, B)`` blocks minus those it
        holds.  A new one also counts its hits and the skipped prefix (whose
        positions get the null block, not a new block) as already covered;
        hits inside the skipped prefix are not taken, so not counted.
        ``admission_cap`` (the full-sequence admission check) caps the need at
        the most blocks the type ever holds at once (sliding window, chunked
        local).
        """
        required = cdiv(num_tokens, self.block_size)
        if admission_cap and self.max_admission_blocks is not None:
            required = min(required, self.max_admission_blocks)
        held = len(self.table(rid))
        if self.is_running(rid):
            return max(required - held, 0)
        skipped_blocks = self.skipped_tokens(total_computed_tokens) // self.block_size
        new_blocks = max(required - max(skipped_blocks, len(hits) + held), 0)
        first_taken_hit = max(0, skipped_blocks - held)
        return new_blocks + self._free_hits(hits[first_taken_hit:])

    def _free_hits(self, hits: list[int]) -> int:
        snap = self.pool.snapshot()
        return sum(1 for b in hits if b != NULL and snap.ref[b] == 0)

    # -- taking hits, allocating ------------------------------------------------------------------

    def take_hits(self, rid: str, hits: list[int], num_local_computed: int, num_external_computed: int) -> None:
        """Start a new request's table with its hits (vLLM's
        ``add_local_computed_blocks``).

        Requires: the request holds nothing in this group.  Guarantees: the
        positions inside the skipped prefix get the null block (hits there are
        not taken), every other hit is taken (:meth:`SpecBlockPool.touch`),
        and the request is running with all of them counted as cached.
        """
        skipped_blocks = self.skipped_tokens(num_local_computed + num_external_computed) // self.block_size
        kept = hits[skipped_blocks:] if skipped_blocks > 0 else list(hits)
        if self.enable_caching:
            self.pool.touch(kept)
        table = [NULL] * max(skipped_blocks, 0) + kept
        self.tables[rid] = table
        self.num_cached[rid] = len(table)

    def allocate_external(self, rid: str, num_local_computed: int, num_external_computed: int) -> None:
        """Blocks for tokens an external KV connector computed (vLLM's
        ``allocate_external_computed_blocks``): enough new blocks to cover all
        computed tokens, unless every external token is already skipped."""
        total = num_local_computed + num_external_computed
        skipped = self.skipped_tokens(total)
        if skipped > 0:
            num_external_computed = min(total - skipped, num_external_computed)
        if num_external_computed <= 0:
            return
        table = self.tables.setdefault(rid, [])
        table.extend(take_new_blocks(self.pool, cdiv(total, self.block_size) - len(table)))

    def allocate(self, rid: str, num_tokens: int, num_tokens_main_model: int) -> list[int]:
        """New blocks so that the table covers ``num_tokens`` tokens; returns
        the new blocks (nothing if it already does)."""
        table = self.tables.setdefault(rid, [])
        missing = cdiv(num_tokens, self.block_size) - len(table)
        if missing <= 0:
            return []
        new = take_new_blocks(self.pool, missing)
        table.extend(new)
        return new

    # -- caching ----------------------------------------------------------------------------------------

    def cache(self, request: Any, num_tokens: int, retention: int | None, replay: tuple[int, ...] | None = None):
        """Make the full blocks of the first ``num_tokens`` tokens cache hits
        (those not cached yet, and only those :meth:`cache_mask` keeps, given
        ``replay``: see :func:`reachable_boundaries`).

        Requires the table to hold those blocks and the request's hashes to
        name them (else the pool refuses).  Guarantees: ``num_cached``
        becomes ``num_tokens // B`` (when larger).
        """
        rid = request.request_id
        start = self.num_cached.get(rid, 0)
        end = num_tokens // self.block_size
        if start >= end:
            return
        mask = self.cache_mask(start, end, retention, reachable_boundaries(request, replay))
        self.pool.cache_full_blocks(request, self.table(rid), start, end, self.block_size, self.group_id, mask)
        self.num_cached[rid] = end

    # -- leaving the window -----------------------------------------------------------------------------

    def removal_plan(
        self, rid: str, total_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> list[list[int]]:
        """The positions whose blocks leave the window once
        ``total_computed_tokens`` are computed, as the free calls that release
        them (each call tail-first).  ``num_prompt_tokens`` matters to R-SWA
        only.

        Walking back from the last skipped position, blocks are released until
        the first position that already holds the null block (everything
        before it was released earlier).
        """
        skipped = self.skipped_tokens(total_computed_tokens)
        if skipped <= 0:
            return []
        return self._released_back_from(rid, 0, skipped // self.block_size)

    def _released_back_from(self, rid: str, first: int, last: int) -> list[list[int]]:
        """Positions ``last-1, last-2, ... >= first`` up to the first null
        entry, as one free call (or none)."""
        table = self.table(rid)
        positions = []
        for i in range(min(last, len(table)) - 1, first - 1, -1):
            if table[i] == NULL:
                break
            positions.append(i)
        return [positions] if positions else []

    def remove(self, rid: str, plan: list[list[int]]) -> None:
        """Apply a :meth:`removal_plan`: free the blocks, null their entries."""
        table = self.table(rid)
        for positions in plan:
            blocks = [table[i] for i in positions]
            for i in positions:
                table[i] = NULL
            self.pool.free_blocks(blocks)

    # -- the end ---------------------------------------------------------------------------------------------

    def free(self, rid: str) -> None:
        """Release the request's table, tail block first (the last block of a
        prefix is the least likely to be shared, so it should be evicted first)."""
        table = self.tables.pop(rid, [])
        self.num_cached.pop(rid, None)
        self.pool.free_blocks(reversed(table))

    def new_step_starts(self) -> None:
        """A scheduler step begins (only Mamba cares)."""
