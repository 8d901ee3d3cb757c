"""The rules' shortcuts judge as the rules' plain forms do.

The rules run after every operation of the gate, so a few of them take
shortcuts (issue 56): what one snapshot or one request gives is derived
once and kept while it is unchanged, and a count is made only where it can
find something.  Each shortcut here is held against the plain computation
it replaces, including the cases that make a kept value stale -- a
request's hashes changed in place, a snapshot's tables changed after they
were walked -- and the cases the shortcut skips (no block repeats) against
the ones it must not (a block repeats).
"""

from __future__ import annotations

import pytest

from kvspec.hashing import (
    block_hash_converter,
    get_request_block_hasher,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
)
from kvspec.request import Request
from kvspec.spec.content import Shadow, hashes_for
from kvspec.spec.interface import ManagerSnapshot, PoolSnapshot
from kvspec.spec.layout import Layout
from kvspec.spec.request_rules import RequestContext, _hash_names, slots
from kvspec.spec.rules import check_state, free_queue_consistency, hash_map_consistency
from kvspec.testing import config, full


def plain_names(ctx: RequestContext) -> dict:
    """content-soundness's names as the rule made them before it kept them."""
    names: dict = {}
    for request in ctx.requests.values():
        for g in range(len(ctx.layout.views)):
            for i, h in enumerate(hashes_for(request, ctx.layout, g)):
                names.setdefault(make_block_hash_with_group_id(h, g), (request, g, i))
    return names


def same(kept: dict, plain: dict) -> bool:
    return kept.keys() == plain.keys() and all(
        kept[k][0] is plain[k][0] and kept[k][1:] == plain[k][1:] for k in plain)


def test_hash_names_follow_the_requests_as_they_change():
    cfg = config(full(4), full(8), num_blocks=16)
    layout = Layout.from_config(cfg, 8, 4, True, False)
    requests: dict[str, Request] = {}
    ctx = RequestContext(layout=layout, requests=requests, shadow=Shadow(layout))
    hasher = get_request_block_hasher(4)

    def check() -> None:
        assert same(_hash_names(ctx), plain_names(ctx))

    check()
    requests["a"] = Request("a", list(range(12)), block_hasher=hasher)
    check()
    requests["b"] = Request("b", list(range(8)) + [7] * 9, block_hasher=hasher)  # shares a's first two blocks
    check()
    assert _hash_names(ctx)[make_block_hash_with_group_id(requests["b"].block_hashes[0], 0)][0] is requests["a"]
    for t in range(6):  # hashes grow as tokens come
        requests["a"].append_output_token_ids(t)
        check()
    requests["b"].block_hashes[1] = requests["b"].block_hashes[3]  # changed in place, same length
    check()
    del requests["a"]  # the first to name a shared key is gone: the next names it
    check()
    requests["a"] = Request("a", [5] * 8, block_hasher=hasher)  # a new request under an old id
    check()
    ctx.layout = Layout.from_config(config(full(4), num_blocks=16), 4, 4, True, False)  # another layout
    check()


def test_slots_follow_a_snapshot_changed_after_it_was_walked():
    pool = PoolSnapshot(4, (0, 1, 1, 0), (3,), {}, {}, {})
    snap = ManagerSnapshot(pool=pool, tables={"a": ((1, 0), (2,))})
    assert list(slots(snap)) == [("a", 0, 0, 1), ("a", 1, 0, 2)]
    assert list(slots(snap)) == [("a", 0, 0, 1), ("a", 1, 0, 2)]  # asked again: the same
    snap.tables["b"] = ((3,), ())
    assert list(slots(snap)) == [("a", 0, 0, 1), ("a", 1, 0, 2), ("b", 0, 0, 3)]
    other = ManagerSnapshot(pool=pool, tables={"c": ((2,), ())})
    assert list(slots(other)) == [("c", 0, 0, 2)]


@pytest.mark.parametrize("setting", [None, "1", "0", "7", "no"])
def test_the_converter_converts_as_maybe_convert_does(monkeypatch, setting):
    if setting is None:
        monkeypatch.delenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", raising=False)
    else:
        monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", setting)
    h = bytes(range(32))
    if setting == "no":
        with pytest.raises(ValueError, match="must be an integer"):
            maybe_convert_block_hash(h)
        with pytest.raises(ValueError, match="must be an integer"):
            block_hash_converter()
    else:
        assert block_hash_converter()(h) == maybe_convert_block_hash(h)
        assert (block_hash_converter()(h) == h) == (setting == "0")


def test_repeated_blocks_are_still_counted():
    key = b"k" * 36
    queued_twice = PoolSnapshot(4, (0, 0, 0, 0), (1, 2, 1, 3), {}, {}, {})
    assert free_queue_consistency(queued_twice) == ["block 1 is queued 2 times"]
    listed_twice = PoolSnapshot(4, (0, 0, 0, 0), (1, 2, 3), {2: key}, {key: (2, 2)}, {})
    assert hash_map_consistency(listed_twice) == ["block 2 is listed 2 times under one key"]
    listed_once = PoolSnapshot(4, (0, 0, 0, 0), (1, 2, 3), {2: key}, {key: (2, 1)}, {})
    assert hash_map_consistency(listed_once) == ["block 1 is listed under a key it does not carry"]


def test_a_rule_left_out_is_only_that_rule():
    broken = PoolSnapshot(4, (0, -1, 0, 0), (1, 1, 2, 3), {}, {}, {})
    everything = check_state(broken)
    assert {v.rule for v in everything} >= {"ref-conservation", "free-queue-consistency"}
    assert check_state(broken, leave_out=frozenset({"ref-conservation"})) == [
        v for v in everything if v.rule != "ref-conservation"]


class Calls:
    def plain(self, request, num_new, hit=0, blocks=None, lookahead=0):
        pass

    def starred(self, request, *rest, **more):
        pass

    def keyword_only(self, request, *, flag=False):
        pass


@pytest.mark.parametrize("op", ["plain", "starred", "keyword_only"])
@pytest.mark.parametrize("args, kwargs", [
    ((), {}), (("r",), {}), (("r", 4), {}), (("r", 4, 1, [1], 2), {}), (("r", 4, 1, [1], 2, 9), {}),
    (("r",), {"num_new": 3}), (("r", 4), {"lookahead": 2, "hit": 1}), (("r", 4), {"num_new": 5}),
    (("r", 4), {"nonsense": 1}), ((), {"request": "r", "num_new": 1}), (("r",), {"flag": True}),
])
def test_observe_names_the_arguments_as_signature_bind_does(op, args, kwargs):
    import inspect

    from kvspec.conformance.machines.observe import _bind

    def by_signature():
        bound = inspect.signature(getattr(Calls(), op)).bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    try:
        expected = by_signature()
    except TypeError:
        with pytest.raises(TypeError):
            _bind(Calls, op, args, kwargs)
    else:
        got = _bind(Calls, op, args, kwargs)
        assert got == expected and list(got) == list(expected)
