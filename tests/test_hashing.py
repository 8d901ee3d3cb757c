"""kvspec.hashing against hash vectors computed by vLLM 0.25.1 itself.

The vectors (``tests/vectors/hash_chain.json``) come from
``tools/make_hash_vectors.py`` run against a real vLLM install; its docstring
describes the layout and how to regenerate.  This test does not import vLLM:
it only replays the recorded inputs through ``kvspec.hashing`` and compares
with the recorded outputs.

Known, deliberate differences from vLLM are marked ``xfail(strict=True)``
with the reason, so that they stay visible and a change of behaviour (either
way) is noticed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvspec import hashing
from kvspec.hashing import (
    BlockHash,
    BlockHashListWithBlockSize,
    block_hashes_for_size,
    generate_block_hash_extra_keys,
    get_block_hash,
    get_group_id,
    get_request_block_hasher,
    hash_block_tokens,
    hash_token_chain,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
    need_extra_keys,
    root_hash,
    sha256_cbor,
)
from kvspec.spec import releases

VECTORS_PATH = Path(__file__).parent / "vectors" / "hash_chain.json"
VECTORS: dict[str, Any] = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))
SEEDS: list[dict[str, Any]] = VECTORS["seeds"]


def _h(hex_str: str) -> BlockHash:
    return BlockHash(bytes.fromhex(hex_str))


def _extra_keys(json_keys: Any) -> tuple[Any, ...] | None:
    """Recorded extra keys (JSON lists; an embeddings digest as {"bytes": hex})
    back to what vLLM hashed (tuples, bytes)."""
    if json_keys is None:
        return None
    return tuple(tuple(k) if isinstance(k, list) else bytes.fromhex(k["bytes"]) if isinstance(k, dict) else k
                 for k in json_keys)


def _jsonable(extra: tuple[Any, ...] | None) -> Any:
    if extra is None:
        return None
    return [list(k) if isinstance(k, tuple) else {"bytes": k.hex()} if isinstance(k, bytes) else k for k in extra]


def _params(kind: str, id_of=lambda v: v["name"]):
    """pytest params (seed, vector) for every seed's vectors of one kind."""
    return [
        pytest.param(seed_vectors, vector, id=f"seed={seed_vectors['seed']}-{id_of(vector)}")
        for seed_vectors in SEEDS
        for vector in seed_vectors[kind]
    ]


# --- a request-like object ---------------------------------------------------


class FakeRequest:
    """The attributes kvspec's hasher reads, mirroring vllm.v1.request.Request:
    ``block_hashes`` is extended by the block hasher at construction and after
    every appended output, as Request.update_block_hashes does."""

    def __init__(
        self,
        prompt: list[int],
        hasher,
        lora_name: str | None = None,
        cache_salt: str | None = None,
        mm: list[dict[str, Any]] = (),  # type: ignore[assignment]
        prompt_embeds: Any = None,
    ):
        self.all_token_ids: list[int] = list(prompt)
        self.prompt_embeds = prompt_embeds
        self.lora_request = (
            SimpleNamespace(lora_name=lora_name) if lora_name is not None else None
        )
        self.cache_salt = cache_salt
        self.mm_features = [
            SimpleNamespace(
                identifier=f["identifier"],
                mm_position=SimpleNamespace(offset=f["offset"], length=f["length"]),
            )
            for f in mm
        ]
        self.block_hashes: list[BlockHash] = []
        self._hasher = hasher
        self.block_hashes.extend(hasher(self))

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    def append_output_token_ids(self, token_ids: list[int]) -> None:
        self.all_token_ids.extend(token_ids)
        self.block_hashes.extend(self._hasher(self))


def embeds_rows(vector: dict[str, Any]) -> list[bytes] | None:
    """The vector's prompt embeddings as raw rows (kvspec's torch-free form)."""
    spec = vector.get("prompt_embeds")
    if spec is None:
        return None
    raw = bytes.fromhex(spec["hex"])
    width = len(raw) // spec["shape"][0]
    return [raw[i * width:(i + 1) * width] for i in range(spec["shape"][0])]


