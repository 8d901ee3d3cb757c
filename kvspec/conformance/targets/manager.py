"""Adapters that present a KV-cache manager as a
:class:`~kvspec.spec.interface.ManagerTarget`: driven by block id, observed
through snapshots and neutral events.

:class:`KVCacheManagerTarget` wraps any object with vLLM 0.25.1's
``KVCacheManager`` API; :class:`ImplManagerTarget` builds kvspec's own,
:class:`VllmManagerTarget` builds vLLM's (imported lazily, from kvspec's
config and requests: each request is mirrored by a vLLM ``Request`` hashed
with vLLM's own block hasher).  Both factories take the
``ManagerTarget`` constructor arguments ``(kv_cache_config, max_model_len,
scheduler_block_size, hash_block_size, enable_caching, use_eagle,
enable_kv_cache_events)``.
"""

from __future__ import annotations

from typing import Any

from kvspec.conformance.targets.pool import VllmApiPoolTarget, _neutral_event
from kvspec.conformance.vllm import compat
from kvspec.dropin_releases import impl_deltas
from kvspec.kv_cache_interface import (
    KVCacheConfig,
)
from kvspec.request import Request
from kvspec.spec import releases
from kvspec.spec.interface import Event, ManagerSnapshot

BlockIds = tuple[list[int], ...]


