"""The vectors corpus: what ``kvspec vectors generate`` writes.

Four sources, every vector recorded from the spec itself:

- **edge cases** written by hand for the pool (:data:`POOL_CASES`): an
  empty pool, an exact fit, LRU eviction, a hit taken from inside the
  queue, one key naming two blocks, masks and null slots, two groups of
  different block sizes, eviction by id, reset refused then accepted,
  caching off, tenants, and every kind of bad input;
- **walks**: the conformance machines over every pool and manager layout
  with the spec as the target (derandomized, so the corpus is the same on
  every run of one Hypothesis version);
- **configurations**: every incoherent variant of a few layouts
  (:func:`config_vectors`), each a configuration the target must refuse to
  be built with (``"refused"``: the rule it breaks; no steps);
- **findings**: each known finding's saved trace replayed on the spec --
  the spec's answer where the implementation went wrong.

The corpus's ``index.json`` lists every file with the rules it exercises
(:func:`kvspec.conformance.vectors.codec.exercised`); ``INDEX.md`` lists, per
rule, the vectors that exercise it; with coverage.py installed the spec's
branch coverage over the whole generation goes to ``coverage.json``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, settings

import kvspec.spec
from kvspec.conformance.findings import FINDINGS, inputs_to_avoid
from kvspec.conformance.machines.layouts import MANAGER_LAYOUTS
from kvspec.conformance.machines.pool import LAYOUTS, PoolLayout
from kvspec.conformance.settings import run_machine
from kvspec.conformance.vectors import content_view
from kvspec.conformance.vectors.codec import (
    CHAPTERS,
    HASH_SEED,
    Recorder,
    Vector,
    chapters,
    config_of,
    exercised,
    refusal_kind,
    write,
)
from kvspec.conformance.vectors.steps import refused
from kvspec.hashing import get_request_block_hasher, rooted_at
from kvspec.request import LoRARequest, MultiModalFeatureSpec, PlaceholderRange, Request, RequestStatus
from kvspec.spec import releases
from kvspec.spec.catalogue import RULES, TIER_RULES
from kvspec.spec.layout import Layout
from kvspec.spec.pool import SpecBlockPool
from kvspec.testing import chunked, full, swa

SPEC_DIR = Path(kvspec.spec.__file__).resolve().parent


# --- hand-written pool cases ------------------------------------------------------------------


@dataclass
class PoolCase:
    """A scripted pool case: ``run(pool, req)`` drives a recording pool;
    ``req(id, tokens, **kw)`` makes a request hashed at the pool's size.
    ``findings``: the known findings its inputs reach."""

    name: str
    description: str
    layout: PoolLayout
    run: Callable[[Any, Callable[..., Request]], None]
    findings: tuple[str, ...] = ()


def _refused_until(release: releases.Release, delta: str, fn: Callable[..., Any], *args: Any) -> None:
    """A call refused in the releases before ``delta`` and accepted from it on (``release``: the case's)."""
    if release.has(delta):
        fn(*args)
    else:
        refused(fn, *args)


def _empty_pool(p, req):
    p.get_usage()  # no usable block: 0.0
    p.get_new_blocks(0)
    refused(p.get_new_blocks, 1)
    p.free_blocks([0])
    p.touch([0])
    p.reset_prefix_cache()


def _exact_fit(p, req):
    blocks = p.get_new_blocks(4)
    refused(p.get_new_blocks, 1)
    p.free_blocks(blocks[::-1])
    p.get_new_blocks(4)


def _hit_from_inside_the_queue(p, req):
    r = req("a", [0, 1, 0, 1, 1])
    blocks = p.get_new_blocks(3)
    p.cache_full_blocks(r, blocks, 0, 2, 2, 0)
    p.free_blocks(blocks[::-1])  # the tail block (no hash) to the head, the cached two to the tail
    b = req("b", [0, 1, 0, 1, 0, 0])
    (first,) = p.get_cached_block(b.block_hashes[0], [0])
    p.touch([first])
    (second,) = p.get_cached_block(b.block_hashes[1], [0])
    p.touch([second])
    p.get_cached_block(b.block_hashes[2], [0])  # a miss
    p.free_blocks([second, first])


def _shared_prefix(p, req):
    a = req("a", [1, 1, 0, 1, 0])
    blocks_a = p.get_new_blocks(3)
    p.cache_full_blocks(a, blocks_a, 0, 2, 2, 0)
    b = req("b", [1, 1, 0, 1, 1, 1])
    hits = [p.get_cached_block(h, [0])[0] for h in b.block_hashes[:2]]
    p.touch(hits)  # held by a and b: two references each
    blocks_b = hits + p.get_new_blocks(1)
    p.cache_full_blocks(b, blocks_b, 2, 3, 2, 0)
    p.free_blocks(blocks_a[::-1])  # a leaves: the shared blocks stay held by b
    p.free_blocks(blocks_b[::-1])


def _lru_eviction(p, req):
    a, b = req("a", [0, 0, 1, 1]), req("b", [1, 1, 0, 0, 1, 1])
    blocks_a = p.get_new_blocks(2)
    p.cache_full_blocks(a, blocks_a, 0, 2, 2, 0)
    p.free_blocks(blocks_a[::-1])
    blocks_b = p.get_new_blocks(1)  # the free queue's head: the oldest of a's blocks is not reused yet
    p.free_blocks(blocks_b)
    p.get_new_blocks(3)  # every free block: the cached ones are evicted, LRU first
    p.get_cached_block(a.block_hashes[0], [0])
    del b


def _one_key_two_blocks(p, req):
    a, b = req("a", [1, 0, 1, 0]), req("b", [1, 0, 1, 0])
    blocks_a, blocks_b = p.get_new_blocks(2), p.get_new_blocks(2)
    p.cache_full_blocks(a, blocks_a, 0, 2, 2, 0)
    p.cache_full_blocks(b, blocks_b, 0, 2, 2, 0)  # computed twice: both cached under one key
    p.get_cached_block(a.block_hashes[0], [0])  # the oldest
    p.evict_blocks({blocks_a[0]})
    p.get_cached_block(a.block_hashes[0], [0])  # now the other
    p.free_blocks(blocks_a[::-1])
    p.free_blocks(blocks_b[::-1])


def _mask_and_null(p, req):
    r = req("a", [0, 1, 1, 0, 0, 0, 1, 1])
    blocks = p.get_new_blocks(3)
    table = [0, *blocks]  # the first slot left the window: the null placeholder
    p.cache_full_blocks(r, table, 0, 4, 2, 0, [True, True, False, True])
    p.free_blocks(table[::-1])


def _two_groups(p, req):
    r = req("a", [0, 1, 1, 1])
    small, big = p.get_new_blocks(2), p.get_new_blocks(1)
    p.cache_full_blocks(r, small, 0, 2, 2, 0)
    p.get_cached_block(r.block_hashes[1], [0, 1])  # group 1 misses: no hit at all
    p.cache_full_blocks(r, big, 0, 1, 4, 1)  # block size 4: keyed by the second hash of size 2
    p.get_cached_block(r.block_hashes[1], [0, 1])
    p.free_blocks(big)
    p.free_blocks(small[::-1])


def _evict_by_id(p, req):
    r = req("a", [0, 1, 1, 0])
    blocks = p.get_new_blocks(2)
    p.cache_full_blocks(r, blocks, 0, 2, 2, 0)
    p.free_blocks([blocks[1]])
    p.evict_blocks({blocks[0], blocks[1]})  # a held block and a free one: both lose their hash, keep their place
    refused(p.evict_blocks, {p.num_blocks})
    p.free_blocks([blocks[0]])


def _reset(p, req):
    r = req("a", [0, 0, 0, 0])
    blocks = p.get_new_blocks(2)
    p.cache_full_blocks(r, blocks, 0, 2, 2, 0)
    p.reset_prefix_cache()  # refused: blocks are in use
    p.free_blocks(blocks[::-1])
    p.reset_prefix_cache()
    p.get_cached_block(r.block_hashes[0], [0])


def _bad_input(p, req):
    r = req("a", [0, 1, 0, 1])
    blocks = p.get_new_blocks(2)
    refused(p.get_new_blocks, -1)
    refused(p.get_new_blocks, True)
    refused(p.get_new_blocks, p.get_num_free_blocks() + 1)
    refused(p.free_blocks, [blocks[0], blocks[0]])  # held once, freed twice
    refused(p.free_blocks, [p.num_blocks])
    refused(p.free_blocks, [-1])
    refused(p.touch, [p.num_blocks])
    refused(p.get_cached_block, "not-bytes", [0])
    refused(p.cache_full_blocks, r, blocks, 0, 2, 3, 0)  # block size not a multiple of 2
    refused(p.cache_full_blocks, r, blocks, 0, 2, 2, 0, [True])  # mask too short
    refused(p.cache_full_blocks, r, blocks, 0, 3, 2, 0)  # more full blocks than given
    p.cache_full_blocks(r, blocks, 0, 2, 2, 0)
    refused(p.cache_full_blocks, r, blocks, 0, 2, 2, 0)  # already carry hashes
    p.free_blocks(blocks[::-1])
    refused(p.cache_full_blocks, req("b", [1, 1]), [blocks[0]], 0, 1, 2, 0)  # nobody holds it
    (block,) = p.get_new_blocks(1)
    # a block of 2 has no boundary inside, and 4 tokens end the block of 4: not partial -- refused until
    # 0.32, whose pool keys an entry at a block boundary too (release delta partial-entries-at-boundaries)
    _refused_until(p.release, "partial-entries-at-boundaries", p.cache_partial_block, r, block, 2, 0, 2)
    _refused_until(p.release, "partial-entries-at-boundaries", p.cache_partial_block, r, block, 4, 0, 4)
    refused(p.cache_partial_block, r, block, 3, 0, 4)  # not a whole hash block
    refused(p.cache_partial_block, req("c", [1]), block, 2, 0, 4)  # the request has no hash yet
    p.free_blocks([block])
    refused(p.cache_partial_block, r, block, 2, 0, 4)  # nobody holds it


def _partial_entries(p, req):
    a = req("a", [0, 1, 1, 1, 0, 0, 1])  # blocks of 4 over hashes of 2
    blocks = p.get_new_blocks(2)
    p.cache_full_blocks(a, blocks, 0, 1, 4, 0)
    p.cache_partial_block(a, blocks[0], 2, 0, 4)  # inside a full block: a further entry it owns
    p.cache_partial_block(a, blocks[1], 6, 0, 4)  # the tail's 2 written tokens: its own key
    p.cache_partial_block(a, blocks[1], 6, 0, 4)  # already there: nothing changes
    b = req("b", [0, 1, 1, 1, 0, 0, 0, 0])
    p.get_cached_block(b.block_hashes[2], [0])  # b's 6-token prefix ends inside a's tail block: a hit
    p.get_cached_block(b.block_hashes[0], [0, 1])  # group 1 never cached it: no hit at all
    a.append_output_token_ids([1])
    p.cache_full_blocks(a, blocks, 1, 2, 4, 0)  # the tail fills: its partial key is replaced by the full one
    p.free_blocks(blocks[::-1])
    p.get_new_blocks(3)  # every free block reused: each loses every key it had
    p.get_cached_block(a.block_hashes[0], [0])


def _partial_replaced(p, req):
    a = req("a", [1, 1, 0, 1, 0, 0, 1], lora_request=LoRARequest("adapter-a", 1))  # blocks of 6 over hashes of 2
    (block,) = p.get_new_blocks(1)
    p.cache_partial_block(a, block, 2, 1, 6)
    p.cache_partial_block(a, block, 4, 1, 6)  # a longer prefix of the same block: the shorter key goes first
    p.cache_partial_block(a, block, 2, 1, 6)  # a shorter one now: an entry beside the block's own key
    p.evict_blocks({block})  # a connector reports it stale: both keys go
    p.cache_partial_block(a, block, 4, 1, 6)
    p.free_blocks([block])
    p.reset_prefix_cache()


def _caching_off(p, req):
    r = req("a", [0, 1, 0, 1])
    blocks = p.get_new_blocks(2)
    p.get_cached_block(r.block_hashes[0], [0])
    refused(p.cache_full_blocks, r, blocks, 0, 2, 2, 0)  # a pool that does not cache keys nothing (vLLM: F13)
    refused(p.cache_full_blocks, r, blocks, 2, 2, 2, 0)  # refused before the no-op check
    p.free_blocks(blocks[::-1])
    p.reset_prefix_cache()


def _tenants(p, req):
    plain = req("plain", [1, 1, 0, 0])
    salted = req("salted", [1, 1, 0, 0], cache_salt="tenant-b")
    adapted = req("adapted", [1, 1, 0, 0], lora_request=LoRARequest("adapter-a", 1))
    held = []
    for r in (plain, salted, adapted):
        blocks = p.get_new_blocks(2)
        p.cache_full_blocks(r, blocks, 0, 2, 2, 0)
        held.append(blocks)
    for r in (plain, salted, adapted):
        p.get_cached_block(r.block_hashes[1], [0])  # three keys for one token prefix
    for blocks in held:
        p.free_blocks(blocks[::-1])


def _every_refusal(p, req):
    """More of chapter 1's refusal table, a row a call (bad-input has the first ones; the rows
    where vLLM answers otherwise are the cases of F13 and F14)."""
    r = req("a", [0, 1, 0, 1])
    blocks = p.get_new_blocks(2)
    refused(p.touch, ["1"])  # an id not an int
    refused(p.evict_blocks, ["1"])
    refused(p.evict_blocks, [p.num_blocks])  # an id outside the pool
    refused(p.cache_full_blocks, r, blocks, 0, 2, "2", 0)  # a block size not an int
    p.free_blocks(blocks[::-1])


def _cache_range_refusals(p, req):
    """cache_full_blocks' range, checked (vLLM: F13)."""
    r = req("a", [0, 1, 2, 3])
    blocks = p.get_new_blocks(2)
    refused(p.cache_full_blocks, r, blocks[:1], -1, 1, 2, 0)  # a negative num_cached_blocks
    refused(p.cache_full_blocks, r, [blocks[0], blocks[0]], 0, 2, 2, 0)  # one block for two positions
    refused(p.cache_full_blocks, req("b", [0, 1, 2]), blocks, 0, 2, 2, 0)  # two blocks, one hash
    p.cache_full_blocks(r, blocks, 0, 2, 2, 0)  # the right range, accepted
    p.free_blocks(blocks[::-1])


def _group_id_refusals(p, req):
    """A group id must fit the key's 4 bytes (vLLM: F14)."""
    r = req("a", [0, 1, 0, 1])
    blocks = p.get_new_blocks(2)
    for group in (-1, 2**32, "0"):
        refused(p.get_cached_block, r.block_hashes[0], [group])
        refused(p.cache_full_blocks, r, blocks, 0, 2, 2, group)
    p.cache_full_blocks(r, blocks, 0, 2, 2, 2**32 - 1)  # the largest group id that fits
    p.get_cached_block(r.block_hashes[0], [2**32 - 1])
    p.free_blocks(blocks[::-1])


def _pool(num_blocks: int, group_block_sizes: tuple[int, ...] = (2,), **kw: Any) -> PoolLayout:
    """The cases' pools: hashes of 2 tokens, one group of 2 unless said."""
    return PoolLayout(num_blocks=num_blocks, hash_block_size=2, group_block_sizes=group_block_sizes, **kw)


POOL_CASES: tuple[PoolCase, ...] = (
    PoolCase("empty-pool", "a pool of the null block alone: nothing to take, the null block skipped",
             _pool(1), _empty_pool),
    PoolCase("exact-fit", "every free block taken, one more refused, all freed and taken again",
             _pool(5), _exact_fit),
    PoolCase("hit-from-inside-the-queue", "cached blocks freed to the tail, then hit and touched out of the queue",
             _pool(6), _hit_from_inside_the_queue),
    PoolCase("shared-prefix", "a second request takes the first one's cached prefix while it still runs",
             _pool(6), _shared_prefix),
    PoolCase("lru-eviction", "plain blocks are reused before cached ones; cached ones least recently used first",
             _pool(4), _lru_eviction),
    PoolCase("one-key-two-blocks", "a prefix computed twice: one key, two blocks, the oldest is the hit",
             _pool(6), _one_key_two_blocks),
    PoolCase("mask-and-null", "caching skips the null placeholder and masked-out blocks; one event for the range",
             _pool(6), _mask_and_null),
    PoolCase("two-groups", "a lookup across groups hits only if every group hits; block size 4 over hashes of 2",
             _pool(6, (2, 4)), _two_groups),
    PoolCase("evict-by-id", "evicting by id drops the hash, not the block's place or references",
             _pool(4), _evict_by_id),
    PoolCase("reset", "reset refused while a block is in use, then accepted: every hash gone",
             _pool(4), _reset),
    PoolCase("bad-input", "every kind of impossible call is refused and changes nothing",
             _pool(5), _bad_input, ("F1", "F2", "F3")),
    PoolCase("every-refusal", "more of the refusal table: ids of the wrong type or outside the pool, a block "
             "size of the wrong type", _pool(5), _every_refusal),
    PoolCase("cache-range-refusals", "cache_full_blocks refuses a negative num_cached_blocks, one block for two "
             "positions and more blocks than hashes, and changes nothing", _pool(5), _cache_range_refusals, ("F13",)),
    PoolCase("group-id-refusals", "a group id below 0, past 4 bytes or not an int is refused by lookups and "
             "caching alike; 2**32 - 1 is a group id", _pool(5), _group_id_refusals, ("F14",)),
    PoolCase("partial-entries", "a block serves prefixes that end inside it: a further entry of a full block, "
             "the tail's own key, a hit on it, promotion to the full key when the tail fills, all keys gone on reuse",
             _pool(4, (4, 4)), _partial_entries),
    PoolCase("partial-replaced", "a longer prefix inside the block replaces a shorter one, a shorter one sits "
             "beside it, and eviction by id and a reset drop them all (a LoRA tenant, group 1)",
             _pool(3, (2, 6)), _partial_replaced),
    PoolCase("caching-off", "with prefix caching off nothing hits, caching is refused, even a call that "
             "caches nothing, and a reset is trivially accepted", _pool(4, enable_caching=False), _caching_off,
             ("F13",)),
    PoolCase("tenants", "a cache salt and a LoRA adapter give one token prefix three keys",
             _pool(8), _tenants),
)


def pool_case_vector(case: PoolCase, release: releases.Release = releases.REFERENCE) -> Vector:
    layout = case.layout
    vector = Vector(f"pool/cases/{case.name}", "pool", config_of("pool", layout, release=release), case.description,
                    list(case.findings))
    pool = Recorder(SpecBlockPool(layout.num_blocks, layout.enable_caching, layout.hash_block_size, layout.events,
                                  release), vector)
    hasher = get_request_block_hasher(layout.hash_block_size, release=release)
    case.run(pool, lambda rid, tokens, **kw: Request(rid, tokens, block_hasher=hasher, **kw))
    return vector


# --- hand-written manager cases ----------------------------------------------------------------


@dataclass
class ManagerCase:
    """A scripted scheduler: ``run(manager, req)`` drives a recording
    manager over ``layout`` (a conformance layout's name), setting each
    request's computed tokens as a scheduler would."""

    name: str
    description: str
    layout: str | Layout  # a conformance layout's name, or a layout of the case's own
    run: Callable[[Any, Callable[..., Request]], None]
    findings: tuple[str, ...] = ()
    watermark: float = 0.0  # the layout's, where the case sets one


def _compute(m, r, num_new, hit=0, blocks=None, **kw):
    """Allocate ``num_new`` tokens after those computed (and a hit of
    ``hit`` blocks' tokens), and compute them."""
    start = r.num_computed_tokens + hit + kw.get("num_external_computed_tokens", 0)
    new = m.allocate_slots(r, num_new, hit, blocks, **kw)
    if new is not None:
        r.num_computed_tokens = start + num_new
    return new


def _prefill(m, r):
    blocks, hit = m.get_computed_blocks(r)
    return _compute(m, r, r.num_tokens - hit, hit, blocks), hit


def _external_after_hits(m, req):
    a = req("a", [0, 1] * 6)
    _prefill(m, a)
    m.free(a)
    b = req("b", [0, 1] * 6 + [1, 1] * 4)
    blocks, hit = m.get_computed_blocks(b)
    _compute(m, b, b.num_tokens - hit - 4, hit, blocks, num_external_computed_tokens=4)
    b.append_output_token_ids([1] * 4)
    _compute(m, b, 2, num_external_computed_tokens=2)  # running: external tokens take no blocks of their own
    m.free(b)  # (step 4) but count in total -- blocks up to 24 tokens, the window's release at 22


def _eagle_drop(m, req):
    a = req("a", [1, 0] * 4)
    _prefill(m, a)
    m.free(a)
    b = req("b", [1, 0] * 4 + [0, 0])
    _prefill(m, b)  # the hit drops its last block: EAGLE recomputes it
    m.free(b)


def _window_release(m, req):
    a = req("a", [0, 0, 1, 1] * 3)
    _compute(m, a, 6)
    _compute(m, a, 6)
    m.remove_skipped_blocks(a.request_id, a.num_computed_tokens)  # the blocks before the window go
    a.append_output_token_ids(1)
    _compute(m, a, 1)
    m.free(a)


def _free_group_by_group(m, req):
    a = req("a", [0, 1, 2, 3, 4])
    _prefill(m, a)  # each group: two full blocks, cached, and a partial tail without a key
    m.free(a)  # one free_blocks per group: the window's tail goes to the head after (so before) the full group's
    b = req("b", [7, 7, 7])
    _prefill(m, b)  # reuses the head of the queue: the window group's old tail first


def _mamba_align_boundary(m, req):
    a = req("a", [1, 1, 0] * 3 + [1])
    _compute(m, a, 8)  # a chunk that ends on a block boundary: the state at 8 is kept
    _compute(m, a, 2)
    m.free(a)
    m.new_step_starts()  # a state cached in this step cannot be hit before the next
    b = req("b", [1, 1, 0] * 2 + [1, 1, 0, 0, 0, 0])
    _prefill(m, b)  # hits the state after 8 tokens
    m.free(b)


def _reset_refused_then_accepted(m, req):
    a = req("a", [0, 1, 1, 0])
    _prefill(m, a)
    m.reset_prefix_cache()
    m.free(a)
    m.reset_prefix_cache()
    _prefill(m, req("b", [0, 1, 1, 0, 1]))
    m.free(m.requests_seen["b"])


def _refusals(m, req):
    a = req("a", [0, 1] * 15)
    _compute(m, a, 30)
    b = req("b", [1, 1] * 15)
    _compute(m, b, 30)  # the pool is short: None, nothing changes
    _compute(m, b, 2, full_sequence_must_fit=True)  # the whole sequence must fit: None
    for bad in (-1, 0):
        try:
            m.allocate_slots(req("bad", [0, 1]), bad)
        except ValueError:
            pass
    m.free(a)


def _cross_attention(m, req):
    a = req("a", [0, 1, 1, 0, 1])
    blocks, hit = m.get_computed_blocks(a)  # caching is off: no hit
    _compute(m, a, a.num_tokens, hit, blocks, num_encoder_tokens=6)  # the encoder's 6 tokens: 3 blocks, once
    a.append_output_token_ids(1)
    _compute(m, a, 1, num_encoder_tokens=6)  # decoding: no more cross-attention blocks
    m.get_block_ids_for_computed_tokens("a", 2)  # a connector's save: 1 decoder block, the encoder's 3 whole
    m.free(a)


def _images_in_the_key(m, req):
    image = [MultiModalFeatureSpec("image-a", PlaceholderRange(2, 4))]
    other = [MultiModalFeatureSpec("image-b", PlaceholderRange(2, 4))]
    a = req("a", [0, 1, 7, 7, 7, 7, 1, 0], mm_features=image)
    _prefill(m, a)
    m.free(a)
    _prefill(m, req("b", [0, 1, 7, 7, 7, 7, 1, 0, 1], mm_features=other))  # another image: only its first block hits
    _prefill(m, req("c", [0, 1, 7, 7, 7, 7, 1, 0, 1], mm_features=image))  # the same image: the whole prefix hits
    for rid in ("b", "c"):
        m.free(m.requests_seen[rid])


def _admission_cap(m, req):
    a = req("a", [0, 1] * 14)
    _compute(m, a, 28)  # 14 of the 23 blocks
    b = req("b", [1, 0] * 2)
    _compute(m, b, 4, full_sequence_must_fit=True)  # its whole sequence fits (2 blocks of 9): admitted
    d = req("d", [1, 0, 0, 1] * 2)  # 4 blocks
    _compute(m, d, 2, full_sequence_must_fit=True, reserved_blocks=4)  # the cap counts 4 of the 7 free, reserved
    m.free(d)  # blocks not subtracted (they are at the chunk's own check: 1 of 7 - 4): admitted
    c = req("c", [1, 1] * 8)  # 8 blocks, 7 free
    _compute(m, c, 2, full_sequence_must_fit=True)  # its first chunk fits, its whole sequence does not: None
    _compute(m, c, 2)  # the same chunk without the cap: admitted
    for r in (a, b, c):
        m.free(r)


def _admission_cap_windows(m, req):
    """The full-sequence check counts a sliding window at most ``cdiv(min(w - 1 + T, M), B) + 1`` blocks and a
    chunk at most ``cdiv(min(c + T, M), B)`` (``T`` = max_num_batched_tokens = 4): 5 + 4 = 9 for a request
    of 24 tokens, where the uncapped count is 12 + 12."""
    a = req("a", [0, 1] * 7)
    _compute(m, a, 14)  # 7 blocks in each group: 10 of the 24 free
    x = req("x", [1, 1])
    _compute(m, x, 2)  # 8 free
    b = req("b", [1, 0] * 12)
    _compute(m, b, 4, full_sequence_must_fit=True)  # 9 > 8: None
    m.free(x)  # 10 free
    _compute(m, b, 4, full_sequence_must_fit=True)  # 9 <= 10 (24 uncapped, 17 or 16 with one cap): admitted
    for r in (a, b):
        m.free(r)


def _allocation_refusals(m, req):
    """Chapter 2 step 0's refusals where vLLM 0.25.1 agrees, one a call, each changing nothing (the
    rows where it answers otherwise are the case trusted-arguments, F15)."""
    a = req("a", [0, 1] * 4)
    _prefill(m, a)
    m.free(a)
    b = req("b", [0, 1] * 4 + [1])
    m.get_computed_blocks(b)
    refused(m.allocate_slots, b, "2")  # a count not an int (1.5 is F15's from 0.32: case trusted-arguments)
    blocks, hit = m.get_computed_blocks(b)
    refused(m.allocate_slots, b, 1, hit, ([*blocks[0][:-1], str(blocks[0][-1])],))  # an id not an int
    refused(m.allocate_slots, b, 1, hit, ([*blocks[0][:-1], 24],))  # an id outside the pool (of 24)
    _prefill(m, b)
    m.free(b)


def _zero_token_adoption(m, req):
    """A call with no new tokens that adopts a local hit: refused in the base release (chapter 2 step 0),
    valid from 0.31 (release delta zero-token-hit-adoption), after which the request computes its last
    token as usual; a call that adopts nothing stays refused."""
    a = req("a", [0, 1] * 4 + [1])
    _prefill(m, a)
    b = req("b", [0, 1] * 4 + [1])
    refused(m.allocate_slots, b, 0)  # nothing to adopt: refused in every release
    blocks, hit = m.get_computed_blocks(b)
    try:
        _compute(m, b, 0, hit, blocks)
        _compute(m, b, b.num_tokens - b.num_computed_tokens)
    except ValueError:
        _compute(m, b, b.num_tokens - hit, hit, blocks)  # the base: the hit and the rest in one call
    m.free(b)
    m.free(a)


def _trusted_arguments(m, req):
    """allocate_slots' arguments a scheduler never gets wrong, checked all the same (vLLM: F15)."""
    a = req("a", [0, 1] * 4)
    _prefill(m, a)
    b = req("b", [0, 1])
    refused(m.allocate_slots, b, m.max_model_len + 1)  # past max_model_len: refused, not capped
    refused(m.allocate_slots, b, 2, 0, None, 0, 0, 1)  # delay_cache_blocks=1: a flag is a bool
    c = req("c", [0, 1] * 4 + [1])
    blocks, hit = m.get_computed_blocks(c)
    refused(m.allocate_slots, a, 1, hit, blocks)  # hits offered to a request that runs
    m.free(a)
    _prefill(m, c)
    m.free(c)
    d = req("d", [0, 1] * 4 + [1, 1])
    blocks, hit = m.get_computed_blocks(d)  # c's four blocks
    m.evict_blocks(set(blocks[0][2:]))  # two of them lose their keys: no longer hits
    refused(m.allocate_slots, d, 2, hit, blocks)
    _prefill(m, d)  # looked up again: the two blocks still cached
    m.free(d)
    refused(m.allocate_slots, req("e", [0, 1, 1]), 1.5)  # a count not an int: vLLM takes it from 0.32
    f = req("f", [0, 1] * 4 + [1])
    blocks, hit = m.get_computed_blocks(f)
    refused(m.allocate_slots, f, 1, hit, (*blocks, []))  # not one hit list per group: vLLM ignores the extra one
    refused(m.cache_blocks, req("g", [0, 1] * 2 + [1]), 4)  # caching blocks a request does not hold (vLLM: an
    # IndexError)


def _hits_with_caching_off(m, req):
    """With prefix caching off there are no hits: blocks offered as one are refused (vLLM: F15)."""
    a = req("a", [0, 1, 1, 0])
    _prefill(m, a)
    b = req("b", [0, 1, 1, 0, 1])
    held = m.get_block_ids("a")
    refused(m.allocate_slots, b, 1, 2, tuple([table[0]] if g == 0 else [] for g, table in enumerate(held)))
    _prefill(m, b)
    for r in (a, b):
        m.free(r)


def _watermark(m, req):
    """A watermark of 0.25 keeps 6 of the 24 blocks free from admissions while others run."""
    a = req("a", [0, 1] * 14)
    _compute(m, a, 28)  # 14 of the 23 blocks: 9 free
    a.status = RequestStatus.RUNNING
    b = req("b", [1, 0] * 4)
    _compute(m, b, 8)  # 4 blocks + the watermark's 6 > 9: None
    _compute(m, b, 8, has_scheduled_reqs=False)  # nobody else scheduled: no watermark, admitted (5 free)
    b.status = RequestStatus.RUNNING
    a.append_output_token_ids([1, 1])
    _compute(m, a, 2)  # a running request's next block: no watermark (1 + 6 > 5 would refuse it)
    c = req("c", [1, 1])
    _compute(m, c, 2)  # 1 block + 6 > 4: None
    # The full-sequence check (step 1) adds the same watermark, under the same two conditions:
    a.append_output_token_ids([0, 0])
    _compute(m, a, 2, full_sequence_must_fit=True)  # running: no watermark at either check (1 of 4): admitted
    _compute(m, c, 2, full_sequence_must_fit=True)  # waiting while others run: 1 + 6 > 3, None
    _compute(m, c, 2, full_sequence_must_fit=True, has_scheduled_reqs=False)  # nobody scheduled: admitted
    for r in (a, b, c):
        m.free(r)


def _reserved_blocks(m, req):
    a = req("a", [0, 1] * 14)
    _compute(m, a, 28)  # 14 of the 23 blocks: 9 free
    b = req("b", [1, 0] * 8)
    _compute(m, b, 16, reserved_blocks=2)  # 8 blocks, but 2 of the 9 are kept back: None
    _compute(m, b, 16, reserved_blocks=1)  # 8 of the 9 less 1: admitted
    for r in (a, b):
        m.free(r)


def _common_prefix(m, req):
    """Cascade attention's question, per group: the leading blocks every running request shares.  A vector
    holds the answer to at most what the tables show (its contract is soundness); gone from 0.34 (delta
    common-prefix-blocks-removed), where the case only allocates and frees."""
    def ask(r):
        if not m.release.has("common-prefix-blocks-removed"):
            m.get_num_common_prefix_blocks(r.request_id)

    a = req("a", [0, 1] * 6)
    _prefill(m, a)
    b = req("b", [0, 1] * 4 + [1, 1] * 2)  # its first 4 blocks hit a's
    _prefill(m, b)
    ask(a)
    ask(b)
    c = req("c", [1, 0] * 3)  # shares nothing with them
    _prefill(m, c)
    ask(a)
    for r in (c, a):
        m.free(r)
    ask(b)  # alone: its whole table is shared by every request holding one
    m.free(b)


def _rswa_gap(m, req):
    """R-SWA releases its gap inside allocate_slots (step 2): once decoding passes the prompt plus the
    window, the blocks wholly between them become nulls, block by block; the prompt's stay."""
    a = req("a", [0, 1, 1, 0])
    _prefill(m, a)
    a.status = RequestStatus.RUNNING
    for _ in range(11):  # to 15 tokens: the gap reaches positions 2 to 4
        a.append_output_token_ids(1)
        _compute(m, a, 1)
    m.free(a)


def _mamba_align_moves(m, req):
    """Align mode with two speculative state blocks (drafts): as decoding crosses a Mamba block boundary,
    the previous step's speculative blocks move up behind the new state position (their old entries
    become nulls), and the previous running state is freed a step later, in a free call of its own."""
    a = req("a", [0, 1, 1, 0] * 4)
    _compute(m, a, 4)  # the state at position 0, speculative blocks at 1 and 2
    _compute(m, a, 12)  # the state moves to position 3: the speculative blocks move up to 3 and 4
    a.status = RequestStatus.RUNNING
    for _ in range(5):  # decoding with drafts: a boundary crossed at 17, the previous state freed after
        a.append_output_token_ids(1)
        _compute(m, a, 1, num_lookahead_tokens=2)
    m.free(a)
    b = req("b", [1, 1, 0, 0] * 3)
    _compute(m, b, 4)
    _compute(m, b, 8)  # the state moves to position 2, before the table's end: one block moves, to 3
    m.free(b)


def _one_group_alignment(m, req):
    """One group ignores the scheduler block size: its hits and its caching are in its own blocks."""
    a = req("a", [0, 1] * 3 + [1])
    _prefill(m, a)  # 3 full blocks cached (6 tokens: not a multiple of the scheduler block, 4)
    m.free(a)
    b = req("b", [0, 1] * 3 + [1, 0])
    m.find_longest_cache_hit_per_group(b)  # one group: no per-group answer (None)
    _prefill(m, b)  # a hit of 6 tokens: 3 blocks, not cut to 4
    m.free(b)


def _window_eagle_cut(m, req):
    """Sliding-window hit search, case (2), under EAGLE with B != A: a run of 4 cached positions, none
    aligned with the window's last k = 5, gives n = cut(3) = 2, then EAGLE's cut(1) = 0 -- no hit,
    though a shorter one is servable (vLLM's arithmetic, kept)."""
    a = req("a", [0, 1, 1, 0] * 4)
    _prefill(m, a)
    m.free(a)
    b = req("b", [0, 1, 1, 0] * 2 + [1, 1, 1, 1] * 2)  # a's first 8 tokens
    _prefill(m, b)
    m.free(b)
    d = req("d", [0, 1, 1, 0] * 2)  # a's first 8 tokens, all hashed: what a connector is given
    m.find_longest_cache_hit_per_group(d)  # full attention: 0 tokens; from 0.32 it peeks one block past 7: 4
    c = req("c", [0, 1, 1, 0] * 4 + [1, 1])  # a's whole prompt: case (1), the window's last blocks
    _prefill(m, c)
    m.free(c)


def _connector_queries(m, req):
    """What a KV connector asks of a hybrid (chapter 7), beside the fill: the blocks it saves of a request
    -- the first cdiv(n, B) per attention group, nulls where the window released them, Mamba's whole
    table --, and each group's own hit, searched alone."""
    a = req("a", [0, 1, 1, 0] * 3)
    _compute(m, a, 8)  # a chunk ending on a block boundary: Mamba keeps the state at 8
    _compute(m, a, 4)
    m.get_usage()
    m.get_block_ids_for_computed_tokens("a", 9)  # 5 of the 6 attention blocks; the Mamba table whole
    m.remove_skipped_blocks("a", 12)  # the blocks before the sliding window go: nulls
    m.get_block_ids_for_computed_tokens("a", 12)
    m.get_block_ids_for_computed_tokens("nobody", 4)  # a request holding nothing: empty lists
    m.free(a)
    m.new_step_starts()
    b = req("b", [0, 1, 1, 0] * 2 + [0, 1, 1, 1, 1])  # a's first 10 tokens
    m.find_longest_cache_hit_per_group(b)  # each group alone: attention's 10 tokens, Mamba's state at 8
    skipping = req("skipping", [0, 1, 1, 0] * 2 + [1], skip_reading_prefix_cache=True)
    m.find_longest_cache_hit_per_group(skipping)  # asked directly, the coordinator ignores the flag
    # (the common hit is 8: the one every group serves)
    _prefill(m, b)  # the common hit, which every group serves
    m.get_usage()
    refused(m.get_block_ids_for_computed_tokens, "b", 2.5)
    refused(m.get_block_ids_for_computed_tokens, "b", -1)  # vLLM answers (F15): last, so that a replay on
    refused(m.get_block_ids_for_computed_tokens, "b", True)  # vLLM, which stops at the first difference,
    m.free(b)  # has checked everything before it
    m.get_usage()


MANAGER_CASES: tuple[ManagerCase, ...] = (
    ManagerCase("external-after-hits", "hits in two groups taken before connector tokens are allocated",
                "full+swa", _external_after_hits),
    ManagerCase("eagle-drop", "with EAGLE the last hit block is dropped and recomputed", "full+swa-eagle",
                _eagle_drop),
    ManagerCase("eagle-mark-without-use-eagle", "the drafter's group is marked but use_eagle is off: the base "
                "drops its last hit block anyway, from 0.33 (delta eagle-drop-needs-use-eagle) nothing drops",
                "full+swa-marked", _eagle_drop),
    ManagerCase("window-release", "blocks that left the sliding window are released, the table keeps nulls",
                "full+swa", _window_release),
    ManagerCase("mamba-align-boundary", "Mamba align mode keeps the state at a chunk's block boundary and "
                "serves it as a hit", "full+mamba-align", _mamba_align_boundary),
    ManagerCase("reset-refused-then-accepted", "a reset is refused while a request holds blocks, accepted after",
                "full", _reset_refused_then_accepted),
    ManagerCase("refusals", "an allocation the pool cannot serve returns None and changes nothing; "
                "negative and empty allocations are refused", "full", _refusals, ("F4",)),
    ManagerCase("cross-attention", "cross attention takes the encoder's blocks once, at the first chunk, and "
                "never caches them", "encoder-decoder", _cross_attention),
    ManagerCase("images-in-the-key", "an image's identifier is in the key of every block its placeholder "
                "overlaps: another image at the same place hits only the blocks before it", "full",
                _images_in_the_key),
    ManagerCase("allocation-refusals", "allocate_slots refuses a count of the wrong type and changes nothing; "
                "the same request is then admitted with its hit", "full",
                _allocation_refusals),
    ManagerCase("zero-token-adoption", "allocate_slots with no new tokens is refused, but from 0.31 accepted "
                "when it adopts a local hit (delta zero-token-hit-adoption)", "full", _zero_token_adoption),
    ManagerCase("trusted-arguments", "allocate_slots refuses a count past max_model_len, a flag that is not a "
                "bool, hits for a running request, hit blocks no longer cached, a count that is a float and a hit "
                "list past the groups; cache_blocks refuses blocks the request does not hold; nothing changes", "full",
                _trusted_arguments, ("F15",)),
    ManagerCase("hits-with-caching-off", "with prefix caching off, blocks offered as a hit are refused", "caching-off",
                _hits_with_caching_off, ("F15",)),
    ManagerCase("watermark", "a watermark keeps a share of the pool free from a waiting request's admission "
                "while others are scheduled, never from a running request, at the full-sequence check too", "full",
                _watermark, watermark=0.25),
    ManagerCase("reserved-blocks", "reserved_blocks keeps free blocks back from an allocation", "full",
                _reserved_blocks),
    ManagerCase("admission-cap", "full_sequence_must_fit admits a request only if its whole sequence fits",
                "full", _admission_cap),
    ManagerCase("admission-cap-windows", "full_sequence_must_fit counts a sliding window and a chunk at most "
                "what they ever hold with max_num_batched_tokens per step",
                Layout((swa(2, window=4), chunked(2, chunk=4)), num_blocks=25, max_num_batched_tokens=4),
                _admission_cap_windows),
    ManagerCase("common-prefix", "get_num_common_prefix_blocks claims no more leading blocks per group than "
                "every running request's table shares", "full+swa", _common_prefix),
    ManagerCase("rswa-gap", "R-SWA releases the blocks between the prompt and the window inside "
                "allocate_slots, as decoding passes the prompt plus the window", "rswa", _rswa_gap),
    ManagerCase("mamba-align-moves", "Mamba align mode with speculative blocks: crossing a block boundary "
                "moves the previous step's speculative blocks up and frees the previous state a step later",
                "full+mamba-align-drafts", _mamba_align_moves),
    ManagerCase("one-group-alignment", "with one group the scheduler block size (4) aligns nothing: the hit "
                "and the caching are in the group's own blocks (2)",
                Layout((full(2),), given_scheduler_block_size=4, given_hash_block_size=2), _one_group_alignment),
    ManagerCase("window-eagle-cut", "a sliding window's hit search falls back to the run from 0 and cuts it "
                "twice under EAGLE when its blocks (2) are smaller than the scheduler block (4)",
                Layout((full(4), swa(2, window=8)), num_blocks=32, use_eagle=True), _window_eagle_cut),
    ManagerCase("connector-queries", "what a KV connector asks of a hybrid: the blocks it saves of a request "
                "(a count that is not an int >= 0 refused), each group's own hit, and the pool's fill",
                "full+swa+mamba", _connector_queries, ("F15",)),
    ManagerCase("free-group-by-group", "free(request) gives each group's table back in a free_blocks call of its "
                "own, in group-id order, tail first: the later group's keyless tail lands at the head ahead of the "
                "earlier group's, the keyed blocks at the tail group by group (one call over every group's blocks "
                "would order the head the other way)", "full+swa", _free_group_by_group),
)


def manager_case_vector(case: ManagerCase, release: releases.Release = releases.REFERENCE) -> Vector:
    from kvspec.conformance.targets.spec_manager import SpecManagerTarget

    layout = MANAGER_LAYOUTS[case.layout] if isinstance(case.layout, str) else case.layout
    layout = dataclasses.replace(layout, watermark=case.watermark).for_release(release)
    vector = Vector(f"manager/cases/{case.name}", "manager", config_of("manager", layout, release=release),
                    case.description, list(case.findings))
    manager = Recorder(layout.make_target(functools.partial(SpecManagerTarget, release=release)), vector)
    hasher = get_request_block_hasher(layout.hash_block_size, release=release)
    seen: dict[str, Request] = {}

    def req(rid: str, tokens: list[int], **kw: Any) -> Request:
        seen[rid] = Request(rid, tokens, block_hasher=hasher, **kw)
        return seen[rid]

    manager.requests_seen = seen
    case.run(manager, req)
    return vector


# --- the offload tier (chapter 11) ---------------------------------------------------------------


def offload_case_vector(case: Any) -> Vector:
    """A hand-written tier case (:data:`kvspec.conformance.vectors.offload.OFFLOAD_CASES`) recorded from the spec."""
    from kvspec.conformance.machines.offload import key_of
    from kvspec.conformance.vectors import offload

    config = offload.case_config(case)
    vector = Vector(f"offload/cases/{case.name}", offload.SCOPE, config, case.description, list(case.findings))
    case.run(offload.recording(vector, **config), key_of)
    return vector


def offload_walk_vectors(name: str, examples: int, steps: int) -> list[Vector]:
    """The offload machine's derandomized walks over tier layout ``name``, the spec's tier as target."""
    from kvspec.conformance.machines.offload import OFFLOAD_LAYOUTS, offload_machine
    from kvspec.conformance.vectors import offload

    layout = OFFLOAD_LAYOUTS[name]
    vectors: list[Vector] = []

    def make(**options: Any) -> Any:
        vector = Vector(f"offload/walks/{name}/{len(vectors):03d}", offload.SCOPE, offload.config_of(layout),
                        f"a walk of the offload machine over the {name} tier ({layout.description})")
        vectors.append(vector)
        return offload.recording(vector, **options)

    return _walks(offload_machine(make, layout), vectors, "offload", name, examples, steps)


def offload_finding_vector(finding: Any) -> Vector:
    """An offload finding's trace replayed on the spec's tier."""
    from kvspec.conformance.machines.offload import OFFLOAD_LAYOUTS
    from kvspec.conformance.runner import replay
    from kvspec.conformance.trace import Trace
    from kvspec.conformance.vectors import offload

    trace = Trace.load(finding.trace_path)
    vector = Vector(f"offload/findings/{finding.id}", offload.SCOPE, offload.config_of(OFFLOAD_LAYOUTS[trace.layout]),
                    f"{finding.id} ({finding.target}): {finding.title}", findings=[finding.id])

    def make(**options: Any) -> Any:
        vector.steps.clear()
        return offload.recording(vector, **options)

    replay(trace, make, "L1")
    return vector


# --- walks and findings ------------------------------------------------------------------------


def _recording(scope: str, name: str, config: dict[str, Any], spec_factory: Callable[..., Any],
               vectors: list[Vector], description: str) -> Callable[..., Any]:
    def make(*args: Any, **options: Any) -> Recorder:
        spec = spec_factory(*args, **options)  # first: a configuration the spec refuses records no vector
        vector = Vector(f"{scope}/walks/{name}/{len(vectors):03d}", scope, config, description)
        vectors.append(vector)
        return Recorder(spec, vector)

    make.__name__ = "recording_spec"
    return make


WALKS_AVOID = frozenset(i for t in {f.target for f in FINDINGS} for i in inputs_to_avoid(t, release=releases.REFERENCE)
                        if not i.startswith("layout:"))
"""Inputs the walks do not send: those of known findings of the reference
release, which have their own vectors -- so that a target with known
findings still learns from every walk.  Walks over a finding's layout are
tagged with the finding.  (The reference release named: asking the
installed vLLM's would import vLLM, and Triton with it, whenever kvspec's
command line is imported.)"""


def walk_vectors(scope: str, name: str, examples: int, steps: int,
                 release: releases.Release = releases.REFERENCE) -> list[Vector]:
    """The machine's derandomized walks over layout ``name``, the spec of ``release`` as target."""
    from kvspec.conformance.machines.manager import manager_machine
    from kvspec.conformance.machines.pool import pool_machine
    from kvspec.conformance.targets.spec_manager import SpecManagerTarget

    vectors: list[Vector] = []
    if scope == "pool":
        layout = LAYOUTS[name]
        description = f"a walk of the pool machine over the {name} pool"
        factory = _recording(scope, name, config_of(scope, layout, release=release),
                             functools.partial(SpecBlockPool, release=release), vectors, description)
        machine = pool_machine(factory, layout, lockstep=False, avoid=WALKS_AVOID, release=release)
    else:
        layout = MANAGER_LAYOUTS[name].for_release(release)
        description = f"a walk of the manager machine (a scheduler in miniature) over the {name} layout"
        factory = _recording(scope, name, config_of(scope, layout, release=release),
                             functools.partial(SpecManagerTarget, release=release), vectors, description)
        machine = manager_machine(factory, layout, avoid=WALKS_AVOID)
    return _walks(machine, vectors, scope, name, examples, steps)


def _walks(machine: Any, vectors: list[Vector], scope: str, name: str, examples: int, steps: int) -> list[Vector]:
    """Run ``machine`` derandomized (its factory records into ``vectors``) and
    keep the walks that took a step, numbered in order, each tagged with the
    findings that steer around layout ``name``."""
    run_machine(machine, settings(
        derandomize=True, database=None, max_examples=examples, stateful_step_count=steps, deadline=None,
        phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck)))
    kept = [v for v in vectors if v.steps]
    for i, v in enumerate(kept):
        v.name = f"{scope}/walks/{name}/{i:03d}"
        v.findings = [f.id for f in FINDINGS if f.avoid == f"layout:{name}"]
    return kept


