"""A third-party pool with another eviction policy, as a conformance target.

It evicts the *most* recently freed cached blocks first (freed cached blocks
go to the head of the queue, not the tail).  That is a legitimate policy --
it keeps no rule of safety from holding -- so it conforms at level L1 and L2,
and fails L3 (identical observations to vLLM's LRU order) on free order::

    kvspec conform --target examples.mru_pool:make --scope pool --level L1   # conforms
    kvspec conform --target examples.mru_pool:make --scope pool --level L3   # diverges
"""

from kvspec.impl import BlockPool


class MRUBlockPool(BlockPool):
    """vLLM's BlockPool API; cached blocks freed to the head of the queue."""

    def free_blocks(self, ordered_blocks):
        blocks = list(ordered_blocks)
        cached_becoming_free = [b for b in blocks if b.ref_cnt == 1 and b.block_hash is not None and not b.is_null]
        super().free_blocks(blocks)
        for block in reversed(cached_becoming_free):
            if block.ref_cnt == 0:  # freed by this call: move it from the tail to the head
                self.free_block_queue.remove(block)
                self.free_block_queue.prepend_n([block])


def make(num_blocks, enable_caching, hash_block_size, enable_kv_cache_events):
    return MRUBlockPool(num_blocks, enable_caching, hash_block_size, enable_kv_cache_events)
