"""CrossHair obligations over impl's own window arithmetic (not a model).

impl's decode fast path (``KVCacheManager.allocate_slots``) trusts each
manager's ``first_computed_skipping`` to invert its
``get_num_skipped_tokens``: the least computed-token count at which ``n``
leading tokens are skipped.  If the inverse were one too large, the fast
path would skip a release vLLM makes; one too small only costs a checked
call.  Each function below calls the production methods -- on a bare
object carrying the one field they read, so no pool is built -- and states
both halves of "least" as postconditions, over every window, chunk, block
size and count in the stated bounds.  R-SWA's gap (``RSWAManager.gap_blocks``)
and its next-release point are checked the same way, as are hit alignment
(``aligned_block_count``) and group-id key packing.  The last section proves
spec == impl where both compute the same numbers: the tokens each kind of
attention skips, and R-SWA's gap.

``python -m kvspec.proofs.run`` proves these with the pool model; each
``post:`` line names the rule it protects.  ``tests/test_proofs.py`` also
plants a wrong inverse in memory and has CrossHair refute it.
"""

from __future__ import annotations

from types import SimpleNamespace

from kvspec.hashing import (  # noqa: F401 (contracts)
    block_hashes_for_size,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
)
from kvspec.impl.block_pool import _group_suffix  # noqa: F401 (read by the contracts)
from kvspec.impl.single_type_kv_cache_manager import (
    ChunkedLocalAttentionManager,
    MambaManager,
    RSWAManager,
    SlidingWindowManager,
    aligned_block_count,
)
from kvspec.spec import kinds as spec_kinds


def _swa(window: int) -> SimpleNamespace:
    return SimpleNamespace(sliding_window=window)


def swa_skip_inverse(window: int, n: int) -> int:
    """Sliding window: the inverse is exact.

    covers: SlidingWindowManager.first_computed_skipping
    pre: 1 <= window <= 4096
    pre: 1 <= n <= 1 << 20
    post: SlidingWindowManager.get_num_skipped_tokens(_swa(window), __return__) >= n  # content-soundness
    post: SlidingWindowManager.get_num_skipped_tokens(_swa(window), __return__ - 1) < n  # content-soundness
    """
    return SlidingWindowManager.first_computed_skipping(_swa(window), n)


def _chunk_skipped(chunk: int, computed: int) -> int:
    return ChunkedLocalAttentionManager.get_num_skipped_tokens(SimpleNamespace(attention_chunk_size=chunk), computed)


def chunked_skip_inverse(chunk: int, n: int) -> int:
    """Chunked local attention: the inverse is exact.

    covers: ChunkedLocalAttentionManager.first_computed_skipping
    pre: 1 <= chunk <= 8192
    pre: 1 <= n <= 1 << 20
    post: _chunk_skipped(chunk, __return__) >= n  # content-soundness
    post: _chunk_skipped(chunk, __return__ - 1) < n  # content-soundness
    """
    return ChunkedLocalAttentionManager.first_computed_skipping(SimpleNamespace(attention_chunk_size=chunk), n)


def mamba_skip_inverse(n: int) -> int:
    """Mamba: only the last state is read, so the inverse is ``n + 1``.

    covers: MambaManager.first_computed_skipping
    pre: 1 <= n <= 1 << 20
    post: MambaManager.get_num_skipped_tokens(None, __return__) >= n  # content-soundness
    post: MambaManager.get_num_skipped_tokens(None, __return__ - 1) < n  # content-soundness
    """
    return MambaManager.first_computed_skipping(None, n)


def _rswa(window: int, block_size: int) -> SimpleNamespace:
    manager = SimpleNamespace(rswa_window=window, block_size=block_size)
    manager.gap_blocks = lambda computed, prompt: RSWAManager.gap_blocks(manager, computed, prompt)
    return manager


def _reaches_the_window(gap: range, block_size: int, window_start: int) -> bool:
    """An empty gap, or one that ends at the block holding the window's first token."""
    return gap.stop <= gap.start or (gap.stop + 1) * block_size > window_start


