"""CrossHair obligations over impl's managers and coordinators: the hit
search of every attention type over every bounded cache state, the hybrid
fixed point, and ``allocate_slots``' block counting.

Each obligation builds impl's production :class:`kvspec.impl.KVCacheManager`
for a small layout and the spec's manager beside it (both through their
conformance targets).  A symbolic bit mask ``cached`` says which of a
request's block hashes are cached in each group: the bench takes a block per
position, has the pool cache them through that mask (impl's
``cache_full_blocks`` branches on each bit) and frees them again, so they
sit in the free queue as prefix-cache hits.  Then the request asks impl for
its longest hit (``get_computed_blocks``) and, for the counting obligations,
allocates its first chunk (``allocate_slots``) with symbolic counts.

Every call is checked as the conformance machine checks it: the
request-level step and state rules of :mod:`kvspec.spec.request_rules` --
among them **hit-optimality**, impl's hit against the brute-force oracle
:func:`~kvspec.spec.oracle.oracle_hit_length`, and
**allocation-accounting**, the blocks impl takes against the spec's count
-- and impl's result, tables, pool and events against the spec's
(:func:`divergence`, rule spec-equivalence).  Each obligation
returns the names of the rules that broke; its ``post:`` says none did, for
every cache state and count within the ``pre:`` bounds.

Layout parameters (EAGLE on or off) are realized up front -- they pick the
configuration -- while the cache bits and token counts stay symbolic into
the production code.
"""

from __future__ import annotations

from typing import Any

from kvspec.conformance.machines.machinery import call, divergence
from kvspec.conformance.targets.manager import ImplManagerTarget
from kvspec.conformance.targets.spec_manager import SpecManagerTarget
from kvspec.hashing import get_request_block_hasher
from kvspec.proofs.tracing import concrete, untraced
from kvspec.request import Request
from kvspec.spec.layout import Layout
from kvspec.spec.request_rules import (
    ManagerStep,
    RequestContext,
    check_request_state,
    check_request_step,
)
from kvspec.spec.rules import EventMirror, check_events
from kvspec.testing import chunked, cross, full, mamba, rswa, swa


