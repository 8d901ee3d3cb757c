"""Chunked local attention ``c``: a token attends to its own chunk of ``c``
tokens, so a hit needs the positions of the chunk it ends in and earlier
chunks are skipped (spec/README.md, chapter 3)."""

from __future__ import annotations

from kvspec.kv_cache_interface import AttentionKind
from kvspec.spec.kinds.group import (
    GroupManager,
    HitPositions,
)


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