def embeds_tensor(vector: dict[str, Any]) -> Any:
    """The vector's prompt embeddings as the torch tensor vLLM was given."""
    torch = pytest.importorskip("torch")
    spec = vector["prompt_embeds"]
    raw = bytearray.fromhex(spec["hex"])
    return torch.frombuffer(raw, dtype=getattr(torch, spec["dtype"])).view(*spec["shape"])


@pytest.fixture
def seeded(monkeypatch):
    """Set kvspec's root hash the way a process with PYTHONHASHSEED=seed gets it
    (through init_none_hash); the original root is restored afterwards."""

    monkeypatch.setattr(hashing, "NONE_HASH", hashing.NONE_HASH)

    def apply(seed: str) -> BlockHash:
        monkeypatch.setenv("PYTHONHASHSEED", seed)
        return hashing.init_none_hash()

    return apply


# --- the file itself ---------------------------------------------------------


def test_vectors_come_from_the_reference_version():
    assert VECTORS["format"] == 1
    assert VECTORS["vllm_version"] == "0.25.1"
    assert VECTORS["hash_function"] == "sha256_cbor"
    assert {s["seed"] for s in SEEDS} >= {"0", "kvspec"}
    for s in SEEDS:
        for kind in (
            "block_vectors",
            "request_vectors",
            "group_id_vectors",
            "view_vectors",
            "event_hash_vectors",
        ):
            assert s[kind], f"seed {s['seed']}: no {kind}"


# --- root hash ---------------------------------------------------------------


@pytest.mark.parametrize("seed_vectors", SEEDS, ids=lambda s: f"seed={s['seed']}")
def test_root_hash(seed_vectors, seeded):
    expected = _h(seed_vectors["root_hash"])
    assert root_hash(seed_vectors["seed"]) == expected
    assert seeded(seed_vectors["seed"]) == expected
    assert hashing.NONE_HASH == expected


def test_root_hash_without_seed_is_random(monkeypatch):
    monkeypatch.setattr(hashing, "NONE_HASH", hashing.NONE_HASH)
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    first, second = hashing.init_none_hash(), hashing.init_none_hash()
    assert len(first) == len(second) == 32
    assert first != second
    assert first not in {_h(s["root_hash"]) for s in SEEDS}


def test_seeds_give_distinct_roots():
    roots = [s["root_hash"] for s in SEEDS]
    assert len(set(roots)) == len(roots)


# --- one block ---------------------------------------------------------------


@pytest.mark.parametrize("seed_vectors,vector", _params("block_vectors"))
def test_hash_block_tokens(seed_vectors, vector):
    parent = None if vector["parent"] is None else _h(vector["parent"])
    got = hash_block_tokens(
        sha256_cbor,
        parent,
        vector["tokens"],
        _extra_keys(vector["extra_keys"]),
        none_hash=_h(seed_vectors["root_hash"]),
    )
    assert got.hex() == vector["expected"]


@pytest.mark.parametrize("seed_vectors,vector", _params("block_vectors"))
def test_hash_block_tokens_uses_the_module_root(seed_vectors, vector, seeded):
    seeded(seed_vectors["seed"])
    parent = None if vector["parent"] is None else _h(vector["parent"])
    got = hash_block_tokens(
        sha256_cbor, parent, vector["tokens"], _extra_keys(vector["extra_keys"])
    )
    assert got.hex() == vector["expected"]


# --- a request's chain -------------------------------------------------------


# Prompt embeddings come as raw rows and, where a vector has them, as a tensor too.
REQUEST_CASES = [
    pytest.param(*p.values, embeds_as, id=f"{embeds_as}-{p.id}")
    for p in _params("request_vectors")
    for embeds_as in ("rows", "tensor")
    if embeds_as == "rows" or p.values[1].get("prompt_embeds") is not None
]


