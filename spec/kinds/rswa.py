"""Reference sliding window (R-SWA): full attention's hits and tables, but
the blocks of the gap -- past the prompt and behind the window -- are
skipped (spec/README.md, chapter 3)."""

from __future__ import annotations

from kvspec.kv_cache_interface import AttentionKind, cdiv
from kvspec.spec.kinds.full import FullAttention


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
