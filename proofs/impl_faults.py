"""One planted fault per obligation over impl: a mutated production function
that the obligation must refute.

Keys are obligation functions of :data:`kvspec.proofs.run.IMPL_MODULES`;
``python -m kvspec.proofs.run --planted`` applies each mutation in memory
(:class:`~kvspec.proofs.mutation.Mutation`), runs CrossHair on that one
obligation and requires a counterexample, which the report shows.
"""

from __future__ import annotations

from kvspec.proofs.mutation import Mutation

_POOL = "kvspec.impl.block_pool"
_MANAGERS = "kvspec.impl.single_type_kv_cache_manager"
_COORDINATOR = "kvspec.impl.kv_cache_coordinator"
_MANAGER = "kvspec.impl.kv_cache_manager"

IMPL_FAULTS: dict[str, Mutation] = {
    # --- impl_windows: the window arithmetic ------------------------------------------------------------------
    "swa_skip_inverse": Mutation(
        _MANAGERS, "SlidingWindowManager.first_computed_skipping",
        "num_skipped_tokens + self.sliding_window - 1", "num_skipped_tokens + self.sliding_window",
        "the decode fast path's inverse is one token late"),
    "chunked_skip_inverse": Mutation(
        _MANAGERS, "ChunkedLocalAttentionManager.first_computed_skipping",
        "cdiv(num_skipped_tokens, self.attention_chunk_size)", "(num_skipped_tokens // self.attention_chunk_size)",
        "the inverse rounds down to the chunk, not up"),
    "mamba_skip_inverse": Mutation(
        _MANAGERS, "MambaManager.first_computed_skipping",
        "num_skipped_tokens + 1", "num_skipped_tokens + 2", "the inverse is one token late"),
    "rswa_gap_is_between_prompt_and_window": Mutation(
        _MANAGERS, "RSWAManager.gap_blocks",
        "range(cdiv(num_prompt_tokens, self.block_size),", "range(num_prompt_tokens // self.block_size,",
        "the gap starts at the prompt's last, partly filled block"),
    "rswa_next_release": Mutation(
        _MANAGERS, "RSWAManager._next_skip", "(end + 1) * self.block_size", "(end + 2) * self.block_size",
        "the steady limit is a block late"),
    "aligned_hit_blocks": Mutation(
        _MANAGERS, "aligned_block_count", "num_blocks % step", "num_blocks % 1",
        "the hit is not cut back to the alignment"),
    "group_key_roundtrip": Mutation(
        "kvspec.hashing", "make_block_hash_with_group_id", '"big"', '"little"',
        "the group id is packed in the other byte order than the pool's lookups use"),
    "swa_skipped_agree": Mutation(
        _MANAGERS, "SlidingWindowManager.get_num_skipped_tokens",
        "num_computed_tokens - self.sliding_window + 1", "num_computed_tokens - self.sliding_window",
        "one token fewer is skipped than the spec says"),
    "chunked_skipped_agree": Mutation(
        _MANAGERS, "ChunkedLocalAttentionManager.get_num_skipped_tokens",
        "num_computed_tokens // self.attention_chunk_size * self.attention_chunk_size",
        "max(0, num_computed_tokens - self.attention_chunk_size)",
        "chunked attention skips like a sliding window"),
    "mamba_skipped_agree": Mutation(
        _MANAGERS, "MambaManager.get_num_skipped_tokens", "num_computed_tokens - 1", "num_computed_tokens",
        "the state the next step reads is skipped too"),
    "rswa_gap_agrees": Mutation(
        _MANAGERS, "RSWAManager.gap_blocks",
        "window_start // self.block_size)", "window_start // self.block_size + 1)",
        "the gap reaches into the window's first block"),
    "hash_view_names_the_same_prefix": Mutation(
        "kvspec.hashing", "BlockHashListWithBlockSize._at",
        "(idx + 1) * self.scale_factor - 1", "idx * self.scale_factor",
        "a coarse block takes the hash of its first fine block, a shorter prefix"),
    # --- impl_pool: the block pool -----------------------------------------------------------------------------
    "get_new_blocks_keeps_the_rules": Mutation(
        _POOL, "BlockPool.get_new_blocks", "self._evict_hash(block)", "None",
        "a reused block keeps its old hash (with events on)"),
    "cache_full_blocks_keeps_the_rules": Mutation(
        _POOL, "BlockPool._blocks_to_cache", "not block_mask[i - num_cached]", "block_mask[i - num_cached]",
        "the block mask is read inverted"),
    "touch_keeps_the_rules": Mutation(
        _POOL, "BlockPool.touch", "self.free_block_queue.num_free_blocks -= taken", "taken = taken",
        "touching a free block does not lower the free count"),
    "free_blocks_keeps_the_rules": Mutation(
        _POOL, "BlockPool.free_blocks", "(plain if block._block_hash is None or evict_first else cached)",
        "(cached if block._block_hash is None or evict_first else plain)",
        "unhashed blocks go to the tail and cached ones to the head"),
    "evict_blocks_keeps_the_rules": Mutation(
        _POOL, "BlockPool.evict_blocks", "if block._block_hash is not None:",
        "if block._block_hash is not None and block.ref_cnt == 0:", "held blocks are not evicted"),
    "reset_keeps_the_rules": Mutation(
        _POOL, "BlockPool.reset_prefix_cache", "if in_use:", "if in_use > 1:",
        "reset goes ahead with one block in use"),
    # --- impl_managers: hits ----------------------------------------------------------------------------------
    "full_attention_hit": Mutation(
        _MANAGERS, "FullAttentionManager.find_longest_cache_hit", "num_hit -= 1", "num_hit -= 0",
        "EAGLE's last block is not dropped"),
    "sliding_window_hit": Mutation(
        _MANAGERS, "SlidingWindowManager._contiguous_blocks_for_hit",
        "cdiv(window_size - 1, block_size)", "cdiv(window_size - 1, block_size) - 1",
        "a hit needs one window block fewer than the window reads"),
    "chunked_local_hit": Mutation(
        _MANAGERS, "ChunkedLocalAttentionManager.find_longest_cache_hit", "break", "continue",
        "a miss inside the chunk does not end the hit"),
    "mamba_hit": Mutation(
        _MANAGERS, "MambaManager.find_longest_cache_hit",
        "range(max_length // block_size - 1, -1, -1)", "range(max_length // block_size)",
        "the first cached state is taken, not the last"),
    "full_and_sliding_window_hit": Mutation(
        _COORDINATOR, "HybridKVCacheCoordinator.find_longest_cache_hit",
        "self._truncate_full_attention(found, settled)", "pass",
        "full attention keeps blocks past the common hit"),
    "full_and_mamba_hit": Mutation(
        _COORDINATOR, "eagle_group_ids",
        "{i for i in marked if not spec_is(groups[i].kv_cache_spec, MambaSpec)}", "marked",
        "a Mamba group is made an EAGLE group, as vLLM 0.25.1 does"),
    "three_group_eagle_hit": Mutation(
        _COORDINATOR, "HybridKVCacheCoordinator.find_longest_cache_hit",
        "if self._single_pass:", "if True:",
        "the fixed point stops after one pass"),
    # --- impl_managers: allocate_slots' counting --------------------------------------------------------------
    "allocate_with_lookahead": Mutation(
        _MANAGER, "KVCacheManager._token_counts",
        "min(num_tokens_main_model + num_lookahead_tokens, self.max_model_len)",
        "min(num_tokens_main_model, self.max_model_len)", "no slots for the lookahead tokens"),
    "allocate_with_external": Mutation(
        _MANAGERS, "SingleTypeKVCacheManager._num_external_blocks",
        "cdiv(total_computed_tokens, self.block_size) - num_held",
        "cdiv(total_computed_tokens, self.block_size) - num_held + 1", "one block too many for connector tokens"),
    "allocate_with_encoder": Mutation(
        _COORDINATOR, "KVCacheCoordinator.allocate_new_blocks", "num_encoder_tokens if encoder else num_tokens",
        "num_tokens", "cross attention is sized by the decoder tokens"),
    "allocate_mamba_align": Mutation(
        _MANAGERS, "MambaManager._num_new_blocks", "return num_required - max(num_held, state_idx) - num_moved",
        "return num_required - max(num_held, state_idx) - num_moved + 1", "one state block too many"),
    # --- impl_managers: releases -----------------------------------------------------------------------------
    "sliding_window_release": Mutation(
        _MANAGERS, "SlidingWindowManager.get_num_skipped_tokens",
        "num_computed_tokens - self.sliding_window + 1", "num_computed_tokens - self.sliding_window + 2",
        "the window's first token is released"),
    "chunked_local_release": Mutation(
        _MANAGERS, "ChunkedLocalAttentionManager.get_num_skipped_tokens",
        "num_computed_tokens // self.attention_chunk_size * self.attention_chunk_size",
        "cdiv(num_computed_tokens, self.attention_chunk_size) * self.attention_chunk_size",
        "the current chunk is released"),
    "mamba_release": Mutation(
        _MANAGERS, "MambaManager.get_num_skipped_tokens", "num_computed_tokens - 1", "num_computed_tokens",
        "the state the next step reads is released"),
    "rswa_release": Mutation(
        _MANAGERS, "RSWAManager.gap_blocks",
        "range(cdiv(num_prompt_tokens, self.block_size),", "range(num_prompt_tokens // self.block_size,",
        "the prompt's last block is released"),
}
