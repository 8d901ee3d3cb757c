"""Hand-worked examples for the spec's KV-cache manager (kvspec.spec.manager).

Every expected value below is worked out by hand from the rules in
spec/kinds/ and spec/coordinator.py (the comments show the working),
and each scenario is one an engineer would check against vLLM 0.25.1.
Block ids: a fresh pool hands out 1, 2, 3, ... in order (0 is the null block).
"""

from __future__ import annotations

import math

import pytest

from kvspec.errors import RuleError, RuleTypeError
from kvspec.hashing import get_request_block_hasher
from kvspec.request import Request, RequestStatus
from kvspec.spec.interface import Cleared, ManagerTarget, Removed, Stored
from kvspec.spec.manager import SpecKVCacheManager
from kvspec.testing import chunked, config, cross, full, mamba, mla, swa


def manager(*specs, num_blocks=16, max_model_len=64, caching=True, eagle=False, events=False,
            eagle_groups=(), sbs=None, hbs=None, **kw):
    sizes = [s.block_size for s in specs]
    sbs = sbs or math.lcm(*sizes)
    hbs = hbs or (math.gcd(*sizes) if caching and len(specs) > 1 else (sbs if not caching else sizes[0]))
    m = SpecKVCacheManager(config(*specs, num_blocks=num_blocks, eagle_groups=eagle_groups), max_model_len, sbs, hbs,
                           enable_caching=caching, use_eagle=eagle, enable_kv_cache_events=events, **kw)
    m.test_hbs = hbs
    return m


def request(m, rid, tokens, **kw):
    return Request(rid, list(tokens), block_hasher=get_request_block_hasher(m.test_hbs), **kw)


def run(m, r, num_new, hit=0, blocks=None, **kw):
    """allocate_slots, then the scheduler's bookkeeping: the tokens are computed."""
    new = m.allocate_slots(r, num_new, hit, blocks, **kw)
    if new is not None:
        r.num_computed_tokens += hit + kw.get("num_external_computed_tokens", 0) + num_new
        r.status = RequestStatus.RUNNING
    return new


def free_queue(m):
    return list(m.snapshot().pool.free)


def refs(m, *blocks):
    ref = m.snapshot().pool.ref
    return [ref[b] for b in blocks]


def cached(m):
    return set(m.snapshot().pool.key_of)


def test_the_model_is_a_manager_target():
    assert isinstance(manager(full(4)), ManagerTarget)


# --- full attention -----------------------------------------------------------------------------


def test_full_attention_prefix_hit_is_capped_at_num_tokens_minus_one():
    m = manager(full(4), num_blocks=10)
    a = request(m, "a", range(8))
    assert m.get_computed_blocks(a) == (([],), 0)
    assert run(m, a, 8) == ([1, 2],)  # two full blocks, both cached at once
    assert cached(m) == {1, 2}
    # the same 8 tokens: the last token is always recomputed, so at most 7 -> 1 block
    assert m.get_computed_blocks(request(m, "b", range(8))) == (([1],), 4)
    c = request(m, "c", list(range(8)) + [99])
    blocks, hit = m.get_computed_blocks(c)
    assert (blocks, hit) == (([1, 2],), 8)
    assert run(m, c, 1, hit, blocks) == ([3],)
    assert refs(m, 1, 2, 3) == [2, 2, 1]
    assert m.get_num_common_prefix_blocks("c") == [2]  # both requests share blocks 1 and 2
    assert m.get_num_common_prefix_blocks("nobody") == [0]
    m.free(a)
    assert refs(m, 1, 2) == [1, 1] and free_queue(m) == [4, 5, 6, 7, 8, 9]
    # c is freed tail first: 3 has no hash (9 tokens = 2 full blocks) -> head; 2, 1 cached -> tail
    m.free(c)
    assert free_queue(m) == [3, 4, 5, 6, 7, 8, 9, 2, 1]


def test_the_oldest_of_two_blocks_with_one_hash_is_hit():
    m = manager(full(4), num_blocks=10)
    a, b = request(m, "a", range(5)), request(m, "b", range(5))
    assert m.get_computed_blocks(a)[1] == m.get_computed_blocks(b)[1] == 0  # both miss
    assert run(m, a, 5) == ([1, 2],)
    assert run(m, b, 5) == ([3, 4],)  # computed the same first block again: 1 and 3 share a hash
    assert cached(m) == {1, 3}
    c = request(m, "c", range(5))
    assert m.get_computed_blocks(c) == (([1],), 4)
    m.evict_blocks({1})
    assert m.get_computed_blocks(c) == (([3],), 4)


