"""The oracle: the optimal hit, by brute force.

:func:`oracle_hit_length` states what rule hit-optimality compares with: it
tries every aligned candidate length, longest first, against the pool's hash
table, and asks each group whether it could serve it
(:func:`group_can_serve`).  It shares no code with the hit search of
:mod:`kvspec.spec.kinds` and :mod:`kvspec.spec.coordinator` -- a bug there
cannot hide here.
"""

from __future__ import annotations

from typing import Any

from kvspec.kv_cache_interface import AttentionKind, cdiv
from kvspec.spec.content import key_for
from kvspec.spec.interface import PoolSnapshot
from kvspec.spec.layout import Layout
from kvspec.spec.releases import Release


def eagle_peek_limit(request: Any, layout: Layout, release: Release) -> int:
    """How far an EAGLE group may look past a hit for the block that proves
    it: ``num_tokens - 1`` in the base; from 0.32 (release delta
    ``eagle-lookahead-hashes``) in a hybrid model, the end of the request's
    last full hash block -- a block-aligned prompt's last block proves the
    block before it."""
    if release.has("eagle-lookahead-hashes") and len(layout.groups) > 1:
        return request.num_tokens // layout.hash_block_size * layout.hash_block_size
    return request.num_tokens - 1


def group_can_serve(pool: PoolSnapshot, request: Any, layout: Layout, g: int, length: int, peek_limit: int) -> bool:
    """Could group ``g`` start ``request`` with ``length`` tokens computed,
    from what the pool's hash table holds?  ``length`` must be a multiple of
    the group's block size ``B``; ``n = length / B``.  The positions it needs
    cached (under the request's hash for the position and group ``g``):

    - full attention: all of ``0 .. n-1``;
    - sliding window ``w``: the last ``max(1, cdiv(w-1, B))`` before ``n``
      (all of them when fewer exist);
    - chunked local ``c``: ``(length // c * c) // B .. n-1`` -- every block
      holding a token of the chunk of token ``length``;
    - Mamba: ``n - 1`` (the state after token ``length - 1``);
    - cross attention: never (length 0 only).

    An EAGLE group (never a Mamba group: drafts have no Mamba layers) must
    also have position ``n`` cached, ending within ``peek_limit``
    (:func:`eagle_peek_limit`): it serves ``length`` by recomputing one
    more block.  Length 0 is always served.
    """
    if length == 0:
        return True
    group = layout.views[g]
    bs = group.block_size
    if length % bs or group.kind == AttentionKind.CROSS_ATTENTION:
        return False
    n = length // bs
    if group.kind in (AttentionKind.FULL_ATTENTION, AttentionKind.RSWA):
        needed = list(range(n))
    elif group.kind == AttentionKind.SLIDING_WINDOW:
        needed = list(range(max(0, n - max(1, cdiv(group.sliding_window - 1, bs))), n))
    elif group.kind == AttentionKind.CHUNKED_LOCAL_ATTENTION:
        c = group.attention_chunk_size
        needed = list(range(length // c * c // bs, n))
    elif group.kind == AttentionKind.MAMBA:
        needed = [n - 1]
    else:
        raise ValueError(f"unknown group kind {group.kind}")
    if group.eagle and group.kind != AttentionKind.MAMBA:
        if length + bs > peek_limit:
            return False
        needed.append(n)
    return all((key := key_for(request, layout, g, i)) is not None and key in pool.table for i in needed)


def oracle_hit_length(pool: PoolSnapshot, request: Any, layout: Layout, release: Release) -> int:
    """The optimal hit: the longest length ``L <= num_tokens - 1``, a
    multiple of the layout's hit alignment, that every group can serve
    (:func:`group_can_serve`) -- found by trying every candidate, longest
    first.  0 when caching is off or the request skips reading the cache."""
    if not layout.enable_caching or getattr(request, "skip_reading_prefix_cache", False):
        return 0
    max_length = request.num_tokens - 1
    peek_limit = eagle_peek_limit(request, layout, release)
    align = layout.hit_alignment
    for length in range(max_length // align * align, 0, -align):
        if all(group_can_serve(pool, request, layout, g, length, peek_limit) for g in range(len(layout.views))):
            return length
    return 0


