"""The drop-in's release shapes (kvspec.dropin_releases), without vLLM: the
API each release's scheduler calls, on impl built with that release's
deltas.  vLLM's own tests run on them by tools/peer_suite.py --release."""

import dataclasses

import pytest

from kvspec import dropin
from kvspec.dropin_releases import (
    API,
    GONE,
    KVCacheManager026,
    KVCacheManager027,
    KVCacheManager028,
    KVCacheManager029,
    KVCacheManager030,
    KVCacheManager031,
    KVCacheManager032,
    KVCacheManager033,
    KVCacheManager034,
)
from kvspec.hashing import get_request_block_hasher
from kvspec.request import Request
from kvspec.testing import config, full, mamba, mla, swa


def _manager_of(cls, *specs, num_blocks=32, scheduler_block_size=4, **options):
    return cls(config(*specs, num_blocks=num_blocks), max_model_len=256, scheduler_block_size=scheduler_block_size,
               hash_block_size=4, max_in_flight_tokens=64, **options)


def _manager(*specs, **options):
    return _manager_of(KVCacheManager026, *specs, **options)


def _request(rid, tokens):
    return Request(rid, list(tokens), block_hasher=get_request_block_hasher(4))


def _compute(manager, request, num_tokens):
    assert manager.allocate_slots(request, num_tokens) is not None
    request.num_computed_tokens = num_tokens
    manager.cache_blocks(request, num_tokens)


def test_the_drop_in_knows_the_releases_it_has_a_shape_for_and_refuses_the_rest_by_name():
    assert list(API)[:3] == ["0.25.1", "0.26.0", "0.27.0"]
    assert dropin.check_release("0.26.0+cpu") == "0.26.0"
    with pytest.raises(dropin.DropinError, match=rf"this is vLLM 0\.99\.0 \(the newest it knows is {list(API)[-1]}\)"):
        dropin.check_release("0.99.0")


def test_0_26_get_computed_blocks_returns_the_hit_and_a_shared_prefix_boundary():
    manager = _manager(full(4))
    _compute(manager, _request("a", range(13)), 13)
    blocks, num_hit, boundary = manager.get_computed_blocks(_request("b", range(13)))
    assert num_hit == 12 and len(blocks.blocks[0]) == 3
    assert boundary == 0  # one group: no group lags behind another
    skipping = Request("c", list(range(13)), block_hasher=get_request_block_hasher(4), skip_reading_prefix_cache=True)
    assert manager.get_computed_blocks(skipping)[1:] == (0, 0)


def test_0_26_names_the_hybrid_s_lagging_group_boundary():
    """Full attention + a window of 4: a 17-token prompt is cached, then
    the window group's block of tokens 12-15 is evicted.  The same prompt
    hits 12 tokens (the window needs that block for 16); full attention
    alone would hit 16: the boundary is 16, where the shared prefix ends."""
    manager = _manager(full(4), swa(4, 4))
    first = _request("a", range(17))
    _compute(manager, first, 17)
    window_blocks = manager.get_block_ids("a")[1]
    manager.free(first)
    manager.evict_blocks({window_blocks[3]})
    assert manager.get_computed_blocks(_request("b", range(17)))[1:] == (12, 16)


def test_0_26_keyword_renames_and_new_calls():
    manager = _manager(full(4), mamba(4, "align"))
    request = _request("a", range(10))
    _compute(manager, request, 10)
    manager.remove_skipped_blocks(request_id="a", processed_computed_tokens=10, num_prompt_tokens=10)
    # the least over the groups: full attention caches 8 tokens, Mamba no state at 10 tokens
    assert manager.estimate_cached_tokens(request) == 0
    alone = _manager(full(4))
    _compute(alone, _request("a", range(10)), 10)
    assert alone.estimate_cached_tokens(_request("a", range(10))) == 8
    # a model with Mamba: its attention group's new blocks are zeroed (0.26), not Mamba's states
    zeroed = manager.take_new_block_ids()
    attention = manager.get_block_ids("a")[0]
    assert zeroed == attention
    assert manager.get_zeroing_block_ids_in_range("a", 4, 9) == attention[1:3]
    manager.record_blocks_for_zeroing("a", 4)
    assert manager.take_new_block_ids() == attention[1:]
    with pytest.raises(ValueError, match="start_token 5 is inside a block of 4 tokens"):
        manager.record_blocks_for_zeroing("a", 5)
    assert manager.take_kv_cache_block_copies() == ([], [])
    assert manager.coordinator.get_num_blocks_to_allocate(
        request_id="a", num_tokens=12, new_computed_blocks=([], []), num_encoder_tokens=0,
        total_computed_tokens=10, num_local_computed_tokens=10, num_tokens_main_model=12, apply_admission_cap=True,
    ) >= 0
    with pytest.raises(ValueError, match="num_local_computed_tokens 11"):
        manager.coordinator.get_num_blocks_to_allocate(
            request_id="a", num_tokens=12, new_computed_blocks=([], []), num_encoder_tokens=0,
            total_computed_tokens=10, num_local_computed_tokens=11, num_tokens_main_model=12)


