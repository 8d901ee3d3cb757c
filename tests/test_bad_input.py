"""Bad input to every pool operation: a clear error naming the value and the
rule, and the pool exactly as it was (checked on the whole snapshot, events
included) -- for the spec and for impl alike."""

from __future__ import annotations

import re

import pytest

from kvspec.conformance.targets.pool import SpecPoolTarget, VllmApiPoolTarget
from kvspec.errors import RuleError, RuleTypeError
from kvspec.hashing import get_request_block_hasher
from kvspec.impl import BlockPool
from kvspec.request import Request

HBS = 2
TOKENS = [1, 2, 3, 4, 5, 6, 7, 8]


def request() -> Request:
    return Request("r", TOKENS, block_hasher=get_request_block_hasher(HBS))


class ImplById:
    """impl's BlockPool addressed by id, resolving ids *without* validation,
    so that out-of-range ids reach the pool itself."""

    def __init__(self):
        self.pool = BlockPool(8, True, HBS, enable_kv_cache_events=True)
        self.view = VllmApiPoolTarget(self.pool)

    def blocks(self, ids):
        return [self.pool.blocks[i] for i in ids]

    def get_new_blocks(self, n):
        return [b.block_id for b in self.pool.get_new_blocks(n)]

    def touch(self, ids):
        self.pool.touch(self.blocks(ids))

    def free_blocks(self, ids):
        self.pool.free_blocks(self.blocks(ids))

    def cache_full_blocks(self, req, ids, *args):
        self.pool.cache_full_blocks(req, self.blocks(ids), *args)

    def __getattr__(self, name):
        return getattr(self.view, name)


def scene(kind):
    """Blocks 1, 2 held and cached; 3 cached and free; 4 held, not cached."""
    pool = SpecPoolTarget(8, True, HBS, True) if kind == "spec" else ImplById()
    assert pool.get_new_blocks(3) == [1, 2, 3]
    pool.cache_full_blocks(request(), [1, 2, 3], 0, 3, HBS, 0)
    pool.free_blocks([3])
    assert pool.get_new_blocks(1) == [4]
    return pool


def unchanged(pool, call, error=(ValueError, TypeError), match=None):
    before, events_before = pool.snapshot(), pool.take_events()
    with pytest.raises(error, match=match):
        call()
    assert pool.snapshot() == before
    assert pool.take_events() == []
    return events_before


KINDS = ["spec", "impl"]

