"""Adapters that present a block pool as a :class:`~kvspec.spec.interface.PoolTarget`.

A target is driven by block id and observed through snapshots and neutral
events, whatever its own representation.  ``SpecPoolTarget`` is the model
itself; ``ImplPoolTarget`` wraps :class:`kvspec.impl.BlockPool` -- or any
class with vLLM's ``BlockPool`` API and attributes (``blocks``,
``free_block_queue``, ``cached_block_hash_to_block``), which is how vLLM and
drop-in replacements are checked.
"""

from __future__ import annotations

from typing import Any

from kvspec.spec.interface import Cleared, Event, PoolSnapshot, Removed, Stored
from kvspec.spec.pool import SpecBlockPool


class SpecPoolTarget(SpecBlockPool):
    """The specification itself, as a target (it already speaks in ids)."""


def _neutral_event(event: Any) -> Event:
    kind = type(event).__name__
    if kind == "BlockStored":
        return Stored(
            group=event.group_idx,
            block_hashes=tuple(event.block_hashes),
            parent_block_hash=event.parent_block_hash,
            token_ids=tuple(event.token_ids),
            block_size=event.block_size,
            lora_id=event.lora_id,
            lora_name=event.lora_name,
            extra_keys=tuple(event.extra_keys) if event.extra_keys else None,
            spec_kind=getattr(event, "kv_cache_spec_kind", None),
            sliding_window=getattr(event, "kv_cache_spec_sliding_window", None),
        )
    if kind == "BlockRemoved":
        (block_hash,) = event.block_hashes
        return Removed(group=event.group_idx, block_hash=block_hash)
    if kind == "AllBlocksCleared":
        return Cleared()
    raise TypeError(f"unknown KV event {event!r}")


class _AsLaterReleasesRead:
    """A kvspec request as later vLLM releases read it: the fields they
    added to ``Request`` (``session_id``, read into KV events from 0.30)
    read as unset; everything else is the request's own."""

    ADDED = {"session_id": None}  # compat.SESSION_ID

    def __init__(self, request: Any):
        self._request = request

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(self._request, name)
        except AttributeError:
            if name in self.ADDED:
                return self.ADDED[name]
            raise


class BrokenFreeList(RuntimeError):
    """The target's free list cannot be read: it loops or breaks off."""


class VllmApiPoolTarget:
    """Any pool with vLLM 0.25.1's ``BlockPool`` API, driven by block id."""

    def __init__(self, pool: Any):
        self.pool = pool
        self.num_blocks = pool.num_gpu_blocks
        self.hash_block_size = pool.hash_block_size
        self.offers_partial_entries = hasattr(pool, "cache_partial_block")  # a fork may predate them

    def _blocks(self, block_ids: Any) -> list[Any]:
        # Ids are resolved here, so an id the pool does not have is the
        # adapter's error, raised before the pool is touched.
        blocks = self.pool.blocks
        out = []
        for b in block_ids:
            if type(b) is not int:
                raise TypeError(f"block id must be an int, got {b!r}")
            if not 0 <= b < len(blocks):
                raise ValueError(f"block id {b} is outside the pool")
            out.append(blocks[b])
        return out

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        return [b.block_id for b in self.pool.get_new_blocks(num_blocks)]

    def touch(self, block_ids: list[int]) -> None:
        self.pool.touch(self._blocks(block_ids))

    def free_blocks(self, block_ids: list[int]) -> None:
        self.pool.free_blocks(self._blocks(block_ids))

    def get_cached_block(self, block_hash: bytes, group_ids: list[int]) -> list[int] | None:
        hits = self.pool.get_cached_block(block_hash, group_ids)
        return None if hits is None else [b.block_id for b in hits]

    def cache_full_blocks(
        self,
        request: Any,
        block_ids: list[int],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        group_id: int,
        block_mask: list[bool] | None = None,
    ) -> None:
        self.pool.cache_full_blocks(
            _AsLaterReleasesRead(request), self._blocks(block_ids), num_cached_blocks, num_full_blocks, block_size,
            group_id, block_mask,
        )

    def cache_partial_block(
        self, request: Any, block_id: int, num_tokens: int, group_id: int, block_size: int
    ) -> bytes | None:
        (block,) = self._blocks([block_id])
        return self.pool.cache_partial_block(_AsLaterReleasesRead(request), block, num_tokens, group_id, block_size)

    def evict_blocks(self, block_ids: set[int]) -> None:
        self.pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

    def get_num_free_blocks(self) -> int:
        return self.pool.get_num_free_blocks()

    def get_usage(self) -> float:
        return self.pool.get_usage()

    def take_events(self) -> list[Event]:
        return [_neutral_event(e) for e in self.pool.take_events()]

    def snapshot(self) -> PoolSnapshot:
        pool = self.pool
        blocks = pool.blocks
        ref = tuple([b.ref_cnt for b in blocks])
        free = self._free_queue()
        hashed = [(b.block_id, h) for b in blocks if (h := b.block_hash) is not None]  # each block's hash read once
        return PoolSnapshot(
            num_blocks=self.num_blocks,
            ref=ref,
            free=free,
            key_of=dict(hashed),
            table=self._table(),
            partial_of={b: frozenset(keys) for b, keys in getattr(pool, "cached_block_hashes_by_block", {}).items()
                        if keys},
        )

    def _free_queue(self) -> tuple[int, ...]:
        """The free list, head first, walked at most ``num_blocks`` links: a
        list that does not end (a cycle) is reported, not followed forever."""
        queue = self.pool.free_block_queue
        head, tail = getattr(queue, "fake_free_list_head", None), getattr(queue, "fake_free_list_tail", None)
        if head is None or tail is None:  # another queue structure: its own listing
            return tuple(b.block_id for b in queue.get_all_free_blocks())
        out, block = [], head.next_free_block
        while block is not None and block is not tail:
            if len(out) >= self.num_blocks:
                raise BrokenFreeList(f"free-queue-consistency: the free list runs past {self.num_blocks} blocks "
                                     f"(a cycle through {sorted(set(out[-self.num_blocks:]))[:8]}...)")
            out.append(block.block_id)
            block = block.next_free_block
        if block is None:
            raise BrokenFreeList(f"free-queue-consistency: the free list ends after {out} without its tail")
        return tuple(out)

    def _table(self) -> dict[bytes, tuple[int, ...]]:
        table = self.pool.cached_block_hash_to_block
        if hasattr(table, "items"):
            return {k: tuple(b.block_id for b in blocks) for k, blocks in table.items()}
        from kvspec.conformance.vllm.compat import cached_table  # vLLM's map: no public iteration

        return cached_table(table)


class ImplPoolTarget(VllmApiPoolTarget):
    """kvspec's production pool as a target, built with the deltas of the
    release judged (``release``: default the reference release)."""

    def __init__(self, num_blocks: int, enable_caching: bool = True, hash_block_size: int = 16,
                 enable_kv_cache_events: bool = False, release: Any = None):
        from kvspec.dropin_releases import impl_deltas
        from kvspec.impl import BlockPool
        from kvspec.spec import releases

        super().__init__(BlockPool(num_blocks, enable_caching, hash_block_size, enable_kv_cache_events,
                                   deltas=impl_deltas(releases.as_release(release))))

