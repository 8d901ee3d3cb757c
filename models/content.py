"""The test model: what a request's tokens put into the KV cache.

A real model's key and value for token ``t`` depend on every token up to
``t`` (layer after layer), on the adapter (LoRA) and on multimodal inputs.
The test model keeps exactly that dependence and nothing else: each token
gets a **content id**, a 62-bit hash of the request's tenant (cache salt,
LoRA adapter), its tokens ``[0, t]``, the multimodal inputs starting by then
and, for a prompt given as embeddings, the embedding rows; keys, values,
queries and Mamba inputs are fixed functions of the content id.  So two
requests that may share a block (same tenant, same prefix) produce the same
K/V there, and a stale or cross-tenant block shows up as different numbers.

The functions are table lookups, not arithmetic: each value is the sum of
two entries of fixed random tables, multiples of 1/64 in [-2, 2), exact in
fp32, fp16 and bf16.  A gather from the paged cache can therefore be
compared with ``torch.equal``, and the same content gives bit-identical
K/V whatever the batch.  (Two different contents collide with probability
2^-24 per token; a block holds several.)
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvspec.hashing import prompt_embeds_bytes
from kvspec.spec.content import tenant

TABLE_ROWS = 4096
_MASK = (1 << 62) - 1


def _mix(state: int, *parts: Any) -> int:
    digest = hashlib.blake2b(repr((state, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _MASK


def tenant_root(request: Any) -> int:
    """The content id before any token: who the request belongs to."""
    return _mix(0, "tenant", tenant(request))


class ContentIds:
    """Content ids of a request's tokens, extended as its tokens grow.

    ``ids(n)`` covers ``all_token_ids[:n]``; :meth:`with_drafts` the same
    followed by speculative draft tokens (not yet part of the request)."""

    def __init__(self, request: Any):
        self.request = request
        self._ids: list[int] = []
        self._mm = {f.mm_position.offset: f.identifier for f in getattr(request, "mm_features", None) or ()}
        self._embeds = getattr(request, "prompt_embeds", None)

    def _extend(self, prev: int, t: int, token: int) -> int:
        parts: tuple = (token,)
        if t in self._mm:
            parts += ("mm", self._mm[t])
        if self._embeds is not None and t < len(self._embeds):  # the token came as an embedding
            parts += ("embedding", prompt_embeds_bytes(self._embeds, t, t + 1))
        return _mix(prev, *parts)

    def ids(self, n: int) -> list[int]:
        tokens = self.request.all_token_ids
        if n > len(tokens):
            raise ValueError(f"request {self.request.request_id!r} has {len(tokens)} tokens, not {n}")
        prev = self._ids[-1] if self._ids else tenant_root(self.request)
        for t in range(len(self._ids), n):
            prev = self._extend(prev, t, tokens[t])
            self._ids.append(prev)
        return self._ids[:n]

    def with_drafts(self, drafts: Sequence[int]) -> list[int]:
        ids = list(self.ids(self.request.num_tokens))
        prev = ids[-1] if ids else tenant_root(self.request)
        for token in drafts:
            prev = self._extend(prev, len(ids), token)
            ids.append(prev)
        return ids

    def encoder_ids(self, num_encoder_tokens: int) -> list[int]:
        """The encoder input (an audio clip, for Whisper): a function of the
        request's tenant and prompt, one id per encoder position."""
        root = _mix(tenant_root(self.request), "encoder", tuple(self.request.prompt_token_ids))
        return [_mix(root, e) for e in range(num_encoder_tokens)]


@dataclass(frozen=True)
class Tables:
    """Two fixed random tables; a value is ``a[id mod R] + b[(id >> 12) mod R]``."""

    a: torch.Tensor
    b: torch.Tensor

    @classmethod
    def make(cls, shape: tuple[int, ...], seed: int, *, low: int = -64, high: int = 64) -> Tables:
        gen = torch.Generator().manual_seed(seed)
        a = torch.randint(low, high, (TABLE_ROWS, *shape), generator=gen).float() / 64
        b = torch.randint(low, high, (TABLE_ROWS, *shape), generator=gen).float() / 64
        return cls(a, b)

    def __call__(self, ids: Sequence[int], dtype: torch.dtype = torch.float32, device: Any = "cpu") -> torch.Tensor:
        ids_t = torch.tensor(list(ids), dtype=torch.long)
        out = self.a[ids_t % TABLE_ROWS] + self.b[(ids_t >> 12) % TABLE_ROWS]
        return out.to(dtype=dtype, device=device)


class AttentionContent:
    """Query, key and value of one attention layer (``num_kv_heads`` x
    ``head_size``; queries ``num_heads`` x ``head_size``)."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_size: int, seed: int):
        self.q = Tables.make((num_heads, head_size), seed)
        self.k = Tables.make((num_kv_heads, head_size), seed + 1)
        self.v = Tables.make((num_kv_heads, head_size), seed + 2)


class MLAContent:
    """DeepSeek's latent cache: one vector of ``latent + rope`` values per
    token (the compressed KV and the rotary key); queries are absorbed into
    the same space, ``num_heads`` of them."""

    def __init__(self, num_heads: int, latent: int, rope: int, seed: int):
        self.q = Tables.make((num_heads, latent + rope), seed)
        self.kv = Tables.make((latent + rope,), seed + 1)
        self.latent = latent


class MambaContent:
    """A Mamba-2 layer's per-token inputs: ``x`` (heads x head_dim), ``dt``
    (per head), ``B`` and ``C`` (groups x state), and its fixed parameters
    ``A`` (negative), ``D`` and ``dt_bias``."""

    def __init__(self, num_heads: int, head_dim: int, num_groups: int, state_size: int, seed: int):
        self.x = Tables.make((num_heads, head_dim), seed)
        self.dt = Tables.make((num_heads,), seed + 1, low=-32, high=32)
        self.B = Tables.make((num_groups, state_size), seed + 2)
        self.C = Tables.make((num_groups, state_size), seed + 3)
        gen = torch.Generator().manual_seed(seed + 4)
        self.A = -torch.randint(8, 64, (num_heads,), generator=gen).float() / 64
        self.D = torch.randint(-64, 64, (num_heads,), generator=gen).float() / 64
        self.dt_bias = torch.randint(-32, 32, (num_heads,), generator=gen).float() / 64
