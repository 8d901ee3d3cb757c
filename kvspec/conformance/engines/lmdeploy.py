"""LMDeploy's PyTorch engine (0.18.0) at cache scope: its own ``Scheduler``
wiring the block manager, the block trie and the eviction helper, driven
as its engine loop drives them.

- admission: ``Scheduler.schedule(is_prefill=True)`` -- the engine's own
  prefill admission (trie match, capacity by reclaiming and trie eviction,
  allocation, the trie's attachment of full blocks, the match's commit or
  rollback); then the forward pass, which makes the prompt history;
- growth: the sampled tokens appended (``update_token_ids``), then
  ``Scheduler.schedule_running`` -- capacity, allocation, attachment of the
  newly full blocks; a request that cannot grow is preempted by it;
- finish, and a preempted request given up: ``Scheduler.end_session``;
- eviction: ``BlockTrie.evict``.

The content view (spec chapter 10; the mapping in docs/engines.md): block
ids are the allocator's logical ids; a block's hold count is its ref count
less the trie's own reference; ``free`` is what the logical allocator has
free; ``cached`` is every trie node's block, keyed by its adapter and the
tokens on its path from the adapter's root; a table is the sequence's
logical blocks, after ``None`` for the blocks a window dropped.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

from kvspec.conformance.engines import TickingClock
from kvspec.spec.engines import CacheLayout, CacheView

PREFILL_INTERVAL = 1  # decode steps per schedule: the engine preallocates this many tokens' slots per step


def problem() -> str | None:
    """Why LMDeploy's paging code does not import here (``None``: it does)."""
    if importlib.util.find_spec("lmdeploy") is None:
        return "lmdeploy is not installed"
    try:
        import lmdeploy.pytorch.paging  # noqa: F401
        import lmdeploy.pytorch.strategies.ar.sequence  # noqa: F401
    except Exception as error:  # an import-time dependency missing, a CUDA-only module
        return f"importing lmdeploy.pytorch.paging failed: {type(error).__name__}: {error}"
    return None


def unsupported(layout: CacheLayout) -> str | None:
    """LMDeploy has every cache-scope layout; with a window it turns prefix
    caching off (``CacheConfig.__post_init__``), so that layout judges its
    window block manager without a trie.  Several groups per request (a
    hybrid model's full and sliding-window pools) are SGLang's layout:
    LMDeploy's hybrid models keep SSM state checkpoints instead, not driven
    yet."""
    if layout.groups:
        return "a full+SWA hybrid pool pair is not LMDeploy's design (its hybrids keep SSM checkpoints: not driven yet)"
    return None


def target(layout: CacheLayout) -> LmdeployCacheTarget:
    return LmdeployCacheTarget(layout)