def test_0_26_stats_count_lookups_as_0_26_does():
    manager = _manager(full(4), log_stats=True)
    manager.get_computed_blocks(_request("a", range(9)))
    stats = manager.make_prefix_cache_stats()
    assert stats.requests == 1 and stats.queries == 9


def test_0_26_announces_a_hit_as_stored_for_a_request_that_asks_for_full_reports():
    manager = _manager(full(4), enable_kv_cache_events=True)
    _compute(manager, _request("a", range(9)), 9)
    manager.take_events()
    reader = _request("b", range(9))
    manager.get_computed_blocks(reader)
    assert manager.take_events() == []
    reader.kv_cache_report_mode = "full"
    manager.get_computed_blocks(reader)
    (stored,) = manager.take_events()
    assert stored.parent_block_hash is None and len(stored.block_hashes) == 2 and stored.token_ids == list(range(8))


def test_0_26_refuses_what_it_would_serve_differently(monkeypatch):
    with pytest.raises(NotImplementedError, match="hits that end inside a block .* block size 8 > hash block size 4"):
        _manager(full(4), mamba(8, "align"))
    monkeypatch.setenv("VLLM_PREFIX_CACHE_RETENTION_INTERVAL", "8")
    assert _manager(full(4), swa(4, 4)).coordinator.retention_interval == 8  # served: the boundary is kept


def test_sparse_retention_keeps_the_shared_prefix_boundary_the_scheduler_stored(monkeypatch):
    """Under retention 0 a hybrid's Mamba group caches only the states later
    requests are known to hit: the prompt's replay boundary and, once the
    scheduler has stored it on the request (0.26 on), where the prefix other
    requests share ends -- the boundary get_computed_blocks answered."""
    monkeypatch.setenv("VLLM_PREFIX_CACHE_RETENTION_INTERVAL", "0")
    shared = list(range(8))

    def hit_on_the_shared_prefix(boundary):
        manager = _manager(full(4), mamba(4, "align"), num_blocks=64)
        request = _request("a", shared + [100 + i for i in range(9)])
        request.shared_prefix_boundary = boundary
        for end in (4, 8, 12, 16):  # align mode: one block a step
            assert manager.allocate_slots(request, 4) is not None
            request.num_computed_tokens = end
            manager.cache_blocks(request, end)
            manager.new_step_starts()
        return manager.get_computed_blocks(_request("b", shared + [200 + i for i in range(9)]))[1]

    assert hit_on_the_shared_prefix(0) == 0  # Mamba kept the replay boundary's state (16) only
    assert hit_on_the_shared_prefix(8) == 8  # and the shared prefix's end



def test_0_27_the_connector_lookup_on_a_mamba_hybrid_is_full_attention_s_own_hit(monkeypatch):
    """On a hybrid of full attention and Mamba the connector's lookup takes
    full attention's own hit and flags a shorter Mamba hit; when Mamba's own
    hit is the longer, or the model has no Mamba group, it is the ordinary
    lookup, not flagged."""
    manager = _manager_of(KVCacheManager027, full(4), mamba(4, "align"))
    _compute(manager, _request("a", range(13)), 13)  # one chunk: Mamba keeps no state inside it
    reader = _request("b", range(13))
    blocks, hit, boundary = manager.get_computed_blocks(reader)
    assert (hit, boundary) == (0, 12)  # every group agrees on nothing; full attention cached 12
    got, num_hit, boundary, diverged = manager.get_computed_blocks_for_connector(reader)
    assert (num_hit, boundary, diverged) == (12, 0, True) and [len(g) for g in got.blocks] == [3, 0]  # as vLLM 0.27.0
    full_blocks = got.blocks[0]
    monkeypatch.setattr(manager.coordinator, "find_longest_cache_hit_per_group",
                        lambda hashes, limit: ((full_blocks[:1], full_blocks[:2]), (4, 8)))  # Mamba deeper
    assert manager.get_computed_blocks_for_connector(reader)[1:] == (0, 12, False)
    plain = _manager_of(KVCacheManager027, full(4))
    _compute(plain, _request("a", range(9)), 9)
    assert plain.get_computed_blocks_for_connector(_request("b", range(9)))[1:] == (8, 0, False)