CONFIG_LAYOUTS = {"pool": ("two-groups",), "manager": ("full", "caching-off", "full+swa+mamba-retention")}
"""The layouts whose incoherent variants are written as configuration vectors."""


def config_vectors(release: releases.Release = releases.REFERENCE) -> list[Vector]:
    """Every incoherent variant of a few layouts, and the manager
    constructor's other refusals
    (:mod:`kvspec.conformance.machines.configurations`): the configuration,
    and the rule the spec names when it refuses to be built with it."""
    from kvspec.conformance.machines.configurations import constructor_variants

    cases = [(scope, name, variant) for scope, names in CONFIG_LAYOUTS.items() for name in names
             for variant in _variants(scope, name, release)]
    cases += [("manager", "constructor", variant) for variant in constructor_variants(release=release)]
    out = []
    for scope, name, variant in cases:
        slug = "-".join("".join(c if c.isalnum() else " " for c in variant.name.lower()).split())
        out.append(_config_vector(f"{scope}/configs/{name}/{slug}", scope, variant, release))
    return out


def _variants(scope: str, layout: str, release: releases.Release, machine: bool = False) -> tuple[Any, ...]:
    """The incoherent variants of ``layout`` -- with ``machine``, every
    configuration the manager machine builds there (its trace may name any)."""
    from kvspec.conformance.machines.configurations import manager_machine_variants, manager_variants, pool_variants
    from kvspec.conformance.runner import manager_layout
    from kvspec.conformance.targets.spec_manager import SpecManagerTarget

    if scope == "pool":
        return pool_variants(LAYOUTS[layout])
    if machine:
        return manager_machine_variants(manager_layout(layout).for_release(release),
                                        functools.partial(SpecManagerTarget, release=release))
    return manager_variants(manager_layout(layout).for_release(release))


