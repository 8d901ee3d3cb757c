"""Hand-worked examples for kvspec's KV-cache managers, one kind of attention
at a time, then hybrids, refusals and the scheduler's other calls.

Pools start with every block free in id order (block 0 is the null block),
so the expected ids follow from the free-queue rules: unhashed blocks freed
go to the head, cached ones to the tail, a request's blocks tail first.
"""

from __future__ import annotations

import pytest

from kvspec.errors import RuleError, RuleTypeError
from kvspec.hashing import get_request_block_hasher
from kvspec.impl import BlockPool, BlockStored, KVCacheBlocks, KVCacheManager
from kvspec.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    MLAAttentionSpec,
)
from kvspec.request import Request, RequestStatus
from kvspec.testing import GEOMETRY, full, mamba, swa


def make(*specs: KVCacheSpec, num_blocks: int = 16, sbs: int = 4, hbs: int = 4, **kwargs) -> KVCacheManager:
    groups = [KVCacheGroupSpec([f"layers.{i}"], spec) for i, spec in enumerate(specs)]
    kwargs.setdefault("retention_interval", None)
    return KVCacheManager(KVCacheConfig(num_blocks=num_blocks, kv_cache_groups=groups), 64, sbs, hbs, **kwargs)


def request(rid: str, tokens, hbs: int = 4) -> Request:
    return Request(rid, list(tokens), block_hasher=get_request_block_hasher(hbs))


def admit(m: KVCacheManager, req: Request, num_new: int | None = None, **kwargs) -> KVCacheBlocks | None:
    """The scheduler admitting a waiting request: look up, allocate, advance."""
    hits, num_hit = m.get_computed_blocks(req)
    num_new = req.num_tokens - num_hit if num_new is None else num_new
    new = m.allocate_slots(req, num_new, num_hit, hits, **kwargs)
    if new is not None:
        req.num_computed_tokens = num_hit + num_new
        req.status = RequestStatus.RUNNING
    return new


def step(m: KVCacheManager, req: Request, num_new: int = 1, **kwargs) -> KVCacheBlocks | None:
    new = m.allocate_slots(req, num_new, **kwargs)
    if new is not None:
        req.num_computed_tokens += num_new
    return new


def state(m: KVCacheManager) -> tuple:
    """Everything a refusal must leave alone."""
    pool = m.block_pool
    tables = [{rid: [b.block_id for b in blocks] for rid, blocks in s.req_to_blocks.items() if blocks}
              for s in m.coordinator.single_type_managers]
    counters = [dict(s.num_cached_block) for s in m.coordinator.single_type_managers]
    return (tables, counters, [b.ref_cnt for b in pool.blocks], pool.free_block_queue.free_block_ids(),
            [b.block_hash for b in pool.blocks])


def free_ids(m: KVCacheManager) -> list[int]:
    return m.block_pool.free_block_queue.free_block_ids()


def hashed(m: KVCacheManager, ids) -> list[bool]:
    return [m.block_pool.blocks[i].block_hash is not None for i in ids]


# --- full attention ----------------------------------------------------------------------------


def test_full_attention_prefix_hit():
    m = make(full(4))
    a = request("a", range(10))
    assert admit(m, a).get_block_ids() == ([1, 2, 3],)
    assert hashed(m, [1, 2, 3]) == [True, True, False]  # only full blocks are cached

    b = request("b", [*range(8), 50, 51, 52])
    hits, num_hit = m.get_computed_blocks(b)
    assert (hits.get_block_ids(), num_hit) == (([1, 2],), 8)
    assert m.allocate_slots(b, 3, num_hit, hits).get_block_ids() == ([4],)
    assert m.get_block_ids("b") == ([1, 2, 4],)
    assert [m.block_pool.blocks[i].ref_cnt for i in (1, 2, 3, 4)] == [2, 2, 1, 1]
    assert m.get_num_common_prefix_blocks("a") == [2]