def test_0_27_truncation_cuts_every_group_and_refuses_a_point_inside_a_block():
    manager = _manager_of(KVCacheManager027, full(4))
    _compute(manager, _request("a", range(13)), 13)
    blocks, hit, _ = manager.get_computed_blocks(_request("b", range(13)))
    assert hit == 12 and manager.truncate_computed_blocks(blocks, 8).get_block_ids() == ([1, 2],)
    assert len(blocks.blocks[0]) == 3  # the lookup's own result is left alone
    with pytest.raises(ValueError, match="cannot truncate a hit of 3 block.* to 6 tokens"):
        manager.truncate_computed_blocks(blocks, 6)
    assert manager.take_partial_tail_offloads() == {}
    assert manager.prefix_cache_lookup_enabled(_request("c", range(4)))


def test_0_27_and_0_28_build_pools_with_their_release_s_free_order():
    """A pool built without caching by a 0.27 caller frees to the tail; a
    0.28 caller's, to the head (deltas free-order-without-caching and
    free-order-restored)."""
    for release, order in (("0.27.0", [4, 5, 3, 2, 1]), ("0.28.0", [3, 2, 1, 4, 5])):
        pool = API[release]["vllm.v1.core.block_pool"]["BlockPool"](6, False, 2)
        blocks = pool.get_new_blocks(3)
        pool.free_blocks(reversed(blocks))
        assert [b.block_id for b in pool.free_block_queue.get_all_free_blocks()] == order, release


def test_0_28_refuses_a_prefill_lookahead_it_would_serve_differently():
    _manager_of(KVCacheManager028, full(4), num_prefill_lookahead=1, use_eagle=True)  # EAGLE: as before
    _manager_of(KVCacheManager028, full(4), num_prefill_lookahead=3, enable_caching=False)  # nothing cached
    with pytest.raises(NotImplementedError, match="hold back the last 2 computed token.*num_prefill_lookahead=3"):
        _manager_of(KVCacheManager028, full(4), num_prefill_lookahead=3, use_eagle=True)
    with pytest.raises(TypeError, match="num_prefill_lookahead must be an int >= 0, got -1"):
        _manager_of(KVCacheManager028, full(4), num_prefill_lookahead=-1)
    window = swa(4, 8)
    object.__setattr__(window, "extra_retained_tokens", 2)
    with pytest.raises(NotImplementedError, match="extra_retained_tokens \\(2, group 1\\)"):
        _manager_of(KVCacheManager028, full(4), window)


def test_0_28_serves_a_mamba_align_hybrid_whose_sliding_window_turns_partial_hits_off():
    """vLLM 0.28 turns hits inside a block off when a sliding-window group's
    blocks are not the hash block; the drop-in then serves the model, which
    0.26 and 0.27 refuse."""
    specs = (full(4), mamba(8, "align"), swa(8, 8))
    with pytest.raises(NotImplementedError, match="hits that end inside a block"):
        _manager_of(KVCacheManager027, *specs, scheduler_block_size=8)
    _manager_of(KVCacheManager028, *specs, scheduler_block_size=8)
    with pytest.raises(NotImplementedError, match="hits that end inside a block"):
        _manager_of(KVCacheManager028, full(4), mamba(8, "align"), swa(4, 8), scheduler_block_size=8)


def test_a_name_a_release_removed_is_left_absent():
    assert API["0.28.0"]["vllm.v1.core.kv_cache_utils"]["need_extra_keys"] is GONE
    assert "need_extra_keys" not in API["0.27.0"].get("vllm.v1.core.kv_cache_utils", {})


def test_0_29_reads_the_retention_interval_from_the_config_and_accepts_0_on_any_model(monkeypatch):
    """0.29 reads the interval from the KV-cache config, not the environment,
    and accepts 0 where no group acts on it (delta retention-zero-anywhere);
    0.28 refuses it there."""
    monkeypatch.setenv("VLLM_PREFIX_CACHE_RETENTION_INTERVAL", "0")
    with pytest.raises(ValueError, match="retention_interval=0 is set but the model has no sliding-window or Mamba"):
        _manager_of(KVCacheManager028, full(4))
    assert _manager_of(KVCacheManager029, full(4)).coordinator.retention_interval is None  # the environment: unread

    def with_interval(interval, *specs):
        cfg = config(*specs, num_blocks=32)
        object.__setattr__(cfg, "prefix_cache_retention_interval", interval)
        return KVCacheManager029(cfg, max_model_len=256, scheduler_block_size=4, hash_block_size=4,
                                 max_in_flight_tokens=64)

    assert with_interval(0, full(4)).coordinator.retention_interval == 0
    with pytest.raises(ValueError, match="retention_interval=8 is set but the model has no sliding-window or Mamba"):
        with_interval(8, full(4))
    assert with_interval(0, full(4), swa(4, 4)).coordinator.retention_interval == 0  # vLLM 0.29's default