def _config_vector(name: str, scope: str, variant: Any, release: releases.Release, description: str = "") -> Vector:
    from kvspec.conformance.machines.configurations import ENGINE_CHECKED, NON_POSITIVE_SIZE, spec_refusal
    from kvspec.conformance.targets.spec_manager import SpecManagerTarget

    refusal = spec_refusal(variant, functools.partial(SpecBlockPool if scope == "pool" else SpecManagerTarget,
                                                      release=release))
    findings = [f.id for f in FINDINGS if variant.non_positive_size and f.avoid == NON_POSITIVE_SIZE
                or variant.engine_checked and f.avoid == ENGINE_CHECKED]
    return Vector(name, scope, config_of(scope, variant.layout, release=release),
                  description or f"built with {variant.name}: refused ({refusal})", findings, refused=refusal.rule,
                  refused_with=refusal_kind(refusal))


def holds_finding(finding: Any, release: releases.Release = releases.REFERENCE) -> bool:
    """Whether ``release``'s corpus holds a vector of ``finding``: one of its
    own release's findings, about an API the vectors cover -- the pool's,
    the manager's, and in the base release's corpus the offload tier's
    (chapter 11 models 0.25.1's ``OffloadingManager`` alone); the
    scheduler's findings are judged by their own scope."""
    if not finding.affects(release.version):
        return False
    return finding.scope in ("pool", "manager") or (finding.scope == "offload" and release.is_base)