def rswa_gap_is_between_prompt_and_window(window: int, block_size: int, prompt: int, computed: int) -> range:
    """R-SWA's gap holds only blocks wholly after the prompt and wholly
    before the window's first token.

    covers: RSWAManager.gap_blocks
    pre: 1 <= window <= 256
    pre: 1 <= block_size <= 64
    pre: 1 <= prompt <= 1024
    pre: prompt <= computed <= 4096
    post: __return__.start * block_size >= prompt  # content-soundness
    post: __return__.stop * block_size <= max(prompt, computed - window)  # content-soundness
    post: _reaches_the_window(__return__, block_size, max(prompt, computed - window))  # content-soundness
    """
    return RSWAManager.gap_blocks(_rswa(window, block_size), computed, prompt)


def _no_new_gap_block(window: int, block_size: int, prompt: int, computed: int, later: int) -> bool:
    """At ``later`` computed tokens the gap reaches no block past where it
    ended at ``computed`` (its stop, or its start while it was empty)."""
    before = RSWAManager.gap_blocks(_rswa(window, block_size), computed, prompt)
    after = RSWAManager.gap_blocks(_rswa(window, block_size), later, prompt)
    return after.stop <= max(before.stop, before.start)


def rswa_next_release(window: int, block_size: int, prompt: int, computed: int, later: int) -> float:
    """R-SWA's steady limit: below it, the gap has no block the last
    release did not cover.

    covers: RSWAManager._next_skip
    pre: 1 <= window <= 256
    pre: 1 <= block_size <= 64
    pre: 1 <= prompt <= 1024
    pre: prompt <= computed <= 4096
    pre: computed <= later
    post: later >= __return__ or _no_new_gap_block(window, block_size, prompt, computed, later)  # content-soundness
    """
    manager = _rswa(window, block_size)
    return RSWAManager._next_skip(manager, computed, prompt)


def aligned_hit_blocks(num_blocks: int, block_size: int, alignment: int) -> int:
    """``aligned_block_count``: a hit cut back to the alignment keeps only
    blocks that were found and ends on an alignment boundary.  (That it is
    the *longest* such prefix times out in CrossHair -- nonlinear in three
    symbols -- and is left to the hit-optimality oracle of the lockstep
    machines.)

    covers: aligned_block_count
    budget: 60
    pre: 0 <= num_blocks <= 12
    pre: 1 <= block_size <= 8
    pre: 1 <= alignment <= 16
    post: 0 <= __return__ <= num_blocks  # hit-soundness
    post: __return__ * block_size % alignment == 0  # hit-soundness
    """
    return aligned_block_count(num_blocks, block_size, alignment)


def group_key_roundtrip(block_hash: bytes, group_id: int) -> bytes:
    """A pool key is the block hash and the group id, both recoverable, and
    the pool's lookups build the same key [hash-map-consistency].

    covers: make_block_hash_with_group_id, get_block_hash, get_group_id
    pre: len(block_hash) == 32
    pre: 0 <= group_id < 1 << 32
    post: get_block_hash(__return__) == block_hash  # hash-map-consistency
    post: get_group_id(__return__) == group_id  # hash-map-consistency
    post: __return__ == block_hash + _group_suffix(group_id)  # hash-map-consistency
    """
    return make_block_hash_with_group_id(block_hash, group_id)


# --- spec == impl: the same numbers from the executable spec and from impl -----------------------


def _spec_group(**fields: int) -> SimpleNamespace:
    block_size = fields.pop("block_size", 1)
    return SimpleNamespace(spec=SimpleNamespace(**fields), block_size=block_size)


def _spec_skipped(kind: str, computed: int, **fields: int) -> int:
    """The spec's ``skipped_tokens`` of that group kind."""
    return getattr(spec_kinds, kind).skipped_tokens(_spec_group(**fields), computed)


def swa_skipped_agree(window: int, computed: int) -> int:
    """covers: SlidingWindowManager.get_num_skipped_tokens == spec SlidingWindow.skipped_tokens
    pre: 1 <= window <= 4096
    pre: 0 <= computed <= 1 << 20
    post: __return__ == _spec_skipped("SlidingWindow", computed, sliding_window=window)  # spec-equivalence
    """
    return SlidingWindowManager.get_num_skipped_tokens(_swa(window), computed)