def test_0_29_refuses_the_state_it_does_not_keep():
    ring = full(4)
    object.__setattr__(ring, "prefix_cacheable", False)
    with pytest.raises(NotImplementedError, match="group 1's FullAttentionSpec, a group outside prefix caching"):
        _manager_of(KVCacheManager029, full(4), ring)
    state = mamba(4, "align")
    object.__setattr__(state, "num_prefill_checkpoint_blocks", 1)
    with pytest.raises(NotImplementedError, match="Mamba prefill checkpoint blocks \\(group 1: .*=1\\)"):
        _manager_of(KVCacheManager029, full(4), state)


def test_0_29_takes_hits_inside_a_block_under_decode_ranks_too():
    """Under decode context parallelism 0.28 takes no hit inside a block, so
    the drop-in serves a Mamba block larger than the hash block; 0.29 does
    (delta partial-hits-under-dcp), for a Mamba block at least the hash
    block, so it is refused -- except where every group's block, full
    attention's spanning the ranks, is the hash block."""
    def build(cls, full_block, mamba_block, hash_block_size):
        return cls(config(full(full_block), mamba(mamba_block, "align"), num_blocks=32), max_model_len=256,
                   scheduler_block_size=max(2 * full_block, mamba_block), hash_block_size=hash_block_size,
                   max_in_flight_tokens=64, dcp_world_size=2)

    build(KVCacheManager028, 4, 8, 4)
    with pytest.raises(NotImplementedError, match="block size 8 >= hash block size 4 under 2 decode ranks"):
        build(KVCacheManager029, 4, 8, 4)
    with pytest.raises(NotImplementedError, match="block size 2 >= hash block size 2 under 2 decode ranks, with "
                                                  "blocks of 4 tokens"):
        build(KVCacheManager029, 2, 2, 2)  # the Mamba block is the hash block, full attention's is not
    build(KVCacheManager029, 1, 2, 2)  # every block is the hash block: no hit can end inside one


def test_0_29_pool_says_which_blocks_their_owner_may_write():
    pool = API["0.29.0"]["vllm.v1.core.block_pool"]["BlockPool"](6, True, 2)
    (block,) = pool.get_new_blocks(1)
    assert pool.is_block_writable(block) and not pool.is_block_writable(pool.null_block)
    pool.touch([block])
    assert not pool.is_block_writable(block)  # shared
    assert not hasattr(API["0.28.0"]["vllm.v1.core.block_pool"]["BlockPool"], "is_block_writable")


def test_0_29_roots_an_unseeded_process_at_a_fixed_seed(monkeypatch):
    """Delta fixed-root-hash: without PYTHONHASHSEED a collision-resistant
    hash roots every chain at one seed (0.28: random bytes); vLLM's xxhash
    keeps a random one; a set PYTHONHASHSEED wins.  The drop-in mirrors the
    root and its seed into vLLM's module."""
    import types

    from kvspec import hashing
    from kvspec.spec.releases import FIXED_ROOT_SEED

    saved = hashing.NONE_HASH
    try:
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
        assert hashing.init_none_hash(hashing.sha256_cbor, FIXED_ROOT_SEED) == hashing.root_hash(FIXED_ROOT_SEED)

        def xxhash(value):
            return hashing.sha256_cbor(value)

        assert hashing.init_none_hash(xxhash, FIXED_ROOT_SEED) != hashing.init_none_hash(xxhash, FIXED_ROOT_SEED)
        assert hashing.init_none_hash(hashing.sha256_cbor) != hashing.init_none_hash(hashing.sha256_cbor)  # 0.28
        module = types.SimpleNamespace(NONE_HASH=None, _NONE_HASH_SEED=None)
        dropin._init_none_hash(module, hashing, "0.29.0")(hashing.sha256_cbor)
        assert (module.NONE_HASH, module._NONE_HASH_SEED) == (hashing.root_hash(FIXED_ROOT_SEED), FIXED_ROOT_SEED)
        monkeypatch.setenv("PYTHONHASHSEED", "7")
        dropin._init_none_hash(module, hashing, "0.29.0")(hashing.sha256_cbor)
        assert (module.NONE_HASH, module._NONE_HASH_SEED) == (hashing.root_hash("7"), "7")
    finally:
        hashing.NONE_HASH = saved


