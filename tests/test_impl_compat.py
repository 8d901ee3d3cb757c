"""What makes impl a drop-in for vLLM 0.25.1's block manager, checked without
vLLM: foreign spec and config objects, KV-event classes of the caller's
choice, vLLM's names, the live root hash, and partial-block prefix caching."""

import dataclasses
import os

import pytest

from kvspec import hashing
from kvspec.errors import RuleError
from kvspec.hashing import get_request_block_hasher, make_block_hash_with_group_id
from kvspec.impl import BlockPool, KVCacheManager, kv_cache_utils, kv_events
from kvspec.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheSpecKind,
    SlidingWindowSpec,
    get_kv_cache_spec_kind,
    spec_is,
)
from kvspec.request import Request


# Stand-ins for vLLM's classes: other classes, the same names and fields.
@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: str

    @property
    def page_size_bytes(self) -> int:
        return 2 * self.block_size * self.num_kv_heads * self.head_size * 2


@dataclasses.dataclass(frozen=True)
class ForeignFull(AttentionSpec):
    sliding_window: int | None = None
    attention_chunk_size: int | None = None


ForeignFull.__name__ = "FullAttentionSpec"


@dataclasses.dataclass(frozen=True)
class ForeignSliding(AttentionSpec):
    sliding_window: int = 8

    def max_admission_blocks_per_request(self, max_num_batched_tokens: int, max_model_len: int) -> int:
        return -(-min(self.sliding_window - 1 + max_num_batched_tokens, max_model_len) // self.block_size) + 1


ForeignSliding.__name__ = "SlidingWindowSpec"


@dataclasses.dataclass
class Group:
    layer_names: list
    kv_cache_spec: object
    is_eagle_group: bool = False


@dataclasses.dataclass
class Config:
    num_blocks: int
    kv_cache_tensors: list
    kv_cache_groups: list


def test_specs_are_recognised_by_class_name():
    full = ForeignFull(block_size=4, num_kv_heads=1, head_size=8, dtype="float16")
    assert spec_is(full, FullAttentionSpec) and not spec_is(full, SlidingWindowSpec)
    assert get_kv_cache_spec_kind(full) is KVCacheSpecKind.FULL_ATTENTION


def test_a_manager_runs_on_a_foreign_config():
    spec_a = ForeignFull(block_size=4, num_kv_heads=1, head_size=8, dtype="float16")
    spec_b = ForeignSliding(block_size=4, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=8)
    config = Config(20, [], [Group(["a"], spec_a), Group(["b"], spec_b)])
    manager = KVCacheManager(config, 64, 4, 4, enable_caching=True)
    a = Request("a", list(range(12)), block_hasher=get_request_block_hasher(4))
    assert manager.allocate_slots(a, 12) is not None
    b = Request("b", list(range(12)) + [99], block_hasher=get_request_block_hasher(4))
    blocks, hit = manager.get_computed_blocks(b)
    assert hit == 12 and len(blocks.get_block_ids()[0]) == 3
    assert manager.kv_cache_config is config


def test_not_a_config_is_refused():
    with pytest.raises(TypeError, match="must be a KVCacheConfig"):
        KVCacheManager(object(), 64, 4, 4)


def test_events_come_from_the_classes_chosen():
    @dataclasses.dataclass
    class Stored:
        block_hashes: list
        parent_block_hash: object
        token_ids: list
        block_size: int
        lora_id: object
        medium: object
        lora_name: object
        extra_keys: object = None
        group_idx: object = None
        kv_cache_spec_kind: object = None
        kv_cache_spec_sliding_window: object = None

    previous = kv_events.use_event_classes(Stored, kv_events.BlockRemoved, kv_events.AllBlocksCleared)
    try:
        pool = BlockPool(8, True, 2, enable_kv_cache_events=True)
        request = Request("r", [1, 2, 3, 4], block_hasher=get_request_block_hasher(2))
        blocks = pool.get_new_blocks(2)
        pool.cache_full_blocks(request, blocks, 0, 2, 2, 0)
        (event,) = pool.take_events()
        assert type(event) is Stored and event.token_ids == [1, 2, 3, 4]
    finally:
        kv_events.use_event_classes(previous.stored, previous.removed, previous.cleared)


def test_vllm_names(monkeypatch):
    pool = BlockPool(4, True, 2)
    queue = pool.free_block_queue
    assert queue.fake_free_list_head is queue.head and queue.fake_free_list_tail is queue.tail
    block = pool.get_new_blocks(1)[0]
    assert pool._maybe_evict_cached_block(block) is False
    monkeypatch.setenv("PYTHONHASHSEED", "123")
    monkeypatch.setattr(hashing, "NONE_HASH", hashing.NONE_HASH)
    kv_cache_utils.init_none_hash()
    assert kv_cache_utils.NONE_HASH == hashing.NONE_HASH == hashing.root_hash("123")
    assert os.environ["PYTHONHASHSEED"] == "123"


# --- partial-block prefix caching ------------------------------------------------------------------


def partial_setup(events=True):
    """Blocks of 4 tokens over hashes of 2: a block can be a hit for the first 2 of its tokens."""
    pool = BlockPool(6, True, 2, enable_kv_cache_events=events)
    request = Request("r", [5, 6, 7, 8, 9, 10], block_hasher=get_request_block_hasher(2))
    return pool, request


def test_a_partial_entry_makes_a_block_a_hit_for_a_prefix_inside_it():
    pool, request = partial_setup()
    block = pool.get_new_blocks(2)[1]
    key = pool.cache_partial_block(request, block, num_tokens=6, kv_cache_group_id=0, block_size=4)
    assert key == make_block_hash_with_group_id(request.block_hashes[2], 0)
    assert pool.get_cached_block(request.block_hashes[2], [0]) == [block]
    assert block.block_hash == key and block.block_hash_num_tokens == 6
    (event,) = pool.take_events()
    assert event.token_ids == [9, 10] and event.block_size == 2
    assert pool.cache_partial_block(request, block, 6, 0, 4) == key and not pool.take_events()  # once


def test_a_partial_entry_is_promoted_when_the_block_fills():
    pool, request = partial_setup()
    request.append_output_token_ids([11, 12])
    blocks = pool.get_new_blocks(2)
    pool.cache_partial_block(request, blocks[1], 6, 0, 4)
    pool.take_events()
    pool.cache_full_blocks(request, blocks, 0, 2, 4, 0)
    removed, stored = pool.take_events()
    assert type(removed).__name__ == "BlockRemoved" and type(stored).__name__ == "BlockStored"
    assert pool.get_cached_block(request.block_hashes[2], [0]) is None
    assert blocks[1].block_hash_num_tokens == 8


def test_a_full_block_keeps_its_hash_and_gains_an_extra_entry():
    pool, request = partial_setup()
    request.append_output_token_ids([11, 12])
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(request, blocks, 0, 2, 4, 0)
    other = Request("o", [5, 6, 7, 8, 9, 10], block_hasher=get_request_block_hasher(2))
    key = pool.cache_partial_block(other, blocks[1], 6, 0, 4)
    assert pool.cached_block_hashes_by_block == {blocks[1].block_id: {key}}
    assert blocks[1].block_hash_num_tokens == 8
    pool.take_events()
    pool.free_blocks(blocks)
    assert pool._maybe_evict_cached_block(blocks[1]) is True  # both keys go, each with an event
    assert len(pool.take_events()) == 2 and not pool.cached_block_hashes_by_block
    assert pool.get_cached_block(other.block_hashes[2], [0]) is None


def test_reallocation_and_reset_drop_partial_entries():
    pool, request = partial_setup(events=False)
    request.append_output_token_ids([11, 12])
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(request, blocks, 0, 2, 4, 0)
    other = Request("o", [5, 6, 7, 8, 9, 10], block_hasher=get_request_block_hasher(2))
    pool.cache_partial_block(other, blocks[1], 6, 0, 4)
    pool.free_blocks(blocks)
    pool.get_new_blocks(5)  # every free block, the cached ones too
    assert not pool.cached_block_hashes_by_block and len(pool.cached_block_hash_to_block) == 0
    pool2, request2 = partial_setup(events=False)
    pool2.cache_partial_block(request2, pool2.get_new_blocks(1)[0], 2, 0, 4)
    pool2.free_blocks(pool2.blocks[1:2])
    assert pool2.reset_prefix_cache() and len(pool2.cached_block_hash_to_block) == 0


@pytest.mark.parametrize("num_tokens, block_size, message", [
    (3, 4, "not a partial block boundary"),
    (4, 4, "not a partial block boundary"),
    (2, 2, "larger multiple"),
    (8, 4, "not a partial block boundary"),
    (10, 8, "block hashes"),
])
def test_bad_partial_entries_are_refused(num_tokens, block_size, message):
    pool, request = partial_setup()
    block = pool.get_new_blocks(1)[0]
    with pytest.raises(RuleError, match=message):
        pool.cache_partial_block(request, block, num_tokens, 0, block_size)
    assert block.block_hash is None and not pool.take_events()


def test_the_null_block_takes_no_partial_entry():
    pool, request = partial_setup()
    assert pool.cache_partial_block(request, pool.null_block, 2, 0, 4) is None