def test_hit_stops_one_token_short_of_the_prompt():
    m = make(full(4))
    admit(m, request("a", range(8)))
    # Replaying the whole 8-token prompt: the last token is recomputed, so only one block hits.
    hits, num_hit = m.get_computed_blocks(request("c", range(8)))
    assert (hits.get_block_ids(), num_hit) == (([1],), 4)


def test_free_order_tail_first_unhashed_to_the_head():
    m = make(full(4))
    a = request("a", range(10))
    admit(m, a)
    m.free(a)
    # 3 (unhashed) is reused first; cached 2 then 1 are evicted last, tail before head.
    assert free_ids(m) == [3, *range(4, 16), 2, 1]
    assert m.get_block_ids("a") == ([],)


def test_eagle_drops_the_last_hit_block():
    m = make(full(4), use_eagle=True)
    admit(m, request("a", range(12)))
    hits, num_hit = m.get_computed_blocks(request("b", [*range(12), 99]))
    assert (hits.get_block_ids(), num_hit) == (([1, 2],), 8)


# --- sliding window ------------------------------------------------------------------------------


def test_remove_skipped_blocks_puts_nulls_and_frees_tail_first():
    m = make(swa(4, window=5))
    a = request("a", range(16))
    admit(m, a)
    # The next query after 13 tokens reads tokens 9..13: blocks 0 and 1 are out of the window.
    m.remove_skipped_blocks("a", 13)
    assert m.get_block_ids("a") == ([0, 0, 3, 4],)
    assert free_ids(m)[-2:] == [2, 1]
    # A later removal stops at the nulls it left.
    m.remove_skipped_blocks("a", 17)
    assert m.get_block_ids("a") == ([0, 0, 0, 4],)
    assert free_ids(m)[-3:] == [2, 1, 3]


def test_sliding_window_hit_has_nulls_before_the_window():
    m = make(swa(4, window=5))
    a = request("a", range(17))
    admit(m, a)
    m.free(a)
    assert free_ids(m) == [5, *range(6, 16), 4, 3, 2, 1]
    b = request("b", [*range(16), 99])
    hits, num_hit = m.get_computed_blocks(b)
    # The window of 5 needs only the last block before the boundary at 16.
    assert (hits.get_block_ids(), num_hit) == (([0, 0, 0, 4],), 16)
    assert m.allocate_slots(b, 1, num_hit, hits).get_block_ids() == ([5],)
    assert m.get_block_ids("b") == ([0, 0, 0, 4, 5],)


def test_sliding_window_retention_caches_segment_tails_and_the_replay_boundary():
    m = make(full(4), swa(4, window=5), retention_interval=16)
    admit(m, request("a", range(22)))
    # Full attention caches every full block; sliding window only block 3 (tail of
    # the first 16-token segment) and block 4 (before the prompt's last boundary, 20).
    full_ids, swa_ids = m.get_block_ids("a")
    assert hashed(m, full_ids) == [True] * 5 + [False]
    assert hashed(m, swa_ids) == [False, False, False, True, True, False]


# --- chunked local attention ---------------------------------------------------------------------


def test_chunked_local_attention_counts_earlier_chunks_as_computed():
    m = make(ChunkedLocalAttentionSpec(block_size=4, attention_chunk_size=8, **GEOMETRY))
    a = request("a", range(20))
    # Token 19 reads only its chunk (16..19): the two earlier chunks are a "hit"
    # of null blocks without any lookup.
    hits, num_hit = m.get_computed_blocks(a)
    assert (hits.get_block_ids(), num_hit) == (([0, 0, 0, 0],), 16)
    assert m.allocate_slots(a, 4, num_hit, hits).get_block_ids() == ([1],)
    assert m.get_block_ids("a") == ([0, 0, 0, 0, 1],)
    b = request("b", [*range(20), 99])
    hits, num_hit = m.get_computed_blocks(b)
    assert (hits.get_block_ids(), num_hit) == (([0, 0, 0, 0, 1],), 20)
    assert m.allocate_slots(b, 1, num_hit, hits).get_block_ids() == ([2],)
    assert m.get_block_ids("b") == ([0, 0, 0, 0, 1, 2],)


