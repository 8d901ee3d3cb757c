"""The production implementation, with vLLM 0.25.1's class names and API.

``from kvspec.impl import BlockPool`` is a drop-in for
``from vllm.v1.core.block_pool import BlockPool``.
"""

from kvspec.impl.block_pool import BlockHashToBlockMap, BlockPool
from kvspec.impl.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock
from kvspec.impl.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent

__all__ = [
    "AllBlocksCleared",
    "BlockHashToBlockMap",
    "BlockPool",
    "BlockRemoved",
    "BlockStored",
    "FreeKVCacheBlockQueue",
    "KVCacheBlock",
    "KVCacheEvent",
]
