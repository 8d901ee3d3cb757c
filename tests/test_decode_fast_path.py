"""impl's decode fast path (``KVCacheManager.allocate_slots`` answering a
running request from its steady limits) changes nothing observable: driven
side by side with a manager whose fast path is switched off, every result,
block table, free count and event is the same, on every layout; and the
argument checks and the watermark still apply on that path."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.conformance.machines.layouts import MANAGER_LAYOUTS
from kvspec.errors import RuleError, RuleTypeError
from kvspec.hashing import get_request_block_hasher
from kvspec.impl import KVCacheManager
from kvspec.request import Request, RequestStatus
from kvspec.spec.layout import Layout
from kvspec.testing import full, mamba, swa

LAYOUTS = {
    **MANAGER_LAYOUTS,
    # Mamba "all" mode with draft-state blocks: the slot and skip limits shift by them.
    "full+mamba-all-drafts": Layout((full(2), mamba(2, "all", speculative=2)), num_blocks=40,
                                           use_eagle=True, eagle_groups=(0,)),
    "swa-wide": Layout((full(4), swa(4, window=9)), num_blocks=40, max_model_len=64),
}


class _NoSteady(dict):
    """A steady-limit table that never keeps anything: every call takes the checked path."""

    def __setitem__(self, key, value) -> None:
        return None


def _managers(layout: Layout, deltas: frozenset[str] | None = None) -> tuple[KVCacheManager, KVCacheManager]:
    def make() -> KVCacheManager:
        return KVCacheManager(layout.kv_cache_config(), layout.max_model_len, layout.scheduler_block_size,
                              layout.hash_block_size, enable_caching=layout.enable_caching,
                              use_eagle=layout.use_eagle, enable_kv_cache_events=True, deltas=deltas,
                              **layout.target_options())

    fast, checked = make(), make()
    checked._steady = _NoSteady()
    return fast, checked


def _state(manager: KVCacheManager, request_ids: list[str]) -> tuple:
    return (
        manager.block_pool.get_num_free_blocks(),
        [manager.get_block_ids(rid) for rid in request_ids],
        [repr(event) for event in manager.take_events()],
    )


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_the_fast_path_answers_as_the_checked_path(name, data):
    _drive_side_by_side(LAYOUTS[name], data)


ALIGN_LAYOUTS = sorted(name for name, layout in LAYOUTS.items() if layout.has_mamba_align)


@pytest.mark.parametrize("name", ALIGN_LAYOUTS)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_mamba_align_s_fast_path_answers_as_the_checked_path_in_a_later_release(name, data):
    """From 0.30 (delta mamba-retire-across-gaps) Mamba align retires every
    state before the window: its steady limits must see that release too."""
    from kvspec.dropin_releases import impl_deltas
    from kvspec.spec import releases

    _drive_side_by_side(LAYOUTS[name], data, impl_deltas(releases.judged("0.33.0")))


def _drive_side_by_side(layout: Layout, data: st.DataObject, deltas: frozenset[str] | None = None) -> None:
    fast, checked = _managers(layout, deltas)
    hasher = get_request_block_hasher(layout.hash_block_size)
    encoder = 6 if layout.has_cross_attention else 0
    drafts = 2 if layout.use_eagle else 0
    requests: dict[str, tuple[Request, Request]] = {}
    for step in range(data.draw(st.integers(8, 40), label="steps")):
        fast.new_step_starts()
        checked.new_step_starts()
        if len(requests) < 3 and data.draw(st.booleans(), label="arrive"):
            prompt = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=10), label="prompt")
            rid = f"r{step}"
            pair = (Request(rid, prompt, block_hasher=hasher), Request(rid, prompt, block_hasher=hasher))
            outcomes = []
            for manager, request in zip((fast, checked), pair, strict=True):
                hits, num_hit = manager.get_computed_blocks(request)
                if layout.has_mamba_align:  # align mode needs block-aligned prefills: take no hit
                    hits, num_hit = manager.empty_kv_cache_blocks, 0
                new = manager.allocate_slots(request, request.num_tokens - num_hit, num_hit, hits,
                                             num_lookahead_tokens=drafts, num_encoder_tokens=encoder)
                outcomes.append(None if new is None else new.get_block_ids())
                if new is not None:
                    request.num_computed_tokens = request.num_tokens
                    request.status = RequestStatus.RUNNING
            assert outcomes[0] == outcomes[1]
            if outcomes[0] is not None:
                requests[rid] = pair
        for rid, pair in list(requests.items()):
            if pair[0].num_tokens + 1 + 2 * drafts > layout.max_model_len:  # done: the model's length
                for manager, request in zip((fast, checked), pair, strict=True):
                    manager.free(request)
                del requests[rid]
                continue
            num_drafts = data.draw(st.integers(0, drafts), label="drafts")
            accepted = data.draw(st.integers(0, num_drafts), label="accepted")
            outcomes = []
            for manager, request in zip((fast, checked), pair, strict=True):
                request.spec_token_ids = [1] * num_drafts
                new = manager.allocate_slots(request, 1 + num_drafts, num_lookahead_tokens=drafts)
                outcomes.append(None if new is None else new.get_block_ids())
                if new is not None:
                    request.num_computed_tokens += 1 + accepted
                    request.spec_token_ids = []
                    request.append_output_token_ids([2] * (1 + accepted))
            assert outcomes[0] == outcomes[1], f"step {step}, {rid}"
            if outcomes[0] is None or data.draw(st.integers(0, 9), label="finish") == 0:
                for manager, request in zip((fast, checked), pair, strict=True):
                    manager.free(request)
                del requests[rid]
        assert _state(fast, list(requests)) == _state(checked, list(requests)), f"step {step}"


def _running(manager: KVCacheManager) -> Request:
    request = Request("r", [1, 2, 3], block_hasher=get_request_block_hasher(2))
    assert manager.allocate_slots(request, 3, has_scheduled_reqs=False) is not None  # no watermark
    request.num_computed_tokens = 3
    request.status = RequestStatus.RUNNING
    request.append_output_token_ids(4)
    assert manager.allocate_slots(request, 1) is not None  # the request now has steady limits
    assert "r" in manager._steady
    return request


@pytest.mark.parametrize(("argument", "value", "error"), [
    ("num_new_computed_tokens", False, RuleTypeError),
    ("num_external_computed_tokens", 0.0, RuleTypeError),
    ("num_encoder_tokens", -1, RuleError),
    ("reserved_blocks", False, RuleTypeError),
    ("num_lookahead_tokens", -1, RuleError),
    ("num_lookahead_tokens", True, RuleTypeError),
])
def test_arguments_are_checked_on_the_fast_path_too(argument, value, error):
    manager = KVCacheManager(MANAGER_LAYOUTS["full"].kv_cache_config(), 32, 2, 2)
    request = _running(manager)
    with pytest.raises(error, match=argument):
        manager.allocate_slots(request, 1, **{argument: value})
    with pytest.raises(RuleTypeError, match="num_new_tokens"):
        manager.allocate_slots(request, 1.0)


def test_the_watermark_still_holds_back_a_waiting_request():
    """A request sent back to waiting keeps its blocks in this test (as a
    scheduler's resumed request would not): with the watermark above the
    free count, the checked path refuses it; so must the fast path."""
    config = MANAGER_LAYOUTS["full"].kv_cache_config()
    manager = KVCacheManager(config, 32, 2, 2, watermark=0.99)
    request = _running(manager)
    assert manager.allocate_slots(request, 1) is not None  # running: no watermark
    request.status = RequestStatus.WAITING
    assert manager.allocate_slots(request, 1) is None
    assert manager.allocate_slots(request, 1, has_scheduled_reqs=False) is not None