class ManagerBench:
    """impl's manager and the spec's, in lockstep, for one layout and request."""

    def __init__(self, layout: Layout, num_tokens: int):
        self.layout = layout
        with untraced():  # configuration only: nothing symbolic reaches the constructors
            args = layout.target_args(enable_kv_cache_events=True)
            # (CrossHair's stand-in for math.gcd/lcm takes two arguments only: read these untraced.)
            self.scheduler_block_size = layout.scheduler_block_size
            self.block_sizes = [g.block_size for g in layout.groups]
            self.impl = ImplManagerTarget(*args)
            self.spec = SpecManagerTarget(*args)
            self.request = Request("r", [i % 3 for i in range(num_tokens)],
                                   block_hasher=get_request_block_hasher(layout.hash_block_size))
            self.ctx = RequestContext(layout=layout, requests={"r": self.request})
            self.mirror = EventMirror()
        self.broken: set[str] = set()

    @classmethod
    def over(cls, layout: Layout, positions: int) -> ManagerBench:
        """A bench whose request is ``positions`` scheduler blocks and one token long."""
        with untraced():
            block = layout.scheduler_block_size
        return cls(layout, positions * block + 1)

    def cache_scheduler_blocks(self, group: int, bits: int, positions: int) -> None:
        """:meth:`cache` over the first ``positions`` scheduler blocks of ``group``."""
        self.cache(group, bits, positions * self.scheduler_block_size // self.block_sizes[group])

    def cache(self, group: int, bits: int, positions: int) -> None:
        """Position ``i < positions`` of ``group`` is cached iff bit ``i`` of
        ``bits`` is set: blocks are taken, cached through that mask, freed."""
        block_size = self.block_sizes[group]
        mask = [bits >> i & 1 == 1 for i in range(positions)]
        ids = self.impl.pool.get_new_blocks(positions)
        self.impl.pool.cache_full_blocks(self.request, ids, 0, positions, block_size, group, mask)
        self.impl.pool.free_blocks(ids[::-1])
        mask = concrete(mask)
        with untraced():
            ids = self.spec.pool.get_new_blocks(positions)
            self.spec.pool.cache_full_blocks(self.request, ids, 0, positions, block_size, group, mask)
            self.spec.pool.free_blocks(ids[::-1])
            self.mirror.apply(self.impl.take_events())
            self.spec.take_events()

    def apply(self, op: str, expected_pulled: int | None = None, **kwargs: Any) -> Any:
        """One manager operation on both; record every rule it breaks."""
        with untraced():
            before = self.impl.snapshot()
        result, error = call(getattr(self.impl, op), (), kwargs)  # the code under proof, traced
        kwargs, result, error, events = concrete((kwargs, result, error, self.impl.take_events()))
        with untraced():
            after = self.impl.snapshot()
            if error is not None and not isinstance(error, (ValueError, TypeError)):
                self.broken.add("refusal-kind")
            step = ManagerStep(op, kwargs, before, after, result, error, expected_pulled)
            self.mirror.apply(events)
            violations = check_request_step(step, ctx=self.ctx) + check_request_state(after, ctx=self.ctx)
            self.broken.update(v.rule for v in violations + check_events(after.pool, self.mirror))
            spec_result, spec_error = call(getattr(self.spec, op), (), kwargs)
            spec_outcome = (spec_result, spec_error, self.spec.snapshot(), self.spec.take_events())
            if divergence(op, (result, error, after, events), spec_outcome):
                self.broken.add("spec-equivalence")
        return result

    def hit(self) -> tuple[Any, int]:
        found = self.apply("get_computed_blocks", request=self.request)
        return found if found is not None else (None, 0)

    def allocate(self, hit: tuple[Any, int], **counts: int) -> Any:
        """The request's first chunk after its hit, with the spec's count of
        the blocks it takes (a trial allocation, exact in Mamba align mode
        with connector tokens too) as the allocation-accounting reference."""
        blocks, num_hit = hit
        args = dict(request=self.request, num_new_computed_tokens=num_hit, new_computed_blocks=blocks, **counts)
        with untraced():
            estimate, _ = call(self.spec.get_num_blocks_to_allocate, (), concrete(args))
        return self.apply("allocate_slots", expected_pulled=estimate, **args)

    def outcome(self) -> tuple[str, ...]:
        return tuple(sorted(self.broken))


def _hit_rules(layout: Layout, bits: tuple[int, ...], positions: int) -> tuple[str, ...]:
    """Cache ``bits[g]`` in group ``g`` (``positions`` blocks of the
    scheduler block size each), look up the hit of a request one token
    longer; the rules broken."""
    bench = ManagerBench.over(layout, positions)
    for g, group_bits in enumerate(bits):
        bench.cache_scheduler_blocks(g, group_bits, positions)
    bench.hit()
    return bench.outcome()


# --- the hit of each attention type (one group) -------------------------------------------------------------


def full_attention_hit(cached: int, eagle: bool) -> tuple[str, ...]:
    """Full attention (``FullAttentionManager.find_longest_cache_hit``): six
    blocks of 2, any subset cached, with and without EAGLE.

    covers: FullAttentionManager.find_longest_cache_hit
    pre: 0 <= cached < 64
    post: __return__ == ()  # hit-soundness, hit-optimality, spec-equivalence
    """
    return _hit_rules(Layout((full(2),), use_eagle=concrete(eagle)), (cached,), 6)


def sliding_window_hit(cached: int, eagle: bool) -> tuple[str, ...]:
    """Sliding window of 4 tokens (two blocks of 2 must be cached before the hit's end).

    covers: SlidingWindowManager.find_longest_cache_hit
    pre: 0 <= cached < 64
    post: __return__ == ()  # hit-soundness, hit-optimality, spec-equivalence
    """
    return _hit_rules(Layout((swa(2, window=4),), use_eagle=concrete(eagle)), (cached,), 6)


def chunked_local_hit(cached: int) -> tuple[str, ...]:
    """Chunked local attention, chunks of 8 tokens (never an EAGLE group):
    the hit needs the blocks of the chunk its end falls in.

    covers: ChunkedLocalAttentionManager.find_longest_cache_hit
    pre: 0 <= cached < 64
    post: __return__ == ()  # hit-soundness, hit-optimality, spec-equivalence
    """
    return _hit_rules(Layout((chunked(2, chunk=8),)), (cached,), 6)


def mamba_hit(cached: int) -> tuple[str, ...]:
    """Mamba (one state block per hit length; never an EAGLE group).

    covers: MambaManager.find_longest_cache_hit
    pre: 0 <= cached < 64
    post: __return__ == ()  # hit-soundness, hit-optimality, spec-equivalence
    """
    return _hit_rules(Layout((mamba(2, "all"),)), (cached,), 6)


# --- the hybrid fixed point ------------------------------------------------------------------------------------------


def full_and_sliding_window_hit(full_cached: int, window_cached: int, eagle: bool) -> tuple[str, ...]:
    """Full attention + sliding window (``HybridKVCacheCoordinator``), four
    blocks each, any subsets, with and without EAGLE.

    covers: HybridKVCacheCoordinator.find_longest_cache_hit
    budget: 120
    pre: 0 <= full_cached < 16 and 0 <= window_cached < 16
    post: __return__ == ()  # hit-soundness, hit-optimality, spec-equivalence
    """
    layout = Layout((full(2), swa(2, window=4)), use_eagle=concrete(eagle))
    return _hit_rules(layout, (full_cached, window_cached), 4)


def full_and_mamba_hit(full_cached: int, mamba_cached: int, eagle: bool) -> tuple[str, ...]:
    """Full attention + Mamba, four blocks each; with EAGLE the full group
    drops a block and Mamba does not.

    covers: HybridKVCacheCoordinator.find_longest_cache_hit, eagle_group_ids
    budget: 120
    pre: 0 <= full_cached < 16 and 0 <= mamba_cached < 16
    post: __return__ == ()  # hit-soundness, hit-optimality, spec-equivalence
    """
    layout = Layout((full(2), mamba(2, "all")), use_eagle=concrete(eagle))
    return _hit_rules(layout, (full_cached, mamba_cached), 4)


def three_group_eagle_hit(full_cached: int, window_cached: int, chunk_cached: int) -> tuple[str, ...]:
    """Full + sliding window (the EAGLE groups) + chunked local: three spec
    groups, so the fixed point may take several passes, each EAGLE drop
    verified once per candidate.

    covers: HybridKVCacheCoordinator.find_longest_cache_hit
    budget: 120
    pre: 0 <= full_cached < 8 and 0 <= window_cached < 8 and 0 <= chunk_cached < 8
    post: __return__ == ()  # hit-soundness, hit-optimality, spec-equivalence
    """
    layout = Layout((full(2), swa(2, window=4), chunked(2, chunk=4)), use_eagle=True, eagle_groups=(0, 1))
    return _hit_rules(layout, (full_cached, window_cached, chunk_cached), 3)


# --- allocate_slots' block counting -------------------------------------------------------------------------------


def _allocation_rules(layout: Layout, cached: int, positions: int, **counts: int) -> tuple[str, ...]:
    """The first ``cached`` positions cached in every group (the hit search
    over every cache state is proved above), a hit, then one allocation."""
    counts = concrete(counts)
    bench = ManagerBench.over(layout, positions)
    if layout.enable_caching:
        for g in range(len(bench.block_sizes)):
            bench.cache_scheduler_blocks(g, (1 << cached) - 1, positions)
    bench.allocate(bench.hit(), **counts)
    return bench.outcome()


def allocate_with_lookahead(cached: int, num_new: int, lookahead: int) -> tuple[str, ...]:
    """Full attention + sliding window with EAGLE: a hit, then a chunk with
    speculative lookahead slots.

    covers: KVCacheManager.allocate_slots
    budget: 150
    pre: 0 <= cached <= 4
    pre: 1 <= num_new <= 6
    pre: 0 <= lookahead <= 2
    post: __return__ == ()  # allocation-accounting, hit-soundness, ref-conservation, spec-equivalence
    """
    layout = Layout((full(2), swa(2, window=4)), num_blocks=24, use_eagle=True)
    return _allocation_rules(layout, cached, 4, num_new_tokens=num_new, num_lookahead_tokens=lookahead)


def allocate_with_external(cached: int, num_new: int, external: int) -> tuple[str, ...]:
    """Full attention + sliding window: a hit, then tokens a KV connector
    computed (external) and a chunk.

    covers: KVCacheManager.allocate_slots, allocate_external_computed_blocks
    budget: 90
    pre: 0 <= cached <= 4
    pre: 1 <= num_new <= 6
    pre: 0 <= external <= 2
    post: __return__ == ()  # allocation-accounting, hit-soundness, ref-conservation, spec-equivalence
    """
    layout = Layout((full(2), swa(2, window=4)), num_blocks=24)
    return _allocation_rules(layout, cached, 4, num_new_tokens=num_new,
                             num_external_computed_tokens=2 * external)


def allocate_with_encoder(num_new: int, encoder: int) -> tuple[str, ...]:
    """Encoder-decoder (full + cross attention, caching off): decoder
    blocks for the chunk, cross-attention blocks for the encoder tokens.

    covers: KVCacheManager.allocate_slots, CrossAttentionManager
    budget: 60
    pre: 1 <= num_new <= 9
    pre: 0 <= encoder <= 12
    post: __return__ == ()  # allocation-accounting, ref-conservation, spec-equivalence
    """
    layout = Layout((full(2), cross(2)), num_blocks=16, enable_caching=False)
    return _allocation_rules(layout, 0, 4, num_new_tokens=num_new, num_encoder_tokens=encoder)


def allocate_mamba_align(cached: int, num_new: int, external: int) -> tuple[str, ...]:
    """Full attention + Mamba in align mode (a state block per scheduler
    block boundary crossed), with connector tokens: vLLM's estimate misses a
    block there and kvspec refuses cleanly instead.

    covers: KVCacheManager.allocate_slots, MambaManager (align)
    budget: 90
    pre: 0 <= cached <= 4
    pre: 1 <= num_new <= 6
    pre: 0 <= external <= 2
    post: __return__ == ()  # allocation-accounting, hit-soundness, ref-conservation, spec-equivalence
    """
    layout = Layout((full(2), mamba(2, "align")), num_blocks=24)
    return _allocation_rules(layout, cached, 4, num_new_tokens=num_new,
                             num_external_computed_tokens=2 * external)


# --- leaving the window: remove_skipped_blocks --------------------------------------------------------------------


def _release_rules(layout: Layout, num_tokens: int, computed: int, prompt: int | None = None) -> tuple[str, ...]:
    """A request allocates ``num_tokens`` tokens (nothing cached), its first
    ``computed`` are done, and the manager releases what left the window."""
    bench = ManagerBench(layout, num_tokens)
    bench.allocate((None, 0), num_new_tokens=num_tokens)
    bench.apply("remove_skipped_blocks", request_id="r", total_computed_tokens=computed, num_prompt_tokens=prompt)
    return bench.outcome()


def sliding_window_release(computed: int) -> tuple[str, ...]:
    """Sliding window of 4 over blocks of 2: exactly the blocks no later
    query reads are released, tail first, the slots keeping the null block.

    covers: KVCacheManager.remove_skipped_blocks (sliding window)
    pre: 0 <= computed <= 14
    post: __return__ == ()  # content-soundness, free-order, ref-conservation, spec-equivalence
    """
    return _release_rules(Layout((swa(2, window=4),)), 14, computed)


def chunked_local_release(computed: int) -> tuple[str, ...]:
    """Chunked local attention, chunks of 4: the blocks of finished chunks.

    covers: KVCacheManager.remove_skipped_blocks (chunked local)
    pre: 0 <= computed <= 14
    post: __return__ == ()  # content-soundness, free-order, ref-conservation, spec-equivalence
    """
    return _release_rules(Layout((chunked(2, chunk=4),)), 14, computed)


def mamba_release(computed: int) -> tuple[str, ...]:
    """Mamba in align mode next to full attention: every state block but the
    one the next step reads.

    covers: KVCacheManager.remove_skipped_blocks (Mamba)
    pre: 0 <= computed <= 14
    post: __return__ == ()  # content-soundness, free-order, ref-conservation, spec-equivalence
    """
    return _release_rules(Layout((full(2), mamba(2, "align"))), 14, computed)


def rswa_release(computed: int, prompt: int) -> tuple[str, ...]:
    """Reference sliding window (window 4, blocks of 2): the prompt stays,
    the gap between it and the window goes.

    covers: KVCacheManager.remove_skipped_blocks (R-SWA)
    budget: 90
    pre: 0 <= computed <= 16
    pre: 1 <= prompt <= 8
    post: __return__ == ()  # content-soundness, free-order, ref-conservation, spec-equivalence
    """
    return _release_rules(Layout((rswa(2, window=4),)), 16, computed, prompt)
