"""F18, standalone (the offload tier): vLLM 0.25.1's ``CPUOffloadingManager``
under ARC refuses a store although a block could be evicted.  ARC's
``evict`` looks in T1 only while T1 is at least its target size; below it,
it looks in T2 alone and gives up (``None``) when T2 has no evictable key --
though T1 holds one.  The store is refused and the tier keeps a key ARC
itself would have given up (a lost store, never wrong KV).  Upstream:
vllm-project/vllm#55461 ("Fall back to T1 when ARC cannot reclaim enough
entries from T2"), merged; 0.34.0 has the fallback.

Against vLLM alone (no kvspec import), on CPU:

    python docs/findings/repro/F18_offload_arc_gives_up_with_a_block_to_evict.py

Exit status 1 and "BUG" while the store is refused, 0 otherwise.
"""

import sys
from importlib.metadata import version

AFFECTS = ("0.25.1", "0.34.0")  # the reference release has it; 0.34.0 is the first measured without it

if version("vllm").split("+")[0] != "0.25.1":  # 0.26-0.33 not measured; 0.34.0's tier API differs
    print(f"n/a: measured on vLLM 0.25.1 only (this is {version('vllm')})")
    sys.exit(0)

from vllm.v1.kv_offload.base import ReqContext, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # noqa: E402

A, B, C = (make_offload_key(bytes([i]) * 4, 0) for i in (1, 2, 3))
ctx = ReqContext(req_id="r")
tier = CPUOffloadingManager(num_blocks=2, cache_policy="arc", enable_events=True)


def store(*keys):
    out = tier.prepare_store(list(keys), ctx)
    if out is not None:
        tier.complete_store(out.keys_to_store, ctx)
    return out


store(A, B)  # T1: A, B
tier.touch([A], ctx)  # A used again: T2
store(C)  # evicts B from T1 (a B1 ghost)
tier.touch([B], ctx)  # B1 ghost: T1's target grows
store(B)  # evicts C from T1 (a B1 ghost)
tier.touch([C], ctx)  # B1 ghost: T1's target grows to 2
tier.prepare_load([A], ctx)  # A (T2) in use; B (T1) is evictable
out = tier.prepare_store([C], ctx)
if out is None:
    print("BUG: prepare_store([C]) gave up with B evictable (T1 under its target, T2's only key in use)")
    sys.exit(1)
print(f"ok: prepare_store([C]) evicted {list(out.evicted_keys)}")