def test_mla_is_full_attention():
    m = manager(mla(4), num_blocks=10)
    run(m, request(m, "a", range(8)), 8)
    assert m.get_computed_blocks(request(m, "b", range(9))) == (([1, 2],), 8)


def test_external_tokens_get_blocks_before_the_new_tokens():
    m = manager(full(4), num_blocks=10)
    a = request(m, "a", range(12))
    # 8 tokens come from a KV connector: blocks 1, 2 for them, then block 3 for the 4 new ones
    assert run(m, a, 4, num_external_computed_tokens=8) == ([3],)
    assert m.get_block_ids("a") == ([1, 2, 3],)
    assert cached(m) == {1, 2, 3}  # min(8 + 4, 12) tokens = 3 full blocks


# --- sliding window -----------------------------------------------------------------------------


def test_sliding_window_hit_has_nulls_for_tokens_outside_the_window():
    m = manager(swa(4, window=5), num_blocks=12)  # a hit needs cdiv(5 - 1, 4) = 1 block before it
    a = request(m, "a", range(16))
    assert run(m, a, 16) == ([1, 2, 3, 4],)
    b = request(m, "b", list(range(16)) + [99])
    blocks, hit = m.get_computed_blocks(b)  # max 16 -> 4 positions; only position 3 is needed
    assert (blocks, hit) == (([0, 0, 0, 4],), 16)
    # 16 computed: tokens 0..11 left the window (16 - 5 + 1 = 12), so positions 0..2 stay null
    assert run(m, b, 1, hit, blocks) == ([5],)
    assert m.get_block_ids("b") == ([0, 0, 0, 4, 5],)
    assert refs(m, 4, 5) == [2, 1]
    m.evict_blocks({4})  # position 3 no longer cached: the longest window now ends at 12
    assert m.get_computed_blocks(request(m, "c", list(range(16)) + [99])) == (([0, 0, 3],), 12)


def test_sliding_window_frees_blocks_that_left_the_window_tail_first():
    m = manager(swa(4, window=5), num_blocks=8)
    a = request(m, "a", range(16))
    run(m, a, 16)
    a.append_output_token_ids(7)
    assert free_queue(m) == [5, 6, 7]
    # 16 computed: positions 0..2 leave the window; released 3, 2, 1 (cached: to the tail),
    # then the new block comes from the head
    assert run(m, a, 1) == ([5],)
    assert m.get_block_ids("a") == ([0, 0, 0, 4, 5],)
    assert free_queue(m) == [6, 7, 3, 2, 1]


def _window_full_pool():
    """Request a (17 tokens, window 5) holds blocks 1..4, x holds 5: nothing is free."""
    m = manager(swa(4, window=5), num_blocks=6)  # 5 usable blocks
    a = request(m, "a", range(16))
    run(m, a, 16)  # blocks 1..4
    run(m, request(m, "x", [9]), 1)  # takes block 5
    a.append_output_token_ids(7)
    return m, a


def test_a_refused_allocation_still_releases_the_blocks_that_left_the_window():
    m, a = _window_full_pool()
    before = m.snapshot()
    # as in vLLM 0.25.1, positions 0..2 leave the window before the capacity check (released
    # 3, 2, 1; cached: to the tail); those 3 are then reserved for others: refused, and nothing
    # else changes
    assert m.allocate_slots(a, 1, reserved_blocks=3) is None
    assert m.get_block_ids("a") == ([0, 0, 0, 4],)
    assert m.get_block_ids("x") == ([5],)
    assert free_queue(m) == [3, 2, 1]
    after = m.snapshot()
    assert after.pool.key_of == before.pool.key_of and after.pool.table == before.pool.table
    assert [after.pool.ref[b] for b in range(1, 6)] == [0, 0, 0, 1, 1]
    # the released blocks pay for the new one; nothing is left to release
    assert run(m, a, 1) == ([3],)
    assert m.get_block_ids("a") == ([0, 0, 0, 4, 3],)
    assert free_queue(m) == [2, 1]


def test_a_full_sequence_refusal_releases_nothing():
    m, a = _window_full_pool()
    before = m.snapshot()
    # 17 tokens need 5 blocks, a holds 4: 1 > 0 free.  The gate comes before the
    # release (as in vLLM), so this refusal changes nothing at all
    assert m.allocate_slots(a, 1, full_sequence_must_fit=True) is None
    assert m.snapshot() == before
    # without the gate, positions 0..2 are released first and pay for the new block
    assert run(m, a, 1) == ([3],)


