# free-order-without-caching (0.27.0) and free-order-restored (0.28.0): where a pool with caching off puts
# freed blocks.  Take 3 of 5 blocks and free them as a request does (last first).
import vllm
from vllm.v1.core.block_pool import BlockPool

for caching in (True, False):
    pool = BlockPool(6, caching, 2)
    blocks = pool.get_new_blocks(3)
    pool.free_blocks(blocks[::-1])
    free = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    print(vllm.__version__, "caching" if caching else "no caching", free)