def test_chunked_local_attention_releases_finished_chunks():
    m = make(ChunkedLocalAttentionSpec(block_size=4, attention_chunk_size=8, **GEOMETRY))
    a = request("a", range(6))
    admit(m, a)
    for token in range(7):
        a.append_output_token_ids(token)
        step(m, a)
    # 12 computed tokens: the next query is in the chunk starting at 8.
    assert m.get_block_ids("a") == ([0, 0, 3, 4],)
    assert free_ids(m)[-2:] == [2, 1]


# --- Mamba -------------------------------------------------------------------------------------------


def test_mamba_all_hit_waits_for_the_next_step():
    m = make(mamba(4, "all"))
    a = request("a", range(12))
    admit(m, a)
    b = request("b", [*range(12), 7])
    hits, num_hit = m.get_computed_blocks(b)
    assert (hits.get_block_ids(), num_hit) == (([0, 0, 3],), 12)
    # Block 3's state was written this step by "a": not readable yet.
    before = state(m)
    assert m.allocate_slots(b, 1, num_hit, hits) is None
    assert state(m) == before
    m.new_step_starts()
    assert m.allocate_slots(b, 1, num_hit, hits).get_block_ids() == ([4],)
    assert m.get_block_ids("b") == ([0, 0, 3, 4],)
    # "a" decodes: only the latest state is kept.
    a.append_output_token_ids(5)
    assert step(m, a).get_block_ids() == ([5],)
    assert m.get_block_ids("a") == ([0, 0, 3, 5],)


def test_mamba_align_keeps_two_states_and_hits_on_block_boundaries():
    m = make(mamba(4, "align"))
    mgr = m.coordinator.single_type_managers[0]
    a = request("a", range(10))
    # Prefill chunks end on block boundaries (the scheduler splits so).
    assert admit(m, a, 8).get_block_ids() == ([0, 1],)
    assert hashed(m, [1]) == [True]
    m.new_step_starts()
    assert step(m, a, 2).get_block_ids() == ([2],)
    assert mgr.last_state_block_idx == {"a": 1}
    a.append_output_token_ids(42)
    m.new_step_starts()
    # The state of two steps back (block 1) is released: cached, it goes to the tail.
    assert step(m, a, 1).get_block_ids(allow_none=True) is None
    assert m.get_block_ids("a") == ([0, 0, 2],)
    assert free_ids(m)[-1] == 1

    b = request("b", [*range(8), 77, 78])
    hits, num_hit = m.get_computed_blocks(b)
    assert (hits.get_block_ids(), num_hit) == (([0, 1],), 8)
    assert m.allocate_slots(b, 2, num_hit, hits).get_block_ids() == ([3],)
    assert m.get_block_ids("b") == ([0, 1, 3],)
    assert mgr.last_state_block_idx["b"] == 1


def test_mamba_align_estimate_is_vllms_even_when_negative():
    m = make(mamba(4, "align", speculative=1))
    a = request("a", range(8))
    assert admit(m, a).get_block_ids() == ([0, 1, 2],)
    # Rejected drafts can leave the table longer than needed; vLLM then
    # counts a negative need, which offsets other groups.
    assert m.coordinator.get_num_blocks_to_allocate("a", 4, ([],), 0, 4, 4) == -1
    # The manager's own query is what the allocation really takes: nothing.
    a.num_computed_tokens = 3
    assert m.get_num_blocks_to_allocate(a, 1) == 0


def test_mamba_align_connector_tokens_refused_cleanly_where_vllm_runs_dry():
    m = make(full(4), mamba(4, "align"), num_blocks=7)
    r = request("r", range(20))
    # vLLM estimates 6 blocks (5 full attention + 1 state) but Mamba also takes a
    # block per external slot: 7 > 6 free.  vLLM raises half-allocated; kvspec refuses.
    assert m.coordinator.get_num_blocks_to_allocate("r", 20, ([], []), 0, 16, 20) == 6
    assert m.get_num_blocks_to_allocate(r, 4, num_external_computed_tokens=16) == 7  # the exact count
    before = state(m)
    assert m.allocate_slots(r, 4, num_external_computed_tokens=16) is None
    assert state(m) == before