def chunked_skipped_agree(chunk: int, computed: int) -> int:
    """covers: ChunkedLocalAttentionManager.get_num_skipped_tokens == spec ChunkedLocal.skipped_tokens
    pre: 1 <= chunk <= 8192
    pre: 0 <= computed <= 1 << 20
    post: __return__ == _spec_skipped("ChunkedLocal", computed, attention_chunk_size=chunk)  # spec-equivalence
    """
    return _chunk_skipped(chunk, computed)


def mamba_skipped_agree(computed: int) -> int:
    """covers: MambaManager.get_num_skipped_tokens == spec Mamba.skipped_tokens
    pre: 0 <= computed <= 1 << 20
    post: __return__ == spec_kinds.Mamba.skipped_tokens(None, computed)  # spec-equivalence
    """
    return MambaManager.get_num_skipped_tokens(None, computed)


def rswa_gap_agrees(window: int, block_size: int, prompt: int, computed: int) -> range:
    """covers: RSWAManager.gap_blocks == spec ReferenceSlidingWindow.gap
    pre: 1 <= window <= 256
    pre: 1 <= block_size <= 64
    pre: 1 <= prompt <= 1024
    pre: prompt <= computed <= 4096
    post: _same_range(__return__, _spec_rswa_gap(window, block_size, prompt, computed))  # spec-equivalence
    """
    return RSWAManager.gap_blocks(_rswa(window, block_size), computed, prompt)


def _spec_rswa_gap(window: int, block_size: int, prompt: int, computed: int) -> range:
    group = _spec_group(rswa_window=window, block_size=block_size)
    return spec_kinds.ReferenceSlidingWindow.gap(group, computed, prompt)


def _same_range(a: range, b: range) -> bool:
    return a.start == b.start and a.stop == b.stop


# --- the hash view: a group's block hashes from the pool's finer ones ----------------------------------------


def hash_view_names_the_same_prefix(hashes: list[int], hash_block_size: int, factor: int, j: int) -> int:
    """A group of block size ``B = factor * H`` sees the request's hashes
    (one per ``H`` tokens) through ``block_hashes_for_size``: its block ``j``
    must carry the fine hash that names the same token prefix, ``[0, (j+1)*B)``
    -- fine block ``(j+1)*B/H - 1`` -- and the view holds only whole blocks;
    negative indices and slices see the same blocks.  (Hashes are stand-in
    ints: the view never looks inside them.)

    covers: block_hashes_for_size, BlockHashListWithBlockSize
    pre: len(hashes) <= 12
    pre: 1 <= hash_block_size <= 4
    pre: 1 <= factor <= 4
    pre: 0 <= j < len(hashes) // factor
    post: __return__ == _fine_hash_ending_with(hashes, j, factor, hash_block_size)  # hash-map-consistency
    post: _whole_blocks_only(hashes, hash_block_size, factor)  # hash-map-consistency
    post: _view(hashes, hash_block_size, factor)[j - len(hashes) // factor] == __return__  # hash-map-consistency
    post: _slice_from(hashes, hash_block_size, factor, j)[0] == __return__  # hash-map-consistency
    """
    return _view(hashes, hash_block_size, factor)[j]


def _fine_hash_ending_with(hashes: list[int], j: int, factor: int, hash_block_size: int) -> int:
    """The fine hash that names the prefix coarse block ``j`` ends, ``[0,
    (j+1)*B)``: the hash of the fine block holding its last token."""
    tokens = (j + 1) * factor * hash_block_size
    return hashes[(tokens - 1) // hash_block_size]


def _whole_blocks_only(hashes: list[int], hash_block_size: int, factor: int) -> bool:
    """The view has a block for every whole coarse block of fine hashes, no more."""
    n = len(_view(hashes, hash_block_size, factor))
    return n * factor <= len(hashes) < (n + 1) * factor


def _slice_from(hashes: list[int], hash_block_size: int, factor: int, j: int) -> list[int]:
    """``view[j:]``, which must equal the blocks ``j, j+1, ...`` one by one."""
    view = _view(hashes, hash_block_size, factor)
    tail = list(view[j:])
    assert tail == [view[i] for i in range(j, len(view))]
    return tail


def _view(hashes: list[int], hash_block_size: int, factor: int):
    return block_hashes_for_size(hashes, hash_block_size, factor * hash_block_size)