def test_0_29_offers_each_cached_mamba_state_to_a_connector_once():
    """0.29's scheduler drains, every step, the Mamba align states cached
    since the last drain -- group, block and the boundary each ends at -- for
    a KV connector; a state is offered once (a hit is not offered again),
    and a freed request's offers not yet taken are withdrawn."""
    manager = _manager_of(KVCacheManager029, full(4), mamba(4, "align"), mamba(4, "align"), num_blocks=256)
    request = _request("a", range(9))
    _compute(manager, request, 8)
    mamba_blocks = [manager.get_block_ids("a")[g] for g in (1, 2)]
    assert manager.take_boundary_state_offloads() == {
        "a": [(1, mamba_blocks[0][1], 8), (2, mamba_blocks[1][1], 8)]}  # the state at 4 is not kept (align)
    assert manager.take_boundary_state_offloads() == {}
    manager.cache_blocks(request, 8)
    assert manager.take_boundary_state_offloads() == {}  # cached already: not offered again
    manager.new_step_starts()  # a Mamba state cached this step is hit from the next on
    reader = _request("b", range(9))
    blocks, hit, _ = manager.get_computed_blocks(reader)
    assert hit == 8 and manager.allocate_slots(reader, 1, hit, blocks) is not None
    manager.cache_blocks(reader, 9)
    assert manager.take_boundary_state_offloads() == {}  # b's states are a's hits, offered already
    _compute(manager, _request("c", range(100, 109)), 8)
    manager.free(_request("c", ()))
    assert manager.take_boundary_state_offloads() == {}


def _with_retention(cls, interval, *specs, use_eagle=False):
    cfg = config(*specs, num_blocks=64)
    object.__setattr__(cfg, "prefix_cache_retention_interval", interval)
    return cls(cfg, max_model_len=256, scheduler_block_size=4, hash_block_size=4, max_in_flight_tokens=64,
               use_eagle=use_eagle)


def test_0_30_a_drafter_keeps_the_window_a_scheduler_block_lower_under_retention():
    """Retention 0 keeps a sliding window's blocks only where a replay of
    the prompt resumes.  A 16-token prompt (block-aligned, blocks of 4,
    window 4): 0.29 keeps the window before 15's aligned boundary, 12 --
    with EAGLE, the block past it too; 0.30 with a drafter (delta
    eagle-replay-boundaries) keeps those before 8 and 12, each with the
    block past it; without a drafter it keeps 0.29's."""
    def cached_swa_blocks(cls, use_eagle):
        manager = _with_retention(cls, 0, full(4), swa(4, 4), use_eagle=use_eagle)
        request = _request("a", range(16))
        _compute(manager, request, 16)
        return [i for i, b in enumerate(manager.coordinator.single_type_managers[1].req_to_blocks["a"])
                if b.block_hash is not None]

    assert cached_swa_blocks(KVCacheManager029, use_eagle=True) == [2, 3]
    assert cached_swa_blocks(KVCacheManager030, use_eagle=True) == [1, 2, 3]
    assert cached_swa_blocks(KVCacheManager030, use_eagle=False) == cached_swa_blocks(KVCacheManager029, False)
    manager = _with_retention(KVCacheManager030, 0, full(4), swa(4, 4), use_eagle=True)
    assert manager.coordinator.get_replay_boundaries(_request("a", range(16))) == (8, 12)


def test_0_30_api_the_fine_grained_flag_partial_tails_and_groups_by_id():
    manager = _manager_of(KVCacheManager030, full(4), mamba(4, "align"), enable_mamba_fine_grained_prefix_cache=True)
    assert manager.mamba_fine_grained_prefix_cache is False  # needs hits inside a block, which are refused
    with pytest.raises(TypeError, match="enable_mamba_fine_grained_prefix_cache must be a bool, got 'yes'"):
        _manager_of(KVCacheManager030, full(4), enable_mamba_fine_grained_prefix_cache="yes")
    request = _request("a", range(9))
    _compute(manager, request, 8)
    assert manager.finalize_partial_tail_offloads(request) == []
    blocks = manager.get_blocks("a")
    assert blocks.get_block_ids(group_ids=(1,)) == (blocks.get_block_ids()[1],)
    assert blocks.get_block_ids(group_ids=(1, 0)) == tuple(reversed(blocks.get_block_ids()))
    assert manager.block_pool.null_block.block_id == 0


def test_0_31_api_the_renamed_flag_and_prefill_end():
    manager = _manager_of(KVCacheManager031, full(4), mamba(4, "align"), enable_mamba_shared_prefix_checkpoint=True)
    assert manager.mamba_shared_prefix_checkpoint is False  # needs Mamba prefill checkpoint blocks (refused)
    assert not hasattr(manager, "mamba_fine_grained_prefix_cache")
    with pytest.raises(TypeError, match="0.30's name; vLLM 0.31 calls it enable_mamba_shared_prefix_checkpoint"):
        _manager_of(KVCacheManager031, full(4), enable_mamba_fine_grained_prefix_cache=True)
    with pytest.raises(TypeError, match="enable_mamba_shared_prefix_checkpoint must be a bool, got 1"):
        _manager_of(KVCacheManager031, full(4), enable_mamba_shared_prefix_checkpoint=1)
    asked = dict(request_id="a", num_tokens=9, new_computed_blocks=manager.empty_kv_cache_blocks.blocks,
                 num_encoder_tokens=0, total_computed_tokens=0, num_local_computed_tokens=0, num_tokens_main_model=9,
                 apply_admission_cap=True)
    need = manager.coordinator.get_num_blocks_to_allocate(**asked)
    assert manager.coordinator.get_num_blocks_to_allocate(**asked, prefill_end=8) == need  # no checkpoint blocks
    with pytest.raises(ValueError, match="prefill_end must be an int >= 0, got -1"):
        manager.coordinator.get_num_blocks_to_allocate(**asked, prefill_end=-1)


