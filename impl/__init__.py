"""The production implementation, with vLLM 0.25.1's class names and API.

``from kvspec.impl import BlockPool`` is a drop-in for
``from vllm.v1.core.block_pool import BlockPool``, and likewise
``KVCacheManager`` (``vllm.v1.core.kv_cache_manager``), the coordinators
(``vllm.v1.core.kv_cache_coordinator``) and the single-type managers
(``vllm.v1.core.single_type_kv_cache_manager``).  The offloading tier,
:mod:`kvspec.impl.offload`'s ``CPUOffloadingManager``, has the API of
``vllm.v1.kv_offload.cpu.manager``'s (spec chapter 11) and is imported from
its module.
"""

from kvspec.impl.block_pool import BlockHashToBlockMap, BlockPool
from kvspec.impl.kv_cache_coordinator import (
    HybridKVCacheCoordinator,
    KVCacheCoordinator,
    KVCacheCoordinatorNoPrefixCache,
    UnitaryKVCacheCoordinator,
    get_kv_cache_coordinator,
)
from kvspec.impl.kv_cache_manager import KVCacheBlocks, KVCacheManager, PrefixCacheStats
from kvspec.impl.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock
from kvspec.impl.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from kvspec.impl.single_type_kv_cache_manager import (
    ChunkedLocalAttentionManager,
    CrossAttentionManager,
    FullAttentionManager,
    MambaManager,
    RSWAManager,
    SingleTypeKVCacheManager,
    SlidingWindowManager,
    get_manager_for_kv_cache_spec,
)

__all__ = [
    "AllBlocksCleared",
    "BlockHashToBlockMap",
    "BlockPool",
    "BlockRemoved",
    "BlockStored",
    "ChunkedLocalAttentionManager",
    "CrossAttentionManager",
    "FreeKVCacheBlockQueue",
    "FullAttentionManager",
    "HybridKVCacheCoordinator",
    "KVCacheBlock",
    "KVCacheBlocks",
    "KVCacheCoordinator",
    "KVCacheCoordinatorNoPrefixCache",
    "KVCacheEvent",
    "KVCacheManager",
    "MambaManager",
    "RSWAManager",
    "PrefixCacheStats",
    "SingleTypeKVCacheManager",
    "SlidingWindowManager",
    "UnitaryKVCacheCoordinator",
    "get_kv_cache_coordinator",
    "get_manager_for_kv_cache_spec",
]
