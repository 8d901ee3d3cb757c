"""How a block's content is named: the chained prefix hash.

A KV-cache block is reusable by another request only if the *whole prefix*
up to and including the block is identical -- the same tokens in every earlier
block, the same tokens in this block, and the same "extra keys" (LoRA adapter,
multimodal inputs, cache salt, and the prompt's embeddings when it came as
embeddings rather than token ids).  vLLM names that prefix with a hash chain:

    hash(block i) = H( (hash(block i-1), tuple(tokens of block i), extra_keys) )

where ``hash(block -1)`` is the *root hash* (``NONE_HASH``).  ``H`` defaults to
SHA-256 over canonical CBOR (``sha256_cbor``), which is language-neutral:
any implementation that serialises the same triple with canonical CBOR gets
the same 32 bytes, so traces can be compared across implementations.

The root hash is ``H(PYTHONHASHSEED)`` when that variable is set (the *string*
value is hashed), otherwise 32 random bytes, so two processes share cache keys
only if they share the seed.

Inside the pool a hash is stored together with the KV-cache group that owns
the block: the group id is appended as 4 big-endian bytes.  Two groups (say a
full-attention group and a sliding-window group) may cache the same tokens in
different physical blocks, and the suffix keeps their keys apart.

Hashes are computed at a granularity ``hash_block_size``.  A group whose block
size is a multiple ``k * hash_block_size`` names its block ``j`` by the hash
at the last fine boundary inside it, index ``(j + 1) * k - 1``: that hash
already chains over the whole prefix (see ``BlockHashListWithBlockSize``).

This module is the single home of hashing for both ``kvspec.spec`` and
``kvspec.impl``; it is pure and has no state except the root hash.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import io
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NewType, overload

import cbor2

BlockHash = NewType("BlockHash", bytes)
BlockHashWithGroupId = NewType("BlockHashWithGroupId", bytes)
ExternalBlockHash = bytes | int

GROUP_ID_BYTES = 4
MAX_GROUP_ID = (1 << (8 * GROUP_ID_BYTES)) - 1


# --- hash functions --------------------------------------------------------


def sha256_cbor(value: Any) -> bytes:
    """SHA-256 of the canonical CBOR encoding of ``value`` (vLLM's default)."""
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


HASH_FUNCTIONS: dict[str, Callable[[Any], bytes]] = {"sha256_cbor": sha256_cbor}


def is_sha256_cbor(hash_fn: Any) -> bool:
    """Whether ``hash_fn`` is SHA-256 over canonical CBOR: kvspec's, or
    vLLM's ``vllm.utils.hashing.sha256_cbor`` (the same function of the
    same bytes)."""
    return hash_fn is sha256_cbor or (
        getattr(hash_fn, "__name__", "") == "sha256_cbor" and getattr(hash_fn, "__module__", "") == "vllm.utils.hashing"
    )


# Canonical CBOR of a plain block -- (32-byte parent, tuple of token ids, None) --
# is the 3-element array header, the parent as a 32-byte string, the token
# array and CBOR's null.  The fast path writes that frame itself and has cbor2
# encode only the token list: no tuple built, no parent re-encoded, per block.  Byte for byte what
# sha256_cbor hashes, whatever the ids are (tests/test_hashing.py compares
# them).  A table of every id's encoding was faster alone, but its 2 MB
# evicted the manager's own data between decode steps.
_PLAIN_HEAD = b"\x83\x58\x20"
_NULL = b"\xf6"


def _plain_chain(parent: bytes, tokens: Sequence[int], block_size: int, lookahead: int = 0) -> list[BlockHash] | None:
    """The hashes of the plain full blocks of ``tokens`` chained from
    ``parent`` -- each SHA-256 of the canonical CBOR of ``(parent,
    tuple(block), None)``, or with ``lookahead`` tokens past each block
    (release delta lookahead-block-hashes) of ``(parent, tuple(block),
    (None, *lookahead_tokens))``, a block hashed only when its lookahead
    tokens are in ``tokens`` -- or ``None`` when the fast form does not
    apply (a parent that is not 32 bytes)."""
    if parent.__class__ is not bytes or len(parent) != 32:
        return None
    # One encoder writes every block's token array into one buffer (cbor2.dumps would set up an encoder per
    # block, a tenth of the time); the offsets after each block cut the buffer back into arrays.
    out = io.BytesIO()
    encode, tell = cbor2.CBOREncoder(out, canonical=True).encode, out.tell
    ends = []
    for start in range(0, len(tokens) - block_size - lookahead + 1, block_size):
        end = start + block_size
        encode(tokens[start:end])
        if lookahead:  # the extra keys: no keys of their own, then the tokens the hash looks ahead to
            encode((None, *tokens[end:end + lookahead]))
        ends.append(tell())
    encoded = out.getbuffer()
    head, tail, sha256 = _PLAIN_HEAD, b"" if lookahead else _NULL, hashlib.sha256
    hashes = []
    begin = 0
    for end in ends:
        parent = sha256(head + parent + encoded[begin:end] + tail).digest()
        hashes.append(parent)
        begin = end
    return hashes


def get_hash_fn_by_name(name: str) -> Callable[[Any], bytes]:
    """The hash function called ``name``; only ``sha256_cbor`` is offered."""
    try:
        return HASH_FUNCTIONS[name]
    except KeyError:
        raise ValueError(
            f"unsupported prefix-caching hash function {name!r}; "
            f"choose one of {sorted(HASH_FUNCTIONS)}"
        ) from None


# --- the root hash ---------------------------------------------------------

NONE_HASH: BlockHash = BlockHash(b"")


ROOT_SEED: str | None = None
"""The seed the root was derived from by the last :func:`init_none_hash` (``None``: random bytes)."""

_NOT_COLLISION_RESISTANT = frozenset({"xxhash", "xxhash_cbor"})  # vLLM's fast hashes: a known seed invites collisions


def root_seed(hash_fn: Callable[[Any], bytes], fixed_seed: str | None = None) -> str | None:
    """The seed a process derives its root from: ``PYTHONHASHSEED`` when it
    is set.  Without it the base release roots at random bytes (``None``);
    a release that roots at a fixed seed (``fixed_seed``: release delta
    fixed-root-hash, 0.29) uses it for a collision-resistant ``hash_fn``, so
    that processes share a prefix cache, and a random seed for vLLM's
    ``xxhash`` functions, whose collisions a known seed would let anyone
    precompute."""
    seed = os.getenv("PYTHONHASHSEED")
    if seed is not None or fixed_seed is None:
        return seed
    return os.urandom(32).hex() if getattr(hash_fn, "__name__", "") in _NOT_COLLISION_RESISTANT else fixed_seed


def init_none_hash(hash_fn: Callable[[Any], bytes] = sha256_cbor, fixed_seed: str | None = None) -> BlockHash:
    """Set the root of every hash chain from :func:`root_seed` (random
    bytes where it gives none).

    Returns the new root so callers need not read the module global.
    """
    global NONE_HASH, ROOT_SEED
    ROOT_SEED = root_seed(hash_fn, fixed_seed)
    NONE_HASH = BlockHash(os.urandom(32) if ROOT_SEED is None else hash_fn(ROOT_SEED))
    return NONE_HASH


def root_hash(seed: str, hash_fn: Callable[[Any], bytes] = sha256_cbor) -> BlockHash:
    """The root hash a process started with ``PYTHONHASHSEED=seed`` uses."""
    return BlockHash(hash_fn(seed))


@contextlib.contextmanager
def rooted_at(seed: str) -> Iterator[BlockHash]:
    """Root every hash chain, for the duration, as a process started with
    ``PYTHONHASHSEED=seed`` does (conformance vectors are rooted at ``"0"``)."""
    global NONE_HASH
    saved, NONE_HASH = NONE_HASH, root_hash(seed)
    try:
        yield NONE_HASH
    finally:
        NONE_HASH = saved


init_none_hash()


# --- one block -------------------------------------------------------------


def hash_block_tokens(
    hash_function: Callable[[Any], bytes],
    parent_block_hash: BlockHash | None,
    curr_block_token_ids: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
    *,
    none_hash: BlockHash | None = None,
) -> BlockHash:
    """The hash of one full block given its parent's hash.

    An absent (or empty) parent means "first block": the root hash stands in.
    ``none_hash`` overrides the module's root for callers that carry their own.
    """
    if not parent_block_hash:
        parent_block_hash = NONE_HASH if none_hash is None else none_hash
    return BlockHash(
        hash_function((parent_block_hash, tuple(curr_block_token_ids), extra_keys))
    )


# --- group-id keys ---------------------------------------------------------


def make_block_hash_with_group_id(
    block_hash: BlockHash, group_id: int
) -> BlockHashWithGroupId:
    """Append the group id as 4 big-endian bytes: the key the pool stores."""
    return BlockHashWithGroupId(block_hash + group_id.to_bytes(GROUP_ID_BYTES, "big"))


def get_block_hash(key: BlockHashWithGroupId) -> BlockHash:
    """The block hash part of a pool key."""
    return BlockHash(key[:-GROUP_ID_BYTES])


def get_group_id(key: BlockHashWithGroupId) -> int:
    """The group id part of a pool key."""
    return int.from_bytes(key[-GROUP_ID_BYTES:], "big")


def maybe_convert_block_hash(block_hash: BlockHash) -> ExternalBlockHash:
    """The form a hash takes in KV events.

    vLLM 0.25.1 publishes the low 64 bits of the big-endian integer unless
    ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` is an integer equal to 0, in which
    case the raw bytes (a non-integer value is an error, as in vLLM).
    """
    return block_hash_converter()(block_hash)


def block_hash_converter() -> Callable[[BlockHash], ExternalBlockHash]:
    """:func:`maybe_convert_block_hash` with the setting read now, once: for
    a caller converting many hashes at one moment (the rules convert every
    key of the hash table after each operation, and reading the environment
    per hash was a tenth of that rule's time)."""
    setting = os.getenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")
    try:
        use_int = bool(int(setting))
    except ValueError:
        raise ValueError(
            f"VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES must be an integer, got {setting!r}"
        ) from None
    return _low_64_bits if use_int else _unconverted


def _low_64_bits(block_hash: BlockHash) -> ExternalBlockHash:
    return int.from_bytes(block_hash, "big") & 0xFFFF_FFFF_FFFF_FFFF


def _unconverted(block_hash: BlockHash) -> ExternalBlockHash:
    return block_hash


# --- extra keys: what besides tokens names a block --------------------------


def need_extra_keys(request: Any) -> bool:
    """Whether a request's blocks carry extra keys (multimodal, LoRA, salt)."""
    return (
        bool(getattr(request, "mm_features", None))
        or getattr(request, "lora_request", None) is not None
        or getattr(request, "cache_salt", None) is not None
    )


def _mm_extra_keys(
    request: Any, start: int, end: int, start_mm_idx: int
) -> tuple[list[Any], int]:
    """(identifier, offset-in-block) for every multimodal input overlapping
    tokens ``[start, end)``, and the index of the input to resume from."""
    features = getattr(request, "mm_features", None)
    if not features:
        return [], start_mm_idx
    last = features[-1].mm_position
    if last.offset + last.length <= start:
        return [], start_mm_idx
    idx = len(features) + start_mm_idx if start_mm_idx < 0 else start_mm_idx
    keys: list[Any] = []
    while idx < len(features):
        feature = features[idx]
        offset, length = feature.mm_position.offset, feature.mm_position.length
        if end <= offset:
            break
        if start >= offset + length:
            idx += 1
            continue
        keys.append((feature.identifier, offset - start))
        if end >= offset + length:
            idx += 1
        else:
            break
    return keys, idx


def prompt_embeds_bytes(embeds: Any, start: int, end: int) -> bytes:
    """The raw bytes of prompt-embedding rows ``[start, end)`` (clamped, as
    slicing is), in row-major order: what vLLM hashes.  ``embeds`` is a torch
    tensor (its memory, as ``vllm.v1.utils.tensor_data`` reads it), another
    buffer such as a numpy array, or a sequence of per-token ``bytes`` rows."""
    rows = embeds[start:end]
    if isinstance(embeds, list | tuple):
        return b"".join(rows)
    if hasattr(rows, "detach"):  # a torch tensor (torch is imported if one exists)
        return bytes(TENSOR_BYTES(rows))
    return memoryview(rows).tobytes()


def tensor_bytes(tensor: Any) -> bytes:
    """A torch tensor's memory as bytes: what vLLM's ``tensor_data`` gives,
    read out of a CPU, contiguous ``uint8`` view of it (vLLM goes through
    numpy, which torch does not require)."""
    import ctypes

    import torch

    flat = tensor.detach().flatten().cpu().contiguous().view(torch.uint8)
    if flat.numel() == 0:
        return b""
    return ctypes.string_at(flat.data_ptr(), flat.numel())


TENSOR_BYTES: Callable[[Any], Any] = tensor_bytes
"""How tensors become bytes; the drop-in routes it through vLLM's own
``kv_cache_utils.tensor_data``."""


def _prompt_embeds_extra_keys(request: Any, start: int, end: int) -> list[bytes]:
    """SHA-256 of the block's prompt-embedding bytes, when the prompt came as
    embeddings: two prompts with the same placeholder token ids but other
    embeddings must not share a block.  Cached per block range on the request
    (vLLM's ``_prompt_embeds_per_block_hashes``) where it offers the dict."""
    embeds = getattr(request, "prompt_embeds", None)
    if embeds is None:
        return []
    cache = getattr(request, "_prompt_embeds_per_block_hashes", None)
    digest = cache.get((start, end)) if cache is not None else None
    if digest is None:
        digest = hashlib.sha256(prompt_embeds_bytes(embeds, start, end)).digest()
        if cache is not None:
            cache[(start, end)] = digest
    return [digest]


# --- the extra keys' format, per vLLM release -------------------------------------

# A hashing function is told the release whose format it hashes in (``release=``: a
# :class:`kvspec.spec.releases.Release`, or anything with its ``extra_key_format`` and
# ``mm_resume_scan``).  Told none, it hashes as vLLM's own functions, which take no
# release, do in this process: the reference release's format, unless the drop-in --
# which stands in for those functions in a vLLM of a later release -- set that
# release's (:func:`use_extra_key_format`, :func:`use_mm_resume_scan`).  Nothing else
# sets them: kvspec's own callers pass the release.

EXTRA_KEY_FORMATS = ("bare", "tagged")
_extra_key_format = "bare"


def _format_of(release: Any) -> str:
    return _extra_key_format if release is None else release.extra_key_format


def use_extra_key_format(fmt: str) -> None:
    """Hash extra keys in format ``fmt`` where no release is passed, from
    now on, in this process: what vLLM's callers of the drop-in's hashing
    functions get (the drop-in sets its release's; the default is the
    reference's)."""
    global _extra_key_format
    if fmt not in EXTRA_KEY_FORMATS:
        raise ValueError(f"extra-key format must be one of {EXTRA_KEY_FORMATS}, not {fmt!r}")
    _extra_key_format = fmt


MM_RESUME_SCANS = ("last", "overlapping")
_mm_resume_scan = "last"


def use_mm_resume_scan(scan: str) -> None:
    """Where a request block hasher built without a release, resuming inside
    a request, starts looking for multimodal inputs, from now on, in this
    process (the drop-in sets its release's): ``last``
    (the reference's: the request's last input only) or ``overlapping``
    (release delta ``mm-keys-on-resume``: the first input overlapping the
    next block, so every one it holds is keyed)."""
    global _mm_resume_scan
    if scan not in MM_RESUME_SCANS:
        raise ValueError(f"multimodal resume scan must be one of {MM_RESUME_SCANS}, not {scan!r}")
    _mm_resume_scan = scan


def use_formats_of(release: Any) -> tuple[str, str]:
    """Hash as ``release`` does where no release is passed, from now on, in
    this process (the drop-in's: vLLM's callers pass none); returns the
    formats before, (extra-key format, multimodal resume scan)."""
    before = _extra_key_format, _mm_resume_scan
    use_extra_key_format(release.extra_key_format)
    use_mm_resume_scan(release.mm_resume_scan)
    return before


def _resume_mm_index(request: Any, start: int, release: Any = None) -> int:
    """The multimodal input a hasher resuming at token ``start`` (> 0)
    scans from: the last input (``-1``), or from delta
    ``mm-keys-on-resume`` on the first whose tokens end after ``start``."""
    features = getattr(request, "mm_features", None)
    scan = _mm_resume_scan if release is None else release.mm_resume_scan
    if scan == "last" or not features:
        return -1
    return bisect.bisect_right(features, start, key=lambda f: f.mm_position.offset + f.mm_position.length)


def lora_path(lora: Any) -> str:
    """The adapter path a LoRA request names (the tagged format hashes it);
    a request without one is named by a placeholder under ``/kvspec/lora``."""
    return getattr(lora, "lora_path", "") or f"/kvspec/lora/{lora.lora_name}"


def generate_block_hash_extra_keys(
    request: Any, start_token_idx: int, end_token_idx: int, start_mm_idx: int, *, release: Any = None
) -> tuple[tuple[Any, ...] | None, int]:
    """Extra keys of the block covering tokens ``[start, end)``.

    Order: LoRA name, multimodal keys, cache salt (first block only), the
    digest of the block's prompt embeddings (every block, once the prompt
    came as embeddings -- past the prompt, the digest of no bytes).  ``None``
    when there are none, so plain blocks hash ``(parent, tokens, None)``.
    In the tagged format (release delta ``tagged-extra-keys``, :mod:`kvspec.spec.releases`) each key is led by
    its kind and the LoRA key carries the adapter's path too.  ``release``:
    the release whose format (see above; ``None``: this process's default).
    """
    mm_keys, next_mm_idx = _mm_extra_keys(
        request, start_token_idx, end_token_idx, start_mm_idx
    )
    lora = getattr(request, "lora_request", None)
    salt = getattr(request, "cache_salt", None)
    salt_keys = [salt] if (start_token_idx == 0 and salt) else []
    embeds_keys = _prompt_embeds_extra_keys(request, start_token_idx, end_token_idx)
    if _format_of(release) == "tagged":
        keys = ([("lora", lora.lora_name, lora_path(lora))] if lora else []) + [("mm", *k) for k in mm_keys] \
            + [("cache_salt", k) for k in salt_keys] + [("prompt_embeds", k) for k in embeds_keys]
    else:
        keys = ([lora.lora_name] if lora else []) + mm_keys + salt_keys + embeds_keys
    return (tuple(keys) if keys else None), next_mm_idx


def event_extra_keys(keys: tuple[Any, ...] | None, *, release: Any = None) -> tuple[Any, ...] | None:
    """A block's extra keys as KV events publish them: the bare format,
    whatever the hash used (vLLM's ``to_event_extra_keys``); ``keys`` are in
    ``release``'s format."""
    if keys is None or _format_of(release) == "bare":
        return keys
    return tuple(_BARE[k[0]](k) for k in keys)


_BARE: dict[str, Callable[[tuple[Any, ...]], Any]] = {
    "lora": lambda k: k[1], "mm": lambda k: (k[1], k[2]), "cache_salt": lambda k: k[1], "prompt_embeds": lambda k: k[1],
}
"""Each tagged key's bare form, by kind."""


# --- a request's hash chain -------------------------------------------------


def generate_lookahead_block_hash_extra_keys(
    request: Any, start_token_idx: int, end_token_idx: int, hash_end_token_idx: int, start_mm_idx: int,
    *, release: Any = None,
) -> tuple[tuple[Any, ...] | None, int]:
    """Extra keys of the block ``[start, end)`` whose hash also covers the
    lookahead tokens up to ``hash_end`` (release delta
    ``lookahead-block-hashes``): the keys of every input overlapping the
    whole window, and the multimodal index rewound to the first input that
    reaches past the block, so the next block keys it too."""
    keys, mm_idx = generate_block_hash_extra_keys(request, start_token_idx, hash_end_token_idx, start_mm_idx,
                                                  release=release)
    features = getattr(request, "mm_features", None)
    while mm_idx > 0:
        position = features[mm_idx - 1].mm_position
        if position.offset + position.length <= end_token_idx:
            break
        mm_idx -= 1
    return keys, mm_idx


def get_request_block_hasher(
    hash_block_size: int,
    caching_hash_fn: Callable[[Any], bytes] = sha256_cbor,
    num_hash_lookahead_tokens: int = 0,
    *,
    release: Any = None,
) -> Callable[[Any], list[BlockHash]]:
    """A function returning the hashes of a request's not-yet-hashed full blocks.

    The request must offer ``block_hashes`` (the hashes so far),
    ``all_token_ids`` and ``num_tokens``; the returned list continues the chain.

    ``num_hash_lookahead_tokens`` (L, release delta ``lookahead-block-hashes``,
    from vLLM 0.33 with an EAGLE-style drafter): each block's hash also covers
    the L tokens after it -- the drafter's KV at the block's last position
    read them -- so a block is hashed only once those tokens exist, and its
    extra keys are ``(E, *lookahead_tokens)``, ``E`` the keys of the block and
    its lookahead window (see :func:`generate_lookahead_block_hash_extra_keys`).

    ``release``: the release whose hashes (its extra-key format and
    multimodal scan on resume); ``None``: this process's default (the
    reference release's, or the drop-in's).
    """
    if not isinstance(hash_block_size, int) or hash_block_size <= 0:
        raise ValueError(
            f"hash_block_size must be a positive int, got {hash_block_size!r}"
        )
    if not isinstance(num_hash_lookahead_tokens, int) or num_hash_lookahead_tokens < 0:  # a bool counts 0 or 1
        raise ValueError(f"num_hash_lookahead_tokens must be an int >= 0, got {num_hash_lookahead_tokens!r}")
    lookahead = int(num_hash_lookahead_tokens)
    fast_cbor = is_sha256_cbor(caching_hash_fn)

    def request_block_hasher(request: Any) -> list[BlockHash]:
        start = len(request.block_hashes) * hash_block_size
        num_tokens = request.num_tokens - lookahead  # a block's hash waits for its lookahead tokens
        if start + hash_block_size > num_tokens:
            return []  # no new full block (most decode steps)
        parent = request.block_hashes[-1] if request.block_hashes else None
        tokens = request.all_token_ids
        if fast_cbor and not need_extra_keys(request) and getattr(request, "prompt_embeds", None) is None:
            end = start + (num_tokens - start) // hash_block_size * hash_block_size
            hashes = _plain_chain(parent or NONE_HASH, tokens[start:end + lookahead], hash_block_size, lookahead)
            if hashes is not None:
                return hashes
        mm_idx = _resume_mm_index(request, start, release) if start > 0 else 0
        hashes = []
        while start + hash_block_size <= num_tokens:
            end = start + hash_block_size
            if lookahead:  # the keys of the block and its lookahead window, then the lookahead tokens
                window, mm_idx = generate_lookahead_block_hash_extra_keys(request, start, end, end + lookahead, mm_idx,
                                                                          release=release)
                extra = (window, *tokens[end:end + lookahead])
            else:
                extra, mm_idx = generate_block_hash_extra_keys(request, start, end, mm_idx, release=release)
            parent = hash_block_tokens(caching_hash_fn, parent, tokens[start:end], extra)
            hashes.append(parent)
            start = end
        return hashes

    return request_block_hasher


def hash_token_chain(
    token_ids: Sequence[int],
    block_size: int,
    *,
    extra_keys: Sequence[tuple[Any, ...] | None] | None = None,
    hash_fn: Callable[[Any], bytes] = sha256_cbor,
    none_hash: BlockHash | None = None,
) -> list[BlockHash]:
    """Hashes of every full block of ``token_ids`` (a convenience for tests and
    tools that have tokens but no request object)."""
    hashes: list[BlockHash] = []
    parent: BlockHash | None = None
    for i in range(len(token_ids) // block_size):
        extra = extra_keys[i] if extra_keys is not None else None
        parent = hash_block_tokens(
            hash_fn,
            parent,
            token_ids[i * block_size : (i + 1) * block_size],
            extra,
            none_hash=none_hash,
        )
        hashes.append(parent)
    return hashes


class BlockHashListWithBlockSize:
    """A read-only view of ``hash_block_size`` hashes as ``target_block_size``
    hashes: block ``j`` of the coarse view is fine hash ``(j + 1) * k - 1``.

    Lazy, so it follows the underlying list as the request grows.
    """

    __slots__ = ("block_hashes", "scale_factor")

    def __init__(
        self, block_hashes: list[BlockHash], hash_block_size: int, target_block_size: int
    ):
        if hash_block_size <= 0 or target_block_size <= 0 or target_block_size % hash_block_size:
            raise ValueError(
                f"block-size-coherence: block size {target_block_size} is not a "
                f"multiple of hash_block_size {hash_block_size}"
            )
        self.block_hashes = block_hashes
        self.scale_factor = target_block_size // hash_block_size

    def __len__(self) -> int:
        return len(self.block_hashes) // self.scale_factor

    @overload
    def __getitem__(self, idx: int) -> BlockHash: ...

    @overload
    def __getitem__(self, idx: slice) -> list[BlockHash]: ...

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return [self._at(i) for i in range(*idx.indices(len(self)))]
        if isinstance(idx, int):
            if idx < 0:
                idx += len(self)
            if not 0 <= idx < len(self):
                raise IndexError(f"block index {idx} out of range ({len(self)})")
            return self._at(idx)
        raise TypeError(f"block index must be int or slice, got {type(idx).__name__}")

    def __iter__(self) -> Iterator[BlockHash]:
        for i in range(len(self)):
            yield self._at(i)

    def _at(self, idx: int) -> BlockHash:
        return self.block_hashes[(idx + 1) * self.scale_factor - 1]


def block_hashes_for_size(
    block_hashes: list[BlockHash], hash_block_size: int, block_size: int
) -> list[BlockHash] | BlockHashListWithBlockSize:
    """The request's hashes seen at ``block_size`` granularity."""
    if block_size == hash_block_size:
        return block_hashes
    return BlockHashListWithBlockSize(block_hashes, hash_block_size, block_size)
