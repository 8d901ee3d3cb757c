"""Produce ``tests/vectors/hash_chain.json``: block-hash test vectors computed by
vLLM 0.25.1's own code.

Nothing in the output is computed by kvspec or by hand.  Every expected value
comes from calling vLLM's functions:

* ``vllm.v1.core.kv_cache_utils.init_none_hash`` (the root hash),
  ``hash_block_tokens``, ``get_request_block_hasher``,
  ``generate_block_hash_extra_keys``, ``make_block_hash_with_group_id``,
  ``get_block_hash``, ``get_group_id``, ``maybe_convert_block_hash`` and
  ``BlockHashListWithBlockSize``;
* ``vllm.utils.hashing.sha256_cbor`` (the hash function);
* real ``vllm.v1.request.Request`` objects, with
  ``vllm.lora.request.LoRARequest``, ``cache_salt`` and
  ``vllm.multimodal.inputs.MultiModalFeatureSpec`` / ``PlaceholderRange``;
  their ``block_hashes`` are filled by vLLM's own ``update_block_hashes``
  (at construction and on every ``append_output_token_ids``).

How to regenerate
-----------------
1. Install vLLM 0.25.1 (CPU only) in its own venv::

       tools/install_vllm.sh /opt/kvspec-vllm

2. Run this script with that venv's python, from the repository root::

       PYTHONHASHSEED=0 /opt/kvspec-vllm/bin/python tools/make_hash_vectors.py

   (``-o PATH`` writes elsewhere; ``--check`` compares with the existing
   file instead of writing, exit status 1 on any difference.)

The output is deterministic: rerunning gives a byte-identical file.

Seeds
-----
vLLM's root hash is ``sha256_cbor(os.getenv("PYTHONHASHSEED"))`` (the
*string*), read when ``init_none_hash`` runs.  This script computes one
vector set per seed in ``SEEDS``, each in a fresh child process:

* seeds that CPython itself accepts (an integer in [0, 4294967295] or
  ``"random"``) are given to the child as a real ``PYTHONHASHSEED``
  environment variable, exactly as a vLLM server would see them;
* other strings (``"kvspec"``) make CPython refuse to start ("Fatal Python
  error: PYTHONHASHSEED must be "random" or an integer"), so a real server
  can never run with them; the child sets ``os.environ["PYTHONHASHSEED"]``
  before calling ``init_none_hash``, which is what vLLM reads.  They are kept
  because they test the string hashing with a non-numeric value.

Note ``"random"``: CPython then randomises ``hash()``, but vLLM's root hash is
the deterministic ``sha256_cbor("random")``.

JSON layout (all hashes are lowercase hex of the raw bytes)
-----------------------------------------------------------
``seeds[*]`` holds, for one seed:

``root_hash``
    vLLM's ``NONE_HASH``.
``block_vectors``
    direct ``hash_block_tokens(sha256_cbor, parent, tokens, extra_keys)``
    calls; ``parent`` is hex or ``null`` (``""`` means the empty bytes
    ``b""``, which vLLM also treats as "no parent").  Extra keys are JSON
    lists (vLLM passes tuples; CBOR encodes both as arrays), a
    multimodal key ``(identifier, offset)`` being a 2-element list.
``request_vectors``
    a real ``Request`` (prompt, optional LoRA name / cache salt /
    multimodal features / prompt embeddings -- a tensor given as dtype,
    shape and the hex of its raw bytes), optionally grown by ``append_output_token_ids``
    one list per step; ``expected_block_hashes_after_each_step[i]`` is
    ``request.block_hashes`` after the prompt (i = 0) and after each append;
    ``expected_extra_keys`` is ``generate_block_hash_extra_keys`` for every
    full block of the final token list, called with
    ``start_mm_idx = 0``.
``group_id_vectors``
    ``make_block_hash_with_group_id`` and the two unpacking functions.
``view_vectors``
    ``BlockHashListWithBlockSize(fine_hashes, hash_block_size,
    target_block_size)``: ``len``, the full list, slices, and single
    indices (expected hex or ``"IndexError"``), including vLLM's answers for
    negative indices.
``event_hash_vectors``
    ``maybe_convert_block_hash`` under a given
    ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` value (``null`` = unset): an
    integer is written as a decimal string, bytes as ``{"bytes": hex}``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = REPO_ROOT / "tests" / "vectors" / "hash_chain.json"

# The release the vectors come from: spec/releases/base.py's BASE, read as text (nothing here imports kvspec).
BASE = re.search(r'^BASE = "([^"]+)"',
                 (Path(__file__).resolve().parents[1] / "spec" / "releases" / "base.py").read_text(), re.M)[1]
SEEDS = ["0", "42", "random", "kvspec"]
FORMAT_VERSION = 1


# --- child: compute one seed's vectors with vLLM ------------------------------


def _python_accepts_hash_seed(seed: str) -> bool:
    if seed == "random":
        return True
    return seed.isdigit() and 0 <= int(seed) <= 4294967295


def _jsonable_extra_keys(extra: Any) -> Any:
    """vLLM's extra keys (tuple of str / (str, int) tuples / bytes) as JSON."""
    if extra is None:
        return None
    out = []
    for key in extra:
        if isinstance(key, tuple):
            out.append(list(key))
        elif isinstance(key, bytes):  # prompt-embeds digests; not used here
            out.append({"bytes": key.hex()})
        else:
            out.append(key)
    return out


