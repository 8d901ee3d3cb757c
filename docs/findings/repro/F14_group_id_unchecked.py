"""F14, standalone: vLLM's ``BlockPool`` takes any KV-cache group id and
packs it into the hash key's 4-byte suffix without a check: a group id of
2**32 or -1 raises ``OverflowError``, one that is not an int (``"0"``)
``AttributeError`` -- from ``get_cached_block`` and ``cache_full_blocks``
alike -- where a pool that checks its input refuses (``ValueError`` /
``TypeError``).  The state is unchanged in each case: the crash comes before
any change.  The managers pass their own group indices, so vLLM's scheduler
never sends such an id.

Against vLLM alone (no kvspec import), on CPU:

    PYTHONHASHSEED=0 python docs/findings/repro/F14_group_id_unchecked.py

Exit status 1 and "BUG" while any of them is not a refusal, 0 otherwise.
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


def attempt(what: str, call) -> str:
    pool = BlockPool(6, True, BLOCK, False)
    request = Request("a", [0, 1, 0, 1], SamplingParams(max_tokens=4), None, block_hasher=HASHER)
    blocks = pool.get_new_blocks(2)
    try:
        call(pool, request, blocks)
    except (ValueError, TypeError) as refusal:
        return f"ok: {what}: refused ({type(refusal).__name__})"
    except Exception as error:  # noqa: BLE001
        return f"BUG: {what}: raised {type(error).__name__} ({error}), not a refusal"
    return f"BUG: {what}: accepted"


def main() -> int:
    lines = []
    for group in (2**32, -1, "0"):
        lines.append(attempt(f"get_cached_block(hash, [{group!r}])",
                             lambda p, r, b, g=group: p.get_cached_block(r.block_hashes[0], [g])))
        lines.append(attempt(f"cache_full_blocks(..., kv_cache_group_id={group!r})",
                             lambda p, r, b, g=group: p.cache_full_blocks(r, b, 0, 2, BLOCK, g)))
    print("\n".join(lines))
    return 1 if any(line.startswith("BUG") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