def finding_vectors(release: releases.Release = releases.REFERENCE) -> list[Vector]:
    """Each known finding's trace replayed on the spec of ``release``: what
    the spec does where the implementation the finding is about went wrong."""
    from kvspec.conformance.runner import manager_layout, replay
    from kvspec.conformance.targets.spec_manager import SpecManagerTarget
    from kvspec.conformance.trace import Trace
    out = []
    for finding in FINDINGS:
        if not holds_finding(finding, release):
            continue
        if finding.scope == "offload":
            out.append(offload_finding_vector(finding))
            continue
        trace = Trace.load(finding.trace_path)
        if [s.rule for s in trace.steps] == ["configure"]:  # a construction: its vector is a configuration's
            built = dict(trace.steps[0].draws)["configuration"]
            variant = next(v for v in _variants(trace.scope, trace.layout, release, machine=True) if v.name == built)
            out.append(_config_vector(f"{trace.scope}/findings/{finding.id}", trace.scope, variant, release,
                                      f"{finding.id} ({finding.target}): {finding.title}"))
            continue
        layout = LAYOUTS[trace.layout] if trace.scope == "pool" else manager_layout(trace.layout).for_release(release)
        vector = Vector(f"{trace.scope}/findings/{finding.id}", trace.scope,
                        config_of(trace.scope, layout, release=release),
                        f"{finding.id} ({finding.target}): {finding.title}", findings=[finding.id])
        judged = releases.judged(trace.release) if trace.release else release  # as replay judges it
        spec = functools.partial(SpecBlockPool if trace.scope == "pool" else SpecManagerTarget, release=judged)

        def make(*args: Any, _vector: Vector = vector, _spec: Any = spec, **options: Any) -> Recorder:
            return Recorder(_spec(*args, **options), _vector)

        replay(trace, make, "L1", release=release)
        out.append(vector)
    return out


