"""Cache-scope targets (:class:`~kvspec.spec.engines.CacheTarget`): an
engine's prefix cache and allocator, driven as its scheduler drives them
and observed through the content view (spec chapter 10).

:class:`ImplCacheTarget` is kvspec's own manager (vLLM's design) seen this
way: the reference mapping, and the proof that the view's rules are not
an engine's special case -- a vLLM-style pool passes them as it passes
chapters 1-9.  SGLang's and LMDeploy's adapters live in
:mod:`kvspec.conformance.engines`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from kvspec.hashing import get_request_block_hasher
from kvspec.request import LoRARequest, Request
from kvspec.spec.engines import CacheLayout, CacheView, Key, content_key
from kvspec.spec.interface import NULL_BLOCK_ID
from kvspec.spec.releases import as_release
from kvspec.testing import config, full, swa

_ADAPTER_IDS: dict[Any, int] = {}


def lora_of(tenant: Any) -> LoRARequest | None:
    """A tenant as a LoRA adapter (ids stable within a process)."""
    if tenant is None:
        return None
    return LoRARequest(str(tenant), _ADAPTER_IDS.setdefault(tenant, len(_ADAPTER_IDS) + 1))


class ManagerCacheTarget:
    """A manager with the spec's target interface (:class:`ManagerTarget`:
    kvspec's impl, or the spec itself) as a cache-scope target: one
    attention group, full or a sliding window.

    Mapping: a block's hold count is its ref count; ``free`` is the free
    queue less the blocks still carrying a key (vLLM's design evicts
    lazily: a freed cached block waits in the queue, servable, until it is
    reused -- it is cached, not free); ``cached`` names each keyed block by
    the content its hash was computed from (each request's hash chain is
    recorded as it is made); the null block is no usable block, and a
    window's released positions (the null block in the table) are ``None``."""

    def __init__(self, layout: CacheLayout, manager_factory: Any, release: Any = None):
        spec = swa(layout.block_size, window=layout.window) if layout.window else full(layout.block_size)
        self.block_size = layout.block_size
        self.num_blocks = layout.num_blocks + 1  # and the null block
        self.manager = manager_factory(config(spec, num_blocks=self.num_blocks), 4096, layout.block_size,
                                       layout.block_size, True, False, False)
        self.hasher = get_request_block_hasher(layout.block_size, release=as_release(release))
        self.requests: dict[str, tuple[Any, Request]] = {}
        self.content: dict[bytes, Key] = {}  # block hash -> the content it was computed from

    def _request(self, request_id: str, tokens: Sequence[int], tenant: Any) -> Request:
        request = Request(request_id, list(tokens), lora_request=lora_of(tenant), block_hasher=self.hasher)
        B = self.block_size  # noqa: N806
        for i, h in enumerate(request.block_hashes):
            self.content.setdefault(bytes(h), content_key(tenant, tokens, (i + 1) * B))
        return request

    # --- the CacheTarget operations ------------------------------------------------------

    def admit(self, request_id: str, tokens: Sequence[int], tenant: Any) -> int | None:
        request = self._request(request_id, tokens, tenant)
        blocks, hit = self.manager.get_computed_blocks(request)
        if self.manager.allocate_slots(request, request.num_tokens - hit, hit, blocks) is None:
            return None
        request.num_computed_tokens = request.num_tokens
        self.requests[request_id] = (tenant, request)
        return hit

    def append(self, request_id: str, tokens: Sequence[int]) -> bool:
        tenant, old = self.requests[request_id]
        # A copy grows first: the manager reads the new tokens from the request before allocating, and a
        # refused allocation must leave the request as it was.
        grown = self._request(request_id, [*old.all_token_ids, *tokens], tenant)
        grown.num_computed_tokens = old.num_computed_tokens
        if self.manager.allocate_slots(grown, len(tokens)) is None:  # vLLM's scheduler preempts it
            self.preempt(request_id)
            return False
        grown.num_computed_tokens += len(tokens)
        self.requests[request_id] = (tenant, grown)
        return True

    def cache(self, request_id: str) -> None:
        pass  # vLLM's design caches every full block as soon as its slots are allocated

    def finish(self, request_id: str) -> None:
        self.manager.free(self.requests.pop(request_id)[1])

    preempt = finish  # vLLM's design frees a preempted request as a finished one: its cached blocks stay

    def evict(self, num_blocks: int) -> int:
        return 0  # vLLM's design evicts only by reusing a cached block: nothing to ask for

    def view(self) -> CacheView:
        snap = self.manager.snapshot()
        pool = snap.pool
        keyed = {b: bytes(key)[:-4] for b, key in pool.key_of.items()}  # a key is the hash, then the group id
        tables = {rid: tuple(None if b == NULL_BLOCK_ID else b for b in groups[0])
                  for rid, groups in snap.tables.items()}
        return CacheView(
            blocks=frozenset(range(1, self.num_blocks)), block_size=self.block_size,
            free=frozenset(pool.free) - set(keyed), tables=tables,
            holds={b: n for b, n in enumerate(pool.ref) if n > 0 and b != NULL_BLOCK_ID},
            cached={b: self.content.get(h, (None, ())) for b, h in keyed.items()})


def impl_cache_target(layout: CacheLayout, release: Any = None) -> ManagerCacheTarget:
    """kvspec's impl manager through the content view (``--target impl --scope cache``),
    built for ``release`` (default the reference release)."""
    from kvspec.conformance.targets.manager import ImplManagerTarget

    return ManagerCacheTarget(layout, functools.partial(ImplManagerTarget, release=release), release)


def spec_cache_target(layout: CacheLayout, release: Any = None) -> ManagerCacheTarget:
    """The spec's manager through the content view (``--target spec --scope cache``),
    built for ``release`` (default the reference release)."""
    from kvspec.conformance.targets.spec_manager import SpecManagerTarget

    return ManagerCacheTarget(layout, functools.partial(SpecManagerTarget, release=release), release)


def unsupported(layout: CacheLayout) -> str | None:
    """Why kvspec's manager is not seen through a layout (``None``: it is)."""
    if layout.groups:
        return ("several groups per request: vLLM's design keeps every group's blocks in one pool, which the "
                "grouped view's groups (a pool each) do not model yet")
    return None


impl_cache_target.unsupported = spec_cache_target.unsupported = unsupported  # type: ignore[attr-defined]