class LmdeployCacheTarget:
    """LMDeploy's scheduler, block manager and block trie, as a :class:`CacheTarget`."""

    def __init__(self, layout: CacheLayout):
        from lmdeploy.pytorch.config import CacheConfig, SchedulerConfig
        from lmdeploy.pytorch.messages import SequenceMeta
        from lmdeploy.pytorch.paging import Scheduler
        from lmdeploy.pytorch.paging.block_manager import base_block_manager
        from lmdeploy.pytorch.strategies.ar.sequence import ARSequenceStrategy

        base_block_manager.time = TickingClock()  # repeatable LRU order (see docs/engines.md)

        self.block_size = layout.block_size
        cache = CacheConfig(max_batches=256, block_size=layout.block_size, num_cpu_blocks=0,
                            num_gpu_blocks=layout.num_blocks, enable_prefix_caching=True,
                            window_size=layout.window or -1)
        self.scheduler = Scheduler(
            SchedulerConfig(max_batches=256, max_session_len=1 << 16, prefill_interval=PREFILL_INTERVAL), cache,
            seq_meta=SequenceMeta(layout.block_size, strategy=ARSequenceStrategy()))
        self.num_blocks = layout.num_blocks
        self.running: dict[str, tuple[int, Any]] = {}  # request id -> (session id, sequence)
        self.next_session = 0

    # --- the CacheTarget operations ------------------------------------------------------

    def admit(self, request_id: str, tokens: Sequence[int], tenant: Any) -> int | None:
        import numpy as np

        session_id, self.next_session = self.next_session, self.next_session + 1
        seq = self.scheduler.add_session(session_id).add_sequence(np.asarray(tokens, dtype=np.int64),
                                                                   adapter_name=tenant)
        admitted = self.scheduler.schedule(is_prefill=True, prealloc_size=0).running
        if seq not in admitted:  # it would wait for memory; the client gives up instead
            self.scheduler.end_session(session_id)
            return None
        self.scheduler.activate_seqs(admitted)
        hit = seq.num_history_ids  # the matched prefix: what the forward pass does not compute
        self._forward(seq)
        self.running[request_id] = (session_id, seq)
        return hit

    @staticmethod
    def _forward(seq: Any) -> None:
        """The model ran: the tokens scheduled are history (nothing sampled
        here -- the machine appends the next tokens itself)."""
        import numpy as np
        from lmdeploy.pytorch.messages import UpdateTokenMode

        seq.update_token_ids(np.empty(0, dtype=np.int64), mode=UpdateTokenMode.DECODE)

    def append(self, request_id: str, tokens: Sequence[int]) -> bool:
        import numpy as np
        from lmdeploy.pytorch.messages import UpdateTokenMode

        session_id, seq = self.running[request_id]
        seq.update_token_ids(np.asarray(tokens, dtype=np.int64), mode=UpdateTokenMode.DECODE)
        valid = self.scheduler.schedule_running([seq], prealloc_size=PREFILL_INTERVAL)
        if not valid[0]:  # preempted by the scheduler; the client gives it up
            self.leave(request_id)
            return False
        self._forward(seq)
        return True

    def cache(self, request_id: str) -> None:
        # LMDeploy attaches a sequence's full blocks to the trie whenever it allocates (admission, growth).
        _, seq = self.running[request_id]
        self.scheduler.block_trie.allocate(seq)

    def finish(self, request_id: str) -> None:
        self.leave(request_id)

    def preempt(self, request_id: str) -> None:
        _, seq = self.running[request_id]
        self.scheduler.preempt_seqs((seq,))
        self.leave(request_id)

    def leave(self, request_id: str) -> None:
        session_id, _ = self.running.pop(request_id)
        self.scheduler.end_session(session_id)

    def evict(self, num_blocks: int) -> int:
        return int(self.scheduler.block_trie.evict(num_blocks))

    def view(self) -> CacheView:
        import numpy as np

        allocator = self.scheduler.block_manager.allocator
        ids = np.arange(self.num_blocks)
        refs = allocator.get_ref_count(ids).tolist()
        cached = self._trie_blocks()
        used = self.num_blocks - allocator.get_num_free_blocks()
        free = frozenset(int(b) for b in allocator._free_blocks[used:])  # the logical free stack, as kept
        tables = {}
        for request_id, (_, seq) in self.running.items():
            dropped = getattr(seq, "num_ignored_history", 0) // self.block_size
            tables[request_id] = (None,) * dropped + tuple(int(b) for b in seq.logical_blocks.get_real_blocks())
        holds = {b: n - (b in cached) for b, n in enumerate(refs) if n - (b in cached) != 0}
        return CacheView(blocks=frozenset(range(self.num_blocks)), block_size=self.block_size, free=free,
                         tables=tables, holds=holds, cached=cached)

    def _trie_blocks(self) -> dict[int, tuple[Any, tuple[int, ...]]]:
        """Every attached node's block, by its adapter and the tokens on its path."""
        out: dict[int, tuple[Any, tuple[int, ...]]] = {}

        def walk(node: Any, adapter: Any, path: tuple[int, ...]) -> None:
            for child in node.children.values():
                tokens = path + tuple(int(t) for t in child.token_ids)
                out[int(child.block_id)] = (adapter, tokens)
                walk(child, adapter, tokens)

        for adapter, root in self.scheduler.block_trie._roots.items():
            walk(root, adapter, ())
        return out