def test_0_31_a_call_with_no_new_tokens_adopts_a_hit():
    manager = _manager_of(KVCacheManager031, full(4))
    _compute(manager, _request("a", range(9)), 9)
    second = _request("b", range(9))
    blocks, hit, _ = manager.get_computed_blocks(second)
    assert hit == 8 and manager.allocate_slots(second, 0, hit, blocks) is not None
    assert manager.get_block_ids("b") == ([1, 2],) and manager.get_block_ids("a") == ([1, 2, 3],)  # shared, no new
    older = _manager_of(KVCacheManager030, full(4))
    _compute(older, _request("a", range(9)), 9)
    blocks, hit, _ = older.get_computed_blocks(second)
    with pytest.raises(ValueError, match="num_new_tokens must be > 0"):
        older.allocate_slots(second, 0, hit, blocks)


def test_0_31_refuses_a_group_decode_ranks_split_otherwise_than_impl():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class MLAAttentionSpec(type(mla(4))):  # vLLM 0.31's shape: the spec says whether decode ranks split it
        dcp_sharded: bool = True

    draft = MLAAttentionSpec(dcp_sharded=False, **{f.name: getattr(mla(4), f.name) for f in dataclasses.fields(mla(4))})
    with pytest.raises(NotImplementedError, match="group 1's MLAAttentionSpec has dcp_sharded=False under 2 decode"):
        _manager_of(KVCacheManager031, full(4), draft, scheduler_block_size=8, dcp_world_size=2)
    _manager_of(KVCacheManager031, full(4), draft)  # no decode ranks: nothing to split


def test_0_31_refuses_bounded_replay():
    bounded = type("SlidingWindowMLASpec", (type(swa(4, 8)),), {"bounded_replay": True, "prefix_cacheable": False})
    spec = bounded(**{f.name: getattr(swa(4, 8), f.name) for f in dataclasses.fields(swa(4, 8))})
    with pytest.raises(NotImplementedError, match="group 1's bounded replay .SlidingWindowMLASpec.bounded_replay=True"):
        _manager_of(KVCacheManager031, full(4), spec)


def test_0_32_api_zeroing_skips_common_prefix_zeros_and_the_cacheable_count():
    manager = _manager_of(KVCacheManager032, full(4), mamba(4, "align"))
    assert not hasattr(manager, "get_zeroing_block_ids_in_range")  # gone in 0.32
    loaded = _request("a", range(13))
    assert manager.allocate_slots(loaded, 4, num_external_computed_tokens=8, skip_zeroing_group_ids=(0,)) is not None
    table = manager.get_block_ids("a")[0]
    assert manager.take_new_block_ids() == table[2:]  # the two blocks the connector loads are not zeroed
    computed = _request("b", range(13))
    assert manager.allocate_slots(computed, 4, num_external_computed_tokens=8) is not None
    assert manager.take_new_block_ids() == manager.get_block_ids("b")[0]
    assert manager.get_num_common_prefix_blocks("a") == [0, 0] == manager.get_num_common_prefix_blocks("nobody")
    assert manager.coordinator.get_num_cacheable_tokens(11, 0) == 8  # the last scheduler-block boundary
    with pytest.raises(TypeError, match="skip_zeroing_group_ids must be a tuple of group ids below 2, got \\(2,\\)"):
        manager.allocate_slots(_request("c", range(9)), 1, skip_zeroing_group_ids=(2,))