def test_sliding_window_caches_only_positions_a_hit_can_use():
    # scheduler block 8, window blocks of 4 tokens: a hit ends on a multiple of 8 and needs
    # the one block before it, so only odd positions are ever worth caching
    m = manager(full(8), swa(4, window=5), num_blocks=12)
    run(m, request(m, "a", range(16)), 16)
    assert m.get_block_ids("a") == ([1, 2], [3, 4, 5, 6])
    assert cached(m) == {1, 2, 4, 6}


# --- chunked local attention ---------------------------------------------------------------------


def test_chunked_local_attention_hit_skips_earlier_chunks_without_lookup():
    m = manager(chunked(4, chunk=8), num_blocks=12)
    a = request(m, "a", range(20))
    # nothing is cached, yet tokens 0..15 (two whole chunks before token 19's) need no KV
    blocks, hit = m.get_computed_blocks(a)
    assert (blocks, hit) == (([0, 0, 0, 0],), 16)
    assert run(m, a, 4, hit, blocks) == ([1],)
    assert cached(m) == {1}
    assert m.get_computed_blocks(request(m, "b", list(range(20)) + [7])) == (([0, 0, 0, 0, 1],), 20)
    assert m.get_computed_blocks(request(m, "c", range(12))) == (([0, 0],), 8)


# --- Mamba ------------------------------------------------------------------------------------------------


def test_mamba_align_caches_the_state_at_the_chunk_end_and_refuses_same_step_hits():
    m = manager(mamba(4, "align"), num_blocks=10)
    a = request(m, "a", range(12))
    # a chunk of 8 ends on a block boundary: the running state goes to position 1, position 0 is null
    assert run(m, a, 8) == ([0, 1],)
    assert cached(m) == {1}  # the state after 8 tokens
    b = request(m, "b", range(12))
    blocks, hit = m.get_computed_blocks(b)
    assert (blocks, hit) == (([0, 1],), 8)
    before = m.snapshot()
    assert m.allocate_slots(b, 4, hit, blocks) is None  # that state is computed during this step
    assert m.snapshot() == before
    m.new_step_starts()
    assert run(m, b, 4, hit, blocks) == ([2],)
    assert m.get_block_ids("b") == ([0, 1, 2],)
    assert refs(m, 1, 2) == [2, 1]


def test_mamba_align_caches_nothing_for_a_chunk_that_ends_inside_a_block():
    m = manager(mamba(4, "align"), num_blocks=10)
    a = request(m, "a", range(12))
    assert run(m, a, 6) == ([0, 1],)  # the state after 6 tokens sits at position 1
    assert cached(m) == set()  # no block is full yet
    # next chunk: block 1 is cached as "the state after 8" -- which it does not hold; this is
    # why vLLM's scheduler ends Mamba align chunks on block boundaries (see test_request_rules)
    assert run(m, a, 6) == ([2],)
    assert cached(m) == {1, 2}


def test_mamba_align_frees_the_previous_state_a_step_later():
    m = manager(mamba(4, "align"), num_blocks=10)
    a = request(m, "a", range(8))
    run(m, a, 8)  # [0, 1]
    a.append_output_token_ids(1)
    assert run(m, a, 1) == ([2],)  # state position 2; block 1 is the previous state
    a.append_output_token_ids(1)
    # 9 computed: only the state at position 2 is needed: block 1 is released (cached: to the tail)
    assert run(m, a, 1) == ([],)
    assert m.get_block_ids("a") == ([0, 0, 2],)
    assert free_queue(m)[-1] == 1


def test_mamba_align_frees_a_hit_state_behind_a_null_gap():
    m = manager(mamba(4, "align"), num_blocks=10)
    run(m, request(m, "a", range(12)), 8)  # [0, 1]: the state after 8 is block 1
    m.new_step_starts()
    b = request(m, "b", list(range(8)) + [5] * 9)
    blocks, hit = m.get_computed_blocks(b)
    assert (blocks, hit) == (([0, 1],), 8)
    # an 8-token chunk: state position 3, position 2 null; the hit's state (1) is the previous one
    assert run(m, b, 8, hit, blocks) == ([0, 2],)
    assert m.get_block_ids("b") == ([0, 1, 0, 2],)
    # 16 computed: the walk back from position 2 stops at the null at once; block 1 is released
    # as the previous state (shared with a: only b's reference goes)
    assert run(m, b, 1) == ([3],)
    assert m.get_block_ids("b") == ([0, 0, 0, 2, 3],)
    assert refs(m, 1) == [1]


