"""An offloading tier with vLLM's ``OffloadingManager`` API: the scheduler
side of a CPU tier of KV blocks, with an LRU or an ARC policy (spec
chapter 11, ``spec/tiers.py``, held to it in lockstep by ``kvspec conform
--target impl --scope offload``).

Fast where it counts: the evictable count is kept, not recounted; LRU keeps
only evictable keys in its order so that eviction walks from the head; a
block's state is one small list ``[block_id, ref]`` (``ref`` -1 while its
store is in flight).
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

MEDIUM = "CPU"
PENDING = -1


class LookupResult(enum.Enum):
    MISS = enum.auto()
    HIT = enum.auto()
    HIT_PENDING = enum.auto()
    RETRY = enum.auto()


class CPULoadStoreSpec:
    """Tier block ids for a worker to load from or store into."""

    __slots__ = ("block_ids",)

    def __init__(self, block_ids: list[int]) -> None:
        self.block_ids = block_ids

    @staticmethod
    def medium() -> str:
        return MEDIUM

    def __repr__(self) -> str:
        return f"CPULoadStoreSpec({self.block_ids})"


@dataclass
class PrepareStoreOutput:
    keys_to_store: list[bytes]
    store_spec: CPULoadStoreSpec
    evicted_keys: list[bytes]


@dataclass
class OffloadingEvent:
    keys: list[bytes]
    medium: str
    removed: bool


@dataclass
class RequestOffloadingContext:
    policy: str = "block_level"


class _LRU:
    def __init__(self, capacity: int) -> None:
        self.order: OrderedDict[bytes, None] = OrderedDict()

    def inserted(self, key: bytes) -> None:
        pass

    def idle(self, key: bytes) -> None:
        self.order[key] = None

    def busy(self, key: bytes) -> None:
        del self.order[key]

    def removed(self, key: bytes) -> None:
        self.order.pop(key, None)

    def touch(self, keys: list[bytes], blocks: dict[bytes, list[int]]) -> None:
        order = self.order
        for key in reversed(keys):
            if key in order:
                order.move_to_end(key)

    def victims(self, n: int, protected: set[bytes], blocks: dict[bytes, list[int]]) -> list[bytes] | None:
        chosen = []
        for key in self.order:
            if key not in protected:
                chosen.append(key)
                if len(chosen) == n:
                    return chosen
        return None

    def evicted(self, keys: list[bytes]) -> None:
        for key in keys:
            del self.order[key]

    def clear(self) -> None:
        self.order.clear()

    def state(self) -> tuple[Any, ...]:
        return (tuple(self.order),)


class _ARC:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.target = 0.0
        self.t1: OrderedDict[bytes, None] = OrderedDict()
        self.t2: OrderedDict[bytes, None] = OrderedDict()
        self.b1: OrderedDict[bytes, None] = OrderedDict()
        self.b2: OrderedDict[bytes, None] = OrderedDict()

    def inserted(self, key: bytes) -> None:
        self.t1[key] = None
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def idle(self, key: bytes) -> None:
        pass

    def busy(self, key: bytes) -> None:
        pass

    def removed(self, key: bytes) -> None:
        if self.t1.pop(key, 0) == 0:
            self.t2.pop(key, None)

    def touch(self, keys: list[bytes], blocks: dict[bytes, list[int]]) -> None:
        t1, t2, b1, b2 = self.t1, self.t2, self.b1, self.b2
        for key in reversed(keys):
            if key in t1:
                del t1[key]
                if blocks[key][1] == PENDING:
                    t1[key] = None
                else:
                    t2[key] = None
            elif key in t2:
                t2.move_to_end(key)
            elif key in b1:
                self.target = min(self.target + max(1, len(b2) / len(b1)), self.capacity)
                b1.move_to_end(key)
            elif key in b2:
                self.target = max(self.target - max(1, len(b1) / len(b2)), 0)
                b2.move_to_end(key)

    def victims(self, n: int, protected: set[bytes], blocks: dict[bytes, list[int]]) -> list[bytes] | None:
        chosen: list[bytes] = []
        taken: set[bytes] = set()
        t1_size = len(self.t1)
        for _ in range(n):
            pick = None
            if t1_size >= int(self.target):
                pick = self._first_idle(self.t1, protected, taken, blocks)
                if pick is not None:
                    t1_size -= 1
            if pick is None:
                pick = self._first_idle(self.t2, protected, taken, blocks)
            if pick is None:  # T2 has none: T1's, below its target or not (vllm#55461)
                pick = self._first_idle(self.t1, protected, taken, blocks)
                if pick is None:
                    return None
                t1_size -= 1
            chosen.append(pick)
            taken.add(pick)
        return chosen

    @staticmethod
    def _first_idle(keys: OrderedDict[bytes, None], protected: set[bytes], taken: set[bytes],
                    blocks: dict[bytes, list[int]]) -> bytes | None:
        for key in keys:
            if blocks[key][1] == 0 and key not in protected and key not in taken:
                return key
        return None

    def evicted(self, keys: list[bytes]) -> None:
        for key in keys:
            if key in self.t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
        for ghosts in (self.b1, self.b2):
            for _ in range(len(ghosts) - self.capacity):
                ghosts.popitem(last=False)

    def clear(self) -> None:
        self.__init__(self.capacity)  # type: ignore[misc]

    def state(self) -> tuple[Any, ...]:
        return (tuple(self.t1), tuple(self.t2), tuple(self.b1), tuple(self.b2), self.target)


_POLICIES = {"lru": _LRU, "arc": _ARC}


class CPUOffloadingManager:
    """The scheduler side of a CPU tier of ``num_blocks`` blocks."""

    def __init__(self, num_blocks: int, cache_policy: str = "lru", enable_events: bool = False,
                 store_threshold: int = 1, max_tracker_size: int = 64_000) -> None:
        if cache_policy not in _POLICIES:
            raise ValueError(f"Unknown cache policy: {cache_policy!r}. Supported: {list(_POLICIES)}")
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        self.medium = MEDIUM
        self._num_blocks = num_blocks
        self._policy = _POLICIES[cache_policy](num_blocks)
        self._blocks: dict[bytes, list[int]] = {}
        self._num_fresh = 0
        self._free_list: list[int] = []
        self._num_evictable = 0
        self.events: list[OffloadingEvent] | None = [] if enable_events else None
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
        self.counts: OrderedDict[bytes, int] | None = OrderedDict() if store_threshold >= 2 else None

    def on_new_request(self, req_context: Any = None) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: Any = None) -> None:
        return None

    def lookup(self, key: bytes, req_context: Any = None) -> LookupResult:
        counts = self.counts
        if counts is not None:
            if key in counts:
                counts.move_to_end(key)
                counts[key] += 1
            else:
                if len(counts) >= self.max_tracker_size:
                    counts.popitem(last=False)
                counts[key] = 1
        block = self._blocks.get(key)
        if block is None:
            return LookupResult.MISS
        return LookupResult.HIT_PENDING if block[1] == PENDING else LookupResult.HIT

    def prepare_load(self, keys: Collection[bytes], req_context: Any = None) -> CPULoadStoreSpec:
        blocks = self._blocks
        found = [blocks.get(k) for k in keys]
        for key, block in zip(keys, found, strict=True):
            if block is None or block[1] == PENDING:
                raise ValueError(f"[tier-content-soundness] prepare_load of key {key!r}, which is "
                                 f"{'pending' if block else 'absent'}: only a stored key can be loaded")
        for key, block in zip(keys, found, strict=True):
            if block[1] == 0:
                self._policy.busy(key)
                self._num_evictable -= 1
            block[1] += 1
        return CPULoadStoreSpec([b[0] for b in found])  # type: ignore[index]

    def touch(self, keys: Collection[bytes], req_context: Any = None) -> None:
        self._policy.touch(list(keys), self._blocks)

    def complete_load(self, keys: Collection[bytes], req_context: Any = None) -> None:
        blocks = self._blocks
        keys = list(keys)
        need: dict[bytes, int] = {}
        for key in keys:
            need[key] = need.get(key, 0) + 1
        for key, n in need.items():
            block = blocks.get(key)
            if block is None or block[1] < n:
                raise ValueError(f"[tier-ref-conservation] complete_load of key {key!r} with no load in flight on it")
        for key in keys:
            block = blocks[key]
            block[1] -= 1
            if block[1] == 0:
                self._num_evictable += 1
                self._policy.idle(key)

    def prepare_store(self, keys: Collection[bytes], req_context: Any = None) -> PrepareStoreOutput | None:
        keys = list(keys)
        if len(set(keys)) != len(keys):
            raise ValueError(f"[tier-content-soundness] prepare_store of repeated keys {keys!r}")
        protected = set(keys)
        if self.counts is not None:
            counts, threshold = self.counts, self.store_threshold
            keys = [k for k in keys if counts.get(k, 0) >= threshold]
        blocks = self._blocks
        new = [k for k in keys if k not in blocks]
        if not new:
            return PrepareStoreOutput([], CPULoadStoreSpec([]), [])
        short = len(new) - (self._num_blocks - self._num_fresh + len(self._free_list))
        evicted: list[bytes] = []
        if short > 0:
            if short > self._num_evictable:
                return None
            victims = self._policy.victims(short, protected, blocks)
            if victims is None:
                return None
            self._policy.evicted(victims)
            for key in victims:
                self._free_list.append(blocks.pop(key)[0])
            self._num_evictable -= len(victims)
            evicted = victims
            if self.events is not None:
                self.events.append(OffloadingEvent(list(victims), MEDIUM, True))
        ids = []
        for key in new:
            if self._num_fresh < self._num_blocks:
                block_id = self._num_fresh
                self._num_fresh += 1
            else:
                block_id = self._free_list.pop()
            ids.append(block_id)
            blocks[key] = [block_id, PENDING]
            self._policy.inserted(key)
        return PrepareStoreOutput(new, CPULoadStoreSpec(ids), evicted)

    def complete_store(self, keys: Collection[bytes], req_context: Any = None, success: bool = True) -> None:
        blocks = self._blocks
        done = []
        for key in dict.fromkeys(keys):
            block = blocks.get(key)
            if block is None or block[1] != PENDING:
                continue
            if success:
                block[1] = 0
                self._num_evictable += 1
                self._policy.idle(key)
                done.append(key)
            else:
                self._policy.removed(key)
                del blocks[key]
                self._free_list.append(block[0])
        if done and self.events is not None:
            self.events.append(OffloadingEvent(done, MEDIUM, False))

    def reset_cache(self) -> None:
        self._blocks.clear()
        self._policy.clear()
        self._num_evictable = 0
        self._num_fresh = 0
        self._free_list.clear()

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self.events is not None:
            events, self.events = self.events, []
            yield from events

    # observation (kvspec's conformance reads the tier through it)

    def tier_state(self) -> tuple[int, dict[bytes, tuple[int, int]], int, tuple[Any, ...]]:
        """(num_blocks, key -> (block id, ref), evictable count, the policy's order)."""
        return (self._num_blocks, {k: (b, r) for k, (b, r) in self._blocks.items()}, self._num_evictable,
                self._policy.state())