# --- the corpus --------------------------------------------------------------------------------


@dataclass
class Corpus:
    """What :func:`generate` wrote."""

    root: Path
    files: list[dict[str, Any]] = field(default_factory=list)
    rules: dict[str, list[str]] = field(default_factory=dict)
    chapters: dict[str, list[str]] = field(default_factory=dict)  # spec/README.md's chapter -> vectors
    coverage: dict[str, Any] | None = None
    tiers: bool = True  # whether the corpus holds the offload tier's vectors (the base release's does)

    @property
    def all_rules(self) -> list[str]:
        """The rules the corpus should exercise: chapters 1-9's, and chapter 11's where it holds the tier."""
        return [*RULES, *(TIER_RULES if self.tiers else ())]

    @property
    def unexercised(self) -> list[str]:
        return [r for r in self.all_rules if not self.rules.get(r)]

    @property
    def unread_chapters(self) -> list[str]:
        """Chapters of spec/README.md no vector needs (releases' is met only
        by a corpus generated with ``--release``; the tiers' only by the base release's)."""
        return [c for c in CHAPTERS if not self.chapters.get(c)]


SIZES = {"cases": (0, 0, 0, 0, 0, 0), "quick": (3, 15, 2, 6, 2, 12), "ci": (8, 25, 8, 12, 6, 20),
         "long": (30, 50, 15, 15, 15, 30)}