def test_mamba_all_keeps_only_the_last_state():
    m = manager(mamba(4, "all"), num_blocks=10)
    a = request(m, "a", range(12))
    assert run(m, a, 12) == ([1, 2, 3],)
    assert cached(m) == {1, 2, 3}
    a.append_output_token_ids(5)
    assert run(m, a, 1) == ([4],)  # 12 computed: only the state after token 11 (position 2) is needed
    assert m.get_block_ids("a") == ([0, 0, 3, 4],)
    assert m.get_computed_blocks(request(m, "b", list(range(12)) + [0])) == (([0, 0, 3],), 12)


# --- EAGLE ---------------------------------------------------------------------------------------------------


def test_eagle_drops_the_last_matched_block():
    m = manager(full(4), num_blocks=10, eagle=True)
    run(m, request(m, "a", range(12)), 12)
    # max 15 -> 3 cached blocks, the last dropped (its hidden state is needed for drafting)
    assert m.get_computed_blocks(request(m, "b", list(range(12)) + [1, 2, 3, 4])) == (([1, 2],), 8)


def test_hybrid_eagle_groups_peek_one_block_past_and_drop_it():
    m = manager(full(4), swa(4, window=5), num_blocks=20, eagle=True)
    run(m, request(m, "a", range(16)), 16)  # full: 1..4, window: 5..8
    # max 19.  full attention: 4 cached, drop one -> 12.  window (EAGLE: needs 2 contiguous):
    # search up to 12 + 4 = 16, window ends at position 3 -> [0, 0, 7, 8], drop 8 -> 12.
    b = request(m, "b", list(range(16)) + [1, 2, 3, 4])
    assert m.get_computed_blocks(b) == (([1, 2, 3], [0, 0, 7]), 12)


def test_eagle_drop_happens_once_per_candidate_length():
    # three spec groups (no simple-hybrid shortcut); only the first window group is EAGLE
    m = manager(full(4), swa(4, window=5), swa(4, window=9), num_blocks=40, eagle_groups=(1,))
    run(m, request(m, "a", range(24)), 24)  # full 1..6, window-5 7..12, window-9 13..18
    m.evict_blocks({18})  # the window-9 group loses position 5
    b = request(m, "b", list(range(24)) + [3])
    # pass 1: full 24; window-5 (EAGLE) peeks position 5 and drops it -> 20; window-9 at 20: ok.
    # pass 2 (20 < 24): full trims to 20; window-5 is verified at 20: no second drop -> 20.
    assert m.get_computed_blocks(b) == (([1, 2, 3, 4, 5], [0, 0, 0, 0, 11], [0, 0, 0, 16, 17]), 20)


# --- hybrid models ------------------------------------------------------------------------------------------------


def test_hybrid_with_different_block_sizes():
    m = manager(full(4), swa(8, window=9), num_blocks=20)  # scheduler block 8, hash block 4
    run(m, request(m, "a", range(32)), 32)  # full: 1..8, window: 9..12
    b = request(m, "b", list(range(32)) + [9])
    blocks, hit = m.get_computed_blocks(b)
    assert (blocks, hit) == (([1, 2, 3, 4, 5, 6, 7, 8], [0, 0, 0, 12]), 32)
    assert run(m, b, 1, hit, blocks) == ([13], [14])
    assert m.get_block_ids("b") == ([1, 2, 3, 4, 5, 6, 7, 8, 13], [0, 0, 0, 12, 14])


def test_hybrid_hit_is_a_fixed_point_over_the_groups():
    m = manager(swa(4, window=5), mamba(4, "all"), num_blocks=20)
    run(m, request(m, "a", range(24)), 24)  # window 1..6, Mamba 7..12
    m.evict_blocks({12, 5})  # Mamba loses its state after 24, the window its position 4
    b = request(m, "b", list(range(24)) + [7])
    # pass 1: window 24; Mamba 24 -> 20.  pass 2: window at 20 needs position 4 -> 16; Mamba 16.
    # pass 3: both accept 16.
    assert m.get_computed_blocks(b) == (([0, 0, 0, 4], [0, 0, 0, 10]), 16)