def test_0_33_hashes_cover_the_lookahead_tokens_and_only_hashed_blocks_are_cached():
    """With EAGLE's lookahead token (L = 1) a block is hashed once the token
    past it exists, its hash covers that token, and a manager built for 0.33
    caches only the blocks the request has hashes for; its Stored events
    name each block's lookahead tokens."""
    from kvspec import hashing
    from kvspec.impl import kv_events

    hasher = get_request_block_hasher(4, hashing.sha256_cbor, 1)
    request = Request("a", list(range(12)), block_hasher=hasher)
    assert len(request.block_hashes) == 2  # 12 tokens: block 3's lookahead token does not exist yet
    assert request.block_hashes[0] == hashing.hash_block_tokens(hashing.sha256_cbor, None, [0, 1, 2, 3], (None, 4))
    other = Request("b", [0, 1, 2, 3, 9, 5, 6, 7, 8], block_hasher=hasher)
    assert other.block_hashes[0] != request.block_hashes[0]  # the same block, another token past it
    manager = _manager_of(KVCacheManager033, full(4), num_hash_lookahead_tokens=1, enable_kv_cache_events=True)
    _compute(manager, request, 12)
    assert [b.block_hash is not None for b in manager.get_blocks("a").blocks[0]] == [True, True, False]
    (event,) = [e for e in manager.take_events() if isinstance(e, kv_events.BlockStored)]
    assert event.lookahead_token_ids == [[4], [8]]
    request.append_output_token_ids(12)  # block 3's lookahead token arrives: hashed, then cached
    assert len(request.block_hashes) == 3
    manager.cache_blocks(request, 12)
    assert all(b.block_hash is not None for b in manager.get_blocks("a").blocks[0])


def test_0_33_bounds_a_hit_and_refuses_what_earlier_releases_lack():
    manager = _manager_of(KVCacheManager033, full(4))
    _compute(manager, _request("a", range(13)), 13)
    resend = _request("b", range(13))
    assert manager.get_computed_blocks(resend)[1] == 12
    assert manager.get_computed_blocks(resend, max_cache_hit_length=9)[1] == 8
    assert manager.get_computed_blocks_for_connector(resend, 5)[1] == 4
    with pytest.raises(ValueError, match=r"max_cache_hit_length must be an int in \[0, 12\].*got 13"):
        manager.get_computed_blocks(resend, max_cache_hit_length=13)
    with pytest.raises(TypeError):
        KVCacheManager032(config(full(4)), 256, 4, 4).get_computed_blocks(resend, 9)  # no such argument before 0.33
    with pytest.raises(ValueError, match="release delta lookahead-block-hashes"):
        _manager_of(KVCacheManager032, full(4), num_hash_lookahead_tokens=1)
    with pytest.raises(ValueError, match="num_hash_lookahead_tokens must be >= 0, got -1"):
        _manager_of(KVCacheManager033, full(4), num_hash_lookahead_tokens=-1)
    with pytest.raises(ValueError, match="num_hash_lookahead_tokens must be an int >= 0"):
        get_request_block_hasher(4, num_hash_lookahead_tokens="1")


def test_0_33_a_marked_drafter_group_drops_nothing_without_use_eagle():
    """The drafter's group is marked; the scheduler builds the manager with
    use_eagle off (lookahead hashes).  0.32 drops the hit's last block for
    the marked group all the same; 0.33 does not."""
    def hit(cls):
        manager = cls(config(full(4), num_blocks=32, eagle_groups=(0,)), max_model_len=256, scheduler_block_size=4,
                      hash_block_size=4, max_in_flight_tokens=64)
        _compute(manager, _request("a", range(16)), 16)
        return manager.get_computed_blocks(_request("b", range(17)))[1]

    assert (hit(KVCacheManager032), hit(KVCacheManager033)) == (12, 16)


def test_0_33_an_eagle_group_keeps_the_block_below_a_shared_prefix_junction_under_retention():
    """Retention 0, a sliding window of 4 in blocks of 4, EAGLE, a junction
    at 8 stored by the scheduler: 0.33 keeps the tail before 4 too (delta
    eagle-junction-peek) -- where a sibling diverging right after the
    junction lands, without the block past the junction to peek at."""
    def cached_swa_blocks(cls):
        manager = _with_retention(cls, 0, full(4), swa(4, 4), use_eagle=True)
        request = _request("a", range(24))
        request.shared_prefix_boundary = 8
        _compute(manager, request, 24)
        return [i for i, b in enumerate(manager.coordinator.single_type_managers[1].req_to_blocks["a"])
                if b.block_hash is not None]

    assert cached_swa_blocks(KVCacheManager032) == [1, 2, 3, 4, 5]
    assert cached_swa_blocks(KVCacheManager033) == [0, 1, 2, 3, 4, 5]  # the tail before 4, with EAGLE's peek


class LimitedRequest(Request):
    """A request as vLLM 0.34 makes one: a hit limit (0: read no cache, N:
    the first N tokens at most, None: unbounded) in place of the skip flag."""

    def __init__(self, rid, tokens, limit=None):
        super().__init__(rid, list(tokens), block_hasher=get_request_block_hasher(4))
        del self.skip_reading_prefix_cache
        self.prefix_cache_hit_limit = limit

    def get_max_cache_hit_length(self, bound=None):
        return min(x for x in (self.num_tokens - 1, self.prefix_cache_hit_limit, bound) if x is not None)