@pytest.mark.parametrize("seed_vectors,vector,embeds_as", REQUEST_CASES)
def test_request_block_hasher(seed_vectors, vector, embeds_as, seeded):
    seeded(seed_vectors["seed"])
    hasher = get_request_block_hasher(vector["hash_block_size"], sha256_cbor)
    req = FakeRequest(
        vector["prompt_token_ids"],
        hasher,
        lora_name=vector["lora_name"],
        cache_salt=vector["cache_salt"],
        mm=vector["mm_features"],
        prompt_embeds=embeds_rows(vector) if embeds_as == "rows" else embeds_tensor(vector),
    )
    snapshots = [[h.hex() for h in req.block_hashes]]
    for step in vector["appended_token_ids"]:
        req.append_output_token_ids(step)
        snapshots.append([h.hex() for h in req.block_hashes])
    assert snapshots == vector["expected_block_hashes_after_each_step"]
    assert need_extra_keys(req) == vector["need_extra_keys"]


@pytest.mark.parametrize("seed_vectors,vector", _params("request_vectors"))
def test_extra_keys(seed_vectors, vector):
    size = vector["hash_block_size"]
    req = SimpleNamespace(
        lora_request=(
            SimpleNamespace(lora_name=vector["lora_name"])
            if vector["lora_name"] is not None
            else None
        ),
        cache_salt=vector["cache_salt"],
        mm_features=[
            SimpleNamespace(
                identifier=f["identifier"],
                mm_position=SimpleNamespace(offset=f["offset"], length=f["length"]),
            )
            for f in vector["mm_features"]
        ],
        prompt_embeds=embeds_rows(vector),
    )
    got = [
        _jsonable(generate_block_hash_extra_keys(req, i * size, (i + 1) * size, 0)[0])
        for i in range(len(vector["expected_extra_keys"]))
    ]
    assert got == vector["expected_extra_keys"]


@pytest.mark.parametrize(
    "seed_vectors,vector",
    [
        p
        for p in _params("request_vectors")
        if p.values[1]["lora_name"] is None
        and p.values[1]["cache_salt"] is None
        and not p.values[1]["mm_features"]
        and p.values[1].get("prompt_embeds") is None
    ],
)
def test_hash_token_chain(seed_vectors, vector):
    """Plain chains through the request-free helper."""
    tokens = vector["prompt_token_ids"] + [
        t for step in vector["appended_token_ids"] for t in step
    ]
    got = hash_token_chain(
        tokens, vector["hash_block_size"], none_hash=_h(seed_vectors["root_hash"])
    )
    assert [h.hex() for h in got] == vector["expected_block_hashes_after_each_step"][-1]


@pytest.mark.parametrize("seed_vectors,vector", _params("request_vectors"))
def test_hash_token_chain_with_extra_keys(seed_vectors, vector):
    """The chain rebuilt from vLLM's per-block extra keys equals vLLM's chain."""
    tokens = vector["prompt_token_ids"] + [
        t for step in vector["appended_token_ids"] for t in step
    ]
    got = hash_token_chain(
        tokens,
        vector["hash_block_size"],
        extra_keys=[_extra_keys(k) for k in vector["expected_extra_keys"]],
        none_hash=_h(seed_vectors["root_hash"]),
    )
    assert [h.hex() for h in got] == vector["expected_block_hashes_after_each_step"][-1]


# --- a wrong hash is caught --------------------------------------------------


def _by_seed(seed: str) -> dict[str, Any]:
    return next(s for s in SEEDS if s["seed"] == seed)


def test_wrong_seed_gives_different_vectors(seeded):
    """Replaying seed "0"'s requests under seed "kvspec" matches no vector:
    the check above would fail on a wrong root."""
    zero, other = _by_seed("0"), _by_seed("kvspec")
    seeded(other["seed"])
    compared = 0
    for vector in zero["request_vectors"]:
        hasher = get_request_block_hasher(vector["hash_block_size"], sha256_cbor)
        req = FakeRequest(
            vector["prompt_token_ids"],
            hasher,
            lora_name=vector["lora_name"],
            cache_salt=vector["cache_salt"],
            mm=vector["mm_features"],
        )
        got = [h.hex() for h in req.block_hashes]
        expected = vector["expected_block_hashes_after_each_step"][0]
        if expected:
            compared += 1
            assert not set(got) & set(expected), vector["name"]
    assert compared > 5


