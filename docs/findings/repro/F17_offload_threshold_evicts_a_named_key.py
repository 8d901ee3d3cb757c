"""F17, standalone (the offload tier): vLLM 0.25.1's
``CPUOffloadingManager`` with ``store_threshold`` 2 or more lets a store
evict a key the same store was asked to store.  ``prepare_store`` first
keeps only the keys whose lookup count passed the threshold, then protects
only those from eviction: a key the tier already holds, whose count the
tracker has forgotten (``max_tracker_size``), is unprotected, and the store
that names it evicts it to make room for another.  The tier loses an entry
its caller was just told about (a lost hit, not wrong KV: an evicted key
is never served).  Found by ``kvspec conform --target vllm --scope offload
--layout threshold-small-tracker --budget 120`` (rules tier-eviction and
tier-policy).  0.34.0 protects every key asked.  Whether vLLM's own
OffloadingConnector sends such a store (a held key among a request's new
blocks once the tracker forgot it) is not yet established.

Against vLLM alone (no kvspec import), on CPU:

    python docs/findings/repro/F17_offload_threshold_evicts_a_named_key.py

Exit status 1 and "BUG" while the store evicts the key it names, 0 otherwise.
"""

import sys
from importlib.metadata import version

AFFECTS = ("0.25.1", "0.34.0")  # the reference release has it; 0.34.0 is the first measured without it

if not (version("vllm").split("+")[0] == "0.25.1"):  # 0.26-0.33 not measured; 0.34.0's tier API differs
    print(f"n/a: measured on vLLM 0.25.1 only (this is {version('vllm')})")
    sys.exit(0)

from vllm.v1.kv_offload.base import ReqContext, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # noqa: E402

A, B, C = (make_offload_key(bytes([i]) * 4, 0) for i in (1, 2, 3))
ctx = ReqContext(req_id="r")
tier = CPUOffloadingManager(num_blocks=1, cache_policy="lru", enable_events=True, store_threshold=2,
                            max_tracker_size=2)
tier.lookup(A, ctx)
tier.lookup(A, ctx)  # A seen twice: past the threshold
out = tier.prepare_store([A], ctx)
tier.complete_store(out.keys_to_store, ctx)  # A is in the tier, ready
tier.lookup(B, ctx)
tier.lookup(B, ctx)  # B past the threshold
tier.lookup(C, ctx)  # the tracker holds 2 keys: it forgets A's count
out = tier.prepare_store([A, B], ctx)  # a store naming A and B, with room for one
evicted = list(out.evicted_keys)
if A in evicted:
    print(f"BUG: prepare_store([A, B]) evicted A, a key it was asked to store (evicted {evicted}, "
          f"stored {list(out.keys_to_store)}); A is now {tier.lookup(A, ctx).name}")
    sys.exit(1)
print(f"ok: prepare_store([A, B]) kept A (evicted {evicted})")