def _tupled_extra_keys(extra: Any) -> tuple[Any, ...] | None:
    """The inverse of ``_jsonable_extra_keys`` for the inputs we build."""
    if extra is None:
        return None
    return tuple(tuple(k) if isinstance(k, list) else k for k in extra)


def compute_seed_vectors(seed: str) -> dict[str, Any]:
    """All vectors for one seed; runs in a child whose PYTHONHASHSEED is set."""
    os.environ["PYTHONHASHSEED"] = seed  # no-op when the child got it already
    os.environ.pop("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", None)

    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core import kv_cache_utils as kcu

    kcu.init_none_hash(sha256_cbor)
    root = kcu.NONE_HASH
    fine = kcu.hash_block_tokens(sha256_cbor, None, [1, 2, 3, 4], None)
    return {
        "seed": seed,
        "seed_given_to_python_at_startup": _python_accepts_hash_seed(seed),
        "root_hash": root.hex(),
        "block_vectors": _block_vectors(),
        "request_vectors": _request_vectors(),
        "group_id_vectors": _group_id_vectors(fine, root),
        "view_vectors": _view_vectors(),
        "event_hash_vectors": _event_hash_vectors(fine, root),
    }


def _block_vectors() -> list[dict[str, Any]]:
    """Direct ``hash_block_tokens`` calls."""
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core import kv_cache_utils as kcu

    block_vectors: list[dict[str, Any]] = []

    def block_vector(name: str, parent: bytes | None, tokens: list[int], extra: Any):
        got = kcu.hash_block_tokens(sha256_cbor, parent, tokens, _tupled_extra_keys(extra))
        block_vectors.append({
            "name": name,
            "parent": None if parent is None else parent.hex(),
            "tokens": tokens,
            "extra_keys": extra,
            "expected": got.hex(),
        })
        return got

    b0 = block_vector("first block, no parent", None, [1, 2, 3, 4], None)
    block_vector("empty parent bytes mean no parent", b"", [1, 2, 3, 4], None)
    block_vector("child of the first block", b0, [5, 6, 7, 8], None)
    block_vector("same tokens, other parent", kcu.hash_block_tokens(
        sha256_cbor, None, [9, 9, 9, 9], None), [5, 6, 7, 8], None)
    block_vector("single token block", None, [7], None)
    block_vector("CBOR integer-width boundaries", None,
                 [0, 23, 24, 255, 256, 65535, 65536, 4294967295, 4294967296], None)
    block_vector("LoRA name", None, [1, 2, 3, 4], ["adapter-a"])
    block_vector("cache salt", None, [1, 2, 3, 4], ["salt-1"])
    block_vector("multimodal key", None, [1, 2, 3, 4], [["mm-0", 2]])
    block_vector("LoRA + two multimodal keys + salt", b0, [5, 6, 7, 8],
                 ["adapter-a", ["mm-0", -2], ["mm-1", 3], "salt-1"])
    block_vector("non-ASCII salt", None, [1, 2, 3, 4], ["sälz-\u6f22"])
    return block_vectors


