"""F11, standalone: vLLM 0.25.1's ``BlockPool.cache_partial_block`` publishes
a ``BlockStored`` event whose ``extra_keys`` leave out every image but the
last one: for a partial entry that does not start the prompt, it looks for
images from the request's *last* image on (``curr_mm_idx = -1``), so an
earlier image overlapping the entry's hash block is not named.  The block's
hash itself (``request.block_hashes``) does include that image: a consumer
of the events that rebuilds the hash from ``parent_block_hash``,
``token_ids`` and ``extra_keys`` -- what the field is for ("Exposed for
external KV cache consumers to reconstruct block hashes") -- gets another
hash, and its index of the server's prefix cache is wrong.

Against vLLM alone (no kvspec import), on CPU:

    pip install vllm==0.25.1   # or: bash tools/install_vllm.sh .venv-vllm
    PYTHONHASHSEED=0 python docs/findings/repro/F11_partial_entry_event_drops_images.py

A pool hashing every 2 tokens, a group of 8-token blocks, a prompt of 8
tokens holding two images: A at tokens 0-3, B at 6-7.  The partial entry for
the first 4 tokens ends inside the block; its hash block is tokens 2-3,
inside image A.  The event's extra keys should name A (at offset -2 from
the hash block's start, as the hash does); vLLM's name nothing.

In 0.25.1 neither the managers nor the scheduler call ``cache_partial_block``
(a pool primitive): reachable through its API only.  Later releases call it
from the full-attention manager (partial-block prefix caching).

Exit status 1 and "BUG" when the event's extra keys differ from the hash's,
0 otherwise (a fixed vLLM).
"""

import sys

from vllm import SamplingParams
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.request import Request

HASH_BLOCK, BLOCK = 2, 8

kv_cache_utils.init_none_hash(sha256_cbor)
images = [MultiModalFeatureSpec(None, "image", "image-A", PlaceholderRange(offset=0, length=4)),
          MultiModalFeatureSpec(None, "image", "image-B", PlaceholderRange(offset=6, length=2))]
request = Request("r1", [9, 9, 9, 9, 1, 1, 9, 9], SamplingParams(max_tokens=8), None, mm_features=images,
                  block_hasher=kv_cache_utils.get_request_block_hasher(HASH_BLOCK, sha256_cbor))

pool = BlockPool(num_gpu_blocks=4, enable_caching=True, hash_block_size=HASH_BLOCK, enable_kv_cache_events=True)
(block,) = pool.get_new_blocks(1)
pool.cache_partial_block(request, block, num_tokens=4, kv_cache_group_id=0, block_size=BLOCK)
(event,) = pool.take_events()

# What the hash of tokens 2-3 was computed with: the request hasher's own extra keys for that hash block.
hashed, _ = kv_cache_utils.generate_block_hash_extra_keys(request, 2, 4, 0)
# The method is sound: with those keys the block's hash is rebuilt exactly.
assert kv_cache_utils.hash_block_tokens(sha256_cbor, request.block_hashes[0], event.token_ids,
                                        hashed) == request.block_hashes[1]
recomputed = kv_cache_utils.hash_block_tokens(sha256_cbor, request.block_hashes[0], event.token_ids,
                                              tuple(event.extra_keys[0]) if event.extra_keys[0] else None)
print(f"the hash block's extra keys: {hashed}")
print(f"the event's extra keys:      {event.extra_keys[0]}")
print(f"hash rebuilt from the event == the block's hash: {recomputed == request.block_hashes[1]}")
if event.extra_keys[0] != hashed or recomputed != request.block_hashes[1]:
    print("BUG: the partial entry's BlockStored event leaves out an image its hash includes")
    sys.exit(1)
print("ok")
