"""The request-level rules (kvspec.spec.request_rules): each one catches a
deliberately broken manager, stays quiet for the spec model on the same
scenario, and the whole catalogue -- the brute-force hit oracle included --
agrees with the model on random small runs."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from broken_managers import IgnoresTenant, hasher_ignoring_embeddings
from kvspec.conformance.machines.observe import observe
from kvspec.errors import RuleError
from kvspec.hashing import get_request_block_hasher
from kvspec.request import Request, RequestStatus
from kvspec.spec import releases
from kvspec.spec.content import Shadow, state_content
from kvspec.spec.coordinator import HybridCoordinator
from kvspec.spec.kinds import FullAttention, ReferenceSlidingWindow, SlidingWindow
from kvspec.spec.manager import SpecKVCacheManager
from kvspec.spec.oracle import oracle_hit_length
from kvspec.spec.pool import SpecBlockPool
from kvspec.spec.request_rules import (
    REQUEST_STATE_RULES,
    REQUEST_STEP_RULES,
    Layout,
    ManagerStep,
    RequestContext,
    check_request_state,
    check_request_step,
    connector_saves_what_was_computed,
    free_order,
    fresh_blocks,
    per_group_hits_sound,
    refusal_changes_nothing,
    zeroed_blocks_are_fresh,
)
from kvspec.testing import chunked, config, cross, embedding_rows, full, mamba, mla, rswa, swa

# --- a scheduler in miniature, checking every rule after every operation ------------------------------


class Harness:
    """Drives one manager like a scheduler and model runner would: keeps the
    requests, writes the shadow after every allocation, and checks rules."""

    def __init__(self, m: SpecKVCacheManager, layout: Layout, hbs: int):
        self.m, self.layout, self.hbs = m, layout, hbs
        self.requests: dict[str, Request] = {}
        self.shadow = Shadow(layout)
        self.ctx = RequestContext(layout=layout, requests=self.requests, shadow=self.shadow)
        self.violations: list = []

    def request(self, rid, tokens, **kw) -> Request:
        kw.setdefault("block_hasher", get_request_block_hasher(self.hbs))
        r = Request(rid, list(tokens), **kw)
        self.requests[rid] = r
        return r

    def check(self, step=None):
        found = check_request_state(self.m.snapshot(), ctx=self.ctx)
        if step is not None:
            found += check_request_step(step, ctx=self.ctx)
        self.violations += found
        return found

    def op(self, name, *args, **kwargs):
        step = observe(self.m, name, *args, **kwargs)
        if name == "new_step_starts":
            self.shadow.new_step()
        self.check(step)
        return step

    def lookup(self, r):
        step = self.op("get_computed_blocks", r)
        return step.result

    def allocate(self, r, num_new, hit=0, blocks=None, accepted_drafts=None, **kw):
        """allocate_slots, then the forward pass: write what is computed."""
        # observe asks the model's own get_num_blocks_to_allocate first (rule allocation-accounting)
        step = observe(self.m, "allocate_slots", r, num_new, hit, blocks, **kw)
        if step.result is not None:
            start = r.num_computed_tokens + hit
            external = kw.get("num_external_computed_tokens", 0)
            end = start + external + num_new
            tables = self.m.get_block_ids(r.request_id)
            if external:  # the connector loads these (a Mamba group: the state at their end)
                self.shadow.write(r, tables, start, start + external)
                start += external
            if accepted_drafts is None:
                self.shadow.write(r, tables, start, end)
                r.num_computed_tokens = end
            else:  # decode with drafts: 1 + accepted are real, the rest rejected
                drafts = num_new - 1
                for _ in range(accepted_drafts + 1):
                    r.append_output_token_ids(len(r.all_token_ids) % 3)
                self.shadow.write(r, tables, start, start + 1 + accepted_drafts)
                self.shadow.scribble(r, tables, start + 1 + accepted_drafts, start + 1 + drafts)
                r.num_computed_tokens = start + 1 + accepted_drafts
            r.status = RequestStatus.RUNNING
        self.check(step)
        return step


def harness(*specs, num_blocks=16, caching=True, eagle=False, eagle_groups=(), events=False, **kw):
    sizes = [s.block_size for s in specs]
    sbs = math.lcm(*sizes)
    hbs = (math.gcd(*sizes) if len(specs) > 1 else sizes[0]) if caching else sbs
    cfg = config(*specs, num_blocks=num_blocks, eagle_groups=eagle_groups)
    m = SpecKVCacheManager(cfg, 64, sbs, hbs, enable_caching=caching, use_eagle=eagle,
                           enable_kv_cache_events=events, **kw)
    return Harness(m, Layout.from_config(cfg, sbs, hbs, caching, eagle), hbs)


def rule_problems(h: Harness, rule: str) -> list:
    return [v for v in h.violations if v.rule == rule]


# --- one broken manager per rule ----------------------------------------------------------------------


class ForgetsToNull(SlidingWindow):
    """Frees blocks that left the window but leaves them in the table."""

    def remove(self, rid, plan):
        table = self.table(rid)
        for positions in plan:
            self.pool.free_blocks([table[i] for i in positions])


@pytest.mark.parametrize("broken", [False, True])
def test_ref_conservation_catches_a_window_block_freed_twice(broken):
    h = harness(swa(4, window=5), num_blocks=8)
    if broken:
        h.m.groups[0].__class__ = ForgetsToNull
    a = h.request("a", range(16))
    h.allocate(a, 16)
    a.append_output_token_ids(1)
    h.allocate(a, 1)  # positions 0..2 leave the window: released
    h.allocate(h.request("b", [7] * 20), 20)  # reuses them
    h.op("free", a)  # broken: b's blocks lose a reference a second time
    assert bool(rule_problems(h, "ref-conservation")) == broken


class ForgetsToTouch(FullAttention):
    """Puts hits in the table without taking a reference."""

    def take_hits(self, rid, hits, num_local_computed, num_external_computed):
        self.tables[rid] = list(hits)
        self.num_cached[rid] = len(hits)


@pytest.mark.parametrize("broken", [False, True])
def test_no_aliasing_catches_a_hit_that_was_never_taken(broken):
    h = harness(full(4), num_blocks=10)
    if broken:
        h.m.groups[0].__class__ = ForgetsToTouch
    a = h.request("a", range(8))
    h.allocate(a, 8)
    h.op("free", a)
    b = h.request("b", list(range(8)) + [9])
    blocks, hit = h.lookup(b)
    h.allocate(b, 1, hit, blocks)
    h.allocate(h.request("c", [5] * 32), 32)  # broken: b's hits are still free, c takes them
    assert bool(rule_problems(h, "no-aliasing")) == broken


class KeepsStaleHashes(SpecBlockPool):
    """Reuses cached blocks without evicting their hashes."""

    def get_new_blocks(self, num_blocks):
        keys = {b: self.state.key_of[b] for b in self.state.free[:num_blocks] if b in self.state.key_of}
        taken = super().get_new_blocks(num_blocks)
        for b, key in keys.items():
            self.state.key_of[b] = key
            self.state.table.setdefault(key, []).append(b)
        return taken


@pytest.mark.parametrize("broken", [False, True])
def test_content_soundness_catches_a_stale_hit(broken):
    h = harness(full(4), num_blocks=10)
    if broken:
        h.m.pool.__class__ = KeepsStaleHashes
    a = h.request("a", range(8))
    h.allocate(a, 8)
    h.op("free", a)
    # 30 of 36 tokens (9 blocks, the last two being a's old blocks 2, 1); 7 full blocks cached
    h.allocate(h.request("x", [4] * 36), 30, num_lookahead_tokens=6)
    blocks, hit = h.lookup(h.request("c", list(range(8)) + [1]))
    assert (hit > 0) == broken
    assert bool(rule_problems(h, "content-soundness")) == broken


@pytest.mark.parametrize("broken", [False, True])
def test_tenant_isolation_catches_a_cross_tenant_hit(broken):
    h = harness(full(4), num_blocks=10)
    if broken:
        h.m.__class__ = IgnoresTenant
    h.allocate(h.request("a", range(8)), 8)
    b = h.request("b", list(range(8)) + [1], cache_salt="tenant-b")
    blocks, hit = h.lookup(b)
    h.allocate(b, 9 - hit, hit, blocks)
    assert bool(rule_problems(h, "tenant-isolation")) == broken


@pytest.mark.parametrize("broken", [False, True])
def test_content_soundness_catches_a_hit_across_prompt_embeddings(broken):
    """Same placeholder token ids, other embeddings: other content (vLLM hashes the embeddings' bytes)."""
    h = harness(full(4), num_blocks=10)
    hasher = {"block_hasher": hasher_ignoring_embeddings(4)} if broken else {}
    a = h.request("a", [0] * 8, prompt_embeds=embedding_rows("source-a", 8), **hasher)
    h.allocate(a, 8)
    b = h.request("b", [0] * 9, prompt_embeds=embedding_rows("source-b", 9), **hasher)
    blocks, hit = h.lookup(b)
    assert (hit > 0) == broken
    h.allocate(b, 9 - hit, hit, blocks)
    assert bool(rule_problems(h, "content-soundness")) == broken


def test_same_embeddings_share_blocks():
    h = harness(full(4), num_blocks=10)
    h.allocate(h.request("a", [0] * 8, prompt_embeds=embedding_rows("source-a", 8)), 8)
    blocks, hit = h.lookup(h.request("b", [0] * 9, prompt_embeds=embedding_rows("source-a", 9)))
    assert hit == 8


class InterleavedExternal(HybridCoordinator):
    """Allocates a group's external blocks before the next group takes its hits."""

    def take_hits(self, rid, hits, num_local_computed, num_external_computed):
        if self.is_running(rid):
            return
        for g, group in enumerate(self.groups):
            group.take_hits(rid, hits[g], num_local_computed, num_external_computed)
            if num_external_computed > 0:
                group.allocate_external(rid, num_local_computed, num_external_computed)


@pytest.mark.parametrize("broken", [False, True])
def test_no_eviction_in_use_catches_external_blocks_allocated_before_all_hits_are_taken(broken):
    h = harness(full(4), swa(4, window=6), num_blocks=13)
    if broken:
        h.m.coordinator.__class__ = InterleavedExternal
    a = h.request("a", range(8))
    d = h.request("d", [5] * 16)
    h.allocate(a, 8)  # full 1, 2; window 3, 4
    h.allocate(d, 16)  # takes every other block
    h.op("free", a)
    h.op("free", d)  # free queue: 2 1 4 3 (a's, LRU), then d's
    b = h.request("b", list(range(8)) + [6] * 4)
    blocks, hit = h.lookup(b)
    assert (blocks, hit) == (([1, 2], [3, 4]), 8)
    # broken: full attention takes 1, 2, then its external block from the head -- the window's hit 4
    h.allocate(b, 1, hit, blocks, num_external_computed_tokens=3)
    assert bool(rule_problems(h, "no-eviction-in-use")) == broken


class NoLastTokenRecompute(SpecKVCacheManager):
    """Lets a hit cover the whole request (the last token's logits are lost)."""

    def get_computed_blocks(self, request):
        tables, hit = self.coordinator.find_longest_cache_hit(request.block_hashes, request.num_tokens)
        return tuple(list(t) for t in tables), hit


@pytest.mark.parametrize("broken", [False, True])
def test_hit_soundness_catches_a_hit_of_the_whole_request(broken):
    h = harness(full(4), num_blocks=10)
    if broken:
        h.m.__class__ = NoLastTokenRecompute
    h.allocate(h.request("a", range(8)), 8)
    h.lookup(h.request("b", range(8)))
    assert bool(rule_problems(h, "hit-soundness")) == broken


def search_mamba_as_an_eagle_group(m: SpecKVCacheManager) -> None:
    """vLLM 0.25.1's EAGLE groups: with use_eagle and none flagged, Mamba too (searched one block
    past the candidate, for a drop Mamba's search never makes)."""
    for sg in m.coordinator.spec_groups:
        sg.use_eagle = True
        for g in sg.group_ids:
            m.groups[g].use_eagle = True


@pytest.mark.parametrize("broken", [False, True])
def test_hit_soundness_catches_mamba_searched_as_an_eagle_group(broken):
    h = harness(full(4), mamba(4, "all"), num_blocks=20, eagle=True)
    if broken:
        search_mamba_as_an_eagle_group(h.m)
    h.allocate(h.request("a", range(16)), 16)
    # full attention: 4 cached, the EAGLE drop -> 12; Mamba searched up to 16 comes back with 16
    assert h.lookup(h.request("b", list(range(16)) + [1, 2, 3, 4]))[1] == (16 if broken else 12)
    problems = rule_problems(h, "hit-soundness")
    assert any("group 0 reports 3 blocks" in v.message for v in problems) == broken
    assert bool(rule_problems(h, "hit-optimality")) == broken  # the oracle says 12
    assert bool(h.violations) == broken


class DropsEveryPass(HybridCoordinator):
    """Applies the EAGLE drop on every pass of the fixed point (no verification, no peek)."""

    def find_longest_cache_hit(self, block_hashes, max_length):
        hits: list = [None] * len(self.groups)
        length = max_length
        while True:
            start = length
            for sg in self.spec_groups:
                hit = sg.cls.find_hit(sg.spec, self.lookup(sg.spec, block_hashes, sg.group_ids), length,
                                      sg.use_eagle, self.scheduler_block_size)
                length = len(hit) * sg.spec.block_size
                for g, column in zip(sg.group_ids, self.columns(hit, len(sg.group_ids)), strict=True):
                    hits[g] = column
            if length >= start:
                break
        for sg in self.spec_groups:
            for g in sg.group_ids:
                del hits[g][length // sg.spec.block_size:]
        return tuple(hits), length


@pytest.mark.parametrize("broken", [False, True])
def test_hit_optimality_catches_an_eagle_drop_on_every_fixed_point_pass(broken):
    h = harness(full(4), swa(4, window=5), swa(4, window=9), num_blocks=40, eagle_groups=(1,))
    if broken:
        h.m.coordinator.__class__ = DropsEveryPass
    h.allocate(h.request("a", range(24)), 24)
    h.op("evict_blocks", {18})
    hit = h.lookup(h.request("b", list(range(24)) + [3]))[1]
    assert hit == (0 if broken else 20)
    assert bool(rule_problems(h, "hit-optimality")) == broken


class TouchesBeforeChecking(SpecKVCacheManager):
    """Takes the hits, then finds there is no room -- and leaves them taken."""

    def allocate_slots(self, request, num_new_tokens, num_new_computed_tokens=0, new_computed_blocks=None, **kw):
        result = super().allocate_slots(request, num_new_tokens, num_new_computed_tokens, new_computed_blocks, **kw)
        if result is None and new_computed_blocks:
            self.pool.touch([b for blocks in new_computed_blocks for b in blocks])
        return result


class RefusalThatReleases(SpecKVCacheManager):
    """Base of the broken managers below: after a refusal, ``damage``."""

    def allocate_slots(self, request, num_new_tokens, num_new_computed_tokens=0, new_computed_blocks=None, **kw):
        result = super().allocate_slots(request, num_new_tokens, num_new_computed_tokens, new_computed_blocks, **kw)
        if result is None:
            self.damage(request.request_id)
        return result


class ReleasesInWindow(RefusalThatReleases):
    """Also releases the request's last block, which the next token reads."""

    def damage(self, rid):
        self.coordinator.remove(rid, [(0, [[len(self.groups[0].table(rid)) - 1]])])


class ReleasesAnotherRequests(RefusalThatReleases):
    """Also releases another request's out-of-window blocks."""

    def damage(self, rid):
        self.remove_skipped_blocks("b", 16)


class EvictsOnRefusal(RefusalThatReleases):
    """Also forgets the hash of a block it released."""

    def damage(self, rid):
        self.evict_blocks({1})


class RaisesAfterReleasing(RefusalThatReleases):
    """Refuses with an error -- after the release: an error must change nothing at all."""

    def damage(self, rid):
        raise RuleError("allocation-accounting", "no room")


@pytest.mark.parametrize("broken", [None, TouchesBeforeChecking])
def test_allocation_accounting_catches_a_refusal_that_leaves_hits_taken(broken):
    h = harness(full(4), num_blocks=10)
    if broken:
        h.m.__class__ = broken
    a = h.request("a", range(8))
    h.allocate(a, 8)
    h.op("free", a)
    b = h.request("b", list(range(8)) + [1])
    blocks, hit = h.lookup(b)
    assert h.allocate(b, 1, hit, blocks, reserved_blocks=9).result is None
    assert bool(rule_problems(h, "allocation-accounting")) == bool(broken)


@pytest.mark.parametrize(("broken", "caught"), [
    (None, None),
    (ReleasesInWindow, "released block 4 (group 0, position 3) inside the attention window"),
    (ReleasesAnotherRequests, "changed another request's tables"),
    (EvictsOnRefusal, "changed the pool beyond freeing the blocks it nulled"),
    (RaisesAfterReleasing, "raised but changed the state"),
    (ForgetsToNull, "changed the pool beyond freeing the blocks it nulled"),
])
def test_allocation_accounting_allows_a_refusal_to_release_only_out_of_window_blocks(broken, caught):
    h = harness(swa(4, window=5), num_blocks=10)
    if broken is ForgetsToNull:
        h.m.groups[0].__class__ = broken  # frees the blocks but leaves them in the table
    elif broken:
        h.m.__class__ = broken
    a, b = h.request("a", range(16)), h.request("b", [7] * 16)
    h.allocate(a, 16)
    h.allocate(b, 16)
    a.append_output_token_ids(1)
    step = h.allocate(a, 1, reserved_blocks=9)
    assert step.result is None
    if not broken:  # as vLLM: positions 0..2 left the window and are released anyway
        assert h.m.get_block_ids("a") == ([0, 0, 0, 4],)
        assert list(step.after.pool.free) == [9, 3, 2, 1]
    problems = [v.message for v in rule_problems(h, "allocation-accounting")]
    assert any(caught in p for p in problems) if broken else not problems


def test_allocation_accounting_checks_the_pool_after_a_refused_release():
    h = harness(swa(4, window=5), num_blocks=8)
    a = h.request("a", range(16))
    h.allocate(a, 16)
    a.append_output_token_ids(1)
    step = h.allocate(a, 1, reserved_blocks=7)
    assert step.result is None and step.after.tables == {"a": ((0, 0, 0, 4),)}
    pool = step.after.pool
    key = pool.key_of[1]
    doctored = {
        "a hash lost": replace(pool, key_of={b: k for b, k in pool.key_of.items() if b != 1},
                               table={k: v for k, v in pool.table.items() if k != key}),
        "a hash added": replace(pool, key_of={**pool.key_of, 5: b"x"}, table={**pool.table, b"x": (5,)}),
        "a released block kept out of the free queue": replace(pool, free=pool.free[:-1]),
        "a held block's reference dropped too": replace(pool, ref=pool.ref[:4] + (0,) + pool.ref[5:]),
    }
    assert not refusal_changes_nothing(step, h.ctx)
    for what, after in doctored.items():
        assert refusal_changes_nothing(replace(step, after=replace(step.after, pool=after)), h.ctx), what
    # the order of the released blocks is a policy (free-order, L2), not a change beyond the release
    reordered = replace(step, after=replace(step.after, pool=replace(pool, free=tuple(reversed(pool.free)))))
    assert not refusal_changes_nothing(reordered, h.ctx)
    assert free_order(reordered, h.ctx) and not free_order(step, h.ctx)
    # the entry of a released block becomes the null block, not another block
    moved = replace(step.after, tables={"a": ((0, 0, 5, 4),)})
    assert refusal_changes_nothing(replace(step, after=moved), h.ctx)


class CountsNoFreeHits(FullAttention):
    """Forgets that taking a free hit removes it from the free queue."""

    def _free_hits(self, hits):
        return 0


@pytest.mark.parametrize("broken", [False, True])
def test_allocation_accounting_catches_an_estimate_that_misses_free_hits(broken):
    # The estimate is the capacity check's (vLLM's formula, Coordinator.blocks_to_allocate); the planted
    # group forgets that taking a free hit takes it from the free queue.
    h = harness(full(4), num_blocks=10)
    if broken:
        h.m.groups[0].__class__ = CountsNoFreeHits
    a = h.request("a", range(8))
    h.allocate(a, 8)
    h.op("free", a)
    b = h.request("b", list(range(8)) + [1])
    blocks, hit = h.lookup(b)
    estimate = h.m.coordinator.blocks_to_allocate("b", 9, blocks, 0, hit, 9)
    h.check(observe(h.m, "allocate_slots", b, 1, hit, blocks, expected_pulled=estimate))
    assert bool(rule_problems(h, "allocation-accounting")) == broken


def test_allocation_accounting_flags_vllms_estimate_for_mamba_align_external_tokens():
    # vLLM 0.25.1 (reproduced by the model) estimates 1 + speculative new blocks for a new request in
    # align mode, missing the block taken for external tokens: 8 external + 8 new tokens take 2.
    h = harness(mamba(4, "align"), num_blocks=10)
    a = h.request("a", range(16))
    vllm_estimate = h.m.coordinator.blocks_to_allocate("a", 16, ([],), 0, 16, 16)
    assert (vllm_estimate, h.m.get_num_blocks_to_allocate(a, 8, num_external_computed_tokens=8)) == (1, 2)
    step = observe(h.m, "allocate_slots", a, 8, num_external_computed_tokens=8, expected_pulled=vllm_estimate)
    h.check(step)
    assert step.result == ([0, 2],)
    assert h.m.get_block_ids("a") == ([0, 1, 0, 2],)
    assert any("took 2 blocks" in v.message and "estimated 1" in v.message
               for v in rule_problems(h, "allocation-accounting"))


class HeadFirst(FullAttention):
    """Releases a table from its first block to its last."""

    def free(self, rid):
        table = self.tables.pop(rid, [])
        self.num_cached.pop(rid, None)
        self.pool.free_blocks(table)


@pytest.mark.parametrize("broken", [False, True])
def test_free_order_catches_head_first_release(broken):
    h = harness(full(4), num_blocks=10)
    if broken:
        h.m.groups[0].__class__ = HeadFirst
    a = h.request("a", range(12))
    h.allocate(a, 12)
    h.op("free", a)
    assert bool(rule_problems(h, "free-order")) == broken


def test_free_order_of_removed_window_blocks():
    h = harness(swa(4, window=5), num_blocks=10)
    a = h.request("a", range(16))
    h.allocate(a, 16)
    h.op("remove_skipped_blocks", "a", 16)
    assert h.m.get_block_ids("a") == ([0, 0, 0, 4],)
    assert not h.violations


class ReleasesThePrompt(ReferenceSlidingWindow):
    """R-SWA that forgets the prompt stays visible: releases from position 0."""

    def removal_plan(self, rid, total_computed_tokens, num_prompt_tokens=None):
        if num_prompt_tokens is None:
            return []
        return self._released_back_from(rid, 0, self.gap(total_computed_tokens, num_prompt_tokens).stop)


class ReleasesEarly(SlidingWindow):
    """A sliding window one token short: releases a block the next query still reads."""

    def skipped_tokens(self, num_computed_tokens):
        return max(0, num_computed_tokens - self.spec.sliding_window + 2)


def _prefill_and_decode(spec, broken_class, num_blocks: int, prompt: int, steps: int) -> Harness:
    """One request: its prompt, then ``steps`` decode steps, on a group of
    ``broken_class`` when given."""
    h = harness(spec, num_blocks=num_blocks)
    if broken_class:
        h.m.groups[0].__class__ = broken_class
    a = h.request("a", range(prompt))
    h.allocate(a, prompt)
    for _ in range(steps):
        a.append_output_token_ids(1)
        h.allocate(a, 1)
    return h


@pytest.mark.parametrize("broken", [False, True])
def test_content_soundness_catches_rswa_releasing_the_prompt(broken):
    h = _prefill_and_decode(rswa(2, window=4), broken and ReleasesThePrompt, 24, prompt=5, steps=12)
    # The last step starts at 16 tokens: the window starts at token 12, so the
    # gap is positions 3 .. 5; the prompt's positions 0 .. 2 and the window stay.
    table = h.m.get_block_ids("a")[0]
    assert (table[:3].count(0), table[3:6].count(0), table[6:].count(0)) == ((3 if broken else 0), 3, 0)
    assert bool(rule_problems(h, "content-soundness")) == broken


def test_rswa_releases_the_gap_only_with_the_prompt_length():
    h = harness(rswa(2, window=4), num_blocks=24)
    a = h.request("a", range(5))
    h.allocate(a, 5)
    a.append_output_token_ids(1)
    h.op("remove_skipped_blocks", "a", 16)  # no prompt length: nothing released
    assert 0 not in h.m.get_block_ids("a")[0]
    h.allocate(a, 12)
    h.op("remove_skipped_blocks", "a", 17, 5)
    assert h.m.get_block_ids("a")[0][:7] == [1, 2, 3, 0, 0, 0, 7]  # the window starts at token 13
    assert not h.violations


@pytest.mark.parametrize("broken", [False, True])
def test_content_soundness_catches_a_window_block_released_early(broken):
    h = _prefill_and_decode(swa(4, window=5), broken and ReleasesEarly, 12, prompt=10, steps=3)
    assert bool(rule_problems(h, "content-soundness")) == broken


@pytest.mark.parametrize("broken", [False, True])
def test_block_size_coherence_catches_a_group_counting_in_hash_blocks(broken):
    h = harness(full(4), swa(8, window=9), num_blocks=20)
    if broken:
        h.m.groups[1].block_size = 4  # converts tokens to blocks with the hash block size
    h.allocate(h.request("a", range(16)), 16)
    assert bool(rule_problems(h, "block-size-coherence")) == broken


def test_every_rule_has_a_predicate():
    catalogue = {"ref-conservation", "no-aliasing", "content-soundness", "tenant-isolation", "no-eviction-in-use",
                 "hit-soundness", "hit-optimality", "allocation-accounting", "free-order", "block-size-coherence",
                 "hash-map-consistency"}
    assert catalogue == set(REQUEST_STATE_RULES) | set(REQUEST_STEP_RULES)


# --- vLLM 0.25.1 behaviours the rules flag (the model reproduces them) ---------------------------------


class CutsTheFirstFullSpecOnly(HybridCoordinator):
    """vLLM 0.25.1's final cut: only the first spec group's blocks are cut to the hit."""

    def cut_full_attention(self, hits, hit_length):
        first = self.spec_groups[0]
        if first.is_full_attention:
            for g in first.group_ids:
                if hits[g] is not None:
                    del hits[g][hit_length // first.spec.block_size:]


@pytest.mark.parametrize("broken", [False, True])
def test_hit_soundness_catches_a_second_full_attention_spec_left_uncut(broken):
    h = harness(full(4), mla(8), swa(4, window=6), num_blocks=40)
    if broken:
        h.m.coordinator.__class__ = CutsTheFirstFullSpecOnly
    h.allocate(h.request("a", range(16)), 16)  # full 1..4, MLA 5, 6, window 7..10
    h.op("evict_blocks", {10})  # the window can serve 8, not 16
    blocks, hit = h.lookup(h.request("b", list(range(16)) + [1]))
    # every full-attention spec group is cut to the final 8 tokens (broken: MLA keeps 16)
    assert (blocks, hit) == ((([1, 2], [5, 6], [7, 8]) if broken else ([1, 2], [5], [7, 8])), 8)
    problems = rule_problems(h, "hit-soundness")
    assert any("group 1 reports 2 blocks" in v.message for v in problems) == broken
    assert bool(h.violations) == broken


@pytest.mark.parametrize("broken", [False, True])
def test_a_second_full_attention_spec_left_uncut_asks_the_pool_for_minus_one_block(broken):
    # vLLM 0.25.1 with connector tokens: the MLA table starts with 2 hit blocks for a hit of 0, and
    # allocate_external_computed_blocks asks for cdiv(8, 8) - 2 = -1 blocks -- vLLM's pool accepts
    # that and counts one block more free than it has; the spec's pool refuses it.
    h = harness(full(4), mla(8), swa(4, window=6), num_blocks=40)
    if broken:
        h.m.coordinator.__class__ = CutsTheFirstFullSpecOnly
    h.allocate(h.request("a", range(16)), 16)
    h.op("evict_blocks", {8, 10})  # the window serves neither 16 nor 8
    b = h.request("b", list(range(16)) + [1])
    blocks, hit = h.lookup(b)
    assert (blocks, hit) == ((([], [5, 6], []) if broken else ([], [], [])), 0)
    step = h.allocate(b, 1, hit, blocks, num_external_computed_tokens=8)
    if broken:
        assert isinstance(step.error, RuleError) and step.error.rule == "allocation-accounting"
        assert "-1" in str(step.error)
    else:
        assert step.result == ([16], [17], [18])
        assert h.m.get_block_ids("b") == ([11, 12, 16], [13, 17], [14, 15, 18])
        assert not h.violations


def test_vllm_quirk_chunk_size_not_a_multiple_of_the_block_size():
    h = harness(chunked(4, chunk=6), num_blocks=10)
    # token 7's chunk starts at 6, inside position 1: position 0 is taken as out of the chunk,
    # but token 4 (the next to compute) attends to tokens 0..3
    assert h.lookup(h.request("a", range(8))) == (([0],), 4)
    assert rule_problems(h, "hit-soundness") and rule_problems(h, "hit-optimality")


def test_vllm_quirk_sliding_window_eagle_hit_shorter_than_servable():
    # window 10 (3 blocks of 4, plus the EAGLE block), scheduler block 8; a prefix of 3 cached
    # window blocks is edge-aligned for EAGLE (3 - 1 = 2 blocks = 8 tokens) but is first cut to
    # the plain alignment (2 blocks), then dropped (1) and cut again: 0.  Hit 8 is servable.
    h = harness(full(8), swa(4, window=10), num_blocks=30, eagle=True)
    h.allocate(h.request("a", range(16)), 16)
    assert h.lookup(h.request("b", list(range(16)) + [7] * 8)) == (([], []), 0)
    assert [v.message for v in rule_problems(h, "hit-optimality")] == ["hit 0, but the longest servable is 8"]


# --- Mamba align needs block-aligned chunks (content-soundness) ---------------------------------------


@pytest.mark.parametrize("chunks", [(8, 4), (6, 6)])
def test_mamba_align_with_misaligned_chunks_caches_a_stale_state(chunks):
    h = harness(full(4), mamba(4, "align"), num_blocks=20)
    a = h.request("a", range(12))
    for n in chunks:
        h.allocate(a, n)
    aligned = chunks[0] % 4 == 0
    # with a 6-token first chunk, block "state after 8" holds the state after 6
    assert bool(rule_problems(h, "content-soundness")) == (not aligned)


def test_mamba_align_speculative_step_copies_the_state_at_the_boundary_it_crosses():
    # Speculative decoding in align mode (two speculative state blocks): a step of one token plus
    # two accepted drafts goes from 6 to 9 tokens, crossing the boundary at 8.  vLLM's model runner
    # (postprocess_mamba) copies the state after 8 into position 1 -- the previous running state --
    # which the next step caches as "the state after 8"; the shadow copies it too.
    h = harness(full(4), mamba(4, "align", speculative=2), num_blocks=20, eagle=True, eagle_groups=(0,))
    a = h.request("a", range(6))
    h.allocate(a, 4)
    h.allocate(a, 2)
    a.append_output_token_ids(0)
    h.allocate(a, 3, accepted_drafts=2)
    position_1 = h.m.get_block_ids("a")[1][1]
    assert h.shadow.states[(1, position_1)] == state_content(a, 8)
    h.allocate(a, 1)
    assert h.m.pool.snapshot().key_of.get(position_1) is not None  # cached as the state after 8
    assert not h.violations


# --- the oracle and the model agree on random runs ------------------------------------------------------


LAYOUTS = {
    "full": dict(specs=(full(4),)),
    "full-eagle": dict(specs=(full(4),), eagle=True),
    "mla": dict(specs=(mla(4),)),
    "swa": dict(specs=(swa(4, window=6),)),
    "swa-eagle": dict(specs=(swa(4, window=7),), eagle=True),
    "chunked": dict(specs=(chunked(4, chunk=8),)),
    "mamba-all": dict(specs=(mamba(4, "all"),)),
    "mamba-align": dict(specs=(mamba(4, "align"),), aligned=True),
    "full+swa": dict(specs=(full(4), swa(4, window=6))),
    "full+swa8": dict(specs=(full(4), swa(8, window=12))),
    "full8+swa4": dict(specs=(full(8), swa(4, window=5))),
    "full+swa-eagle": dict(specs=(full(4), swa(4, window=6)), eagle=True),
    "full+mamba-align": dict(specs=(full(4), mamba(4, "align")), aligned=True),
    "full+mamba-all": dict(specs=(full(4), mamba(4, "all"))),
    "swa+mamba": dict(specs=(swa(4, window=6), mamba(4, "all"))),
    "full+swa+mamba": dict(specs=(full(4), swa(4, window=6), mamba(4, "all")), num_blocks=40),
    "full+chunked": dict(specs=(full(4), chunked(4, chunk=8))),
    "full+full+swa": dict(specs=(full(4), full(4), swa(4, window=6)), num_blocks=40),
    "full+mla8+swa": dict(specs=(full(4), mla(8), swa(4, window=6)), num_blocks=40),
    "full+mamba-all-eagle": dict(specs=(full(4), mamba(4, "all")), eagle=True),
    "full+swa+mamba-eagle": dict(specs=(full(4), swa(4, window=6), mamba(4, "all")), eagle=True, num_blocks=40),
    "full8+swa4-eagle": dict(specs=(full(8), swa(4, window=9)), eagle=True),
    "swa4+swa8-eagle": dict(specs=(swa(4, window=6), swa(8, window=17)), eagle=True),
    "full8+swa3-sparse": dict(specs=(full(8), swa(4, window=3))),
    "swa-w1": dict(specs=(swa(4, window=1),), hits=False),  # vLLM caches nothing for a 1-token window
    "caching-off": dict(specs=(full(4), swa(4, window=6)), caching=False),
    "encoder-decoder": dict(specs=(full(4), cross(4)), caching=False, encoder=True),
}


def drive(name: str, seed: int, steps: int) -> tuple[Harness, int, int]:
    """Random requests over three shared prefixes, admitted after a lookup (sometimes with
    external tokens), prefilled in chunks, decoded (with drafts where no Mamba group is),
    preempted, finished; steps, evictions, resets in between."""
    spec = LAYOUTS[name]
    h = harness(*spec["specs"], num_blocks=spec.get("num_blocks", 24), caching=spec.get("caching", True),
                eagle=spec.get("eagle", False))
    has_mamba = any(g.kind == "mamba" for g in h.layout.views)
    sbs = h.layout.scheduler_block_size
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3) for _ in range(36)] for _ in range(3)]
    waiting, running, count, hits, lookups = [], [], 0, 0, 0

    def chunk(r, start):
        n = rng.randint(1, min(r.num_tokens - start, 12))
        if spec.get("aligned") and start + n < r.num_tokens and (start + n) % sbs:
            end = (start + n) // sbs * sbs
            n = end - start if end > start else min(sbs - start % sbs, r.num_tokens - start)
        return n

    for _ in range(steps):
        op = rng.choices(["arrive", "admit", "step", "free", "misc"], [3, 4, 8, 2, 2])[0]
        if op == "arrive" or (op == "admit" and not waiting):
            count += 1
            tokens = rng.choice(prefixes)[: rng.randint(1, 36)] + [rng.randrange(3) for _ in range(rng.randint(0, 4))]
            salt = rng.choice([None, None, None, "s"])
            waiting.append(h.request(f"r{count}", tokens, cache_salt=salt))
        elif op == "admit":
            r = waiting[rng.randrange(len(waiting))]
            blocks, hit = h.lookup(r)
            lookups += 1
            hits += hit > 0
            assert hit == oracle_hit_length(h.m.snapshot().pool, r, h.layout, releases.REFERENCE) or h.violations
            ext = 0
            if h.m.enable_caching and r.num_tokens - hit > sbs and rng.random() < 0.2:
                ext = rng.randint(1, (r.num_tokens - hit - 1) // sbs) * sbs
            n = chunk(r, hit + ext)
            kw = dict(num_external_computed_tokens=ext, reserved_blocks=rng.choice([0, 0, 2]),
                      full_sequence_must_fit=rng.random() < 0.3)
            if spec.get("encoder"):
                kw["num_encoder_tokens"] = 6
            if h.allocate(r, n, hit, blocks, **kw).result is not None:
                waiting.remove(r)
                running.append(r)
                if r.num_computed_tokens >= r.num_tokens:
                    r.append_output_token_ids(rng.randrange(3))
        elif op == "step" and running:
            r = running[rng.randrange(len(running))]
            if r.num_tokens > 56:
                h.op("free", r)
                running.remove(r)
                continue
            if r.num_computed_tokens < r.num_tokens - 1:
                n, drafts = chunk(r, r.num_computed_tokens), None
            elif not has_mamba and rng.random() < 0.3:
                d = rng.randint(1, 3)
                n, drafts = 1 + d, rng.randint(0, d)
            else:
                n, drafts = r.num_tokens - r.num_computed_tokens, None
            look = rng.choice([0, 2]) if h.m.use_eagle else 0
            step = h.allocate(r, n, accepted_drafts=drafts, num_lookahead_tokens=look)
            if step.result is None:
                h.op("free", r)
                running.remove(r)
                r.num_computed_tokens = 0
                r.status = RequestStatus.PREEMPTED
                waiting.append(r)
            elif drafts is None and r.num_computed_tokens >= r.num_tokens:
                r.append_output_token_ids(rng.randrange(3))
        elif op == "free" and (running or waiting):
            r = rng.choice(running + waiting)
            h.op("free", r)
            (running if r in running else waiting).remove(r)
        elif op == "misc":
            what = rng.choice(["new_step", "new_step", "evict", "reset", "common", "remove"])
            if what == "new_step":
                h.op("new_step_starts")
            elif what == "evict":
                h.op("evict_blocks", {rng.randrange(1, h.m.pool.num_blocks) for _ in range(2)})
            elif what == "reset":
                h.op("reset_prefix_cache")
            elif running and what == "common":
                h.op("get_num_common_prefix_blocks", rng.choice(running).request_id)
            elif running and what == "remove":
                r = rng.choice(running)
                h.op("remove_skipped_blocks", r.request_id, r.num_computed_tokens)
    for r in running + waiting:
        h.op("free", r)
    assert h.m.pool.get_num_free_blocks() == h.m.pool.num_blocks - 1
    return h, lookups, hits


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_the_model_keeps_every_rule_and_the_oracle_agrees(name):
    total_hits = 0
    for seed in range(3):
        h, lookups, hits = drive(name, seed, 250)
        assert not h.violations, f"{name} seed {seed}: " + "\n".join(map(str, h.violations[:8]))
        total_hits += hits
    if LAYOUTS[name].get("caching", True) and LAYOUTS[name].get("hits", True):
        assert total_hits > 0  # the runs do exercise the hit search


# --- KV-event contents (hash-map-consistency) --------------------------------------------------------------


def _event_step(events, layout, requests):
    from kvspec.spec.request_rules import ManagerStep, stored_events_describe_their_blocks

    snap = layout.make_target(SpecKVCacheManager).snapshot()
    step = ManagerStep("allocate_slots", {}, snap, snap, events=tuple(events))
    return stored_events_describe_their_blocks(step, RequestContext(layout=layout, requests=requests))


def test_a_stored_event_must_describe_its_request_blocks():
    """A router rebuilds the prefix tree from BlockStored events: the event
    of a continuation names its parent, the range's tokens, the request's
    adapter and its group's kind -- an event with the chain cut, the tokens
    shifted, another adapter or another kind (or none: a pool's event handed
    on unannotated) describes no request's blocks."""
    from kvspec.request import LoRARequest
    from kvspec.spec.pool import stored_event

    layout = Layout((full(2), full(4)), given_hash_block_size=2)
    hasher = get_request_block_hasher(2)
    a = Request("a", [1, 0, 1, 1, 0, 0, 1, 0, 1], lora_request=LoRARequest("adapter-a", 7), block_hasher=hasher)
    requests = {"a": a}
    for group, size in ((0, 2), (1, 4)):
        hashes = a.block_hashes if size == 2 else [a.block_hashes[i] for i in (1, 3)]
        first = replace(stored_event(a, hashes, [0], [0], size, group), spec_kind="full_attention")
        later = replace(stored_event(a, hashes, [1], [1], size, group), spec_kind="full_attention")
        assert later.parent_block_hash is not None
        assert _event_step([first, later], layout, requests) == []
        for bent in (replace(later, parent_block_hash=None), replace(later, parent_block_hash=later.block_hashes[0]),
                     replace(later, token_ids=(*later.token_ids[1:], 0)), replace(later, lora_name="adapter-b"),
                     replace(first, group=1 - group), replace(first, spec_kind=None),
                     replace(first, spec_kind="sliding_window", sliding_window=4)):
            problems = _event_step([bent], layout, requests)
            assert problems and "describes no request's blocks" in problems[0], bent


# --- what the worker zeroes, what a connector saves ----------------------------------------------------


def test_fresh_blocks_are_the_new_full_attention_blocks_not_the_hits():
    h = harness(full(4), swa(4, window=6), num_blocks=20)
    a = h.request("a", range(8))
    first = h.allocate(a, 8)
    assert fresh_blocks(first, h.layout) == list(first.result[0])  # the window's blocks are never zeroed
    b = h.request("b", list(range(8)) + [1])
    blocks, hit = h.lookup(b)
    assert hit == 8
    second = h.allocate(b, 1, hit, blocks)
    assert fresh_blocks(second, h.layout) == list(second.result[0])
    assert not set(fresh_blocks(second, h.layout)) & set(blocks[0])


def test_zeroed_blocks_must_be_exactly_the_fresh_ones():
    h = harness(full(4))
    snap = h.m.snapshot()
    ctx = RequestContext(layout=h.layout, fresh=[3, 4, 4])

    def problems(zeroed):
        return zeroed_blocks_are_fresh(ManagerStep("take_new_block_ids", {}, snap, snap, zeroed), ctx)

    assert problems([4, 3, 4]) == []
    assert problems([3, 4]) == ["block 4 was taken fresh but is not zeroed"]
    assert problems([3, 4, 4, 7]) == ["block 7 is zeroed but was not taken fresh"]


def test_a_connector_saves_the_blocks_of_the_computed_tokens():
    h = harness(full(4))
    a = h.request("a", range(10))
    h.allocate(a, 10)
    snap = h.m.snapshot()
    table = list(h.m.get_block_ids("a")[0])

    def problems(saved, n=8):
        args = {"request_id": "a", "num_computed_tokens": n}
        return connector_saves_what_was_computed(
            ManagerStep("get_block_ids_for_computed_tokens", args, snap, snap, (saved,)), h.ctx)

    assert problems(table[:2]) == []
    assert problems(table[:3]) and problems(table[:1])  # one block past the 8 tokens, one short
    h.shadow.scribble(a, h.m.get_block_ids("a"), 4, 5)  # token 4's KV overwritten
    assert problems(table[:2]) and "token 4" in problems(table[:2])[0]


def test_each_groups_own_hit_must_be_sound():
    h = harness(full(4), swa(4, window=6), num_blocks=20)
    a = h.request("a", range(8))
    h.allocate(a, 8)
    b = h.request("b", list(range(8)) + [1])
    snap = h.m.snapshot()
    table = h.m.get_block_ids("a")

    def problems(tables, lengths):
        step = ManagerStep("find_longest_cache_hit_per_group", {"request": b}, snap, snap, (tables, lengths))
        return per_group_hits_sound(step, h.ctx)

    assert problems((table[0], [0, table[1][1]]), (8, 8)) == []
    assert problems((table[0], [0, table[1][1]]), (9, 8))  # a length that is not its blocks
    assert problems((table[0][::-1], [0, table[1][1]]), (8, 8))  # blocks at the wrong positions