def _request_vectors() -> list[dict[str, Any]]:
    """Real ``Request`` objects, their block hashes after the prompt and each append."""
    tokens10 = list(range(100, 110))
    cases: list[tuple[str, int, list[int], dict[str, Any]]] = [
        ("plain, hash_block_size 2, partial tail", 2, tokens10, {}),
        ("plain, hash_block_size 4, partial tail", 4, tokens10, {}),
        ("plain, shorter than one block", 4, [1, 2, 3], {}),
        ("plain, exactly three blocks of 4", 4, list(range(12)), {}),
        ("plain, grown by decode steps", 4, [11, 12, 13, 14, 15, 16],
         {"appends": [[17], [18], [19, 20, 21], [22], [23, 24, 25, 26, 27]]}),
        ("LoRA name on every block", 4, tokens10, {"lora_name": "adapter-a"}),
        ("other LoRA name", 4, tokens10, {"lora_name": "adapter-b"}),
        ("cache salt on the first block only", 4, tokens10, {"cache_salt": "tenant-1"}),
        ("other cache salt", 2, tokens10, {"cache_salt": "tenant-2"}),
        ("LoRA + cache salt, grown by decode steps", 4, tokens10,
         {"appends": [[1, 2], [3, 4, 5, 6]], "lora_name": "adapter-a", "cache_salt": "tenant-1"}),
        ("multimodal: one image inside a block, one across blocks", 4, list(range(20)),
         {"mm": [("img-a", 1, 2), ("img-b", 6, 7)]}),
        ("multimodal: two images in one block, image at offset 0", 4, list(range(16)),
         {"mm": [("img-a", 0, 1), ("img-b", 2, 2), ("img-c", 9, 3)]}),
        ("multimodal: same image id at two positions", 2, list(range(12)),
         {"mm": [("img-a", 1, 3), ("img-a", 7, 3)]}),
        ("prompt as float32 embeddings (placeholder ids)", 4, [0] * 10, {"embeds": ("float32", 3, 0.5)}),
        ("same placeholder ids, other embeddings", 4, [0] * 10, {"embeds": ("float32", 3, 1.5)}),
        ("bfloat16 embeddings, grown by decode steps past the prompt", 2, [0] * 5,
         {"appends": [[7], [8, 9], [10, 11, 12]], "embeds": ("bfloat16", 4, -2.0)}),
        ("embeddings + LoRA + salt", 4, [3, 1, 4, 1, 5, 9, 2, 6],
         {"lora_name": "adapter-a", "cache_salt": "tenant-1", "embeds": ("float16", 2, 0.25)}),
        ("multimodal + LoRA + salt, grown by decode steps", 4, list(range(14)),
         {"appends": [[50, 51], [52, 53, 54, 55]], "lora_name": "adapter-a", "cache_salt": "tenant-1",
          "mm": [("img-a", 2, 5), ("img-b", 10, 3)]}),
    ]
    return [_request_vector(f"vec-{i}", name, size, prompt, **options)
            for i, (name, size, prompt, options) in enumerate(cases)]


