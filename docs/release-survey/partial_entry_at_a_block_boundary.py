# cache_partial_block at a full-block boundary (or block == hash block): asserted before 0.32, accepted from 0.32.
import inspect

import vllm
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.request import Request

init_none_hash(sha256)
pool = BlockPool(8, True, 2)
r = Request("r", list(range(8)), SamplingParams(max_tokens=1), None, block_hasher=get_request_block_hasher(2, sha256))
blocks = pool.get_new_blocks(2)
params = inspect.signature(pool.cache_partial_block).parameters
print(vllm.__version__, list(params))
kwargs = {"request": r, "block": blocks[0], "num_tokens": 4, "block_size": 4, "kv_cache_group_id": 0}
kwargs = {k: v for k, v in kwargs.items() if k in params}
try:
    out = pool.cache_partial_block(**kwargs)
    print(vllm.__version__, "num_tokens=4 in a block of 4: accepted ->", out)
except AssertionError as e:
    print(vllm.__version__, "num_tokens=4 in a block of 4: AssertionError", e)
