# A block holding two images, completed by a generated token: keyed by the last image only before 0.31 (two
# requests differing in the first image share the block's hash), by both from 0.31.
# Run with a vLLM release first on the path:  PYTHONHASHSEED=0 python mm_keys_on_resume.py
import vllm
from vllm.multimodal.inputs import MultiModalFeatureSpec, MultiModalKwargsItem, PlaceholderRange
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.request import Request

init_none_hash(sha256)


def request(rid: str, first_image: str, tokens: int) -> Request:
    features = [MultiModalFeatureSpec(data=MultiModalKwargsItem.dummy(), modality="image", identifier=name,
                                      mm_position=PlaceholderRange(offset=offset, length=length))
                for name, offset, length in ((first_image, 4, 2), ("B", 6, 1))]
    params = SamplingParams(max_tokens=4)
    params.update_from_generation_config({}, eos_token_id=100)
    return Request(rid, list(range(tokens)), params, None, mm_features=features,
                   block_hasher=get_request_block_hasher(4, sha256))


hashes = {}
for image in ("A", "C"):
    resumed = request(f"resumed-{image}", image, 7)  # tokens 4-7 are a block only once token 7 is generated
    resumed.append_output_token_ids(7)
    hashes[image] = resumed.block_hashes[1]
fresh = request("fresh-A", "A", 8).block_hashes[1]
print(vllm.__version__, "images A,B and C,B share the resumed block's hash:", hashes["A"] == hashes["C"],
      "| resumed equals fresh:", hashes["A"] == fresh)