class KVCacheManagerTarget:
    """Any manager with vLLM 0.25.1's ``KVCacheManager`` API, by block id.

    Subclasses translate requests (``_request``); everything else is shared.
    """

    def __init__(self, manager: Any):
        self.manager = manager
        self.pool = VllmApiPoolTarget(manager.block_pool)

    def _request(self, request: Request) -> Any:
        return request

    def _blocks(self, block_ids: BlockIds | None) -> Any:
        if block_ids is None:
            return None
        return self.manager.create_kv_cache_blocks(tuple(self.pool._blocks(ids) for ids in block_ids))

    @staticmethod
    def _ids(blocks: Any) -> BlockIds | None:
        return None if blocks is None else blocks.get_block_ids()

    # --- the ManagerTarget operations ---------------------------------------------------

    def get_computed_blocks(self, request: Request) -> tuple[BlockIds, int]:
        blocks, num_hit = compat.hit_of(self.manager.get_computed_blocks(self._request(request)))
        return blocks.get_block_ids(), num_hit

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: BlockIds | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
    ) -> BlockIds | None:
        new = self.manager.allocate_slots(
            self._request(request),
            num_new_tokens,
            num_new_computed_tokens=num_new_computed_tokens,
            new_computed_blocks=self._blocks(new_computed_blocks),
            num_lookahead_tokens=num_lookahead_tokens,
            num_external_computed_tokens=num_external_computed_tokens,
            delay_cache_blocks=delay_cache_blocks,
            num_encoder_tokens=num_encoder_tokens,
            full_sequence_must_fit=full_sequence_must_fit,
            reserved_blocks=reserved_blocks,
            has_scheduled_reqs=has_scheduled_reqs,
        )
        return self._ids(new)

    def get_num_blocks_to_allocate(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: BlockIds | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        num_encoder_tokens: int = 0,
    ) -> int:
        """The free blocks the manager says ``allocate_slots`` with these
        arguments takes (rule allocation-accounting holds the allocation to
        it): its own ``get_num_blocks_to_allocate`` where it has one (kvspec's
        does), else its coordinator's -- vLLM's estimate, the number its
        capacity check compares with the free count, asked with the token
        counts ``allocate_slots`` derives from its arguments."""
        mirror = self._request(request)
        hits = self._blocks(new_computed_blocks) or self.manager.empty_kv_cache_blocks
        query = getattr(self.manager, "get_num_blocks_to_allocate", None)
        if query is not None:
            return query(mirror, num_new_tokens, num_new_computed_tokens, hits, num_lookahead_tokens,
                         num_external_computed_tokens, num_encoder_tokens)
        local = mirror.num_computed_tokens + num_new_computed_tokens
        total = min(local + num_external_computed_tokens, self.manager.max_model_len)
        main = total + num_new_tokens
        return self.manager.coordinator.get_num_blocks_to_allocate(
            request_id=mirror.request_id,
            num_tokens=min(main + num_lookahead_tokens, self.manager.max_model_len),
            new_computed_blocks=hits.blocks,
            num_encoder_tokens=num_encoder_tokens,
            total_computed_tokens=local + num_external_computed_tokens,
            num_tokens_main_model=main,
        )

    def free(self, request: Request) -> None:
        self.manager.free(self._request(request))

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        self.manager.cache_blocks(self._request(request), num_computed_tokens)

    def remove_skipped_blocks(
        self, request_id: str, total_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        self.manager.remove_skipped_blocks(request_id, total_computed_tokens, num_prompt_tokens)

    def evict_blocks(self, block_ids: set[int]) -> None:
        self.manager.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.manager.reset_prefix_cache()

    def new_step_starts(self) -> None:
        self.manager.new_step_starts()

    def take_events(self) -> list[Event]:
        return [_neutral_event(e) for e in self.manager.take_events()]

    def get_block_ids(self, request_id: str) -> BlockIds:
        return self.manager.get_block_ids(request_id)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return self.manager.get_num_common_prefix_blocks(running_request_id)

    def snapshot(self) -> ManagerSnapshot:
        return ManagerSnapshot(pool=self.pool.snapshot(), tables=self.tables())

    # --- beyond the protocol: the scheduler's other calls and inner state --------------------

    def tables(self) -> dict[str, tuple[tuple[int, ...], ...]]:
        """Every request holding a block in some group: its block ids per group."""
        managers = self.manager.coordinator.single_type_managers
        holders = {rid for m in managers for rid, blocks in m.req_to_blocks.items() if blocks}
        return {
            rid: tuple(tuple(b.block_id for b in m.req_to_blocks.get(rid, ())) for m in managers)
            for rid in sorted(holders)
        }

    def pop_blocks_for_free(self, request: Request) -> list[int]:
        return [b.block_id for b in self.manager.pop_blocks_for_free(self._request(request))]

    def free_block_ids(self, block_ids: list[int]) -> None:
        """Free blocks in the given order (the scheduler's deferred free)."""
        self.manager.block_pool.free_blocks(self.pool._blocks(block_ids))

    def take_new_block_ids(self) -> list[int]:
        return self.manager.take_new_block_ids()

    def get_block_ids_for_computed_tokens(self, request_id: str, num_computed_tokens: int) -> BlockIds:
        return self.manager.get_block_ids_for_computed_tokens(request_id, num_computed_tokens)

    def find_longest_cache_hit_per_group(self, request: Request) -> tuple[BlockIds, tuple[int, ...]] | None:
        """Each group's own longest hit (hybrid coordinators only; what a KV
        connector of a Mamba hybrid asks); ``None`` for other coordinators."""
        lookup = getattr(self.manager.coordinator, "find_longest_cache_hit_per_group", None)
        if lookup is None:
            return None
        mirror = self._request(request)
        blocks, lengths = lookup(mirror.block_hashes, mirror.num_tokens - 1)
        return tuple([b.block_id for b in group] for group in blocks), tuple(lengths)

    def get_usage(self) -> float:
        return self.manager.usage

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        """What vLLM's scheduler calls for an admitted request from 0.27
        (spec delta ``stats-at-admission``); a manager without it refuses
        (``TypeError``), having counted nothing."""
        record = getattr(self.manager, "record_prefix_cache_stats", None)
        if record is None:
            raise TypeError("this manager has no record_prefix_cache_stats (spec delta stats-at-admission, 0.27)")
        record(self._request(request), num_hits)

    def make_prefix_cache_stats(self) -> dict[str, Any] | None:
        """The manager's prefix-cache stats since the last call, as a dict."""
        stats = self.manager.make_prefix_cache_stats()
        if stats is None:
            return None
        fields = ("reset", "requests", "queries", "hits", "preempted_requests", "preempted_queries", "preempted_hits")
        return {name: getattr(stats, name) for name in fields}

    def bookkeeping(self) -> list[dict[str, Any]]:
        """Per group, the manager's per-request counters (non-empty ones):
        cached-block counts and, for Mamba, its state-block tracking."""
        out = []
        for m in self.manager.coordinator.single_type_managers:
            state: dict[str, Any] = {"num_cached_block": dict(sorted(m.num_cached_block.items()))}
            for name in ("last_state_block_idx", "_allocated_block_reqs"):
                value = getattr(m, name, None)
                if value:
                    state[name] = sorted(value.items()) if isinstance(value, dict) else sorted(value)
            out.append(state)
        return out


class ImplManagerTarget(KVCacheManagerTarget):
    """kvspec's production :class:`kvspec.impl.KVCacheManager` as a target."""

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        enable_caching: bool = True,
        use_eagle: bool = False,
        enable_kv_cache_events: bool = False,
        metrics_collector: Any = None,
        release: releases.Release | str | None = None,
        **options: Any,
    ):
        from kvspec.impl import KVCacheManager

        options.setdefault("log_stats", True)  # as vLLM's engine runs by default: the stats are observed
        options.setdefault("deltas", impl_deltas(releases.as_release(release)))  # the release judged
        super().__init__(
            KVCacheManager(
                kv_cache_config,
                max_model_len,
                scheduler_block_size,
                hash_block_size,
                enable_caching=enable_caching,
                use_eagle=use_eagle,
                enable_kv_cache_events=enable_kv_cache_events,
                metrics_collector=metrics_collector,
                **options,
            )
        )