"""Per size: pool walks per layout and their steps, manager walks per layout
and their steps, offload walks per tier layout and their steps.  ``cases``:
the edge cases and findings alone -- what the repository keeps under
``vectors/`` (independent of Hypothesis's version)."""


def generate(out: Path, size: str = "ci", on_file: Callable[[str], None] | None = None,
             measure_coverage: bool = True, release: str | None = None) -> Corpus:
    """Write the corpus under ``out`` (see the module docstring), replacing
    the vectors a previous corpus left there: a vector the spec no longer
    yields must not linger.  ``release``: the spec of that vLLM release
    (spec/releases/; default the base), recorded in every vector."""
    if size not in SIZES:
        raise ValueError(f"unknown corpus size {size!r}: use one of {sorted(SIZES)}")
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} exists and is not a directory")
    for old in out.glob("*/**/*.json") if out.is_dir() else []:
        old.unlink()
    cov = _start_coverage() if measure_coverage else None
    try:
        with rooted_at(HASH_SEED):
            vectors = _all_vectors(size, releases.judged(release or releases.BASE))
    finally:
        coverage = _stop_coverage(cov) if cov is not None else None
    corpus = Corpus(out, coverage=coverage, tiers=releases.judged(release or releases.BASE).is_base)
    for vector in vectors:
        path = out / f"{vector.name}.json"
        write(vector, path)
        rules = sorted(exercised(vector))
        sections = sorted(chapters(vector), key=lambda c: tuple(map(int, c.split("."))))
        corpus.files.append({"path": f"{vector.name}.json", "scope": vector.scope, "steps": len(vector.steps),
                             "findings": vector.findings, "rules": rules, "chapters": sections,
                             "description": vector.description})
        for rule in rules:
            corpus.rules.setdefault(rule, []).append(f"{vector.name}.json")
        for chapter in sections:
            corpus.chapters.setdefault(chapter, []).append(f"{vector.name}.json")
        if on_file:
            on_file(vector.name)
    content_view.generate(out)
    _write_index(corpus)
    return corpus