def _request_vector(
    request_id: str,
    name: str,
    hash_block_size: int,
    prompt: list[int],
    appends: list[list[int]] = (),  # type: ignore[assignment]
    lora_name: str | None = None,
    cache_salt: str | None = None,
    mm: list[tuple[str, int, int]] = (),  # type: ignore[assignment]
    embeds: tuple[str, int, float] | None = None,
) -> dict[str, Any]:
    """One request built by vLLM, grown by ``appends``, with its hashes after each step."""
    import torch
    from vllm.lora.request import LoRARequest
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core import kv_cache_utils as kcu
    from vllm.v1.request import Request
    from vllm.v1.utils import tensor_data

    lora = LoRARequest(lora_name=lora_name, lora_int_id=1, lora_path="/unused") if lora_name is not None else None
    features = [
        MultiModalFeatureSpec(data=None, modality="image", identifier=ident,
                              mm_position=PlaceholderRange(offset=offset, length=length))
        for ident, offset, length in mm
    ]
    prompt_embeds = None
    if embeds is not None:  # (dtype, width, offset): a fixed, non-trivial tensor
        dtype, width, offset = embeds
        values = torch.arange(len(prompt) * width, dtype=torch.float64).reshape(len(prompt), width)
        prompt_embeds = (values * 0.37 + offset).to(getattr(torch, dtype))
    req = Request(
        request_id=request_id,
        prompt_token_ids=list(prompt),
        prompt_embeds=prompt_embeds,
        sampling_params=SamplingParams(max_tokens=64),
        pooling_params=None,
        mm_features=features or None,
        lora_request=lora,
        cache_salt=cache_salt,
        block_hasher=kcu.get_request_block_hasher(hash_block_size, sha256_cbor),
    )
    snapshots = [[h.hex() for h in req.block_hashes]]
    for step in appends:
        req.append_output_token_ids(list(step))
        snapshots.append([h.hex() for h in req.block_hashes])
    extra_keys = []
    for start in range(0, req.num_tokens - hash_block_size + 1, hash_block_size):
        extra, _ = kcu.generate_block_hash_extra_keys(req, start, start + hash_block_size, 0)
        extra_keys.append(_jsonable_extra_keys(extra))
    return {
        "name": name,
        "hash_block_size": hash_block_size,
        "prompt_token_ids": list(prompt),
        "appended_token_ids": [list(s) for s in appends],
        "lora_name": lora_name,
        "cache_salt": cache_salt,
        "mm_features": [{"identifier": i, "offset": o, "length": n} for i, o, n in mm],
        "prompt_embeds": None if prompt_embeds is None else {
            "dtype": embeds[0],
            "shape": list(prompt_embeds.shape),
            "hex": bytes(tensor_data(prompt_embeds)).hex(),
        },
        "need_extra_keys": kcu.need_extra_keys(req),
        "expected_block_hashes_after_each_step": snapshots,
        "expected_extra_keys": extra_keys,
    }


def _group_id_vectors(fine: bytes, root: bytes) -> list[dict[str, Any]]:
    """``make_block_hash_with_group_id`` and the two unpacking functions."""
    from vllm.v1.core import kv_cache_utils as kcu

    vectors = []
    for group_id in (0, 1, 7, 255, 256, 2**32 - 1):
        for block_hash in (fine, root):
            key = kcu.make_block_hash_with_group_id(block_hash, group_id)
            vectors.append({
                "block_hash": block_hash.hex(),
                "group_id": group_id,
                "expected": key.hex(),
                "expected_block_hash": kcu.get_block_hash(key).hex(),
                "expected_group_id": kcu.get_group_id(key),
            })
    return vectors


# (start, stop, step) of the slices every view vector takes.
VIEW_SLICES = ((None, None, None), (1, None, None), (None, -1, None), (0, 100, 2), (-2, None, None),
               (None, None, -1), (3, 1, None))


def _view_vectors() -> list[dict[str, Any]]:
    """``BlockHashListWithBlockSize`` over fine hashes: length, list, indices, slices."""
    sizes = [(8, 2, 2), (8, 2, 4), (9, 2, 4), (9, 2, 6), (7, 2, 8),
             (3, 4, 16)]  # the last: shorter than one target block, an empty view
    return [_view_vector(*size) for size in sizes]


