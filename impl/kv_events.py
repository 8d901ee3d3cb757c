"""KV-cache events, shaped like vLLM 0.25.1's ``vllm.distributed.kv_events``.

An external KV-cache index (a router, an offloading tier) learns what the
pool caches only through these events: ``BlockStored`` when full blocks
become hits, ``BlockRemoved`` when a hash stops being one, ``AllBlocksCleared``
on reset.  Plain dataclasses here; vLLM's are msgspec structs with the same
field names and order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MEDIUM_GPU = "GPU"


class KVCacheEvent:
    """Base class of every KV-cache event."""

    __slots__ = ()


@dataclass(slots=True)
class BlockStored(KVCacheEvent):
    block_hashes: list[Any]
    parent_block_hash: Any
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    lookahead_token_ids: list[list[int]] | None = None
    """Per block, the tokens past it that its hash covers (vLLM 0.33's field,
    release delta lookahead-block-hashes); ``None`` where hashes look nowhere."""


@dataclass(slots=True)
class BlockRemoved(KVCacheEvent):
    block_hashes: list[Any]
    medium: str | None
    group_idx: int | None = None


@dataclass(slots=True)
class AllBlocksCleared(KVCacheEvent):
    pass


@dataclass
class EventClasses:
    """The classes the pool builds its events from: kvspec's by default;
    :func:`use_event_classes` swaps in others with the same fields (vLLM's
    msgspec structs, so that vLLM's KV-event consumers work unchanged).
    ``stored_session``: whether a ``BlockStored`` names the request's
    session (vLLM's from 0.30, release delta session-id; kvspec's do not)."""

    stored: type = BlockStored
    removed: type = BlockRemoved
    cleared: type = AllBlocksCleared
    stored_session: bool = False


EVENTS = EventClasses()


def use_event_classes(stored: type, removed: type, cleared: type) -> EventClasses:
    """Build events from these classes from now on; returns the previous
    ones (to restore them)."""
    global EVENTS
    fields = getattr(stored, "__struct_fields__", None) or getattr(stored, "__dataclass_fields__", ())
    previous, EVENTS = EVENTS, EventClasses(stored, removed, cleared, "session_id" in fields)
    return previous
