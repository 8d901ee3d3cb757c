# the root hash with PYTHONHASHSEED unset and sha256: random per process before 0.29, fixed from 0.29.
import vllm
from vllm.utils.hashing import sha256
from vllm.v1.core import kv_cache_utils as u

u.init_none_hash(sha256)
print(vllm.__version__, bytes(u.NONE_HASH).hex()[:16])