def _view_vector(num_fine: int, hash_block_size: int, target_block_size: int) -> dict[str, Any]:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core import kv_cache_utils as kcu
    from vllm.v1.request import Request

    req = Request(
        request_id="view",
        prompt_token_ids=list(range(num_fine * hash_block_size)),
        sampling_params=SamplingParams(max_tokens=1),
        pooling_params=None,
        block_hasher=kcu.get_request_block_hasher(hash_block_size, sha256_cbor),
    )
    fine_hashes = list(req.block_hashes)
    view = kcu.BlockHashListWithBlockSize(fine_hashes, hash_block_size, target_block_size)
    n = len(view)
    indices = {}
    for i in range(-n - 2, n + 2):
        try:
            indices[str(i)] = view[i].hex()
        except IndexError:
            indices[str(i)] = "IndexError"
    slices = [
        {"start": start, "stop": stop, "step": step,
         "expected": [h.hex() for h in view[slice(start, stop, step)]]}
        for start, stop, step in VIEW_SLICES
    ]
    return {
        "fine_hashes": [h.hex() for h in fine_hashes],
        "hash_block_size": hash_block_size,
        "target_block_size": target_block_size,
        "expected_len": n,
        "expected_list": [h.hex() for h in view],
        "expected_index": indices,
        "expected_slices": slices,
    }


def _event_hash_vectors(fine: bytes, root: bytes) -> list[dict[str, Any]]:
    """``maybe_convert_block_hash`` under each ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` value."""
    from vllm.v1.core import kv_cache_utils as kcu

    vectors = []
    for env_value in (None, "1", "0", "00"):
        if env_value is None:
            os.environ.pop("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", None)
        else:
            os.environ["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"] = env_value
        for block_hash in (fine, root):
            out = kcu.maybe_convert_block_hash(block_hash)
            vectors.append({
                "env": env_value,
                "block_hash": block_hash.hex(),
                "expected": {"bytes": out.hex()} if isinstance(out, bytes) else str(out),
            })
    os.environ.pop("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", None)
    return vectors


# --- parent: one child per seed, then write -----------------------------------


def run_child(seed: str) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", None)
    if _python_accepts_hash_seed(seed):
        env["PYTHONHASHSEED"] = seed
    else:
        env.pop("PYTHONHASHSEED", None)
    # vLLM logs to stdout, so the child hands its JSON back through a file.
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "vectors.json"
        proc = subprocess.run(
            [sys.executable, __file__, "--child-seed", seed, "--child-out", str(out)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            sys.stderr.write(proc.stdout + proc.stderr)
            raise SystemExit(f"vector child for seed {seed!r} failed")
        return json.loads(out.read_text(encoding="utf-8"))


def build() -> dict[str, Any]:
    import vllm  # only for the version; the children do the work

    return {
        "format": FORMAT_VERSION,
        "description": (
            "Block-hash test vectors computed by vLLM's own functions; "
            "see tools/make_hash_vectors.py for the layout and how to regenerate."
        ),
        "vllm_version": vllm.__version__,
        "hash_function": "sha256_cbor",
        "seeds": [run_child(seed) for seed in SEEDS],
    }


def dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument(
        "--check",
        action="store_true",
        help="compare with the existing file instead of writing it",
    )
    parser.add_argument("--child-seed", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child_seed is not None:
        vectors = compute_seed_vectors(args.child_seed)
        args.child_out.write_text(json.dumps(vectors), encoding="utf-8")
        return 0

    import vllm

    if vllm.__version__ != BASE:
        raise SystemExit(f"expected vLLM {BASE}, found {vllm.__version__}")
    text = dumps(build())
    if args.check:
        if args.output.read_text(encoding="utf-8") != text:
            print(f"{args.output} differs from what vLLM computes now", file=sys.stderr)
            return 1
        print(f"{args.output} matches vLLM {vllm.__version__}")
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    n = sum(
        len(s[k])
        for s in json.loads(text)["seeds"]
        for k in (
            "block_vectors",
            "request_vectors",
            "group_id_vectors",
            "view_vectors",
            "event_hash_vectors",
        )
    )
    print(f"wrote {args.output}: {len(SEEDS)} seeds, {n} vectors + roots")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
