"""Attention kinds: what each kind of layer keeps, and how it finds a cache hit.

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

One module per kind, each owning its group manager, its window arithmetic
and its hit search: :mod:`~kvspec.spec.kinds.group` (what every kind
shares), :mod:`~kvspec.spec.kinds.full`, :mod:`~kvspec.spec.kinds.rswa`,
:mod:`~kvspec.spec.kinds.sliding_window`,
:mod:`~kvspec.spec.kinds.chunked_local`, :mod:`~kvspec.spec.kinds.mamba`,
:mod:`~kvspec.spec.kinds.cross_attention`; this package maps each kind to
its class (:func:`group_class`).
"""

from __future__ import annotations

from kvspec.errors import RuleError
from kvspec.kv_cache_interface import AttentionKind, KVCacheSpec, managed_kind
from kvspec.spec.kinds.chunked_local import ChunkedLocal
from kvspec.spec.kinds.cross_attention import CrossAttention
from kvspec.spec.kinds.full import FullAttention
from kvspec.spec.kinds.group import NULL, GroupManager, HitPositions, OutOfBlocks
from kvspec.spec.kinds.mamba import Mamba
from kvspec.spec.kinds.rswa import ReferenceSlidingWindow
from kvspec.spec.kinds.sliding_window import SlidingWindow, window_blocks


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


__all__ = [
    "GROUP_CLASSES",
    "NULL",
    "ChunkedLocal",
    "CrossAttention",
    "FullAttention",
    "GroupManager",
    "HitPositions",
    "Mamba",
    "OutOfBlocks",
    "ReferenceSlidingWindow",
    "SlidingWindow",
    "group_class",
    "window_blocks",
]