def _exists(layout: Layout, release: releases.Release) -> bool:
    """Whether the release has the layout: from 0.33 no Mamba group uses the ``all`` mode (a release's
    corpus holds no walk a target on it could not even build)."""
    modes = set(layout.mamba_cache_modes) if layout.enable_caching else set()
    return release.unsupported(modes) is None


def _all_vectors(size: str, release: releases.Release) -> list[Vector]:
    from kvspec.conformance.machines.offload import OFFLOAD_LAYOUTS
    from kvspec.conformance.vectors import offload

    pool_examples, pool_steps, manager_examples, manager_steps, tier_examples, tier_steps = SIZES[size]
    vectors = [pool_case_vector(case, release) for case in POOL_CASES]
    vectors += [manager_case_vector(c, release) for c in MANAGER_CASES]
    vectors += config_vectors(release)
    for name in LAYOUTS if pool_examples else ():
        vectors += walk_vectors("pool", name, pool_examples, pool_steps, release)
    for name in MANAGER_LAYOUTS if manager_examples else ():
        if _exists(MANAGER_LAYOUTS[name], release):
            vectors += walk_vectors("manager", name, manager_examples, manager_steps, release)
    if release.is_base:  # chapter 11 models 0.25.1's tier alone
        vectors += [offload_case_vector(case) for case in offload.OFFLOAD_CASES]
        for name in OFFLOAD_LAYOUTS if tier_examples else ():
            vectors += offload_walk_vectors(name, tier_examples, tier_steps)
    return vectors + finding_vectors(release)


