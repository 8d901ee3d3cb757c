"""Mamba: one recurrent state per request instead of per-token KV, kept in
state blocks; a hit is the state after the hit's last token, and every
earlier state is skipped (spec/README.md, chapter 5)."""

from __future__ import annotations

from typing import Any

from kvspec.kv_cache_interface import AttentionKind, MambaSpec, cdiv
from kvspec.spec.kinds.group import (
    NULL,
    GroupManager,
    hash_key,
    take_new_blocks,
)
from kvspec.spec.layout import mamba_hold_back


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
        self.hold_back = mamba_hold_back(spec.num_speculative_blocks, self.pool.release)
        self.cached_this_step: set[bytes] = set()
        # align mode only: who has allocated, and where the previous state sits
        self.allocated: set[str] = set()
        self.last_state_position: dict[str, int] = {}
        # whether the manager runs an EAGLE drafter (use_eagle): its prompt boundary is a hash block lower
        self.use_eagle_checkpoint = False

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

    def cache_mask(self, start, end, retention, boundaries):
        """All states are cached unless ``retention`` is set: then one per
        ``retention`` tokens (``0``: none) plus the state at the last aligned
        boundary before each of ``boundaries`` (an exact replay of the prompt,
        a shared prefix's end: positions a later request hits)."""
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
        for position in boundaries:
            latest = position // alignment * alignment
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
        lies before the current state position (a separate free call).

        From 0.30 (release delta ``mamba-retire-across-gaps``) align mode
        frees every state before the window, past the null entries prefill
        leaves between states (the base stops at the first null, as every
        kind does)."""
        computed = max(0, total_computed_tokens - self.hold_back)
        if self.mode == "align" and self.pool.release.has("mamba-retire-across-gaps"):
            plan = self._states_before(rid, max(0, self.skipped_tokens(computed)) // self.block_size)
        else:
            plan = super().removal_plan(rid, computed)
        if self.mode == "align":
            last = self.last_state_position.get(rid)
            if last is not None and last < cdiv(computed, self.block_size) - 1:
                removed = {i for call in plan for i in call}
                if last not in removed and self.table(rid)[last] != NULL:
                    plan.append([last])
        return plan

    def _states_before(self, rid: str, last: int) -> list[list[int]]:
        """Every position before ``last`` that holds a block, ``last-1``
        down, as one free call (or none): null entries do not stop it."""
        table = self.table(rid)
        positions = [i for i in range(min(last, len(table)) - 1, -1, -1) if table[i] != NULL]
        return [positions] if positions else []

    def cache(self, request, num_tokens, retention, replay=None):
        """As for attention; the newly cached states are remembered until the
        next step (their hits are refused until then).  From 0.32 (release
        delta mamba-boundary-remarked) the state at the prompt's last
        reusable boundary is keyed and remembered again whenever
        ``num_tokens`` is that boundary; from 0.33 (delta
        mamba-boundary-remark-fixed) only when its block does not hold the
        key of that boundary (its key was evicted while the request held it)."""
        rid = request.request_id
        before = self.num_cached.get(rid, 0)
        super().cache(request, num_tokens, retention, replay)
        after = self.num_cached.get(rid, 0)
        if after > before:
            keys = self.pool.snapshot().key_of
            for b in self.table(rid)[before:after]:
                if b != NULL and b in keys:
                    self.cached_this_step.add(keys[b])
        release = self.pool.release
        if self.mode == "align" and release.has("mamba-boundary-remarked"):
            self._remark_prompt_boundary(request, num_tokens,
                                         unkeyed_only=release.has("mamba-boundary-remark-fixed"))

    def _remark_prompt_boundary(self, request, num_tokens, unkeyed_only):
        """Key the state block at the prompt's last reusable boundary, if
        ``num_tokens`` is it, and remember it as cached this step; with
        ``unkeyed_only``, only a block whose own key names another prefix
        (or that has none)."""
        hbs = self.pool.state.hash_block_size
        prompt = request.num_prompt_tokens
        boundary = prompt // hbs * hbs - hbs if self.use_eagle_checkpoint else (prompt - 1) // hbs * hbs
        if num_tokens <= 0 or num_tokens % hbs or num_tokens != max(boundary, 0):
            return
        table = self.table(request.request_id)
        position = cdiv(num_tokens, self.block_size) - 1
        if position >= len(table) or table[position] == NULL:
            return
        if unkeyed_only and self.pool.state.tokens_of.get(table[position]) == num_tokens:
            return
        key = self.pool.cache_partial_block(request, table[position], num_tokens, self.group_id, self.block_size)
        self.cached_this_step.add(key)

    def free(self, rid):
        self.allocated.discard(rid)
        self.last_state_position.pop(rid, None)
        super().free(rid)

    def new_step_starts(self):
        self.cached_this_step.clear()