def test_every_input_difference_changes_the_hash():
    """Tokens, order, parent, and each kind of extra key all matter."""
    root = root_hash("0")
    base = hash_block_tokens(sha256_cbor, None, [1, 2, 3, 4], None, none_hash=root)
    variants = [
        hash_block_tokens(sha256_cbor, None, [1, 2, 3, 5], None, none_hash=root),
        hash_block_tokens(sha256_cbor, None, [2, 1, 3, 4], None, none_hash=root),
        hash_block_tokens(sha256_cbor, base, [1, 2, 3, 4], None, none_hash=root),
        hash_block_tokens(sha256_cbor, None, [1, 2, 3, 4], ("a",), none_hash=root),
        hash_block_tokens(sha256_cbor, None, [1, 2, 3, 4], (("a", 0),), none_hash=root),
        hash_block_tokens(sha256_cbor, None, [1, 2, 3, 4], (), none_hash=root),
        hash_block_tokens(
            sha256_cbor, None, [1, 2, 3, 4], None, none_hash=root_hash("1")
        ),
    ]
    assert len({base, *variants}) == len(variants) + 1


def test_a_corrupted_vector_is_detected():
    vector = _by_seed("0")["block_vectors"][0]
    got = hash_block_tokens(
        sha256_cbor,
        None,
        vector["tokens"],
        _extra_keys(vector["extra_keys"]),
        none_hash=_h(_by_seed("0")["root_hash"]),
    ).hex()
    flipped = ("0" if vector["expected"][0] != "0" else "1") + vector["expected"][1:]
    assert got == vector["expected"]
    assert got != flipped


# --- group ids ---------------------------------------------------------------


@pytest.mark.parametrize(
    "seed_vectors,vector",
    _params("group_id_vectors", id_of=lambda v: f"g{v['group_id']}-{v['block_hash'][:8]}"),
)
def test_group_id_packing(seed_vectors, vector):
    block_hash = _h(vector["block_hash"])
    key = make_block_hash_with_group_id(block_hash, vector["group_id"])
    assert key.hex() == vector["expected"]
    assert get_block_hash(key).hex() == vector["expected_block_hash"]
    assert get_group_id(key) == vector["expected_group_id"]


@pytest.mark.parametrize("group_id", [0, 1, 2, 7, 255, 256, 65535, 2**31, 2**32 - 1])
def test_group_id_round_trip(group_id):
    block_hash = root_hash("0")
    key = make_block_hash_with_group_id(block_hash, group_id)
    assert len(key) == len(block_hash) + 4
    assert get_block_hash(key) == block_hash
    assert get_group_id(key) == group_id


def test_groups_keep_the_same_content_apart():
    block_hash = root_hash("0")
    keys = {make_block_hash_with_group_id(block_hash, g) for g in (0, 1, 7)}
    assert len(keys) == 3


@pytest.mark.parametrize("group_id", [-1, 2**32])
def test_group_id_out_of_range_is_refused(group_id):
    with pytest.raises(OverflowError):
        make_block_hash_with_group_id(root_hash("0"), group_id)


# --- BlockHashListWithBlockSize ------------------------------------------------


def _view_id(v: dict[str, Any]) -> str:
    return f"{len(v['fine_hashes'])}x{v['hash_block_size']}->{v['target_block_size']}"


def _view(vector: dict[str, Any]) -> BlockHashListWithBlockSize:
    return BlockHashListWithBlockSize(
        [_h(h) for h in vector["fine_hashes"]],
        vector["hash_block_size"],
        vector["target_block_size"],
    )


@pytest.mark.parametrize("seed_vectors,vector", _params("view_vectors", id_of=_view_id))
def test_view_fine_hashes_are_the_chain(seed_vectors, vector):
    """The fine hashes the view was built on are themselves a vLLM chain of
    0, 1, 2, ... at hash_block_size."""
    size = vector["hash_block_size"]
    tokens = list(range(len(vector["fine_hashes"]) * size))
    got = hash_token_chain(tokens, size, none_hash=_h(seed_vectors["root_hash"]))
    assert [h.hex() for h in got] == vector["fine_hashes"]


