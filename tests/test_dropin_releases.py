"""The drop-in's release shapes (kvspec.dropin_releases), without vLLM: the
API each release's scheduler calls, on impl built with that release's
deltas.  vLLM's own tests run on them by tools/peer_suite.py --release."""

import pytest

from kvspec import dropin
from kvspec.dropin_releases import API, KVCacheManager026
from kvspec.hashing import get_request_block_hasher
from kvspec.request import Request
from kvspec.testing import config, full, mamba, swa


def _manager(*specs, num_blocks=32, **options):
    return KVCacheManager026(config(*specs, num_blocks=num_blocks), max_model_len=256, scheduler_block_size=4,
                             hash_block_size=4, max_in_flight_tokens=64, **options)


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
    _manager(swa(4, 4))  # one group: no shared-prefix boundary to pin
    with pytest.raises(NotImplementedError, match="does not pin the shared-prefix boundary .* group 1"):
        _manager(full(4), swa(4, 4))
