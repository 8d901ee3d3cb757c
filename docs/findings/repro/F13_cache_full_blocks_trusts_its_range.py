"""F13, standalone: vLLM's ``BlockPool.cache_full_blocks`` trusts the range
it is given, and that caching is on.  Four calls its managers never make,
each of which a pool that checks its input refuses having changed nothing:

1. ``num_cached_blocks=-1``: the call slices ``blocks[-1:num_full_blocks]``
   and the request's hashes from ``-1`` on, so the one block given for
   position 0 is keyed with the hash of the request's *last* block -- a
   later lookup of that prefix is served position 0's KV;
2. one block twice in the range (positions 0 and 1): it is keyed once,
   under position 1's hash, without a word -- whatever the block holds, one
   of the two positions is wrong;
3. more blocks to cache than the request has hashes: an ``AssertionError``
   (gone under ``python -O``), not a refusal;
4. a well-formed call to a pool built with prefix caching off: the blocks
   are keyed all the same, and a lookup of the prefix then hits them.

Against vLLM alone (no kvspec import), on CPU:

    pip install vllm==0.25.1   # or: bash tools/install_vllm.sh .venv-vllm
    PYTHONHASHSEED=0 python docs/findings/repro/F13_cache_full_blocks_trusts_its_range.py

Exit status 1 and "BUG" while any of the four is taken, 0 otherwise.
"""

import sys

from vllm import SamplingParams
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.request import Request

BLOCK = 2
kv_cache_utils.init_none_hash(sha256_cbor)
HASHER = kv_cache_utils.get_request_block_hasher(BLOCK, sha256_cbor)


def keyed(pool: BlockPool, request: Request) -> list[str]:
    """Each keyed block, with the position of the request's hash it is keyed by."""
    positions = {h: i for i, h in enumerate(request.block_hashes)}
    return [f"block {b.block_id} as position {positions.get(kv_cache_utils.get_block_hash(b.block_hash), '?')}"
            for b in pool.blocks if b.block_hash is not None]


def attempt(what: str, tokens: list[int], call, caching: bool = True) -> str:
    pool = BlockPool(6, caching, BLOCK, False)
    request = Request("a", tokens, SamplingParams(max_tokens=4), None, block_hasher=HASHER)
    blocks = pool.get_new_blocks(2)
    try:
        call(pool, request, blocks)
    except (ValueError, TypeError) as refusal:
        return f"ok: {what}: refused ({type(refusal).__name__}: {refusal})"
    except Exception as error:  # noqa: BLE001
        return f"BUG: {what}: raised {type(error).__name__} ({error or 'assert'}), not a refusal"
    return f"BUG: {what}: accepted; keyed now: {keyed(pool, request) or 'none'}"


def main() -> int:
    lines = [
        attempt("num_cached_blocks=-1, num_full_blocks=1: block 1 for position 0 of [0, 1 | 2, 3]", [0, 1, 2, 3],
                lambda p, r, b: p.cache_full_blocks(r, b[:1], -1, 1, BLOCK, 0)),
        attempt("one block twice: blocks [1, 1], positions 0 and 1", [0, 1, 0, 1],
                lambda p, r, b: p.cache_full_blocks(r, [b[0], b[0]], 0, 2, BLOCK, 0)),
        attempt("two blocks to cache, a request with one hash", [0, 1, 0],
                lambda p, r, b: p.cache_full_blocks(r, b, 0, 2, BLOCK, 0)),
        attempt("two blocks of [0, 1 | 0, 1] cached by a pool with caching off", [0, 1, 0, 1],
                lambda p, r, b: p.cache_full_blocks(r, b, 0, 2, BLOCK, 0), caching=False),
    ]
    print("\n".join(lines))
    return 1 if any(line.startswith("BUG") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