def test_0_34_a_request_s_hit_limit_bounds_its_hit_and_the_probe_takes_nothing():
    manager = _manager_of(KVCacheManager034, full(4), log_stats=True)
    _compute(manager, LimitedRequest("a", range(17)), 17)
    assert manager.get_computed_blocks(LimitedRequest("b", range(17)))[1] == 16
    assert manager.get_computed_blocks(LimitedRequest("c", range(17), limit=10))[1] == 8  # prompt logprobs from 10
    assert manager.get_computed_blocks(LimitedRequest("d", range(17), limit=10), 5)[1] == 4
    assert manager.get_computed_blocks(LimitedRequest("e", range(17), limit=0))[1:] == (0, 0)  # reads no cache
    assert manager.get_computed_blocks(LimitedRequest("h", range(17)), 99)[1] == 16  # a bound only tightens
    with pytest.raises(ValueError, match="max_cache_hit_length must be an int >= 0, got -1"):
        manager.get_computed_blocks(LimitedRequest("i", range(17)), -1)
    free = manager.block_pool.get_num_free_blocks()
    assert manager.get_num_cached_tokens(LimitedRequest("f", range(17))) == 16
    assert manager.get_num_cached_tokens(LimitedRequest("g", range(17), limit=0)) == 0
    assert manager.block_pool.get_num_free_blocks() == free  # a probe: no reference taken
    assert not hasattr(manager, "get_num_common_prefix_blocks")  # gone in 0.34


def test_0_34_pool_frees_blocks_another_tier_holds_to_the_head_and_builds_its_map_over_the_blocks():
    from kvspec.dropin_releases import BlockHashToBlockMap034

    manager = _manager_of(KVCacheManager034, full(4))
    request = LimitedRequest("a", range(9))
    _compute(manager, request, 9)
    blocks = manager.pop_blocks_for_free(request)
    cached = [b for b in blocks if b.block_hash is not None]
    assert len(cached) == 2
    manager.block_pool.free_blocks(reversed(blocks), evict_first=True)
    head = manager.block_pool.free_block_queue.get_all_free_blocks()[:3]
    assert [b.block_id for b in head] == [b.block_id for b in reversed(blocks)]  # cached ones first to go too
    assert len(BlockHashToBlockMap034(manager.block_pool.blocks)) == 0


def test_0_30_stored_events_name_the_session_where_the_event_class_has_the_field():
    """vLLM 0.30's BlockStored has a session_id: the pool fills it in from the
    request; kvspec's own event class (0.25.1's fields) has none."""
    from dataclasses import dataclass

    from kvspec.impl import kv_events

    @dataclass
    class StoredWithSession(kv_events.BlockStored):
        session_id: str | None = None

    def stored(manager):
        request = _request("a", range(8))
        request.session_id = "chat-7"
        _compute(manager, request, 8)
        return [e for e in manager.take_events() if isinstance(e, kv_events.BlockStored)]

    previous = kv_events.use_event_classes(StoredWithSession, kv_events.BlockRemoved, kv_events.AllBlocksCleared)
    try:
        (event,) = stored(_manager_of(KVCacheManager030, full(4), enable_kv_cache_events=True))
        assert event.session_id == "chat-7"
    finally:
        kv_events.use_event_classes(previous.stored, previous.removed, previous.cleared)
    (event,) = stored(_manager_of(KVCacheManager030, full(4), enable_kv_cache_events=True))
    assert not hasattr(event, "session_id")


def test_the_drop_in_builds_what_vllm_builds_itself_with_the_release_s_deltas(monkeypatch):
    """A pool, coordinator or single-type manager vLLM's own code builds (a
    connector's CPU coordinator, a test) takes the installed release's
    deltas; uninstall puts the base back."""
    from kvspec.impl import release
    from kvspec.impl.single_type_kv_cache_manager import MambaManager
    from kvspec.kv_cache_interface import MambaSpec

    previous = release.use_default_deltas({"mamba-retire-across-gaps"})
    try:
        pool = API["0.30.0"]["vllm.v1.core.block_pool"]["BlockPool"](8, False, 4)
        manager = MambaManager(MambaSpec(block_size=4, mamba_cache_mode="align"), block_pool=pool,
                               enable_caching=False, kv_cache_group_id=0, scheduler_block_size=4)
        assert "mamba-retire-across-gaps" in manager.deltas
    finally:
        release.use_default_deltas(previous)
    assert release.require_deltas(None) == previous
    with pytest.raises(ValueError, match="does not implement release delta"):
        release.use_default_deltas({"partial-hit-copy-on-write"})
    assert release.require_deltas(None) == previous  # refused: nothing changed