BAD_CALLS = {
    # name: (call, rule)
    "allocate more than free": (lambda p: p.get_new_blocks(p.get_num_free_blocks() + 1), "allocation-accounting"),
    "allocate a negative count": (lambda p: p.get_new_blocks(-1), "allocation-accounting"),
    "allocate a float count": (lambda p: p.get_new_blocks(1.5), "allocation-accounting"),
    "allocate a bool count": (lambda p: p.get_new_blocks(True), "allocation-accounting"),
    "free a block nobody holds": (lambda p: p.free_blocks([5]), "ref-conservation"),
    "free a block more often than held": (lambda p: p.free_blocks([4, 4]), "ref-conservation"),
    "free a bad block after good ones": (lambda p: p.free_blocks([2, 1, 4, 6]), "ref-conservation"),
    "free a cached free block": (lambda p: p.free_blocks([3]), "ref-conservation"),
    "evict an id past the pool": (lambda p: p.evict_blocks([1, 8]), "allocation-accounting"),
    "evict a negative id": (lambda p: p.evict_blocks([1, -1]), "allocation-accounting"),
    "evict a non-int id": (lambda p: p.evict_blocks([1, "2"]), "allocation-accounting"),
    "look up a str hash": (lambda p: p.get_cached_block("abc", [0]), "hash-map-consistency"),
    "look up an int hash": (lambda p: p.get_cached_block(123, [0]), "hash-map-consistency"),
    "look up a negative group": (lambda p: p.get_cached_block(b"x" * 32, [-1]), "hash-map-consistency"),
    "look up a group past 4 bytes": (lambda p: p.get_cached_block(b"x" * 32, [2**32]), "hash-map-consistency"),
    "cache with a block size not a multiple": (
        lambda p: p.cache_full_blocks(request(), [4], 0, 1, 3, 0), "block-size-coherence"),
    "cache with a zero block size": (
        lambda p: p.cache_full_blocks(request(), [4], 0, 1, 0, 0), "block-size-coherence"),
    "cache more blocks than given": (
        lambda p: p.cache_full_blocks(request(), [4], 0, 2, HBS, 1), "hash-map-consistency"),
    "cache more blocks than hashes": (
        lambda p: p.cache_full_blocks(request(), [1, 2, 4, 4, 4], 4, 5, HBS, 1), "hash-map-consistency"),
    "cache with a short mask": (
        lambda p: p.cache_full_blocks(request(), [4], 0, 1, HBS, 1, [True, False]), "hash-map-consistency"),
    "cache a free block": (lambda p: p.cache_full_blocks(request(), [5], 0, 1, HBS, 1), "content-soundness"),
    "cache an already cached block": (
        lambda p: p.cache_full_blocks(request(), [4, 1], 0, 2, HBS, 1), "hash-map-consistency"),
    "cache one block twice": (lambda p: p.cache_full_blocks(request(), [4, 4], 0, 2, HBS, 1), "no-aliasing"),
    "cache with a negative count": (
        lambda p: p.cache_full_blocks(request(), [4], -1, 1, HBS, 1), "allocation-accounting"),
    "cache for a negative group": (
        lambda p: p.cache_full_blocks(request(), [4], 0, 1, HBS, -1), "hash-map-consistency"),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_refused_and_unchanged(kind, case):
    pool = scene(kind)
    call, rule = BAD_CALLS[case]
    unchanged(pool, lambda: call(pool), match=rf"\[{rule}\]")


@pytest.mark.parametrize("kind", KINDS)
def test_error_names_the_value(kind):
    pool = scene(kind)
    with pytest.raises(ValueError, match="cannot get 9 free blocks|Cannot get 9 free blocks"):
        pool.get_new_blocks(9)
    with pytest.raises(ValueError, match="block 5"):
        pool.free_blocks([5])
    with pytest.raises(ValueError, match="block id 8"):
        pool.evict_blocks([8])
    with pytest.raises(TypeError, match="'abc'"):
        pool.get_cached_block("abc", [0])


@pytest.mark.parametrize("kind", KINDS)
def test_freeing_the_null_block_is_a_no_op(kind):
    """null-exclusion: the null block is a placeholder in block tables, which
    managers free wholesale -- so freeing it is skipped, never an error, and
    it never enters the free queue."""
    pool = scene(kind)
    before = pool.snapshot()
    pool.free_blocks([0, 0])
    pool.touch([0])
    assert pool.snapshot().without_null_ref() == before.without_null_ref()
    assert 0 not in pool.snapshot().free


@pytest.mark.parametrize("kind", KINDS)
def test_reset_while_in_use_is_refused_and_unchanged(kind):
    pool = scene(kind)
    pool.take_events()
    before = pool.snapshot()
    assert pool.reset_prefix_cache() is False
    assert pool.snapshot() == before
    assert pool.take_events() == []


@pytest.mark.parametrize("kind", KINDS)
def test_caching_disabled_pool_refuses_to_cache(kind):
    pool = SpecPoolTarget(4, False, HBS) if kind == "spec" else VllmApiPoolTarget(BlockPool(4, False, HBS))
    pool.get_new_blocks(1)
    before = pool.snapshot()
    with pytest.raises(ValueError, match="caching is disabled"):
        pool.cache_full_blocks(request(), [1], 0, 1, HBS, 0)
    assert pool.snapshot() == before


@pytest.mark.parametrize(
    "args, error",
    [((0, True, 2), RuleError), ((-3, True, 2), RuleError), (("8", True, 2), RuleTypeError),
     ((8, True, 0), RuleError), ((8, True, 2.0), RuleTypeError)],
)
def test_bad_construction(args, error):
    with pytest.raises(error):
        BlockPool(*args)
    with pytest.raises((RuleError, RuleTypeError)):
        SpecPoolTarget(*args)


def test_impl_refuses_non_blocks_unchanged():
    """impl's API takes KVCacheBlock objects; anything else is a TypeError
    raised before any block changes."""
    pool = ImplById()
    blocks = pool.pool.get_new_blocks(2)
    before = pool.snapshot()
    with pytest.raises(TypeError, match="KVCacheBlock"):
        pool.pool.free_blocks([blocks[0], 7])
    assert pool.snapshot() == before
    with pytest.raises(TypeError, match="KVCacheBlock"):
        pool.pool.touch([pool.pool.blocks[5], "x"])
    assert pool.snapshot() == before
    with pytest.raises(TypeError, match="KVCacheBlock"):
        pool.pool.cache_full_blocks(request(), [blocks[0], None], 0, 2, HBS, 0)
    assert pool.snapshot() == before


def test_impl_set_block_hash_twice_is_refused():
    pool = BlockPool(4, True, HBS)
    (block,) = pool.get_new_blocks(1)
    block.set_block_hash(b"k" * 36)
    with pytest.raises(RuleError, match="already carries a hash"):
        block.set_block_hash(b"j" * 36)
    assert block.block_hash == b"k" * 36


# --- computing past max_model_len: refused before anything changes ---------------------------------------


def _manager_targets():
    from kvspec.conformance.machines.layouts import MANAGER_LAYOUTS
    from kvspec.conformance.targets.manager import ImplManagerTarget
    from kvspec.conformance.targets.spec_manager import SpecManagerTarget

    return [(name, layout, target) for name, layout in MANAGER_LAYOUTS.items()
            for target in (ImplManagerTarget, SpecManagerTarget)]


@pytest.mark.parametrize("name, layout, target", _manager_targets(),
                         ids=lambda v: v if isinstance(v, str) else getattr(v, "__name__", ""))
def test_computing_past_max_model_len_is_refused_with_nothing_changed(name, layout, target):
    """A request asks to compute past max_model_len -- fresh, or with
    tokens computed and blocks held: a RuleError naming max_model_len, the
    state exactly as it was (impl once changed state first, then failed)."""
    manager = layout.make_target(target)
    hasher = get_request_block_hasher(layout.hash_block_size)
    limit = layout.max_model_len
    running = Request("a", [1, 0, 1, 1], block_hasher=hasher)
    manager.get_computed_blocks(running)
    assert manager.allocate_slots(running, 4) is not None
    running.num_computed_tokens = 4
    running.append_output_token_ids([0] * limit)
    fresh = Request("b", [1] * (limit + 1), block_hasher=hasher)
    before = manager.snapshot()
    for request, n in ((running, limit - 3), (running, limit), (fresh, limit + 1)):
        with pytest.raises(RuleError, match="past max_model_len"):
            manager.allocate_slots(request, n)
        assert manager.snapshot() == before


@pytest.mark.parametrize("bad", [1.0, True, "7", None])
def test_a_request_refuses_a_token_id_that_is_not_an_int_naming_it(bad):
    with pytest.raises(TypeError, match=rf"prompt_token_ids must be ints, got {re.escape(repr(bad))} "):
        Request("r", [1, 2, bad, 3])


def test_a_request_keeps_its_own_copy_of_the_prompt():
    prompt = [1, 2, 3]
    request = Request("r", prompt)
    prompt.append(4)
    request.append_output_token_ids(9)
    assert request.prompt_token_ids == [1, 2, 3] and request.all_token_ids == [1, 2, 3, 9]
