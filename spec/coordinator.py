"""How the KV-cache groups of a model act together.

A request-level operation (:mod:`kvspec.spec.manager`) is spread over every
group of the model (:mod:`kvspec.spec.kinds`); the *coordinator* decides
how.  Most of it is "each group in turn, in group order"; the interesting
part is the **cache hit**: a request can skip computing its first ``L``
tokens only if *every* group can serve a hit of length ``L``.

Three coordinators, chosen by the manager:

- :class:`NoPrefixCacheCoordinator` -- prefix caching is off: never a hit,
  any number of groups (also none).
- :class:`UnitaryCoordinator` -- one group: its own hit, aligned to its block
  size.
- :class:`HybridCoordinator` -- several groups (e.g. full attention + sliding
  window, or attention + Mamba): a common hit found by a fixed point over
  *spec groups*, aligned to the scheduler block size.

Every coordinator also knows which groups are **EAGLE groups** (speculative
decoding drafts from them, so their hits drop the last block, see
:mod:`kvspec.spec.kinds`): the groups the config flags with
``is_eagle_group``, or, when ``use_eagle`` is set and none is flagged, all of
them -- Mamba groups excepted, always: draft models have no Mamba layers, so
a Mamba hit has no block to drop (vLLM compatibility, a departure: vLLM
0.25.1 makes a Mamba group an EAGLE group too; see
:func:`kvspec.kv_cache_interface.eagle_group_ids`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvspec.hashing import block_hashes_for_size
from kvspec.kv_cache_interface import FullAttentionSpec, KVCacheSpec, MambaSpec
from kvspec.spec import releases
from kvspec.spec.kinds import NULL, CrossAttention, GroupManager, HitPositions
from kvspec.spec.pool import SpecBlockPool

Tables = tuple[list[int], ...]
"""One list of block ids per group, in group order."""

RemovalPlan = list[tuple[int, list[list[int]]]]
"""Per group (by index), the free calls a removal makes (positions, in order)."""


def replay_boundaries(num_prompt_tokens: int, scheduler_block_size: int, with_drafter: bool,
                      release: releases.Release = releases.REFERENCE) -> tuple[int, ...]:
    """Where a later request replaying a prompt of ``P`` tokens resumes: an
    exact resend stops at ``P - 1`` (its last token is computed again, for
    the logits).

    From 0.30 (release delta ``eagle-replay-boundaries``), in a model a
    drafter reads, a hit drops back one scheduler block ``A`` from where it
    matched, so there are two positions, each one block lower: the resend's
    ``max(R - A, 0)`` with ``R = (P - 1) // A * A``, and a longer
    sibling's ``max(E - A, 0)`` with ``E = P // A * A`` (they differ on a
    block-aligned prompt only)."""
    if not (with_drafter and release.has("eagle-replay-boundaries")):
        return (num_prompt_tokens - 1,)
    resend = (num_prompt_tokens - 1) // scheduler_block_size * scheduler_block_size
    sibling = num_prompt_tokens // scheduler_block_size * scheduler_block_size
    return tuple(sorted({max(resend - scheduler_block_size, 0), max(sibling - scheduler_block_size, 0)}))


def caches_unrounded(specs: list, dcp_world_size: int, hash_block_size: int,
                     release: releases.Release = releases.REFERENCE) -> bool:
    """Whether a hybrid's caching call covers every computed token (release
    delta unrounded-caching-under-dcp, from 0.29): under decode context
    parallelism, with a Mamba align group whose block is at least the hash
    block -- where vLLM turns hits inside a block on."""
    return release.has("unrounded-caching-under-dcp") and dcp_world_size > 1 and any(
        isinstance(s, MambaSpec) and s.mamba_cache_mode == "align" and s.block_size >= hash_block_size
        for s in specs)


class Coordinator:
    """What all coordinators share: each operation visits the groups in order."""

    rounds_caching = True
    """Whether a hybrid's caching call rounds the computed tokens down to the
    scheduler block (not where release delta unrounded-caching-under-dcp
    applies: :func:`caches_unrounded`)."""

    def __init__(
        self,
        pool: SpecBlockPool,
        groups: list[GroupManager],
        scheduler_block_size: int,
        hash_block_size: int,
        eagle_groups: set[int],
        retention: int | None,
        with_drafter: bool = False,
    ):
        """``with_drafter``: whether a drafter reads the model
        (:func:`~kvspec.kv_cache_interface.has_drafter`; from 0.30 it moves
        where a prompt's replay resumes)."""
        self.pool = pool
        self.groups = groups
        self.scheduler_block_size = scheduler_block_size
        self.hash_block_size = hash_block_size
        self.eagle_groups = eagle_groups
        self.retention = retention
        self.with_drafter = with_drafter

    # -- the hit ----------------------------------------------------------------------------

    def find_longest_cache_hit(self, block_hashes: list[bytes], max_length: int) -> tuple[Tables, int]:
        raise NotImplementedError

    def lookup(self, spec: KVCacheSpec, block_hashes: list[bytes], group_ids: list[int]):
        """Position -> the oldest blocks cached there in each of ``group_ids``
        (``None`` when one misses), at ``spec``'s block size."""
        hashes = block_hashes_for_size(block_hashes, self.hash_block_size, spec.block_size)

        def lookup(i: int):
            found = self.pool.get_cached_block(hashes[i], group_ids)
            return None if found is None else tuple(found)

        return lookup

    @staticmethod
    def columns(hit: HitPositions, width: int) -> list[list[int]]:
        """A hit (positions of columns) as one block list per member group."""
        return [[NULL if column is None else column[j] for column in hit] for j in range(width)]

    # -- allocation -----------------------------------------------------------------------------

    def blocks_to_allocate(
        self,
        rid: str,
        num_tokens: int,
        hits: Tables,
        num_encoder_tokens: int,
        total_computed_tokens: int,
        num_tokens_main_model: int,
        admission_cap: bool = False,
    ) -> int:
        """The sum of every group's need.  Cross attention needs blocks for
        the encoder tokens instead, and has no hits."""
        total = 0
        for g, group in enumerate(self.groups):
            if isinstance(group, CrossAttention):
                total += group.blocks_to_allocate(rid, num_encoder_tokens, [], 0, num_encoder_tokens, admission_cap)
            else:
                total += group.blocks_to_allocate(
                    rid, num_tokens, hits[g], total_computed_tokens, num_tokens_main_model, admission_cap
                )
        return total

    def is_running(self, rid: str) -> bool:
        return any(group.is_running(rid) for group in self.groups)

    def take_hits(self, rid: str, hits: Tables, num_local_computed: int, num_external_computed: int) -> None:
        """Give a new request its hits, then blocks for external tokens.

        Two phases: *every* group takes its hits before *any* group allocates
        for external tokens, so that one group's new blocks can never evict
        another group's hit before it is taken (rule no-eviction-in-use).
        A running request takes nothing.
        """
        if self.is_running(rid):
            return
        for g, group in enumerate(self.groups):
            group.take_hits(rid, hits[g], num_local_computed, num_external_computed)
        if num_external_computed > 0:
            for group in self.groups:
                group.allocate_external(rid, num_local_computed, num_external_computed)

    def allocate(self, rid: str, num_tokens: int, num_tokens_main_model: int, num_encoder_tokens: int) -> Tables:
        return tuple(
            group.allocate(
                rid, num_encoder_tokens if isinstance(group, CrossAttention) else num_tokens, num_tokens_main_model
            )
            for group in self.groups
        )

    def replay(self, request: Any) -> tuple[int, ...]:
        """Where a replay of the request's prompt resumes, the same for every
        group (:func:`replay_boundaries`, above): a hit is
        the shortest over all groups, so each keeps its state there."""
        return replay_boundaries(request.num_prompt_tokens, self.scheduler_block_size, self.with_drafter,
                                 self.pool.release)

    def cache(self, request: Any, num_tokens: int) -> None:
        """Each group caches the full blocks of the first ``num_tokens`` tokens."""
        replay = self.replay(request)
        for group in self.groups:
            group.cache(request, num_tokens, self.retention, replay)

    # -- removal, release --------------------------------------------------------------------------

    def removal_plan(self, rid: str, total_computed_tokens: int, num_prompt_tokens: int | None = None) -> RemovalPlan:
        plans = [(g, group.removal_plan(rid, total_computed_tokens, num_prompt_tokens))
                 for g, group in enumerate(self.groups)]
        return [(g, plan) for g, plan in plans if plan]

    def remove(self, rid: str, plan: RemovalPlan) -> None:
        for g, calls in plan:
            self.groups[g].remove(rid, calls)

    def free(self, rid: str) -> None:
        """Each group releases its table in turn (tail-first within a group)."""
        for group in self.groups:
            group.free(rid)

    def common_prefix_blocks(self, rid: str) -> list[int]:
        return [group.common_prefix_blocks(rid) for group in self.groups]

    def new_step_starts(self) -> None:
        for group in self.groups:
            group.new_step_starts()


class NoPrefixCacheCoordinator(Coordinator):
    """Prefix caching is off: no hits, no common prefix."""

    def find_longest_cache_hit(self, block_hashes, max_length):
        return tuple([] for _ in self.groups), 0

    def common_prefix_blocks(self, rid):
        return [0] * len(self.groups)


class UnitaryCoordinator(Coordinator):
    """One group.  Its hit is the group's own, aligned to its block size
    (which must equal the hash block size); EAGLE drops one block if the
    group is an EAGLE group."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.groups[0].use_eagle = 0 in self.eagle_groups

    def find_longest_cache_hit(self, block_hashes, max_length):
        group = self.groups[0]
        hit = group.find_hit(
            group.spec, self.lookup(group.spec, block_hashes, [0]), max_length, 0 in self.eagle_groups, group.block_size
        )
        return (self.columns(hit, 1)[0],), len(hit) * group.block_size


@dataclass
class SpecGroup:
    """Groups with equal specs, looked up together: a position is cached for
    the spec group only if it is cached in every member.  ``use_eagle`` when
    any member is an EAGLE group (then all members drop)."""

    spec: KVCacheSpec
    group_ids: list[int]
    cls: type[GroupManager]
    use_eagle: bool

    @property
    def is_full_attention(self) -> bool:
        return isinstance(self.spec, FullAttentionSpec)


class HybridCoordinator(Coordinator):
    """Several groups of different specs.

    Spec groups are formed in group order, then full attention is moved
    first (a stable sort): its left-to-right scan gives the tightest first
    bound.  Hits are multiples of the scheduler block size ``A`` (the least
    common multiple of the block sizes).

    **Caching** is aligned too: a group caches the full blocks of the first
    ``n // A * A`` tokens only -- except that an EAGLE group also caches the
    block just after that boundary (when computed), since its hits peek one
    block past it.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        spec_groups: list[SpecGroup] = []
        for g, group in enumerate(self.groups):
            eagle = g in self.eagle_groups
            for sg in spec_groups:
                if sg.spec == group.spec:
                    sg.group_ids.append(g)
                    sg.use_eagle = sg.use_eagle or eagle
                    break
            else:
                spec_groups.append(SpecGroup(group.spec, [g], type(group), eagle))
        spec_groups.sort(key=lambda sg: not sg.is_full_attention)
        self.spec_groups = spec_groups
        self.lookahead_hashes = self.pool.release.has("eagle-lookahead-hashes")
        for sg in spec_groups:
            if sg.use_eagle:
                for g in sg.group_ids:
                    self.groups[g].use_eagle = True

    def cache(self, request, num_tokens):
        aligned = num_tokens // self.scheduler_block_size * self.scheduler_block_size if self.rounds_caching \
            else num_tokens
        replay = self.replay(request)
        for group in self.groups:
            n = aligned
            if group.use_eagle and aligned > 0:
                n = min(num_tokens, aligned + group.block_size)
            group.cache(request, n, self.retention, replay)

    def find_longest_cache_hit(self, block_hashes, max_length):
        """The longest common hit, by a fixed point.

        Start with the candidate length ``max_length``.  Each spec group in
        turn cuts the candidate to the longest hit it can serve that is no
        longer (its own search with the candidate as the maximum); when a
        full pass leaves the candidate unchanged, every group serves it.  The
        length only decreases, so this ends.  Details that decide the result:

        - **full attention** is searched once: its hits are prefix-closed, so
          later passes just cut the candidate to its block size, and at the
          end the blocks of *every* full-attention spec group are cut to the
          final length (a model may have several full-attention specs, e.g.
          two block or head sizes);
        - **simple hybrid** (two spec groups, full attention first): one pass
          suffices, because full attention serves every shorter aligned
          length;
        - **one EAGLE drop per candidate length**: an EAGLE spec group
          searches up to one block *past* the candidate (never past
          ``max_length``; from 0.32, release delta ``eagle-lookahead-hashes``,
          never past the request's last full hash block: the block after
          the hit may be the prompt's last, whose hash proves it) and drops
          that block; it is then *verified* and
          searches without a drop while the candidate stays put, or shrinks
          through another EAGLE group's drop.  When a group without a pending
          drop shrinks the candidate, every verification is forgotten.

        Every spec group's search returns at most the candidate it is given
        (an EAGLE group's peek is dropped again), so the candidate never
        grows; a Mamba group is never an EAGLE group
        (:func:`kvspec.kv_cache_interface.eagle_group_ids`).  Every group's blocks then cover exactly
        the hit: full attention is cut to it, and every other group's last
        search returned exactly the final length.

        (vLLM compatibility, a departure; the rules flag it: its final cut is
        applied to the *first* spec group only, so a second full-attention
        spec keeps the blocks of its first, longer search -- rule
        hit-soundness, and with connector tokens
        ``allocate_external_computed_blocks`` computes ``cdiv(total, B)``
        minus a table longer than that and calls ``get_new_blocks(-1)``;
        and it searches a Mamba group as an EAGLE group, see
        :func:`eagle_group_ids`.)
        """
        hits: list[list[int] | None] = [None] * len(self.groups)
        hit_length = max_length
        peek_limit = self.peek_limit(block_hashes, max_length)
        simple_hybrid = len(self.spec_groups) == 2 and self.spec_groups[0].is_full_attention
        verified: set[int] = set()
        while True:
            length = hit_length
            for idx, sg in enumerate(self.spec_groups):
                block_size = sg.spec.block_size
                if sg.is_full_attention and hits[sg.group_ids[0]] is not None:
                    length = length // block_size * block_size
                    continue
                drop = sg.use_eagle and idx not in verified
                search_max = min(length + block_size, peek_limit) if drop else length
                hit = sg.cls.find_hit(
                    sg.spec,
                    self.lookup(sg.spec, block_hashes, sg.group_ids),
                    search_max,
                    drop,
                    self.scheduler_block_size,
                )
                new_length = len(hit) * block_size
                if drop:
                    verified.add(idx)
                elif new_length < length:
                    verified.clear()
                length = new_length
                for g, column in zip(sg.group_ids, self.columns(hit, len(sg.group_ids)), strict=True):
                    hits[g] = column
            if length >= hit_length:
                break
            hit_length = length
            if simple_hybrid:
                break
        self.cut_full_attention(hits, hit_length)
        return tuple(h if h is not None else [] for h in hits), hit_length

    def find_longest_cache_hit_per_group(
        self, block_hashes: list[bytes], max_length: int
    ) -> tuple[Tables, tuple[int, ...]]:
        """Each spec group's own longest hit, searched alone with maximum
        ``max_length`` -- not reconciled into the common hit --, and its
        length per group (what a hybrid model's KV connector is given).  An
        EAGLE spec group drops its last block; from 0.32 (release delta
        ``eagle-lookahead-hashes``) it first peeks one block past
        ``max_length``, never past the request's last full hash block, as
        the common search does."""
        tables: list[list[int]] = [[] for _ in self.groups]
        lengths = [0] * len(self.groups)
        for sg in self.spec_groups:
            limit = min(max_length + sg.spec.block_size, self.peek_limit(block_hashes, max_length)) \
                if sg.use_eagle else max_length
            hit = sg.cls.find_hit(sg.spec, self.lookup(sg.spec, block_hashes, sg.group_ids), limit, sg.use_eagle,
                                  self.scheduler_block_size)
            for g, column in zip(sg.group_ids, self.columns(hit, len(sg.group_ids)), strict=True):
                tables[g], lengths[g] = column, len(hit) * sg.spec.block_size
        return tuple(tables), tuple(lengths)

    def peek_limit(self, block_hashes: list[bytes], max_length: int) -> int:
        """How far an EAGLE group's search may peek past its candidate:
        ``max_length`` (no further than the lookup's maximum), or from 0.32
        (``eagle-lookahead-hashes``) the end of the last full hash block."""
        return len(block_hashes) * self.hash_block_size if self.lookahead_hashes else max_length

    def cut_full_attention(self, hits: list[list[int] | None], hit_length: int) -> None:
        """Cut the blocks of every full-attention spec group to ``hit_length``
        (each was searched once, with a longer candidate)."""
        for sg in self.spec_groups:
            if sg.is_full_attention:
                for g in sg.group_ids:
                    if hits[g] is not None:
                        del hits[g][hit_length // sg.spec.block_size :]