@pytest.mark.parametrize("seed_vectors,vector", _params("view_vectors", id_of=_view_id))
def test_view_len_iter_slices(seed_vectors, vector):
    view = _view(vector)
    assert len(view) == vector["expected_len"]
    assert [h.hex() for h in view] == vector["expected_list"]
    for case in vector["expected_slices"]:
        got = view[slice(case["start"], case["stop"], case["step"])]
        assert [h.hex() for h in got] == case["expected"], case
    assert block_hashes_for_size(
        view.block_hashes, vector["hash_block_size"], vector["target_block_size"]
    )[:] == view[:]


def _vllm_negative_index_quirk(vector: dict[str, Any], idx: int) -> bool:
    """vLLM 0.25.1 indexes the fine list with ``(idx + 1) * k - 1`` without
    normalising a negative ``idx`` first.  That agrees with list semantics
    only when the fine list holds whole coarse blocks and ``idx >= -len``."""
    k = vector["target_block_size"] // vector["hash_block_size"]
    n = vector["expected_len"]
    whole = len(vector["fine_hashes"]) % k == 0
    return idx < 0 and (not whole or idx < -n) and (
        vector["expected_index"][str(idx)] != "IndexError"
    )


def _index_params():
    params = []
    for n, seed_vectors in enumerate(SEEDS):
        for vector in seed_vectors["view_vectors"]:
            for idx_str in vector["expected_index"]:
                idx = int(idx_str)
                marks = []
                if _vllm_negative_index_quirk(vector, idx):
                    if n:  # index arithmetic does not depend on the seed
                        continue
                    marks.append(
                        pytest.mark.xfail(
                            strict=True,
                            reason=(
                                "vLLM 0.25.1 maps a negative index i to fine hash "
                                "(i + 1) * k - 1 without normalising it, so with a "
                                "partial trailing coarse block (or i < -len) it "
                                "returns a fine hash that names no coarse block; "
                                "kvspec uses list semantics. vLLM itself never "
                                "indexes a view negatively."
                            ),
                        )
                    )
                params.append(
                    pytest.param(
                        vector,
                        idx,
                        marks=marks,
                        id=f"seed={seed_vectors['seed']}-{_view_id(vector)}-[{idx}]",
                    )
                )
    return params


@pytest.mark.parametrize("vector,idx", _index_params())
def test_view_index(vector, idx):
    view = _view(vector)
    expected = vector["expected_index"][str(idx)]
    if expected == "IndexError":
        with pytest.raises(IndexError):
            view[idx]
    else:
        assert view[idx].hex() == expected


def test_view_unit():
    fine = [BlockHash(bytes([i]) * 32) for i in range(7)]
    view = BlockHashListWithBlockSize(fine, 2, 4)
    assert len(view) == 3
    assert list(view) == [fine[1], fine[3], fine[5]]
    assert view[0] == fine[1]
    assert view[-1] == fine[5]
    assert view[-3] == fine[1]
    assert view[1:] == [fine[3], fine[5]]
    assert view[::-1] == [fine[5], fine[3], fine[1]]
    assert view[5:] == []
    with pytest.raises(IndexError):
        view[3]
    with pytest.raises(IndexError):
        view[-4]
    with pytest.raises(TypeError):
        view["0"]  # type: ignore[index]


def test_view_follows_the_growing_list():
    fine: list[BlockHash] = []
    view = BlockHashListWithBlockSize(fine, 4, 8)
    assert len(view) == 0 and list(view) == []
    fine.extend(BlockHash(bytes([i]) * 32) for i in range(3))
    assert len(view) == 1 and view[0] == fine[1]
    fine.append(BlockHash(b"\x09" * 32))
    assert len(view) == 2 and view[1] == fine[3]


def test_view_same_size_is_identity():
    fine = [BlockHash(bytes([i]) * 32) for i in range(5)]
    assert list(BlockHashListWithBlockSize(fine, 4, 4)) == fine
    assert block_hashes_for_size(fine, 4, 4) is fine