def _start_coverage() -> Any:
    try:
        import coverage
    except ImportError:
        return None
    cov = coverage.Coverage(branch=True, source=[str(SPEC_DIR)], data_file=None)
    cov.start()
    return cov


def _stop_coverage(cov: Any) -> dict[str, Any]:
    from kvspec.conformance.spec_coverage import per_file

    cov.stop()
    return per_file(cov)


def _write_index(corpus: Corpus) -> None:
    index = {"kvspec_vectors_index": 1, "files": corpus.files, "rules": corpus.rules, "chapters": corpus.chapters}
    (corpus.root / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    if corpus.coverage:  # apart: it moves with every edit of the spec, the vectors do not
        (corpus.root / "coverage.json").write_text(json.dumps(corpus.coverage, indent=1) + "\n")
    lines = ["# Conformance vectors", "",
             f"{len(corpus.files)} vectors ({sum(f['steps'] for f in corpus.files)} operations), derived from the "
             "spec by `kvspec vectors generate`.  The format is described in kvspec's `docs/VECTORS.md`; "
             "`index.json` lists every file with the rules it exercises and the chapters of spec/README.md "
             "it needs.  Chapter 10's rules over an engine's content view have their own cases, one per line "
             f"of `{content_view.FILE}` ({len(content_view.CASES)} cases: a view, the verdict the spec's "
             "predicates give).", "", "## By chapter of spec/README.md", "", "| chapter | vectors | for example |",
             "|---|---|---|"]
    for chapter, title in CHAPTERS.items():
        files = corpus.chapters.get(chapter, [])
        example = f"`{min(files, key=lambda f: ('/cases/' not in f, f))}`" if files else "-"
        lines.append(f"| {chapter}. {title} | {len(files)} | {example} |")
    lines += ["", "## By rule", ""]
    for rule in corpus.all_rules:
        files = corpus.rules.get(rule, [])
        lines += [f"### {rule}", "", f"{len(files)} vector{'' if len(files) == 1 else 's'}, for example:", ""]
        lines += [f"- `{f}`" for f in sorted(files, key=lambda f: ("/cases/" not in f, "/findings/" not in f, f))[:8]]
        lines.append("")
    (corpus.root / "INDEX.md").write_text("\n".join(lines).rstrip() + "\n")
