"""vLLM's offloading tier: its ``CPUOffloadingManager`` (LRU or ARC policy)
built for a layout, and read -- what the tier holds, its ref counts, its
evictable count, its policy's order -- in the plain form of spec chapter 11
(``spec/tiers.py``'s ``TierSnapshot`` fields).  The seam's floor: it imports
vLLM and nothing of conformance (the adapter over it is
:mod:`kvspec.conformance.targets.offload`).

vLLM 0.25.1's API (``vllm.v1.kv_offload``); 0.34.0 renamed the blocks
chunks (``ChunkStatus``), moved recency into ``lookup`` (no ``touch``) and
keeps LRU in a heap of request ranks -- not read here.
"""

from __future__ import annotations

from typing import Any


def vllm_offloading_manager(num_blocks: int, cache_policy: str = "lru", enable_events: bool = True,
                            store_threshold: int = 1, max_tracker_size: int = 64_000) -> Any:
    """vLLM's own ``CPUOffloadingManager`` for a layout."""
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    return CPUOffloadingManager(num_blocks, cache_policy=cache_policy, enable_events=enable_events,
                                store_threshold=store_threshold, max_tracker_size=max_tracker_size)


def is_vllm_manager(manager: Any) -> bool:
    """Whether ``manager`` is (a subclass of) vLLM's ``CPUOffloadingManager``."""
    return any(c.__module__.startswith("vllm.v1.kv_offload") and c.__name__ == "CPUOffloadingManager"
               for c in type(manager).__mro__)


def tier_state(manager: Any) -> tuple[int, dict[bytes, tuple[int, int]], int, tuple[Any, ...]]:
    """(num_blocks, key -> (block id, ref count; -1 while pending), the
    manager's own evictable count, the policy's order) of vLLM's manager."""
    policy = manager._policy
    if hasattr(policy, "t1"):  # ARC
        blocks = {**policy.t1, **policy.t2}
        order: tuple[Any, ...] = (tuple(policy.t1), tuple(policy.t2), tuple(policy.b1), tuple(policy.b2),
                                  float(policy.target_t1_size))
    else:  # LRU
        blocks = dict(policy.blocks)
        order = (tuple(policy.evictable_blocks),)
    entries = {key: (int(block.block_id), int(block.ref_cnt)) for key, block in blocks.items()}
    return manager._num_blocks, entries, manager._num_evictable_cache_blocks, order


def lru_evictable(manager: Any) -> frozenset[bytes] | None:
    """LRU's own evictable set (ARC keeps none: it derives it from ref counts)."""
    policy = manager._policy
    return None if hasattr(policy, "t1") else frozenset(policy.evictable_blocks)
