"""Full attention (and MLA): every token attends to every earlier token, so
a hit needs every position and nothing is ever skipped (spec/README.md,
chapter 2)."""

from __future__ import annotations

from typing import Any

from kvspec.kv_cache_interface import AttentionKind
from kvspec.spec.kinds.group import (
    GroupManager,
    HitPositions,
    aligned,
)


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
        release = self.pool.release
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

    def cache(self, request: Any, num_tokens: int, retention: int | None,
              replay: tuple[int, ...] | None = None) -> None:
        """As for every group (:meth:`GroupManager.cache`); then, where
        :meth:`partial_tail` names a boundary within ``num_tokens`` that ends
        inside a block, that block becomes a hit for the prompt up to the
        boundary (:meth:`~kvspec.spec.pool.SpecBlockPool.cache_partial_block`,
        with its ``Stored`` event) -- at every call, whether or not a full
        block was cached."""
        super().cache(request, num_tokens, retention, replay)
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