def test_full_attention_with_chunked_local():
    m = manager(full(4), chunked(4, chunk=8), num_blocks=20)
    run(m, request(m, "a", range(12)), 12)  # full 1..3, chunked 4..6
    # max 12: full serves 12; chunked: chunk of token 12 starts at 8 -> position 2 needed
    assert m.get_computed_blocks(request(m, "b", list(range(12)) + [1])) == (([1, 2, 3], [0, 0, 6]), 12)


def test_mamba_is_never_an_eagle_group():
    # use_eagle with no group flagged makes every group an EAGLE group -- every group but Mamba:
    # draft models have no Mamba layers, so a Mamba hit has no block to drop.  (vLLM 0.25.1 flags
    # Mamba too and searches it up to one block past the candidate: it comes back with the state
    # after 16, and the hit is 16 with only 3 full-attention blocks -- finding, docs/rules.md.)
    m = manager(full(4), mamba(4, "all"), num_blocks=20, eagle=True)
    assert m.coordinator.eagle_groups == {0}
    run(m, request(m, "a", range(16)), 16)  # full 1..4, Mamba 5..8
    # full: 4 cached, drop -> 12.  Mamba (no peek, no drop): up to 12 -> state after 12.
    b = request(m, "b", list(range(16)) + [1, 2, 3, 4])
    blocks, hit = m.get_computed_blocks(b)
    assert (blocks, hit) == (([1, 2, 3], [0, 0, 7]), 12)
    # the tables start exactly at the hit: full attention recomputes from token 12 (the next step,
    # once Mamba's states cached this step are computed)
    m.new_step_starts()
    assert run(m, b, 8, hit, blocks) == ([9, 10], [11, 12])
    assert m.get_block_ids("b") == ([1, 2, 3, 9, 10], [0, 0, 7, 11, 12])


def test_every_full_attention_spec_is_cut_to_the_hit():
    # two full-attention specs (block sizes 4 and 8) and a window: the window cuts the hit to 0 on
    # the first pass; both full-attention groups must be cut to it, not just the first.
    m = manager(full(4), mla(8), swa(4, window=6), num_blocks=40)
    run(m, request(m, "a", range(16)), 16)  # full 1..4, MLA 5, 6, window 7..10
    m.evict_blocks({8, 10})  # the window (2 contiguous blocks) serves neither 16 nor 8
    b = request(m, "b", list(range(16)) + [1])
    blocks, hit = m.get_computed_blocks(b)
    # pass 1: full 16, MLA 16, window 0; pass 2: both full groups trim to 0.
    assert (blocks, hit) == (([], [], []), 0)
    # 8 connector tokens: each group takes cdiv(8, B) blocks for them (vLLM, its MLA table still
    # holding 2 hit blocks, asks the pool for cdiv(8, 8) - 2 = -1 here), then one token more.
    assert run(m, b, 1, hit, blocks, num_external_computed_tokens=8) == ([16], [17], [18])
    assert m.get_block_ids("b") == ([11, 12, 16], [13, 17], [14, 15, 18])
    assert m.pool.get_num_free_blocks() == len(m.pool.snapshot().free) == 39 - 10 - 8


# --- cross attention, caching off --------------------------------------------------------------------------


def test_cross_attention_is_allocated_once_from_the_encoder_tokens():
    m = manager(full(4), cross(4), num_blocks=12, caching=False)
    a = request(m, "a", range(10))
    assert m.get_computed_blocks(a) == (([], []), 0)
    assert run(m, a, 10, num_encoder_tokens=6) == ([1, 2, 3], [4, 5])
    a.append_output_token_ids(1)
    assert run(m, a, 1, num_encoder_tokens=6) == ([], [])
    assert m.get_num_common_prefix_blocks("a") == [0, 0]
    assert cached(m) == set()


def test_caching_off_never_hits():
    m = manager(full(4), swa(4, window=5), num_blocks=12, caching=False)
    run(m, request(m, "a", range(8)), 8)
    assert m.get_computed_blocks(request(m, "b", range(9))) == (([], []), 0)


# --- admission ------------------------------------------------------------------------------------------------


def test_watermark_applies_to_waiting_requests_while_others_are_scheduled():
    m = manager(full(4), num_blocks=11, watermark=0.2)  # 2 blocks of headroom
    a = request(m, "a", range(36))  # 9 blocks, 10 free
    assert m.allocate_slots(a, 36) is None
    assert m.allocate_slots(a, 36, has_scheduled_reqs=False) == ([1, 2, 3, 4, 5, 6, 7, 8, 9],)


