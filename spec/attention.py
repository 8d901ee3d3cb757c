"""Attention types: what each kind of layer keeps, and how it finds a cache hit.

A model's layers are split into **KV-cache groups** (see
:mod:`kvspec.kv_cache_interface`).  Every group has its own block size ``B``
and, per request, its own **block table**: a list of block ids in which entry
``i`` (the block at *position* ``i``) holds the request's tokens
``[i*B, (i+1)*B)``.  The entry may be the null block (id 0) when the group
does not need those tokens' KV (:mod:`kvspec.spec.pool` describes blocks and
the pool).  This module states, for each attention type, the rules of one
group; :mod:`kvspec.spec.coordinator` combines the groups of a model and
:mod:`kvspec.spec.manager` is the request-level model.

Vocabulary
----------
- A request's **hash at position i** for a group of block size ``B`` is
  ``block_hashes_for_size(request.block_hashes, H, B)[i]`` (``H`` is the
  pool's ``hash_block_size``): it names the whole token prefix
  ``[0, (i+1)*B)`` plus the request's extra keys (:mod:`kvspec.hashing`).
- Position ``i`` is **cached** in a group when the pool's table holds a block
  under (hash at ``i``, group id).  When several blocks carry the same key,
  a lookup returns the oldest (:meth:`SpecBlockPool.get_cached_block`).
- A **hit of length L** for a group is the block table a new request would
  start with: ``L / B`` entries, the cached blocks at the positions the group
  needs to continue from token ``L``, the null block elsewhere.
- Tokens are **skipped** by a group once no future token attends to them:
  their blocks can be freed and their table entries become the null block.

The attention types
-------------------
======================  =====================================  ==============================
type                    a hit of length L needs                tokens skipped after n computed
======================  =====================================  ==============================
full (and MLA)          every position ``0 .. L/B - 1``        none
reference sliding       every position ``0 .. L/B - 1``        the gap: positions from
window ``w`` (R-SWA)    (as full attention)                    ``cdiv(P, B)`` up to
                                                               ``max(P, n - w) // B``
                                                               (``P``: prompt length)
sliding window ``w``    the last ``cdiv(w-1, B)`` positions    ``max(0, n - w + 1)``
                        before ``L`` (all of them if fewer;
                        at least one)
chunked local ``c``     positions from ``(L//c*c)//B`` to      ``n // c * c``
                        ``L/B - 1`` (the chunk of token ``L``)
Mamba                   position ``L/B - 1`` only (the         ``n - 1``
                        recurrent state after token ``L-1``)
cross attention         never cached (per-request encoder KV)  none
======================  =====================================  ==============================

A hit length is always a multiple of an **alignment** ``A`` (the scheduler
block size in hybrid models, ``B`` otherwise).

**EAGLE**: a speculative-decoding draft head needs the hidden state of the last
hit token, so an EAGLE group must recompute its last hit block: it looks for a
hit one block longer and then drops that block ("the EAGLE drop").  Draft
models have no Mamba layers, so a Mamba group is never an EAGLE group.

Each hit search below is written the way it is easiest to check -- "the
longest length such that ..." -- and returns exactly what vLLM 0.25.1's
scans return, quirks included (each quirk is pointed out where it happens;
:mod:`kvspec.spec.request_rules` states the rules those quirks break).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvspec.errors import RuleError
from kvspec.kv_cache_interface import (
    AttentionKind,
    KVCacheSpec,
    MambaSpec,
    cdiv,
    managed_kind,
)
from kvspec.spec import releases
from kvspec.spec.interface import NULL_BLOCK_ID
from kvspec.spec.layout import mamba_hold_back
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

    def cache_mask(self, start: int, end: int, retention: int | None, num_prompt_tokens: int) -> list[bool] | None:
        """Which of the new full positions ``start .. end-1`` are worth caching
        (``None``: all of them)."""
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

    def cache(self, request: Any, num_tokens: int, retention: int | None) -> None:
        """Make the full blocks of the first ``num_tokens`` tokens cache hits
        (those not cached yet, and only those :meth:`cache_mask` keeps).

        Requires the table to hold those blocks and the request's hashes to
        name them (else the pool refuses).  Guarantees: ``num_cached``
        becomes ``num_tokens // B`` (when larger).
        """
        rid = request.request_id
        start = self.num_cached.get(rid, 0)
        end = num_tokens // self.block_size
        if start >= end:
            return
        mask = self.cache_mask(start, end, retention, request.num_prompt_tokens)
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


# --- full attention -------------------------------------------------------------------------


class FullAttention(GroupManager):
    """Every token attends to every earlier token: nothing is ever skipped,
    and a hit of length ``L`` needs every position before ``L``.

    From 0.26 (release delta ``partial-tail-entries``), where a block holds
    several hash blocks, caching also registers the prompt's last hash
    boundary inside a block as a *partial entry* of the block that holds it
    (:meth:`partial_tail`).
    """

    kind = AttentionKind.FULL_ATTENTION

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        release = releases.current()
        self.partial_tails = release.has("partial-tail-entries")
        self.tail_spares_last_token = release.has("partial-tail-resend-boundary")

    def partial_tail(self, request: Any) -> int:
        """The prompt boundary (in tokens) a partial entry is registered at,
        or 0 for none: the last multiple of the hash block size ``H`` within
        the prompt (from 0.32, release delta ``partial-tail-resend-boundary``:
        within the prompt less its last token -- what a resend of the prompt
        can hit -- except in an EAGLE group, whose search reads the whole
        prompt), where a block holds more than one hash block."""
        hbs = self.pool.hash_block_size
        if not self.partial_tails or self.block_size <= hbs:
            return 0
        limit = request.num_prompt_tokens
        if self.tail_spares_last_token and not self.use_eagle:
            limit -= 1
        return min(limit // hbs, len(request.block_hashes)) * hbs

    def cache(self, request: Any, num_tokens: int, retention: int | None) -> None:
        """As for every group (:meth:`GroupManager.cache`); then, where
        :meth:`partial_tail` names a boundary within ``num_tokens`` that ends
        inside a block, that block becomes a hit for the prompt up to the
        boundary (:meth:`~kvspec.spec.pool.SpecBlockPool.cache_partial_block`,
        with its ``Stored`` event) -- at every call, whether or not a full
        block was cached."""
        super().cache(request, num_tokens, retention)
        boundary = self.partial_tail(request)
        table = self.table(request.request_id)
        if 0 < boundary <= num_tokens and boundary % self.block_size and boundary // self.block_size < len(table):
            self.pool.cache_partial_block(request, table[boundary // self.block_size], boundary, self.group_id,
                                          self.block_size)

    @classmethod
    def find_hit(cls, spec, lookup, max_length, drop_eagle, alignment):
        """The longest run of cached positions from position 0 (at most
        ``max_length // B`` of them); with EAGLE, one block shorter; then cut
        back to the alignment."""
        block_size = spec.block_size
        run: HitPositions = []
        for i in range(max_length // block_size):
            column = lookup(i)
            if column is None:
                break
            run.append(column)
        n = len(run)
        if drop_eagle and n:
            n -= 1
        return run[: aligned(n, block_size, alignment)]

    def common_prefix_blocks(self, rid: str) -> int:
        """The leading blocks of ``rid``'s table whose reference count equals
        the number of requests holding a table in this group: blocks every
        such request shares."""
        ref = self.pool.snapshot().ref
        n = 0
        for b in self.table(rid):
            if ref[b] != len(self.tables):
                break
            n += 1
        return n


# --- reference sliding window (R-SWA) ------------------------------------------------------------


class ReferenceSlidingWindow(FullAttention):
    """The prompt (``P`` tokens) stays visible to every later token; a
    generated token ``t`` sees the prompt and tokens ``[t - w, t]``.
    Allocated and hit exactly as full attention.  The blocks wholly between
    the prompt and the window -- positions ``cdiv(P, B)`` up to
    ``max(P, n - w) // B`` once ``n`` tokens are computed -- are released;
    without the prompt length nothing is."""

    kind = AttentionKind.RSWA

    def gap(self, total_computed_tokens: int, num_prompt_tokens: int) -> range:
        """The positions wholly after the prompt and before the window's
        first token (the window starts ``w`` tokens back, never inside the
        prompt)."""
        window_start = max(num_prompt_tokens, total_computed_tokens - self.spec.rswa_window)
        return range(cdiv(num_prompt_tokens, self.block_size), window_start // self.block_size)

    def removal_plan(self, rid, total_computed_tokens, num_prompt_tokens=None):
        if num_prompt_tokens is None:
            return []
        gap = self.gap(total_computed_tokens, num_prompt_tokens)
        return self._released_back_from(rid, gap.start, gap.stop)


# --- sliding window ----------------------------------------------------------------------------


def window_blocks(sliding_window: int, block_size: int, use_eagle: bool) -> int:
    """How many contiguous cached positions a sliding-window hit needs: the
    blocks holding the ``w - 1`` tokens before the next one, plus the block
    that EAGLE drops."""
    return cdiv(sliding_window - 1, block_size) + (1 if use_eagle else 0)


class SlidingWindow(GroupManager):
    """Token ``t`` attends to tokens ``[t - w + 1, t]``."""

    kind = AttentionKind.SLIDING_WINDOW

    def skipped_tokens(self, num_computed_tokens: int) -> int:
        """Once ``n`` tokens are computed, the next token (``n``) no longer sees
        the first ``n - w + 1``."""
        return max(0, num_computed_tokens - self.spec.sliding_window + 1)

    @classmethod
    def find_hit(cls, spec, lookup, max_length, drop_eagle, alignment):
        """The longest length whose window is cached.

        With ``k`` = :func:`window_blocks` (at least 1) and ``n`` the number of
        positions of a candidate (``n <= max_length // B``), a candidate is
        *aligned* when ``n * B`` -- with EAGLE ``(n - 1) * B``, the length
        left after the drop -- is a multiple of the alignment.

        1. The largest aligned ``n >= k`` whose last ``k`` positions are all
           cached: the hit is ``n - k`` null entries and those ``k`` blocks
           (with EAGLE, minus the last).
        2. Otherwise the largest aligned ``n`` no longer than the leading run
           of cached positions (the window reaches back to token 0): those
           ``n`` blocks, cut back to the alignment; with EAGLE one block is
           dropped and the rest cut back to the alignment again.  (vLLM
           compatibility, binding at L3 only: with EAGLE and ``B`` not equal to the alignment, the first
           cut undoes the EAGLE alignment, so the result can be shorter than
           the longest servable length.)
        """
        block_size = spec.block_size
        k = max(window_blocks(spec.sliding_window, block_size, drop_eagle), 1)
        max_blocks = max_length // block_size

        def is_aligned(n: int) -> bool:
            kept = n - 1 if drop_eagle else n
            return block_size == alignment or kept * block_size % alignment == 0

        for n in range(max_blocks, k - 1, -1):
            if not is_aligned(n):
                continue
            window = [lookup(i) for i in range(n - k, n)]
            if all(column is not None for column in window):
                hit: HitPositions = [None] * (n - k) + window
                if drop_eagle:
                    hit.pop()
                return hit

        run: HitPositions = []
        for i in range(max_blocks):
            column = lookup(i)
            if column is None:
                break
            run.append(column)
        n = max((m for m in range(1, len(run) + 1) if is_aligned(m)), default=0)
        n = aligned(n, block_size, alignment)
        if drop_eagle and n:
            n = aligned(n - 1, block_size, alignment)
        return run[:n]

    def cache_mask(self, start, end, retention, num_prompt_tokens):
        """Cache only the positions a hit can ever use.

        Hits end on multiples of the scheduler block size ``A``, and use the
        last ``need`` positions before that boundary (with EAGLE the window
        is shifted one block right).  With ``per = A // B`` positions per
        aligned segment, position ``i`` is kept when
        ``(i - shift) % per >= per - need``; if ``need >= per`` every position
        is kept.  ``retention`` (vLLM's ``VLLM_PREFIX_CACHE_RETENTION_INTERVAL``)
        keeps such a tail only once per ``retention`` tokens (``0``: never),
        plus the tail before the prompt's last aligned boundary, which an
        exact replay of the prompt hits.
        """
        block_size = self.block_size
        alignment = self.scheduler_block_size
        need = window_blocks(self.spec.sliding_window, block_size, self.use_eagle)
        shift = 1 if self.use_eagle else 0
        mask = [False] * (end - start)
        segment = alignment if retention is None else (retention or None)
        if segment is not None:
            per = segment // block_size
            if need >= per:
                return None
            for i in range(start, end):
                if i >= shift and (i - shift) % per >= per - need:
                    mask[i - start] = True
        if retention is not None and num_prompt_tokens is not None:
            latest = (num_prompt_tokens - 1) // alignment * alignment
            prompt_end = latest // block_size + shift
            for i in range(max(start, prompt_end - need), min(end, prompt_end)):
                mask[i - start] = True
        return mask


# --- chunked local attention -----------------------------------------------------------------------


class ChunkedLocal(GroupManager):
    """Tokens attend within their chunk of ``c`` tokens: ``[t // c * c, t]``."""

    kind = AttentionKind.CHUNKED_LOCAL_ATTENTION

    def skipped_tokens(self, num_computed_tokens: int) -> int:
        """Every chunk before the one of the next token."""
        c = self.spec.attention_chunk_size
        return num_computed_tokens // c * c

    @classmethod
    def find_hit(cls, spec, lookup, max_length, drop_eagle, alignment):
        """Null entries for every position before the chunk of token
        ``max_length`` (position ``(max_length // c * c) // B`` on), then the
        run of cached positions from there, up to ``max_length // B``.

        The positions before the chunk need no lookup at all, so a request
        longer than a chunk always "hits" them.  (vLLM compatibility, binding at L3 only: when ``c`` is
        not a multiple of ``B``, the chunk's first block also holds tokens of
        the previous chunk, and a hit ending there is not checked for them.)
        EAGLE is not supported with chunked local attention and the alignment
        must be ``B`` (the manager refuses such layouts).
        """
        block_size = spec.block_size
        max_blocks = max_length // block_size
        chunk_start = max_length // spec.attention_chunk_size * spec.attention_chunk_size if max_length > 0 else 0
        first = chunk_start // block_size
        hit: HitPositions = [None] * first
        for i in range(first, max_blocks):
            column = lookup(i)
            if column is None:
                break
            hit.append(column)
        return hit


# --- Mamba -------------------------------------------------------------------------------------------------


class Mamba(GroupManager):
    """A state-space layer: one recurrent state per request instead of per-token KV.

    The table holds state blocks: the state after the request's tokens up to
    the end of the position.  Only the latest state is needed to continue,
    so everything but the last block is skipped.  ``num_speculative_blocks``
    (``s``) extra blocks hold the states of draft tokens.

    Cache modes: ``"all"`` caches the state at every block boundary;
    ``"align"`` keeps just the running state block (plus the previous one,
    freed a step later) and caches the state at the boundaries prefill chunks
    end on; ``"none"`` is meant for caching disabled (with caching on the
    manager behaves as in ``"all"``).

    A state cached during the current scheduler step is not computed yet:
    hits on it are refused until :meth:`new_step_starts`.
    """

    kind = AttentionKind.MAMBA

    def __init__(self, spec: MambaSpec, *args: Any, **kwargs: Any):
        super().__init__(spec, *args, **kwargs)
        self.mode = spec.mamba_cache_mode
        self.num_speculative_blocks = spec.num_speculative_blocks
        self.hold_back = mamba_hold_back(spec.num_speculative_blocks)
        self.cached_this_step: set[bytes] = set()
        # align mode only: who has allocated, and where the previous state sits
        self.allocated: set[str] = set()
        self.last_state_position: dict[str, int] = {}

    def skipped_tokens(self, num_computed_tokens: int) -> int:
        """Only the state after the last computed token is needed."""
        return num_computed_tokens - 1

    @classmethod
    def find_hit(cls, spec, lookup, max_length, drop_eagle, alignment):
        """The largest aligned ``n <= max_length // B`` whose position
        ``n - 1`` is cached: ``n - 1`` null entries and that state block.

        There is no EAGLE drop (draft models have no Mamba layers), and a
        Mamba group is never an EAGLE group
        (:func:`~kvspec.kv_cache_interface.eagle_group_ids`), so the search is
        never widened past the candidate and the hit is never longer than
        ``max_length``.  (vLLM compatibility, a departure: vLLM 0.25.1 widens it by one block
        for EAGLE and ignores ``drop_eagle`` here; its hit can outrun the candidate, finding F7.)
        """
        block_size = spec.block_size
        for n in range(max_length // block_size, 0, -1):
            if block_size != alignment and n * block_size % alignment:
                continue
            column = lookup(n - 1)
            if column is not None:
                return [None] * (n - 1) + [column]
        return []

    def cache_mask(self, start, end, retention, num_prompt_tokens):
        """All states are cached unless ``retention`` is set: then one per
        ``retention`` tokens (``0``: none) plus the state at the prompt's last
        aligned boundary (which an exact replay of the prompt hits)."""
        alignment = self.scheduler_block_size
        if retention is None:
            return None
        block_size = self.block_size
        mask = [False] * (end - start)
        if retention:
            per = retention // block_size
            if per <= 1:
                return None
            first = (start + per) // per * per - 1
            for i in range(first - start, len(mask), per):
                mask[i] = True
        if num_prompt_tokens is not None:
            latest = (num_prompt_tokens - 1) // alignment * alignment
            boundary = latest // block_size - 1
            if start <= boundary < end:
                mask[boundary - start] = True
        return mask

    def blocks_to_allocate(self, rid, num_tokens, hits, total_computed_tokens, num_tokens_main_model,
                           admission_cap=False):
        """As for attention, with ``s`` extra speculative blocks; but:

        - a hit whose state was cached during this step cannot be taken yet:
          the answer is then "more blocks than the pool has", which refuses
          the allocation;
        - align mode allocates no lookahead blocks and at most one new state
          block per step (``1 + s`` on the first allocation), plus free hits.
        """
        if hits and hash_key(self.pool, hits[-1]) in self.cached_this_step:
            return self.pool.num_blocks + 1
        if self.mode != "align":
            num_tokens += self.block_size * self.num_speculative_blocks
            return super().blocks_to_allocate(rid, num_tokens, hits, total_computed_tokens,
                                              num_tokens_main_model, admission_cap)
        required = cdiv(num_tokens_main_model, self.block_size) + self.num_speculative_blocks
        new_blocks = required - len(hits) - len(self.table(rid))
        if new_blocks > 0:
            new_blocks = 1 if rid in self.allocated else 1 + self.num_speculative_blocks
        return new_blocks + self._free_hits(hits)

    def allocate(self, rid, num_tokens, num_tokens_main_model):
        """Outside align mode: as attention, with ``s`` extra blocks.

        Align mode: the table must reach ``cdiv(main, B) + s`` entries where
        ``main`` excludes lookahead tokens.  Positions before the running
        state get the null block; the speculative blocks of the previous step
        move up to follow the new state position (their old entries become
        null) when they would otherwise fall behind it; whatever is still
        missing is new.  The previous running state is remembered, to be
        freed once the next step has copied it (:meth:`removal_plan`).
        Returns the table's new entries (null and moved blocks included).
        """
        if self.mode != "align":
            return super().allocate(rid, num_tokens + self.block_size * self.num_speculative_blocks,
                                    num_tokens_main_model)
        s = self.num_speculative_blocks
        table = self.tables.setdefault(rid, [])
        required = cdiv(num_tokens_main_model, self.block_size) + s
        if required <= len(table):
            return []
        before = len(table)
        seen = rid in self.allocated
        if seen:
            self.last_state_position[rid] = before - 1 - s
        elif before > 0:
            self.last_state_position[rid] = before - 1  # the state a hit brought
        state_position = required - s - 1
        table.extend([NULL] * (state_position - before))
        if seen:
            for i in range(before - s, before):
                if i >= state_position:
                    break
                table.append(table[i])
                table[i] = NULL
        table.extend(take_new_blocks(self.pool, required - len(table)))
        self.allocated.add(rid)
        return table[before:]

    def removal_plan(self, rid, total_computed_tokens, num_prompt_tokens=None):
        """Draft tokens may still be rejected, so fewer tokens count as
        computed: ``s`` in the base, none from 0.26
        (:func:`~kvspec.spec.layout.mamba_hold_back`).  Besides the skipped
        prefix, align mode also frees the previous running state once it
        lies before the current state position (a separate free call)."""
        computed = max(0, total_computed_tokens - self.hold_back)
        plan = super().removal_plan(rid, computed)
        if self.mode == "align":
            last = self.last_state_position.get(rid)
            if last is not None and last < cdiv(computed, self.block_size) - 1:
                removed = {i for call in plan for i in call}
                if last not in removed and self.table(rid)[last] != NULL:
                    plan.append([last])
        return plan

    def cache(self, request, num_tokens, retention):
        """As for attention; the newly cached states are remembered until the
        next step (their hits are refused until then)."""
        rid = request.request_id
        before = self.num_cached.get(rid, 0)
        super().cache(request, num_tokens, retention)
        after = self.num_cached.get(rid, 0)
        if after > before:
            keys = self.pool.snapshot().key_of
            for b in self.table(rid)[before:after]:
                if b != NULL and b in keys:
                    self.cached_this_step.add(keys[b])

    def free(self, rid):
        self.allocated.discard(rid)
        self.last_state_position.pop(rid, None)
        super().free(rid)

    def new_step_starts(self):
        self.cached_this_step.clear()


# --- cross attention ----------------------------------------------------------------------------------------


class CrossAttention(GroupManager):
    """The decoder's view of the encoder output: allocated once per request
    from ``num_encoder_tokens``, never shared, never cached (a model with a
    cross-attention group runs with prefix caching off)."""

    kind = AttentionKind.CROSS_ATTENTION

    def take_hits(self, rid, hits, num_local_computed, num_external_computed):
        """Cross attention never has hits, and ignores the request's prefix."""

    def allocate_external(self, rid, num_local_computed, num_external_computed):
        """External KV connectors do not load encoder states."""

    def cache(self, request, num_tokens, retention):
        raise RuleError("hash-map-consistency", "cross-attention blocks are never cached")

    @classmethod
    def find_hit(cls, spec, lookup, max_length, drop_eagle, alignment):
        raise RuleError("hash-map-consistency", "cross-attention blocks are never cached")


# --- which class serves which spec ---------------------------------------------------------------------------


def group_class(spec: KVCacheSpec) -> type[GroupManager]:
    """The group manager for a spec, by its kind
    (:func:`~kvspec.kv_cache_interface.managed_kind`: MLA is full attention)."""
    kind = managed_kind(spec)
    if kind is None:
        raise RuleError("block-size-coherence", f"unsupported KV-cache spec {type(spec).__name__}")
    return GROUP_CLASSES[kind]


GROUP_CLASSES: dict[AttentionKind, type[GroupManager]] = {
    cls.kind: cls for cls in (FullAttention, ReferenceSlidingWindow, SlidingWindow, ChunkedLocal, Mamba, CrossAttention)
}
"""Each kind's group manager (each class names its kind)."""
