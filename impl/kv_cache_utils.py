"""Blocks and the free-block queue (and, for drop-in imports, the hashing
names vLLM keeps in ``vllm.v1.core.kv_cache_utils``).

Data-structure choice, measured (see ``benchmarks/pool_bench.py``): vLLM
threads a doubly linked list through the blocks themselves, so each link
change is a Python attribute write.  Here the free queue is an
``OrderedDict`` from block id to block -- a doubly linked hash map written in
C -- which gives the same O(1) ``popleft`` / ``remove`` / ``append`` /
``prepend`` with a fraction of the interpreter work, and keeps the blocks
free of link fields.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from kvspec.errors import RuleError
from kvspec.hashing import (  # noqa: F401  (re-exported: vLLM keeps them here)
    NONE_HASH,
    BlockHash,
    BlockHashListWithBlockSize,
    BlockHashWithGroupId,
    ExternalBlockHash,
    generate_block_hash_extra_keys,
    get_block_hash,
    get_group_id,
    get_request_block_hasher,
    hash_block_tokens,
    init_none_hash,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
    need_extra_keys,
)


class KVCacheBlock:
    """Metadata of one physical KV-cache block.

    ``block_id`` is its index in the pool, ``ref_cnt`` how many slots hold it,
    ``block_hash`` the key (hash + group id) it is cached under, if any.
    """

    __slots__ = ("block_id", "ref_cnt", "_block_hash", "_block_hash_num_tokens", "is_null")

    def __init__(self, block_id: int, ref_cnt: int = 0, is_null: bool = False):
        self.block_id = block_id
        self.ref_cnt = ref_cnt
        self._block_hash: BlockHashWithGroupId | None = None
        self._block_hash_num_tokens: int | None = None
        self.is_null = is_null

    @property
    def block_hash(self) -> BlockHashWithGroupId | None:
        return self._block_hash

    @property
    def block_hash_num_tokens(self) -> int | None:
        return self._block_hash_num_tokens

    def set_block_hash(self, block_hash: BlockHashWithGroupId, num_tokens: int | None = None) -> None:
        if self._block_hash is not None:
            raise RuleError(
                "hash-map-consistency",
                f"block {self.block_id} already carries a hash; evict it first",
            )
        self._block_hash = block_hash
        self._block_hash_num_tokens = num_tokens

    def reset_hash(self) -> None:
        self._block_hash = None
        self._block_hash_num_tokens = None

    def __repr__(self) -> str:
        h = self._block_hash.hex()[:12] if self._block_hash else None
        null = ", null" if self.is_null else ""
        return f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt}, hash={h}{null})"


class FreeKVCacheBlockQueue:
    """The free blocks in reuse order: head = next to be reused.

    Every operation is O(1) per block.  Callers keep the order policy
    (unhashed blocks to the head, cached blocks to the tail, a request's
    blocks tail-first); the queue only keeps the order it is given.
    """

    __slots__ = ("_queue",)

    def __init__(self, blocks: Iterable[KVCacheBlock]) -> None:
        self._queue: OrderedDict[int, KVCacheBlock] = OrderedDict(
            (block.block_id, block) for block in blocks
        )

    @property
    def num_free_blocks(self) -> int:
        return len(self._queue)

    def __len__(self) -> int:
        return len(self._queue)

    def __contains__(self, block: KVCacheBlock) -> bool:
        return block.block_id in self._queue

    def popleft(self) -> KVCacheBlock:
        if not self._queue:
            raise ValueError("No free blocks available")
        return self._queue.popitem(last=False)[1]

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if n > len(self._queue):
            raise ValueError(f"cannot pop {n} blocks from a queue of {len(self._queue)}")
        pop = self._queue.popitem
        return [pop(False)[1] for _ in range(n)]

    def remove(self, block: KVCacheBlock) -> None:
        try:
            del self._queue[block.block_id]
        except KeyError:
            raise RuntimeError(f"remove() called on a block that is not free: {block}") from None

    def append(self, block: KVCacheBlock) -> None:
        self._queue[block.block_id] = block

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        queue = self._queue
        for block in blocks:
            queue[block.block_id] = block

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        """Put ``blocks`` at the head, keeping their order."""
        queue = self._queue
        to_front = queue.move_to_end
        for block in reversed(blocks):
            queue[block.block_id] = block
            to_front(block.block_id, last=False)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        return list(self._queue.values())

    def free_block_ids(self) -> list[int]:
        return list(self._queue)