def test_full_sequence_must_fit():
    m = manager(full(4), num_blocks=6)  # 5 free
    a = request(m, "a", range(24))  # 6 blocks in all
    assert m.allocate_slots(a, 4, full_sequence_must_fit=True) is None
    assert m.allocate_slots(a, 4) == ([1],)
    # a sliding window never holds more than cdiv(window - 1 + max_num_batched_tokens, B) + 1 blocks
    w = manager(swa(4, window=5), num_blocks=6, max_num_batched_tokens=4)
    assert w.allocate_slots(request(w, "a", range(24)), 4, full_sequence_must_fit=True) == ([1],)


# --- reset and events ----------------------------------------------------------------------------------------


def test_reset_only_when_nothing_is_held():
    m = manager(full(4), num_blocks=10, events=True)
    a = request(m, "a", range(8))
    run(m, a, 8)
    assert m.reset_prefix_cache() is False and cached(m) == {1, 2}
    m.free(a)
    assert m.reset_prefix_cache() is True
    assert cached(m) == set()
    assert m.get_computed_blocks(request(m, "b", range(9))) == (([],), 0)
    events = m.take_events()
    assert isinstance(events[0], Stored) and len(events[0].block_hashes) == 2
    assert events[-1] == Cleared()


def test_events_follow_caching_and_eviction():
    m = manager(full(4), num_blocks=10, events=True)
    run(m, request(m, "a", range(8)), 8)
    m.evict_blocks({2})
    stored, removed = m.take_events()
    assert isinstance(stored, Stored) and stored.token_ids == tuple(range(8)) and stored.group == 0
    assert isinstance(removed, Removed) and removed.block_hash == stored.block_hashes[1]


# --- bad input ---------------------------------------------------------------------------------------------


def _bad_calls():
    def no_tokens(m, a):
        m.allocate_slots(a, 0)

    def negative(m, a):
        m.allocate_slots(a, -1)

    def not_an_int(m, a):
        m.allocate_slots(a, "3")

    def wrong_shape(m, a):
        m.allocate_slots(a, 1, 0, ([], []))

    def hits_for_a_running_request(m, a):
        m.allocate_slots(a, 1, 4, ([1],))

    def stale_hit(m, a):
        b = request(m, "b", range(9))
        blocks, hit = m.get_computed_blocks(b)
        m.evict_blocks({2})
        m.allocate_slots(b, 1, hit, blocks)

    def cache_beyond_the_table(m, a):
        a.append_output_token_ids([1, 2, 3, 4, 5])
        m.cache_blocks(a, 12)

    def evict_outside_the_pool(m, a):
        m.evict_blocks({99})

    def common_prefix_of_a_non_string(m, a):
        m.get_num_common_prefix_blocks(7)

    return [no_tokens, negative, not_an_int, wrong_shape, hits_for_a_running_request, stale_hit,
            cache_beyond_the_table, evict_outside_the_pool, common_prefix_of_a_non_string]


@pytest.mark.parametrize("call", _bad_calls(), ids=lambda f: f.__name__)
def test_bad_input_is_refused_and_changes_nothing(call):
    m = manager(full(4), num_blocks=10)
    a = request(m, "a", range(8))
    run(m, a, 8)
    before = m.snapshot()
    with pytest.raises((RuleError, RuleTypeError)) as refused:
        call(m, a)
    assert refused.value.rule
    if call.__name__ != "stale_hit":  # that one evicts on purpose before the refused call
        assert m.snapshot() == before


@pytest.mark.parametrize(
    "build",
    [
        lambda: manager(full(4), cross(4)),  # cross attention is never cached
        lambda: manager(full(4), swa(4, window=5), sbs=6),  # scheduler block not a multiple of 4
        lambda: manager(chunked(4, chunk=8), eagle=True),  # EAGLE with chunked local attention
        lambda: manager(full(4), full(4)),  # a hybrid needs two distinct specs
        lambda: manager(full(8), hbs=4),  # one group: block size == hash block size
        lambda: manager(full(4), retention_interval=4),  # retention needs a window or Mamba group
        lambda: manager(full(4), swa(4, window=5), retention_interval=6),  # ... and a multiple of the scheduler block
        lambda: manager(full(4), watermark=-0.1),
    ],
)
def test_unsupported_layouts_are_refused(build):
    with pytest.raises((RuleError, RuleTypeError)):
        build()
