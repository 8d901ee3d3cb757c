"""Deliberately broken pools: each breaks exactly one rule, so the tests can
show that the rule's predicate (and the machine) catches it."""

from kvspec.conformance.targets.pool import VllmApiPoolTarget
from kvspec.impl import BlockPool


class DoubleDecrement(BlockPool):
    """Frees a cached block's reference twice when it is freed alone."""

    def free_blocks(self, ordered_blocks):
        blocks = list(ordered_blocks)
        super().free_blocks(blocks)
        for b in blocks:
            if b.ref_cnt > 0 and not b.is_null:
                b.ref_cnt -= 1
                if b.ref_cnt == 0:
                    self.free_block_queue.append(b)
                return


class NullEnqueued(BlockPool):
    """Puts the null block into the free queue when a table holding it is freed."""

    def free_blocks(self, ordered_blocks):
        blocks = list(ordered_blocks)
        super().free_blocks(blocks)
        if any(b.is_null for b in blocks) and self.null_block not in self.free_block_queue:
            self.free_block_queue.append(self.null_block)


class StaleHash(BlockPool):
    """Reuses cached blocks without evicting their hash."""

    def get_new_blocks(self, num_blocks):
        if type(num_blocks) is not int or not 0 <= num_blocks <= self.get_num_free_blocks():
            return super().get_new_blocks(num_blocks)
        ret = self.free_block_queue.popleft_n(num_blocks)
        for b in ret:
            b.ref_cnt = 1
        return ret


class ReversedFreeOrder(BlockPool):
    """Puts freed blocks back in the opposite order."""

    def free_blocks(self, ordered_blocks):
        super().free_blocks(list(ordered_blocks)[::-1])


class RefusalThatChanges(BlockPool):
    """Takes what it can before refusing an allocation that is too large."""

    def get_new_blocks(self, num_blocks):
        if type(num_blocks) is int and num_blocks > self.get_num_free_blocks() > 0:
            super().get_new_blocks(1)
        return super().get_new_blocks(num_blocks)


class ResetWhileInUse(BlockPool):
    """Resets the prefix cache even while blocks are held."""

    def reset_prefix_cache(self):
        self.cached_block_hash_to_block.clear()
        for b in self.blocks:
            b.reset_hash()
        return True


class SilentEviction(BlockPool):
    """Evicts by id without telling event consumers."""

    def evict_blocks(self, block_ids):
        if any(not 0 <= b < len(self.blocks) for b in block_ids):
            raise ValueError(f"no such block among {sorted(block_ids)}")  # the bug is elsewhere
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.block_hash is not None:
                self.cached_block_hash_to_block.pop(block.block_hash, block_id)
                block.reset_hash()


class TouchKeepsQueued(BlockPool):
    """Takes a hit without removing the block from the free queue."""

    def touch(self, blocks):
        for b in blocks:
            if not b.is_null:
                b.ref_cnt += 1


class TableWithoutBlockHash(BlockPool):
    """Evicts the hash from the block but leaves the table entry behind."""

    def evict_blocks(self, block_ids):
        ids = list(block_ids)
        if not all(type(b) is int and 0 <= b < len(self.blocks) for b in ids):
            return super().evict_blocks(ids)  # a clean refusal: the planted bug is the table, not the input check
        for block_id in ids:
            self.blocks[block_id].reset_hash()


class FirstGroupForAll(BlockPool):
    """A lookup for several groups answers with the first group's block for each."""

    def get_cached_block(self, block_hash, kv_cache_group_ids):
        first = super().get_cached_block(block_hash, list(kv_cache_group_ids)[:1])
        return None if first is None else first * len(kv_cache_group_ids)


def target(pool_cls):
    def factory(num_blocks, enable_caching, hash_block_size, events):
        return VllmApiPoolTarget(pool_cls(num_blocks, enable_caching, hash_block_size, events))

    factory.__name__ = pool_cls.__name__
    return factory


BROKEN = {
    "ref-conservation": DoubleDecrement,
    "null-exclusion": NullEnqueued,
    "hash-map-consistency": StaleHash,
    "free-order": ReversedFreeOrder,
    "allocation-accounting": RefusalThatChanges,
    "reset": ResetWhileInUse,
    "free-queue-consistency": TouchKeepsQueued,
}


class SnapshotExplodes(VllmApiPoolTarget):
    """A target that raises where no refusal is possible (its snapshot fails
    once the pool runs low): the run must report it, not crash."""

    def __init__(self, num_blocks, enable_caching=True, hash_block_size=16, enable_kv_cache_events=False):
        super().__init__(BlockPool(num_blocks, enable_caching, hash_block_size, enable_kv_cache_events))

    def snapshot(self):
        if self.pool.get_num_free_blocks() < 3:
            raise RuntimeError("snapshot exploded")
        return super().snapshot()


class CyclicFreeList(BlockPool):
    """Freeing three or more blocks at once links the queue's last block back
    to its first: the free list never ends (a walk over it would hang)."""

    def free_blocks(self, ordered_blocks):
        blocks = list(ordered_blocks)
        super().free_blocks(blocks)
        queue = self.free_block_queue
        first, last = queue.fake_free_list_head.next_free_block, queue.fake_free_list_tail.prev_free_block
        if len(blocks) >= 3 and first is not last and first is not queue.fake_free_list_tail:
            last.next_free_block = first


class HangsOnFirstAllocation(BlockPool):
    """The pool's first allocation sends it into an endless loop of its own
    (one an in-process alarm can still interrupt).  The first, not a rarer
    event: a budgeted search's slices are timed and, in a suite, share the
    process with other searches; a hang on reusing a handed-out block, and
    then one on the third allocation, never came within a 5 s budget of the
    tiny pool in CI (1,413 and 1,683 operations over 8 distinct states,
    2026-12-07), while every state past the empty pool starts with an
    allocation."""

    def get_new_blocks(self, num_blocks):
        if type(num_blocks) is int and 0 < num_blocks <= self.get_num_free_blocks():
            import time

            while True:
                time.sleep(0.05)
        return super().get_new_blocks(num_blocks)


class IgnoresAlarms(BlockPool):
    """The pool's third allocation shuts out SIGALRM and loops: a target
    stuck where no in-process watchdog reaches (as a native loop would be).
    Only a process watchdog can stop it.  (The third allocation, not a
    rarer event such as reusing a cached block, so that every search meets
    it within a second whatever the machine's load.)"""

    def get_new_blocks(self, num_blocks):
        if type(num_blocks) is int and 0 < num_blocks <= self.get_num_free_blocks():
            self.allocations = getattr(self, "allocations", 0) + 1
            if self.allocations == 3:
                import signal
                import time

                signal.signal(signal.SIGALRM, signal.SIG_IGN)
                while True:
                    time.sleep(0.05)
        return super().get_new_blocks(num_blocks)


class SlowButReturns(BlockPool):
    """Every allocation takes 0.9 s of wall time and then returns as it
    should: a correct pool on a starved machine.  Whatever call is in flight
    when the budget runs out, it returns -- a slow call is not a hang."""

    def get_new_blocks(self, num_blocks):
        if type(num_blocks) is int and 0 < num_blocks <= self.get_num_free_blocks():
            import time

            time.sleep(0.9)
        return super().get_new_blocks(num_blocks)