# --- cross attention ----------------------------------------------------------------------------------


def test_cross_attention_is_sized_by_encoder_tokens_and_never_cached():
    m = make(full(4), CrossAttentionSpec(block_size=4, **GEOMETRY), enable_caching=False)
    r = request("r", range(6))
    assert admit(m, r, num_encoder_tokens=10).get_block_ids() == ([1, 2], [3, 4, 5])
    r.append_output_token_ids(1)
    assert step(m, r).get_block_ids(allow_none=True) is None  # no new encoder tokens: unchanged
    assert m.get_block_ids("r") == ([1, 2], [3, 4, 5])
    assert not any(hashed(m, range(1, 6)))
    assert m.get_num_common_prefix_blocks("r") == [0, 0]
    assert m.get_block_ids_for_computed_tokens("r", 5) == ([1, 2], [3, 4, 5])
    m.free(r)
    assert m.block_pool.get_num_free_blocks() == 15


# --- hybrids ---------------------------------------------------------------------------------------------


def test_hybrid_full_and_sliding_window_with_different_block_sizes():
    m = make(full(4), swa(8, window=8), num_blocks=32, sbs=8, hbs=4)
    a = request("a", range(24))
    assert admit(m, a).get_block_ids() == ([1, 2, 3, 4, 5, 6], [7, 8, 9])
    b = request("b", [*range(24), 99])
    hits, num_hit = m.get_computed_blocks(b)
    assert (hits.get_block_ids(), num_hit) == (([1, 2, 3, 4, 5, 6], [0, 0, 9]), 24)
    assert m.allocate_slots(b, 1, num_hit, hits).get_block_ids() == ([10], [11])
    # Without the sliding window's last block, the common hit shrinks to 16 tokens.
    m.evict_blocks({9})
    hits, num_hit = m.get_computed_blocks(request("c", [*range(24), 98]))
    assert (hits.get_block_ids(), num_hit) == (([1, 2, 3, 4], [0, 8]), 16)


def test_hybrid_hit_is_a_multiple_of_the_scheduler_block_size():
    m = make(full(4), swa(8, window=8), num_blocks=32, sbs=8, hbs=4)
    admit(m, request("a", range(20)))
    # Full attention has 5 cached blocks (20 tokens) but hits end on 8-token boundaries.
    hits, num_hit = m.get_computed_blocks(request("b", [*range(20), 5, 5, 5]))
    assert (hits.get_block_ids(), num_hit) == (([1, 2, 3, 4], [0, 7]), 16)


def test_every_full_attention_spec_is_cut_to_the_hit():
    # Two full-attention specs (block sizes 4 and 8) and a window that cuts the hit to 0.  vLLM 0.25.1
    # cuts only the first full-attention spec group: its MLA hit keeps blocks 5, 6, and with 8
    # connector tokens allocate_external_computed_blocks calls get_new_blocks(cdiv(8, 8) - 2 = -1).
    mla8 = MLAAttentionSpec(block_size=8, **GEOMETRY)
    m = make(full(4), mla8, swa(4, window=6), num_blocks=40, sbs=8, hbs=4)
    admit(m, request("a", range(16)))  # full 1..4, MLA 5, 6, window 7..10
    m.evict_blocks({8, 10})  # the window (2 contiguous blocks) serves neither 16 nor 8
    b = request("b", [*range(16), 1])
    hits, num_hit = m.get_computed_blocks(b)
    assert (hits.get_block_ids(), num_hit) == (([], [], []), 0)
    new = m.allocate_slots(b, 1, num_hit, hits, num_external_computed_tokens=8)
    assert new.get_block_ids() == ([16], [17], [18])
    assert m.get_block_ids("b") == ([11, 12, 16], [13, 17], [14, 15, 18])
    assert m.block_pool.get_num_free_blocks() == len(free_ids(m)) == 39 - 18