@pytest.mark.parametrize(
    "hash_block_size,target_block_size",
    [(4, 6), (4, 2), (16, 8), (3, 16), (0, 4), (-2, 4)],
)
def test_view_bad_block_size_is_refused(hash_block_size, target_block_size):
    with pytest.raises(ValueError, match="block-size-coherence"):
        BlockHashListWithBlockSize([], hash_block_size, target_block_size)


@pytest.mark.parametrize("target_block_size", [0, -4])
def test_view_non_positive_target_is_refused(target_block_size):
    with pytest.raises(ValueError, match="block-size-coherence"):
        view = BlockHashListWithBlockSize([], 2, target_block_size)
        len(view)


def test_request_hasher_refuses_bad_block_size():
    for bad in (0, -4):
        with pytest.raises(ValueError):
            get_request_block_hasher(bad)


# --- KV-event form -----------------------------------------------------------


def _event_params():
    params = []
    for seed_vectors in SEEDS:
        for vector in seed_vectors["event_hash_vectors"]:
            params.append(
                pytest.param(
                    vector,
                    id=f"seed={seed_vectors['seed']}-env={vector['env']}-"
                    f"{vector['block_hash'][:8]}",
                )
            )
    return params


@pytest.mark.parametrize("vector", _event_params())
def test_event_hash_vectors(vector, monkeypatch):
    if vector["env"] is None:
        monkeypatch.delenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", raising=False)
    else:
        monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", vector["env"])
    got = maybe_convert_block_hash(_h(vector["block_hash"]))
    if isinstance(vector["expected"], dict):
        assert got == bytes.fromhex(vector["expected"]["bytes"])
    else:
        assert isinstance(got, int)
        assert got == int(vector["expected"])


def test_maybe_convert_block_hash_unit(monkeypatch):
    block_hash = BlockHash(bytes(range(32)))
    low64 = int.from_bytes(bytes(range(24, 32)), "big")
    monkeypatch.delenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", raising=False)
    assert maybe_convert_block_hash(block_hash) == low64
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")
    assert maybe_convert_block_hash(block_hash) == low64
    assert 0 <= maybe_convert_block_hash(BlockHash(b"\xff" * 32)) == 2**64 - 1
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0")
    assert maybe_convert_block_hash(block_hash) == block_hash
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "false")
    with pytest.raises(ValueError, match="must be an integer"):
        maybe_convert_block_hash(block_hash)


def test_the_fast_plain_chain_is_canonical_cbor():
    """Plain blocks are hashed by writing the CBOR of (parent, block, None)
    around cbor2's encoding of the block alone; it must be byte for byte the
    encoding of the whole tuple, whatever the token ids are (every size,
    negative, bools, floats: vLLM hashes what it is given), and step aside
    for a parent that is not 32 bytes."""
    import os
    import random

    import cbor2

    def general(parent, tokens, size):
        expected, chain = [], parent
        for i in range(0, len(tokens) - size + 1, size):
            chain = hashlib.sha256(cbor2.dumps((chain, tuple(tokens[i:i + size]), None), canonical=True)).digest()
            expected.append(chain)
        return expected

    rng = random.Random(0)
    for _ in range(500):
        parent = os.urandom(32)
        size = rng.choice([1, 2, 3, 16, 23, 24, 64, 255, 256, 300])
        tokens = [rng.choice([rng.randrange(24), rng.randrange(256), rng.randrange(65536), rng.randrange(1 << 20),
                              rng.randrange(1 << 40)]) for _ in range(size * rng.randint(1, 3) + rng.randrange(size))]
        assert hashing._plain_chain(parent, tokens, size) == general(parent, tokens, size)
    for odd in ([1, -2], [1, 2.0], [70000, 2.5], [True, 1], [1 << 70, -(1 << 70)], [3, 1 << 40]):
        parent = os.urandom(32)
        assert hashing._plain_chain(parent, odd, 2) == general(parent, odd, 2)
        long = [rng.randrange(65536) for _ in range(64)] + odd
        assert hashing._plain_chain(parent, long, 2) == general(parent, long, 2)
    assert hashing._plain_chain(b"short", [1, 2], 2) is None


