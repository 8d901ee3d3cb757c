"""Sliding window ``w``: a token attends to the ``w - 1`` tokens before it,
so a hit needs only the last window's positions and blocks behind the
window are skipped (spec/README.md, chapter 3)."""

from __future__ import annotations

from kvspec.kv_cache_interface import AttentionKind, cdiv
from kvspec.spec.kinds.group import (
    GroupManager,
    HitPositions,
    aligned,
)


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

    def cache_mask(self, start, end, retention, boundaries):
        """Cache only the positions a hit can ever use.

        Hits end on multiples of the scheduler block size ``A``, and use the
        last ``need`` positions before that boundary (with EAGLE the window
        is shifted one block right).  With ``per = A // B`` positions per
        aligned segment, position ``i`` is kept when
        ``(i - shift) % per >= per - need``; if ``need >= per`` every position
        is kept.  ``retention`` (vLLM's ``VLLM_PREFIX_CACHE_RETENTION_INTERVAL``)
        keeps such a tail only once per ``retention`` tokens (``0``: never),
        plus the tail before the last aligned boundary before each of
        ``boundaries`` (an exact replay of the prompt, a shared prefix's end:
        positions a later request hits).
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
        if retention is not None:
            for position in boundaries:
                latest = position // alignment * alignment
                tail_end = latest // block_size + shift
                for i in range(max(start, tail_end - need), min(end, tail_end)):
                    mask[i - start] = True
        return mask