def test_mamba_is_never_an_eagle_group():
    # use_eagle, no group flagged: every group drops the EAGLE block but Mamba (draft models have no
    # Mamba layers).  vLLM 0.25.1 searches Mamba one block past the candidate and returns 16 here,
    # with 3 full-attention blocks.
    m = make(full(4), mamba(4, "all"), num_blocks=20, use_eagle=True)
    assert m.coordinator.eagle_group_ids == {0}
    assert [s.use_eagle for s in m.coordinator.single_type_managers] == [True, False]
    admit(m, request("a", range(16)))  # full 1..4, Mamba 5..8
    hits, num_hit = m.get_computed_blocks(request("b", [*range(16), 1, 2, 3, 4]))
    assert (hits.get_block_ids(), num_hit) == (([1, 2, 3], [0, 0, 7]), 12)


# --- refusals --------------------------------------------------------------------------------------------


def test_refused_allocation_changes_nothing_but_the_out_of_window_release():
    m = make(swa(4, window=5), num_blocks=6)
    a = request("a", range(16))
    admit(m, a)
    a.append_output_token_ids(0)
    before = state(m)
    # Needs 6 more blocks.  As in vLLM, the 3 out-of-window blocks are released
    # first (tail first, cached: to the tail), making 4 free: still refused, and
    # nothing else changes.
    assert step(m, a, 1, num_lookahead_tokens=20) is None
    assert m.get_block_ids("a") == ([0, 0, 0, 4],)
    assert free_ids(m) == [5, 3, 2, 1]
    tables, counters, refs, _, hashes = state(m)
    assert (counters, hashes) == (before[1], before[4])
    assert refs[1:] == [0, 0, 0, 1, 0]
    # Needing 4, it fits with the released blocks -- as in vLLM.
    assert step(m, a, 1, num_lookahead_tokens=12).get_block_ids() == ([5, 3, 2, 1],)
    assert m.get_block_ids("a") == ([0, 0, 0, 4, 5, 3, 2, 1],)


def test_full_sequence_refusal_releases_nothing():
    m = make(swa(4, window=5), num_blocks=6)
    a = request("a", range(16))
    admit(m, a)
    m.allocate_slots(request("x", [9]), 1)  # the last free block
    a.append_output_token_ids(0)
    before = state(m)
    # The admission gate runs before the release: refused there, nothing changes.
    assert step(m, a, 1, full_sequence_must_fit=True) is None
    assert state(m) == before
    assert step(m, a, 1).get_block_ids() == ([3],)


def test_reserved_blocks_watermark_and_full_sequence_gate():
    m = make(full(4), num_blocks=9, watermark=0.25)  # 8 usable blocks, 2 kept free
    admit(m, request("running", range(8)))  # 6 free now
    r = request("r", range(100, 120))
    # The whole 20-token prompt needs 5 blocks: with the watermark, 7 > 6.
    assert admit(m, r, 8, full_sequence_must_fit=True, has_scheduled_reqs=True) is None
    # Nothing else is scheduled this step: no watermark.
    assert admit(m, r, 8, full_sequence_must_fit=True, has_scheduled_reqs=False) is not None
    m.free(r)
    r = request("r2", range(200, 208))
    assert admit(m, r, reserved_blocks=5, has_scheduled_reqs=False) is None
    assert admit(m, r, reserved_blocks=4, has_scheduled_reqs=False) is not None


def test_bad_allocations_are_refused_before_anything_changes():
    m = make(full(4), swa(4, window=5))
    a = request("a", range(8))
    admit(m, a)
    before = state(m)
    with pytest.raises(RuleTypeError, match="num_new_tokens must be an int"):
        m.allocate_slots(a, 1.5)
    with pytest.raises(RuleError, match="num_lookahead_tokens must be >= 0, got -1"):
        m.allocate_slots(a, 1, num_lookahead_tokens=-1)
    with pytest.raises(RuleError, match="num_new_tokens must be > 0 when there are no external tokens"):
        m.allocate_slots(a, 0)
    hits = m.get_blocks("a")
    with pytest.raises(RuleError, match="already holds blocks; it takes no new hits"):
        m.allocate_slots(a, 1, 8, hits)
    b = request("b", range(10))
    with pytest.raises(RuleError, match="new_computed_blocks has 1 groups, the model has 2"):
        m.allocate_slots(b, 1, 4, KVCacheBlocks(([m.block_pool.blocks[1]],)))
    foreign = BlockPool(16, True, 4).blocks[1]
    with pytest.raises(RuleTypeError, match="is not a block of this pool"):
        m.allocate_slots(b, 1, 4, KVCacheBlocks(([foreign], [])))
    with pytest.raises(RuleError, match="cannot cache 12 tokens"):
        m.cache_blocks(a, 12)
    assert state(m) == before