def test_the_fast_lookahead_chain_is_canonical_cbor():
    """With L lookahead tokens (release delta lookahead-block-hashes) a
    plain block hashes (parent, block, (None, *next L tokens)), and only
    blocks whose next L tokens exist are hashed: the fast chain is byte for
    byte the generic hasher's, whatever the sizes."""
    import os
    import random

    import cbor2

    def general(parent, tokens, size, lookahead):
        expected, chain = [], parent
        for i in range(0, len(tokens) - size - lookahead + 1, size):
            extra = (None, *tokens[i + size:i + size + lookahead])
            chain = hashlib.sha256(cbor2.dumps((chain, tuple(tokens[i:i + size]), extra), canonical=True)).digest()
            expected.append(chain)
        return expected

    rng = random.Random(1)
    for _ in range(300):
        parent, size, lookahead = os.urandom(32), rng.choice([1, 2, 4, 16, 24]), rng.choice([1, 2, 3, 24])
        tokens = [rng.choice([rng.randrange(24), rng.randrange(1 << 20)]) for _ in range(rng.randrange(4 * size + 30))]
        assert hashing._plain_chain(parent, tokens, size, lookahead) == general(parent, tokens, size, lookahead)
    # the request hasher: the fast chain and the per-block path (a salted request's) agree on the shape
    hasher = hashing.get_request_block_hasher(4, hashing.sha256_cbor, 2)
    from kvspec.request import Request

    plain = Request("r", list(range(17)), block_hasher=hasher)
    assert len(plain.block_hashes) == 3  # 17 tokens: block 4's two lookahead tokens do not exist yet
    assert plain.block_hashes == general(hashing.NONE_HASH, list(range(17)), 4, 2)


# --- the extra-key format of later vLLM releases ---------------------------------------------


@pytest.fixture
def tagged():
    hashing.use_extra_key_format("tagged")
    try:
        yield
    finally:
        hashing.use_extra_key_format("bare")


def _keyed_request(embeds: bool = False) -> SimpleNamespace:
    feature = SimpleNamespace(identifier="img-1", mm_position=SimpleNamespace(offset=1, length=2))
    return SimpleNamespace(
        lora_request=SimpleNamespace(lora_name="ada", lora_int_id=1, lora_path="/models/ada"),
        cache_salt="s", mm_features=[feature], prompt_embeds=[b"\x01", b"\x02", b"\x03", b"\x04"] if embeds else None,
    )


def test_release_formats():
    assert releases.judged("0.25.1").extra_key_format == "bare"
    assert releases.judged("0.30.0").extra_key_format == "bare"
    assert releases.judged("0.31.0").extra_key_format == "tagged"
    assert releases.judged("0.33.0").extra_key_format == "tagged"
    with pytest.raises(ValueError, match="extra-key format"):
        hashing.use_extra_key_format("binary")


def test_the_tagged_format_leads_every_key_with_its_kind_and_events_keep_the_bare_one(tagged):
    request = _keyed_request(embeds=True)
    keys, _ = hashing.generate_block_hash_extra_keys(request, 0, 4, 0)
    digest = hashlib.sha256(b"\x01\x02\x03\x04").digest()
    assert keys == (("lora", "ada", "/models/ada"), ("mm", "img-1", 1), ("cache_salt", "s"), ("prompt_embeds", digest))
    hashing.use_extra_key_format("bare")
    bare, _ = hashing.generate_block_hash_extra_keys(request, 0, 4, 0)
    hashing.use_extra_key_format("tagged")
    assert hashing.event_extra_keys(keys) == bare == ("ada", ("img-1", 1), "s", digest)


def test_a_lora_without_a_path_is_named_by_a_placeholder_on_both_sides(tagged):
    request = SimpleNamespace(lora_request=SimpleNamespace(lora_name="ada", lora_int_id=1, lora_path=""),
                              cache_salt=None, mm_features=None, prompt_embeds=None)
    keys, _ = hashing.generate_block_hash_extra_keys(request, 0, 4, 0)
    assert keys == (("lora", "ada", "/kvspec/lora/ada"),)
