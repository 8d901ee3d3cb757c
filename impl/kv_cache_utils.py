"""Blocks and the free-block queue (and, for drop-in imports, the hashing
names vLLM keeps in ``vllm.v1.core.kv_cache_utils``).

Data-structure choice, measured (``benchmarks/pool_bench.py``): the free
queue is a doubly linked list threaded through the blocks themselves
(``prev_free_block`` / ``next_free_block``) between two sentinels, as in
vLLM.  An ``OrderedDict`` keyed by block id was tried first: it matched at
10k blocks but fell to 0.6x vLLM's touch+free at 1M, because a removal and
re-insertion touches the dict's slot, its node array, the node and both
neighbours -- memory fetches once the pool outgrows the CPU cache -- while
the intrusive list touches only the block and its two neighbours.  The pool's
hot paths (``touch``, ``free_blocks``, ``get_new_blocks``) link and unlink
inline rather than through these methods.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvspec import hashing
from kvspec.errors import RuleError
from kvspec.hashing import (  # noqa: F401  (re-exported: vLLM keeps them here)
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


def __getattr__(name: str):
    # NONE_HASH is read live from kvspec.hashing: init_none_hash() there (or
    # through this module) replaces the root, and callers that read
    # ``kv_cache_utils.NONE_HASH`` afterwards -- as vLLM's own tests do -- see it.
    if name == "NONE_HASH":
        return hashing.NONE_HASH
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class KVCacheBlock:
    """Metadata of one physical KV-cache block.

    ``block_id`` is its index in the pool, ``ref_cnt`` how many slots hold it,
    ``block_hash`` the key (hash + group id) it is cached under, if any.  The
    two links are set exactly while the block is in the free queue.
    """

    __slots__ = (
        "block_id", "ref_cnt", "_block_hash", "_block_hash_num_tokens", "is_null",
        "prev_free_block", "next_free_block",
    )

    def __init__(self, block_id: int, ref_cnt: int = 0, is_null: bool = False):
        self.block_id = block_id
        self.ref_cnt = ref_cnt
        self._block_hash: BlockHashWithGroupId | None = None
        self._block_hash_num_tokens: int | None = None
        self.is_null = is_null
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None

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
    ``head`` and ``tail`` are sentinels, never handed out.
    """

    __slots__ = ("head", "tail", "num_free_blocks")

    def __init__(self, blocks: Iterable[KVCacheBlock]) -> None:
        self.head = KVCacheBlock(-1)
        self.tail = KVCacheBlock(-1)
        self.head.next_free_block = self.tail
        self.tail.prev_free_block = self.head
        self.num_free_blocks = 0
        self.append_n(list(blocks))

    @property
    def fake_free_list_head(self) -> KVCacheBlock:
        """vLLM's name for the head sentinel."""
        return self.head

    @property
    def fake_free_list_tail(self) -> KVCacheBlock:
        """vLLM's name for the tail sentinel."""
        return self.tail

    def __len__(self) -> int:
        return self.num_free_blocks

    def __contains__(self, block: KVCacheBlock) -> bool:
        return block.prev_free_block is not None

    def popleft(self) -> KVCacheBlock:
        if not self.num_free_blocks:
            raise ValueError("No free blocks available")
        return self.popleft_n(1)[0]

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if n > self.num_free_blocks:
            raise ValueError(f"cannot pop {n} blocks from a queue of {self.num_free_blocks}")
        out = []
        block = self.head.next_free_block
        for _ in range(n):
            out.append(block)
            nxt = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = nxt
        self.head.next_free_block = block
        block.prev_free_block = self.head  # type: ignore[union-attr]
        self.num_free_blocks -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free_block, block.next_free_block
        if prev is None or nxt is None:
            raise RuntimeError(f"remove() called on a block that is not free: {block}")
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        self.append_n([block])

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        last = self.tail.prev_free_block
        if last is None:  # a corrupted queue (vLLM's check; free_blocks links inline)
            raise AssertionError("[free-queue-consistency] the free queue's tail sentinel is unlinked")
        for block in blocks:
            last.next_free_block = block  # type: ignore[union-attr]
            block.prev_free_block = last
            last = block
        last.next_free_block = self.tail  # type: ignore[union-attr]
        self.tail.prev_free_block = last
        self.num_free_blocks += len(blocks)

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        """Put ``blocks`` at the head, keeping their order."""
        first = self.head.next_free_block
        prev = self.head
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
        prev.next_free_block = first
        first.prev_free_block = prev  # type: ignore[union-attr]
        self.num_free_blocks += len(blocks)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        out = []
        block = self.head.next_free_block
        while block is not self.tail:
            out.append(block)
            block = block.next_free_block  # type: ignore[union-attr]
        return out

    def free_block_ids(self) -> list[int]:
        return [b.block_id for b in self.get_all_free_blocks()]