# --- the scheduler's other calls ------------------------------------------------------------------------


def test_pop_blocks_for_free_defers_the_return():
    m = make(full(4))
    a = request("a", range(10))
    admit(m, a)
    blocks = m.pop_blocks_for_free(a)
    assert [b.block_id for b in blocks] == [1, 2, 3]
    assert m.get_block_ids("a") == ([],)
    assert m.block_pool.get_num_free_blocks() == 12  # still held until freed
    m.block_pool.free_blocks(reversed(blocks))
    assert free_ids(m) == [3, *range(4, 16), 2, 1]


def test_new_block_ids_are_attention_blocks_only():
    m = make(full(4), mamba(4, "all"))
    admit(m, request("a", range(6)))
    assert m.take_new_block_ids() == [1, 2]
    assert m.take_new_block_ids() == []


def test_events_name_the_kind_of_attention():
    m = make(full(4), swa(4, window=5), enable_kv_cache_events=True)
    admit(m, request("a", range(8)))
    stored = [e for e in m.take_events() if isinstance(e, BlockStored)]
    assert [(e.group_idx, e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window) for e in stored] == [
        (0, "full_attention", None),
        (1, "sliding_window", 5),
    ]


def test_prefix_cache_stats():
    m = make(full(4), log_stats=True)
    a = request("a", range(9))
    admit(m, a)
    b = request("b", range(9))
    b.num_preemptions = 1
    m.get_computed_blocks(b)
    stats = m.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (1, 9, 0)
    assert (stats.preempted_requests, stats.preempted_queries, stats.preempted_hits) == (1, 9, 8)
    m.free(a)
    assert m.reset_prefix_cache()
    assert m.make_prefix_cache_stats().reset
    assert make(full(4)).make_prefix_cache_stats() is None


def test_reset_only_when_idle_and_skip_reading():
    m = make(full(4))
    a = request("a", range(9))
    admit(m, a)
    assert not m.reset_prefix_cache()
    b = request("b", range(9))
    b.skip_reading_prefix_cache = True
    assert m.get_computed_blocks(b) == (m.empty_kv_cache_blocks, 0)
    m.free(a)
    assert m.reset_prefix_cache()
    assert m.get_computed_blocks(request("c", range(9)))[1] == 0


def test_kv_cache_blocks_api():
    pool = BlockPool(8, True, 4)
    b1, b2, b3 = pool.blocks[1:4]
    b2._block_hash = b"x"
    left, right = KVCacheBlocks(([b1], [pool.null_block])), KVCacheBlocks(([b2], [b3]))
    both = left + right
    assert both.get_block_ids() == ([1, 2], [0, 3])
    assert both.get_unhashed_block_ids_all_groups() == [[1], [3]]
    assert KVCacheBlocks(([b1, b2],)).get_unhashed_block_ids() == [1]
    empty = both.new_empty()
    assert empty.get_block_ids() == ([], []) and empty.get_block_ids(allow_none=True) is None


def test_remove_blocks_in_range_stops_at_nulls():
    m = make(full(4))
    admit(m, request("a", range(16)))
    manager = m.coordinator.single_type_managers[0]
    manager._remove_blocks_in_range("a", 1, 3)
    assert m.get_block_ids("a") == ([1, 0, 0, 4],)
    assert free_ids(m)[-2:] == [3, 2]
    manager._remove_blocks_in_range("a", 0, 3)  # slot 2 is already null: nothing more
    assert m.get_block_ids("a") == ([1, 0, 0, 4],)
    manager._remove_blocks_in_range("nobody", 0, 3)


def test_reachable_block_masks():
    window = swa(4, window=5)
    swa_cls = type(make(window).coordinator.single_type_managers[0])
    assert swa_cls.reachable_block_mask(0, 4, None, window, False) is None
    # Two blocks per 8-token segment, one of them needed: the segment tails.
    assert swa_cls.reachable_block_mask(0, 4, 8, window, False) == [False, True, False, True]
    # With EAGLE the run ends one block past each boundary.
    assert swa_cls.reachable_block_mask(0, 4, 8, window, True) is None
    state = mamba(4, "all")
    mamba_cls = type(make(state).coordinator.single_type_managers[0])
    assert mamba_cls.reachable_block_mask(0, 6, 4, state, False) is None
    assert mamba_cls.reachable_block_mask(0, 6, 4, state, False, retention_interval=4) is None
    assert mamba_cls.reachable_block_mask(0, 6, 4, state, False, retention_interval=8, num_prompt_tokens=13) == [
        False, True, True, True, False, True,
    ]
    # Retention 0 keeps only the states a later request is known to hit: the prompt's replay boundary (12)
    # and, where the scheduler stored one, the end of a prefix other requests share (8: from 0.26 on).
    assert mamba_cls.reachable_block_mask(0, 6, 4, state, False, retention_interval=0, num_prompt_tokens=13) == [
        False, False, True, False, False, False,
    ]
    assert mamba_cls.reachable_block_mask(0, 6, 4, state, False, retention_interval=0, num_prompt_tokens=13,
                                          shared_prefix_boundary=8) == [False, True, True, False, False, False]
    assert swa_cls.reachable_block_mask(0, 6, 8, window, False, retention_interval=0, num_prompt_tokens=21,
                                        shared_prefix_boundary=8) == [False, True, False, True, False, False]


def test_cross_attention_refuses_caching_and_hits():
    m = make(full(4), CrossAttentionSpec(block_size=4, **GEOMETRY), enable_caching=False)
    cross_manager = m.coordinator.single_type_managers[1]
    with pytest.raises(RuleError, match="never cached"):
        cross_manager.cache_blocks(request("r", range(4)), 4)
    with pytest.raises(RuleError, match="never prefix-cache hits"):
        type(cross_manager).find_longest_cache_hit([], 4, [1], m.block_pool, cross_manager.kv_cache_spec, False, 4)


def test_rswa_releases_the_gap_between_prompt_and_window():
    """vLLM 0.25.1's own R-SWA expectations (its test_rswa_remove_skipped_blocks_gap_range,
    with held blocks: kvspec refuses to free unheld ones): nothing without the prompt
    length; then the blocks wholly between the prompt and the window, tail first."""
    from kvspec.impl.single_type_kv_cache_manager import RSWAManager
    from kvspec.kv_cache_interface import RSWASpec

    spec = RSWASpec(block_size=4, num_kv_heads=1, head_size=1, dtype="float32", rswa_window=8)
    pool = BlockPool(num_gpu_blocks=64, enable_caching=True, hash_block_size=4)
    manager = RSWAManager(spec, block_pool=pool, enable_caching=True, kv_cache_group_id=0, scheduler_block_size=4)
    table = pool.get_new_blocks(10)
    ids = [block.block_id for block in table]
    manager.req_to_blocks["r"] = table
    manager.remove_skipped_blocks("r", 28)
    assert [block.block_id for block in table] == ids
    manager.remove_skipped_blocks("r", 28, num_prompt_tokens=16)  # the window starts at 20: gap = block 4
    ids[4] = 0
    assert [block.block_id for block in table] == ids
    manager.remove_skipped_blocks("r", 36, num_prompt_tokens=16)  # the window starts at 28: blocks 5, 6 too
    ids[5] = ids[6] = 0
    assert [block.block_id for block in table] == ids
    assert pool.get_num_free_blocks() == 63 - 10 + 3
