"""The request-level rules, each a named predicate.

:mod:`kvspec.spec.rules` checks the pool alone.  The rules here look at a
whole KV-cache manager from outside -- through
:class:`~kvspec.spec.interface.ManagerSnapshot` (the pool and every request's
block tables) -- plus what the caller knows and the manager cannot hide:

- the **layout** (:class:`Layout`): the groups' attention types and block
  sizes, the scheduler and hash block sizes, caching, EAGLE;
- the **requests** (by id): their tokens, cache salt, LoRA, hashes;
- a **shadow** (:class:`Shadow`) of what was written into every
  (group, block): the caller plays the model runner and records, after each
  allocation, which request's tokens land in which slot;
- the **hit** a lookup returned, and the call that produced each step.

A rule returns the list of ways it is broken (empty: it holds); its docstring
is the rule.  **State rules** take ``(snapshot, context)``; **step rules** take
``(step, context)`` for one operation (:class:`ManagerStep`, built by
:func:`observe`).  :func:`check_request_state` and :func:`check_request_step`
run them all and return :class:`~kvspec.spec.rules.Violation` records that
cite the rule names of the catalogue (:mod:`kvspec.spec.catalogue`).  Rules that need context the caller did
not give (a shadow, the requests) skip silently.

**The oracle.** :func:`oracle_hit_length` states the optimal hit by brute
force: it tries every aligned candidate length, longest first, against the
pool's hash table, and asks each group whether it could serve it
(:func:`group_can_serve`).  It shares no code with the hit search of
:mod:`kvspec.spec.kinds` and :mod:`kvspec.spec.coordinator`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kvspec.hashing import make_block_hash_with_group_id
from kvspec.kv_cache_interface import AttentionKind, event_metadata
from kvspec.spec import releases
from kvspec.spec import rules as pool_rules
from kvspec.spec.content import (
    ATTENTION_KINDS,
    NULL,
    Shadow,
    blocks_to_save,
    hashes_for,
    key_for,
    out_of_window,
    partial_keys_for,
    tenant,
)
from kvspec.spec.interface import ManagerSnapshot, PoolSnapshot, Stored
from kvspec.spec.layout import GroupView, Layout
from kvspec.spec.oracle import eagle_peek_limit, group_can_serve, oracle_hit_length
from kvspec.spec.pool import requeue
from kvspec.spec.releases import Release
from kvspec.spec.rules import Violation

# --- what the caller knows -----------------------------------------------------------------------


@dataclass
class RequestContext:
    """What the caller knows besides the snapshot (all optional)."""

    layout: Layout | None = None
    requests: Mapping[str, Any] = field(default_factory=dict)
    shadow: Shadow | None = None
    pins: Mapping[int, int] = field(default_factory=dict)
    computed: Mapping[str, int] = field(default_factory=dict)  # request -> tokens it counts as computed
    # Blocks a connector's failed load left unfilled: under the recompute policy they stay cached and shared by
    # design (the first holder recomputes them, the others wait), so the rules on what cached and shared blocks
    # hold skip them -- never the rule on what a step reads (computed_content_sound).
    unfilled: frozenset[int] = frozenset()
    # The blocks full-attention groups took fresh since the last take_new_block_ids (see fresh_blocks).
    fresh: list[int] = field(default_factory=list)
    # What the prefix-cache stats count since the last make_prefix_cache_stats (see stats_records).
    since_stats: list[tuple[Any, ...]] = field(default_factory=list)
    # The release whose rules judge (chapter Releases): which operations the stats count.
    release: Release = releases.REFERENCE
    # What the rules derive from the requests alone, kept between operations while the requests are unchanged
    # (content-soundness's names of each request's hashes: _hash_names); never part of a verdict.
    memo: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class ManagerStep:
    """One manager operation as observed from outside: the call (arguments by
    name), the snapshots around it, and its result or refusal.
    ``expected_pulled`` is the target's own estimate of the blocks an
    ``allocate_slots`` takes from the free queue, when it offers one."""

    op: str
    args: dict[str, Any]
    before: ManagerSnapshot
    after: ManagerSnapshot
    result: Any = None
    error: BaseException | None = None
    expected_pulled: int | None = None
    computed_before: int | None = None  # the request's num_computed_tokens at the call
    events: tuple[Any, ...] = ()  # the KV events the operation emitted, where the caller collected them
    # The calls the target made to its metrics collector in the operation, as (call, block id) pairs
    # (call: "allocated", "accessed", "evicted", "reset" with block id None); None: it was given none.
    residency: tuple[tuple[str, int | None], ...] | None = None


def _computed_at_call(step: ManagerStep) -> int:
    """The request's ``num_computed_tokens`` when the operation was called
    (the caller may advance it before the rules look)."""
    if step.computed_before is not None:
        return step.computed_before
    return getattr(step.args.get("request"), "num_computed_tokens", 0)


def _computed_after_call(step: ManagerStep) -> int:
    """The tokens an ``allocate_slots`` counts as computed once it is done:
    ``num_computed_tokens + num_new_computed_tokens +
    num_external_computed_tokens`` (counts that are not ints left out: the
    call refuses them)."""
    counts = (_computed_at_call(step), step.args.get("num_new_computed_tokens", 0),
              step.args.get("num_external_computed_tokens", 0))
    return sum(c for c in counts if type(c) is int)


# --- registries ----------------------------------------------------------------------------------------

StateRule = Callable[[ManagerSnapshot, RequestContext], list[str]]
StepRule = Callable[[ManagerStep, RequestContext], list[str]]

REQUEST_STATE_RULES: dict[str, list[StateRule]] = {}
REQUEST_STEP_RULES: dict[str, list[StepRule]] = {}


def state_rule(name: str) -> Callable[[StateRule], StateRule]:
    def register(fn: StateRule) -> StateRule:
        REQUEST_STATE_RULES.setdefault(name, []).append(fn)
        fn.rule_name = name  # type: ignore[attr-defined]
        return fn

    return register


def step_rule(name: str) -> Callable[[StepRule], StepRule]:
    def register(fn: StepRule) -> StepRule:
        REQUEST_STEP_RULES.setdefault(name, []).append(fn)
        fn.rule_name = name  # type: ignore[attr-defined]
        return fn

    return register


# --- helpers over snapshots --------------------------------------------------------------------------------


def slots(snap: ManagerSnapshot):
    """Every (request, group, position, block) with a non-null block.

    Five rules walk the same snapshot's slots after each operation: the
    list is made once per snapshot (the latest one asked about, kept with a
    copy of its tables, so that a snapshot whose tables were changed since
    is walked again)."""
    global _SLOTS
    tables = snap.tables
    if _SLOTS is not None and _SLOTS[0] is snap and _SLOTS[1] == tables:
        return iter(_SLOTS[2])
    found = [(rid, g, i, b) for rid, groups in tables.items() for g, table in enumerate(groups)
             for i, b in enumerate(table) if b != NULL]
    _SLOTS = (snap, dict(tables), found)
    return iter(found)


_SLOTS: tuple[ManagerSnapshot, dict[str, Any], list[tuple[str, int, int, int]]] | None = None


def holders(snap: ManagerSnapshot) -> Counter[int]:
    """How many (request, group) slots hold each non-null block."""
    return Counter(b for _, _, _, b in slots(snap))


def _tables_of(snap: ManagerSnapshot, rid: str, num_groups: int) -> tuple[tuple[int, ...], ...]:
    return snap.tables.get(rid, tuple(() for _ in range(num_groups)))


def _unchanged(before: ManagerSnapshot, after: ManagerSnapshot) -> bool:
    return before.pool.without_null_ref() == after.pool.without_null_ref() and before.tables == after.tables


# --- state rules ---------------------------------------------------------------------------------------------------


@state_rule("ref-conservation")
def ref_conservation(snap: ManagerSnapshot, ctx: RequestContext) -> list[str]:
    """Every non-null block's reference count equals the number of
    (request, group) slots holding it, plus explicit pins; never negative."""
    count = holders(snap)
    for b, n in ctx.pins.items():
        count[b] += n
    return pool_rules.ref_conservation(snap.pool, count)


@state_rule("no-aliasing")
def no_aliasing(snap: ManagerSnapshot, ctx: RequestContext) -> list[str]:
    """A physical block sits in at most one (request, group) slot, unless it
    is shared as a cache hit: then every holder is in the same group at the
    same position (same position, same prefix) and, when the shadow is known,
    it holds what that position names for each holder."""
    where: dict[int, list[tuple[str, int, int]]] = {}
    for rid, g, i, b in slots(snap):
        where.setdefault(b, []).append((rid, g, i))
    problems = []
    for b, places in where.items():
        if len(places) < 2:
            continue
        rids = [rid for rid, _, _ in places]
        if len(set(rids)) < len(rids):
            problems.append(f"block {b} appears twice in one request's tables: {places}")
        if len({(g, i) for _, g, i in places}) > 1:
            problems.append(f"block {b} is held at different groups/positions: {places}")
        elif ctx.shadow is not None and ctx.requests and b not in ctx.unfilled:
            for rid, g, i in places:
                if rid in ctx.requests:
                    for p in ctx.shadow.holds(g, b, ctx.requests[rid], i):
                        problems.append(f"shared block {b} (group {g}) does not hold {rid}'s position {i}: {p}")
    return problems


@state_rule("content-soundness")
def cached_content_sound(snap: ManagerSnapshot, ctx: RequestContext) -> list[str]:
    """Every cached block holds exactly what its hash names: the tokens (and
    extra keys) of the position it was cached for -- checked against the
    shadow, for hashes named by a known request."""
    if ctx.shadow is None or ctx.layout is None or not ctx.requests:
        return []
    names = _hash_names(ctx)
    problems = []
    for b, key in snap.pool.key_of.items():
        if key in names and b not in ctx.unfilled:
            request, g, i = names[key]
            problems += [f"cached block {b} (group {g}, position {i}): {p}" for p in ctx.shadow.holds(g, b, request, i)]
    return problems


def _hash_names(ctx: RequestContext) -> dict[bytes, tuple[Any, int, int]]:
    """Every key a known request's blocks carry once cached, naming the
    first (request, group, position) it names -- requests in order, then
    groups, then positions.  Each request's own names are kept in
    ``ctx.memo`` with the hashes they were made from, and made again only
    when those hashes (or the layout) changed: a request's hashes change
    when its tokens do, a few operations in many."""
    layout = ctx.layout
    kept = ctx.memo.get("hash-names")
    if kept is None or kept[0] is not layout:
        kept = ctx.memo["hash-names"] = (layout, {})
    per_request = kept[1]
    mine = []
    for request in ctx.requests.values():
        hashes = tuple(request.block_hashes)
        entry = per_request.get(id(request))
        if entry is None or entry[0] is not request or entry[1] != hashes:
            own: dict[bytes, tuple[Any, int, int]] = {}
            for g in range(len(layout.views)):
                for i, h in enumerate(hashes_for(request, layout, g)):
                    own.setdefault(make_block_hash_with_group_id(h, g), (request, g, i))
            entry = per_request[id(request)] = (request, hashes, own)
        mine.append(entry[2])
    names: dict[bytes, tuple[Any, int, int]] = {}
    for own in reversed(mine):  # the first request naming a key wins
        names.update(own)
    return names


@state_rule("content-soundness")
def computed_content_sound(snap: ManagerSnapshot, ctx: RequestContext) -> list[str]:
    """A request that counts ``n`` tokens as computed holds, in every group,
    what its next step reads of them: the KV its own tokens produced (or the
    state after them), as the shadow records -- whether they were computed,
    hit in the cache or loaded.  (The caller says who counts what computed.)"""
    if ctx.shadow is None or ctx.layout is None or not ctx.computed:
        return []
    problems = []
    for rid, n in ctx.computed.items():
        request = ctx.requests.get(rid)
        if request is None or n == 0:
            continue
        tables = _tables_of(snap, rid, len(ctx.layout.views))
        for g in range(len(ctx.layout.views)):
            problems += [f"{rid} counts {n} tokens computed; group {g}: {p}"
                         for p in ctx.shadow.backs(g, tables[g], request, n)]
    return problems


@state_rule("tenant-isolation")
def shared_within_tenant(snap: ManagerSnapshot, ctx: RequestContext) -> list[str]:
    """Requests with different cache salts or LoRA adapters never share a block."""
    if not ctx.requests:
        return []
    by_block: dict[int, set[tuple[Any, Any]]] = {}
    for rid, _, _, b in slots(snap):
        if rid in ctx.requests:
            by_block.setdefault(b, set()).add(tenant(ctx.requests[rid]))
    return [f"block {b} is shared by tenants {sorted(map(str, t))}" for b, t in by_block.items() if len(t) > 1]


@state_rule("block-size-coherence")
def block_size_coherence(snap: ManagerSnapshot, ctx: RequestContext) -> list[str]:
    """A group of block size ``B`` uses hashes built from the hash block size
    ``H`` (``B % H == 0``) and converts tokens to blocks with its own ``B``:
    a cached block at position ``i`` of a request's table carries the
    request's hash of the prefix ``[0, (i+1)*B)`` -- or, from 0.26 (release
    delta ``partial-tail-entries``), that of a prefix ending at a hash-block
    boundary inside the block: a partial entry that is the block's own key,
    as when the prompt's tail is registered again after an eviction took
    the full key -- and the attention groups' tables of one request cover
    the same token count (``cdiv(T, B)`` blocks each, for one ``T``)."""
    layout = ctx.layout
    if layout is None:
        return []
    partial = ctx.release.has("partial-tail-entries")
    problems = []
    for g, group in enumerate(layout.views):
        if group.block_size % layout.hash_block_size or layout.scheduler_block_size % group.block_size:
            problems.append(f"group {g} block size {group.block_size} does not fit hash block size "
                            f"{layout.hash_block_size} / scheduler block size {layout.scheduler_block_size}")
    for rid, g, i, b in slots(snap):
        key = snap.pool.key_of.get(b)
        if key is None or rid not in ctx.requests:
            continue
        want = key_for(ctx.requests[rid], layout, g, i)
        if want is not None and key != want and not (partial and key in partial_keys_for(ctx.requests[rid], layout,
                                                                                          g, i)):
            problems.append(f"block {b} at position {i} of {rid} (group {g}) carries another position's hash")
    for rid, tables in snap.tables.items():
        spans = [(len(t) - 1) * layout.views[g].block_size for g, t in enumerate(tables)
                 if t and layout.views[g].kind in ATTENTION_KINDS]
        ends = [len(t) * layout.views[g].block_size for g, t in enumerate(tables)
                if t and layout.views[g].kind in ATTENTION_KINDS]
        if spans and max(spans) >= min(ends):
            problems.append(f"{rid}'s attention tables cover different token counts: "
                            f"{[len(t) for t in tables]} blocks")
    return problems


# --- step rules: the hit ----------------------------------------------------------------------------------------


def _hit_of(step: ManagerStep) -> tuple[Any, tuple[list[int], ...], int] | None:
    if step.op != "get_computed_blocks" or step.error is not None:
        return None
    tables, hit = step.result
    return step.args["request"], tables, hit


@step_rule("hit-soundness")
def hit_soundness(step: ManagerStep, ctx: RequestContext) -> list[str]:
    """A hit is at most ``num_tokens - 1`` (the last token is recomputed for
    its logits), a multiple of the hit alignment, 0 when caching is off or
    the request skips reading; every group reports ``hit / B`` blocks (cross
    attention none), each non-null one cached under the request's hash for
    its position; and every group can serve it (:func:`group_can_serve`)."""
    observed = _hit_of(step)
    layout = ctx.layout
    if observed is None or layout is None:
        return []
    request, tables, hit = observed
    peek_limit = eagle_peek_limit(request, layout, ctx.release)
    problems = []
    if hit < 0 or hit > max(request.num_tokens - 1, 0):
        problems.append(f"hit {hit} outside 0..{request.num_tokens - 1}")
    if hit and (not layout.enable_caching or getattr(request, "skip_reading_prefix_cache", False)):
        problems.append(f"hit {hit} although the cache is not read")
    if hit % layout.hit_alignment:
        problems.append(f"hit {hit} is not a multiple of {layout.hit_alignment}")
    if len(tables) != len(layout.views):
        return problems + [f"{len(tables)} block lists for {len(layout.views)} groups"]
    for g, (group, blocks) in enumerate(zip(layout.views, tables, strict=True)):
        want = 0 if group.kind == AttentionKind.CROSS_ATTENTION else hit // group.block_size
        if len(blocks) != want or len(blocks) * group.block_size not in (0, hit):
            problems.append(f"group {g} reports {len(blocks)} blocks ({len(blocks) * group.block_size} tokens) "
                            f"for hit {hit}")
        for i, b in enumerate(blocks):
            if b != NULL and step.before.pool.key_of.get(b) != key_for(request, layout, g, i):
                problems.append(f"hit block {b} at position {i} of group {g} is not cached for this request")
        if hit and not group_can_serve(step.before.pool, request, layout, g, hit, peek_limit):
            problems.append(f"group {g} ({group.kind}) cannot serve hit {hit}")
    return problems


@step_rule("hit-soundness")
def per_group_hits_sound(step: ManagerStep, ctx: RequestContext) -> list[str]:
    """``find_longest_cache_hit_per_group(r)`` -- each group's own longest
    hit, which a hybrid model's KV connector is given -- is sound group by
    group: within ``r``'s first ``num_tokens - 1`` tokens, its length the
    group's blocks times its block size, and every block that is not null
    holding ``r``'s own prefix at its position (as the shadow records)."""
    if step.op != "find_longest_cache_hit_per_group" or step.error is not None or step.result is None \
            or ctx.layout is None:
        return []
    request, (tables, lengths) = step.args["request"], step.result
    problems = []
    for g, (group, blocks, length) in enumerate(zip(ctx.layout.views, tables, lengths, strict=True)):
        if length != len(blocks) * group.block_size or length > request.num_tokens - 1:
            problems.append(f"group {g} reports a hit of {length} tokens with {len(blocks)} blocks of "
                            f"{group.block_size} for a request of {request.num_tokens} tokens")
        if ctx.shadow is not None:
            problems += [f"group {g}'s own hit block {b} (position {i}): {p}"
                         for i, b in enumerate(blocks) if b != NULL for p in ctx.shadow.holds(g, b, request, i)]
    return problems


@step_rule("hit-optimality")
def hit_optimality(step: ManagerStep, ctx: RequestContext) -> list[str]:
    """The hit equals the oracle's: the longest aligned length every group can
    serve from what is cached (:func:`oracle_hit_length`)."""
    observed = _hit_of(step)
    if observed is None or ctx.layout is None:
        return []
    request, _, hit = observed
    best = oracle_hit_length(step.before.pool, request, ctx.layout, ctx.release)
    return [] if hit == best else [f"hit {hit}, but the longest servable is {best}"]


@step_rule("content-soundness")
def hit_content_sound(step: ManagerStep, ctx: RequestContext) -> list[str]:
    """A hit block holds exactly the tokens and extra keys its position names
    for the request (against the shadow)."""
    observed = _hit_of(step)
    if observed is None or ctx.shadow is None:
        return []
    request, tables, _ = observed
    problems = []
    for g, blocks in enumerate(tables):
        for i, b in enumerate(blocks):
            if b != NULL:
                problems += [f"hit block {b} (group {g}, position {i}): {p}"
                             for p in ctx.shadow.holds(g, b, request, i)]
    return problems


@step_rule("content-soundness")
def hit_state_written(step: ManagerStep, ctx: RequestContext) -> list[str]:
    """A state-space hit is read at the start of the step that takes it, so
    its state must already exist: an allocation may not take a hit whose
    state was written during the current step (that step's forward pass
    computes it while the new request would read it).  A hit block the
    allocation released and reused for its own new state is no such read."""
    if step.op != "allocate_slots" or step.error is not None or step.result is None:
        return []
    hits, layout, shadow = step.args.get("new_computed_blocks"), ctx.layout, ctx.shadow
    if not hits or layout is None or shadow is None:
        return []
    request = step.args["request"]
    problems = []
    for g, (group, blocks) in enumerate(zip(layout.views, hits, strict=False)):
        if group.kind != AttentionKind.MAMBA:
            continue
        for i in reversed(range(len(blocks))):
            b = blocks[i]
            if b == NULL:
                continue
            if shadow.state_written_this_step(g, b) and not shadow.holds(g, b, request, i):
                problems.append(f"group {g} takes the state in block {b} as a hit in the step that writes it")
            break
    return problems


@step_rule("tenant-isolation")
def hit_within_tenant(step: ManagerStep, ctx: RequestContext) -> list[str]:
    """A hit block was written by the request's own tenant."""
    observed = _hit_of(step)
    if observed is None or ctx.shadow is None:
        return []
    request, tables, _ = observed
    mine = tenant(request)
    return [
        f"hit block {b} (group {g}) holds writes of {sorted(map(str, others - {mine}))}, the request is {mine}"
        for g, blocks in enumerate(tables)
        for b in blocks
        if b != NULL and (others := ctx.shadow.writers(g, b)) - {mine}
    ]


# --- step rules: allocation and release -------------------------------------------------------------------------


@step_rule("hash-map-consistency")
def stored_events_describe_their_blocks(step: ManagerStep, ctx: RequestContext) -> list[str]:
    """Each ``Stored`` event an operation emits describes blocks of one
    request as the request filled them: its parent is the hash of the block
    before the first (none from the request's first block), its tokens are
    the range's, its LoRA adapter and each block's extra keys the request's
    (:func:`~kvspec.spec.pool.stored_event`), and it names its group's kind
    and sliding window (:func:`~kvspec.kv_cache_interface.event_metadata`)
    -- so a consumer of the events, a KV-aware router, rebuilds the prefix
    tree the pool holds and tells the groups apart.  From 0.26 a partial
    entry's event (one hash block) describes the request too."""
    if ctx.layout is None:
        return []
    problems = []
    for event in step.events:
        if isinstance(event, Stored) and not any(_describes(event, r, ctx.layout, ctx.release)
                                                 for r in ctx.requests.values()):
            problems.append(f"a Stored event of group {event.group} ({len(event.block_hashes)} hashes, parent "
                            f"{event.parent_block_hash!r}, {len(event.token_ids)} tokens) describes no request's "
                            "blocks as the request filled them (parent, tokens, LoRA or extra keys)")
    return problems


def _describes(event: Stored, request: Any, layout: Layout, release: Release) -> bool:
    """Whether ``event`` is the one caching ``request``'s blocks would emit:
    blocks of its group's size -- or, from 0.26 (release delta
    ``partial-tail-entries``), one hash block: a partial entry's --,
    annotated with its group's kind."""
    if not 0 <= event.group < len(layout.views):
        return False
    sizes = {layout.views[event.group].block_size}
    if release.has("partial-tail-entries"):
        sizes.add(layout.hash_block_size)
    if event.block_size not in sizes:
        return False
    return (event.spec_kind, event.sliding_window) == event_metadata(layout.groups[event.group]) \
        and pool_rules.describes(event, request, layout.hash_block_size, release)


def _moving_blocks(view: GroupView) -> int:
    """How many blocks at the end of a table move up it instead of being
    released and taken anew: a Mamba align group's speculative blocks."""
    return view.num_speculative_blocks if view.kind == AttentionKind.MAMBA and view.mamba_cache_mode == "align" else 0


def _released(step: ManagerStep, rid: str, num_groups: int, layout: Layout | None) -> int:
    """How many blocks a request's operation released: blocks whose every
    reference left the request's slots (a Mamba align group's speculative
    blocks move up the table instead; they are not released)."""
    before, after = _tables_of(step.before, rid, num_groups), _tables_of(step.after, rid, num_groups)
    dropped: Counter[int] = Counter()
    for g, bt in enumerate(before):
        at = after[g] if g < len(after) else ()
        moving = _moving_blocks(layout.views[g]) if layout is not None else 0
        for i, b in enumerate(bt):
            if b != NULL and (i >= len(at) or at[i] != b) and i < len(bt) - moving:
                dropped[b] += 1
    return sum(1 for b, n in dropped.items() if step.before.pool.ref[b] == n)


def _release_calls(before: tuple[tuple[int, ...], ...], after: tuple[tuple[int, ...], ...]) -> list[list[int]]:
    """The free calls that null a request's entries from tables ``before`` to
    ``after``: group by group, each run of consecutive nulled positions, tail
    first, the latest run first."""
    calls = []
    for g, bt in enumerate(before):
        at = after[g] if g < len(after) else ()
        runs: list[list[int]] = []
        for i in (i for i, b in enumerate(bt) if b != NULL and i < len(at) and at[i] == NULL):
            if runs and runs[-1][-1] == i - 1:
                runs[-1].append(i)
            else:
                runs.append([i])
        calls += [[bt[i] for i in reversed(run)] for run in reversed(runs)]
    return calls


def _refused_release_problems(step: ManagerStep, layout: Layout | None) -> list[str]:
    """How a refused ``allocate_slots`` changed more than releasing its
    request's out-of-window blocks (see :func:`refusal_changes_nothing`)."""
    request = step.args.get("request")
    rid = getattr(request, "request_id", None)
    before, after = step.before, step.after
    if any(before.tables.get(r) != after.tables.get(r) for r in (set(before.tables) | set(after.tables)) - {rid}):
        return ["changed another request's tables"]
    n = len(before.tables.get(rid) or after.tables.get(rid) or ())
    bt, at = _tables_of(before, rid, n), _tables_of(after, rid, n)
    if [len(t) for t in bt] != [len(t) for t in at]:
        return [f"changed the lengths of {rid}'s tables"]
    changed = [(g, i, b, a) for g in range(n) for i, (b, a) in enumerate(zip(bt[g], at[g], strict=True)) if a != b]
    problems = [f"put block {a} at group {g}, position {i} (was {b})" for g, i, b, a in changed if a != NULL]
    if layout is not None:
        computed = _computed_after_call(step)
        prompt = getattr(request, "num_prompt_tokens", None)
        gone = [out_of_window(group, computed, prompt) for group in layout.views]
        problems += [f"released block {b} (group {g}, position {i}) inside the attention window"
                     for g, i, b, _ in changed if i not in gone[g]]
    expected = _after_frees(before.pool, _release_calls(bt, at))  # in any order: which blocks, not where
    if _any_order(expected).without_null_ref() != _any_order(after.pool).without_null_ref():
        problems.append("changed the pool beyond freeing the blocks it nulled")  # the order is free-order's
    return problems


@step_rule("content-soundness")
def released_out_of_window(step: ManagerStep, ctx: RequestContext) -> list[str]:
    """A request's block is released only once no future query of it reads
    the block's tokens: an accepted ``allocate_slots`` (after its
    ``num_computed_tokens + num_new_computed_tokens +
    num_external_computed_tokens`` tokens) or ``remove_skipped_blocks``
    (after ``total_computed_tokens``) releases positions out of the window
    only (:func:`out_of_window`; R-SWA's gap needs the prompt length).  A
    block released while still read would be reused and overwritten under
    the request: wrong KV, no error.  (A refused ``allocate_slots``:
    :func:`refusal_changes_nothing`.)"""
    if step.error is not None or ctx.layout is None:
        return []
    if step.op == "allocate_slots" and step.result is not None:
        request = step.args["request"]
        rid, prompt = request.request_id, getattr(request, "num_prompt_tokens", None)
        computed = _computed_after_call(step)
    elif step.op == "remove_skipped_blocks":
        rid, computed = step.args["request_id"], step.args["total_computed_tokens"]
        prompt = step.args.get("num_prompt_tokens")
    else:
        return []
    groups = ctx.layout.views
    before, after = _tables_of(step.before, rid, len(groups)), _tables_of(step.after, rid, len(groups))
    problems = []
    for g, (bt, at) in enumerate(zip(before, after, strict=False)):
        gone = out_of_window(groups[g], computed, prompt)
        kept = set(at)
        problems += [f"{step.op} released block {b} of {rid} (group {g}, position {i}) inside the attention window"
                     for i, b in enumerate(bt)
                     if b != NULL and i < len(at) and at[i] == NULL and b not in kept and i not in gone]
    return problems


@step_rule("no-aliasing")
def common_prefix_is_shared(step: ManagerStep, ctx: RequestContext) -> list[str]:
    """``get_num_common_prefix_blocks(r)`` -- the prefix cascade attention
    computes once for the whole batch -- never claims more than is shared:
    per group, at most the number of leading blocks of ``r``'s table that
    every request holding a table holds at the same positions.  An
    over-count makes cascade attention read one request's K/V as every
    request's prefix; fewer is allowed (vLLM answers 0 for windowed and Mamba
    groups, and counts requests whose tables are empty), a negative count is
    not."""
    if step.op != "get_num_common_prefix_blocks" or step.error is not None or step.result is None:
        return []
    rid = step.args.get("running_request_id")
    bound = shared_prefix(step.after.tables, rid, len(step.result))
    problems = []
    for g, (claimed, shared) in enumerate(zip(step.result, bound, strict=True)):
        if type(claimed) is not int or claimed < 0:
            problems.append(f"get_num_common_prefix_blocks({rid}) answers {claimed!r} for group {g}: not a count")
        elif claimed > shared:
            problems.append(f"get_num_common_prefix_blocks({rid}) claims {claimed} common blocks in group {g}; "
                            f"every request's table shares {shared}")
    return problems


def shared_prefix(tables: Mapping[str, Any], rid: str, num_groups: int) -> list[int]:
    """Per group, the leading blocks of ``rid``'s table that every request
    holding a table holds at the same positions (a null entry ends the
    prefix; 0 for a request holding no table): the most
    ``get_num_common_prefix_blocks(rid)`` may claim."""
    mine = tables.get(rid)
    bound = []
    for g in range(num_groups):
        shared = 0
        for i, b in enumerate(mine[g] if mine is not None and g < len(mine) else ()):
            if b == NULL or any(i >= len(t[g]) or t[g][i] != b for t in tables.values() if g < len(t)):
                break
            shared += 1
        bound.append(shared)
    return bound


@step_rule("allocation-accounting")
def usage_is_the_ledger(step: ManagerStep, ctx: RequestContext) -> list[str]:
    """``get_usage()`` -- what the scheduler and the metrics report as the KV
    cache's fill -- is the share of usable blocks (all but the null block)
    that are not free: ``1 - free / (num_blocks - 1)``."""
    if step.op != "get_usage" or step.error is not None or step.result is None:
        return []
    pool = step.after.pool
    usable = pool.num_blocks - 1
    ledger = 0.0 if usable == 0 else 1.0 - len(pool.free) / usable
    if abs(step.result - ledger) > 1e-9:
        return [f"get_usage() reports {step.result!r}; {len(pool.free)} of {usable} usable blocks are free "
                f"(usage {ledger!r})"]
    return []


@step_rule("content-soundness")
def released_in_time(step: ManagerStep, ctx: RequestContext) -> list[str]:
    """A block is released no later than the accepted ``allocate_slots``
    after which no query reads it: afterwards, every position of the
    request's table *as the call found it* that :func:`out_of_window` names
    for its ``num_computed_tokens + num_new_computed_tokens +
    num_external_computed_tokens`` tokens (a window's or chunk's past, a
    superseded Mamba state, R-SWA's gap) holds the null block.  A block held
    longer is a leak no error reveals: capacity the pool could give to
    others, until the request ends.  Blocks the call itself adds -- a prefix
    hit taken whole, as R-SWA's is -- are released by the next call.  (A
    bound, not an order: they may go earlier, at ``remove_skipped_blocks``.)"""
    if step.op != "allocate_slots" or step.error is not None or step.result is None or ctx.layout is None:
        return []
    request = step.args["request"]
    rid, prompt = request.request_id, getattr(request, "num_prompt_tokens", None)
    computed = _computed_after_call(step)
    groups = ctx.layout.views
    found = _tables_of(step.before, rid, len(groups))
    return [f"after allocate_slots {rid} still holds block {table[i]} (group {g}, position {i}), which no query "
            f"of its {computed} tokens reads"
            for g, table in enumerate(_tables_of(step.after, rid, len(groups)))
            for i in out_of_window(groups[g], computed, prompt) if i < min(len(table), len(found[g]))
            and table[i] != NULL]


@step_rule("allocation-accounting")
def refusal_changes_nothing(step: ManagerStep, ctx: RequestContext) -> list[str]:
    """A refused operation changes nothing.  An error changes no state at
    all.  A refused ``allocate_slots`` (it returns ``None``) changes nothing,
    except that the request's blocks that left the attention window are
    released first (as ``remove_skipped_blocks`` would), whether or not the
    allocation then fits: other requests' tables are unchanged; the
    request's tables keep their lengths, each entry staying or becoming the
    null block -- with a layout, only before the window of the request's
    ``num_computed_tokens + num_new_computed_tokens +
    num_external_computed_tokens`` tokens; and the pool is as if those
    blocks were freed (tail first, run by run): ref counts drop by exactly
    the nulled references, the blocks whose count reaches 0 join the free
    queue, and no hash is lost or added."""
    if step.error is not None:
        return [] if _unchanged(step.before, step.after) else [f"{step.op} raised but changed the state"]
    if step.op != "allocate_slots" or step.result is not None or _unchanged(step.before, step.after):
        return []
    return [f"allocate_slots returned None but {p}" for p in _refused_release_problems(step, ctx.layout)]


@step_rule("allocation-accounting")
def pulls_match_estimate(step: ManagerStep, ctx: RequestContext) -> list[str]:
    """An accepted ``allocate_slots`` takes from the free queue exactly the
    blocks the target estimated (``expected_pulled``, when given): the free
    count drops by the blocks taken minus those its removal released."""
    if step.op != "allocate_slots" or step.error is not None or step.result is None or step.expected_pulled is None:
        return []
    rid = step.args["request"].request_id
    released = _released(step, rid, len(step.result), ctx.layout)
    pulled = step.before.pool.num_free + released - step.after.pool.num_free
    if pulled != step.expected_pulled:
        return [f"allocate_slots took {pulled} blocks from the free queue, estimated {step.expected_pulled}"]
    return []


@step_rule("allocation-accounting")
def every_token_has_a_slot(step: ManagerStep, ctx: RequestContext) -> list[str]:
    """An accepted ``allocate_slots`` gives every token the step may write a
    slot in every attention group: the computed tokens (hits and connector
    tokens included), the new ones and the lookahead tokens a drafter writes,
    up to the model's length (out-of-window positions may be null)."""
    if step.op != "allocate_slots" or step.error is not None or step.result is None or ctx.layout is None:
        return []
    args, layout = step.args, ctx.layout
    computed = _computed_at_call(step) + (args.get("num_new_computed_tokens") or 0) + \
        (args.get("num_external_computed_tokens") or 0)
    need = min(computed + args["num_new_tokens"] + (args.get("num_lookahead_tokens") or 0), layout.max_model_len)
    tables = _tables_of(step.after, args["request"].request_id, len(layout.views))
    return [f"group {g} has {len(table)} blocks ({len(table) * group.block_size} slots) for {need} tokens"
            for g, (group, table) in enumerate(zip(layout.views, tables, strict=True))
            if group.kind in ATTENTION_KINDS and len(table) * group.block_size < need]


def impossible_allocation(args: Mapping[str, Any]) -> list[str]:
    """What makes ``allocate_slots(**args)`` impossible: the counts that are
    not non-negative ints, or else no tokens at all (empty: it is possible)."""
    counts = ("num_new_tokens", "num_new_computed_tokens", "num_lookahead_tokens",
              "num_external_computed_tokens", "num_encoder_tokens", "reserved_blocks")
    bad = [n for n in counts if n in args and (type(args[n]) is not int or args[n] < 0)]
    if not bad and args.get("num_new_tokens") == 0 and args.get("num_external_computed_tokens", 0) == 0:
        bad = ["num_new_tokens == 0"]
    return bad


@step_rule("allocation-accounting")
def impossible_is_refused(step: ManagerStep, ctx: RequestContext) -> list[str]:
    """A negative count or no tokens at all is refused, never applied."""
    if step.op != "allocate_slots" or step.error is not None:
        return []
    bad = impossible_allocation(step.args)
    return [f"allocate_slots accepted impossible input: {bad}"] if bad else []


def taken_blocks(step: ManagerStep, layout: Layout) -> list[tuple[list[int], list[int]]]:
    """Per group, what an accepted ``allocate_slots`` took, in table order:
    the hit blocks it kept (touched: a hit out of the window is not) and the
    blocks it took fresh from the free queue.  Null blocks are neither."""
    if step.op != "allocate_slots" or step.error is not None or step.result is None:
        return [([], []) for _ in layout.views]
    rid = step.args["request"].request_id
    hits = step.args.get("new_computed_blocks") or ()
    before, after = _tables_of(step.before, rid, len(layout.views)), _tables_of(step.after, rid, len(layout.views))
    taken = []
    for g in range(len(layout.views)):
        added = after[g][len(before[g]):]
        num_hits = 0 if before[g] or g >= len(hits) else len(hits[g])  # only a request's first allocation hits
        moving = _moving_blocks(layout.views[g])
        moved = set(before[g][len(before[g]) - moving:]) if moving else set()  # up the table, not taken anew
        taken.append(([b for b in added[:num_hits] if b != NULL],
                      [b for b in added[num_hits:] if b != NULL and b not in moved]))
    return taken


_FULL_ATTENTION_ONLY = frozenset({AttentionKind.FULL_ATTENTION})
_EVERY_ATTENTION_KIND = frozenset(kind for kind in AttentionKind if kind != AttentionKind.MAMBA)


def fresh_blocks(step: ManagerStep, layout: Layout, release: Release = releases.REFERENCE) -> list[int]:
    """The blocks an accepted ``allocate_slots`` took fresh from the free
    queue (not as hits) for full-attention groups -- the blocks the worker
    zeroes before the step runs -- group by group, in table order.  From
    release delta ``zeroing-with-mamba-only`` (0.26) the worker zeroes them
    only for a model with a Mamba group: for any other, none; from delta
    ``zeroing-every-attention-group`` (0.28) those of every group but Mamba."""
    if release.has("zeroing-with-mamba-only") and not any(v.kind == AttentionKind.MAMBA for v in layout.views):
        return []
    zeroed = _EVERY_ATTENTION_KIND if release.has("zeroing-every-attention-group") else _FULL_ATTENTION_ONLY
    return [b for group, (_, fresh) in zip(layout.views, taken_blocks(step, layout), strict=True)
            if group.kind in zeroed for b in fresh]


def stats_records(step: ManagerStep, layout: Layout, release: Release = releases.REFERENCE) -> list[tuple[Any, ...]]:
    """What an operation adds to the prefix-cache stats: a lookup
    (``get_computed_blocks`` with caching on, for a request that reads the
    cache) as ``("lookup", num_tokens, hit_tokens, preempted)``, a
    ``reset_prefix_cache`` that succeeded as ``("reset",)``.  From release
    delta ``stats-at-admission`` (0.27) the lookup records nothing; the
    scheduler's ``record_prefix_cache_stats(request, num_hits)`` for an
    admitted request records the same tuple, ``num_hits`` as its hits."""
    if step.error is not None:
        return []
    if step.op == "reset_prefix_cache":
        return [("reset",)] if step.result is True else []
    at_admission = release.has("stats-at-admission")
    if step.op != ("record_prefix_cache_stats" if at_admission else "get_computed_blocks"):
        return []
    request = step.args.get("request")
    if not layout.enable_caching or request.skip_reading_prefix_cache:
        return []
    hits = step.args["num_hits"] if at_admission else step.result[1]
    return [("lookup", request.num_tokens, hits, request.num_preemptions > 0)]


def expected_stats(records: list[tuple[Any, ...]]) -> dict[str, Any]:
    """The prefix-cache stats ``records`` (:func:`stats_records`) make: each
    lookup is one request, its tokens queries and its hit tokens hits --
    counted apart for a request that was preempted before."""
    stats = dict.fromkeys(("requests", "queries", "hits", "preempted_requests", "preempted_queries",
                           "preempted_hits"), 0)
    stats["reset"] = any(r[0] == "reset" for r in records)
    for _, tokens, hits, preempted in (r for r in records if r[0] == "lookup"):
        prefix = "preempted_" if preempted else ""
        stats[prefix + "requests"] += 1
        stats[prefix + "queries"] += tokens
        stats[prefix + "hits"] += hits
    return stats


@step_rule("allocation-accounting")
def stats_count_the_lookups(step: ManagerStep, ctx: RequestContext) -> list[str]:
    """``make_prefix_cache_stats()`` -- the prefix-cache hit rate the metrics
    report -- counts exactly the lookups since the previous call: per lookup
    one request, its ``num_tokens`` as queries and its hit tokens as hits,
    apart for a request preempted before; ``reset`` is set exactly when a
    ``reset_prefix_cache`` succeeded meanwhile.  (``None``: the target keeps
    no stats.)  From release delta ``stats-at-admission`` (0.27) a lookup
    counts when its request is admitted (``record_prefix_cache_stats``), not
    when it is made: see :func:`stats_records`."""
    if step.op != "make_prefix_cache_stats" or step.error is not None or step.result is None:
        return []
    expected = expected_stats(ctx.since_stats)
    got = {name: step.result.get(name) for name in expected}
    if got != expected:
        wrong = ", ".join(f"{k} {got[k]!r} (expected {v!r})" for k, v in expected.items() if got[k] != v)
        return [f"make_prefix_cache_stats() reports {wrong} for the lookups since the previous call"]
    return []


def expected_residency(step: ManagerStep, layout: Layout) -> list[tuple[str, int | None]]:
    """The calls a metrics collector hears in ``step`` (see
    :func:`metrics_follow_the_blocks`), in the order they are due."""
    if step.error is not None:
        return []
    if step.op == "allocate_slots":
        calls: list[tuple[str, int | None]] = []
        for kept, fresh in taken_blocks(step, layout):
            calls += [("accessed", b) for b in kept]
            for b in fresh:
                calls += [("evicted", b), ("allocated", b)] if layout.enable_caching else [("allocated", b)]
        return calls
    if step.op == "evict_blocks":
        return [("evicted", b) for b in sorted(step.args["block_ids"])]
    if step.op == "reset_prefix_cache":
        return [("reset", None)] if step.result is True else []
    return []


@step_rule("allocation-accounting")
def metrics_follow_the_blocks(step: ManagerStep, ctx: RequestContext) -> list[str]:
    """A metrics collector given to the manager (vLLM's
    ``KVCacheMetricsCollector``: block lifetimes, idle times, reuse gaps)
    hears of every block's residency as the pool lives it: each block taken
    fresh from the free queue is ``allocated`` -- with caching on, its
    previous residency ``evicted`` just before --, each hit block kept is
    ``accessed``, each id ``evict_blocks`` names is ``evicted``, a
    ``reset_prefix_cache`` that succeeds ``reset``s it; nothing else.  Calls
    naming the null block are ignored (it is never allocated); the calls'
    order matters only between a block's ``evicted`` and its ``allocated``."""
    if step.residency is None or ctx.layout is None:
        return []
    heard = [call for call in step.residency if call[1] != NULL]
    due = [call for call in expected_residency(step, ctx.layout) if call[1] != NULL]
    problems = []
    if heard != due:  # equal lists: nothing missed, nothing unduly (the counts are compared only where they differ)
        heard_n, due_n = Counter(heard), Counter(due)
        problems += [f"{step.op}: the metrics collector missed {call} {b}"
                     for call, b in sorted((due_n - heard_n).elements(), key=str)]
        problems += [f"{step.op}: the metrics collector heard {call} {b} unduly"
                     for call, b in sorted((heard_n - due_n).elements(), key=str)]
    for i, (call, b) in enumerate(heard):
        if call == "allocated" and ctx.layout.enable_caching and (i == 0 or heard[i - 1] != ("evicted", b)):
            problems.append(f"{step.op}: block {b} allocated without its previous residency evicted just before")
    return problems


@step_rule("content-soundness")
def zeroed_blocks_are_fresh(step: ManagerStep, ctx: RequestContext) -> list[str]:
    """``take_new_block_ids`` -- the blocks the worker zeroes before the
    step's kernels read them -- names exactly the blocks full-attention
    groups took fresh from the free queue since the previous call, each as
    often as it was taken: a fresh block left out keeps its last owner's
    KV, and a hit named loses the KV it was cached for."""
    if step.op != "take_new_block_ids" or step.error is not None or ctx.layout is None:
        return []
    named, fresh = Counter(step.result), Counter(ctx.fresh)
    problems = [f"block {b} is zeroed but was not taken fresh" for b in sorted(named - fresh)]
    return problems + [f"block {b} was taken fresh but is not zeroed" for b in sorted(fresh - named)]


@step_rule("content-soundness")
def connector_saves_what_was_computed(step: ManagerStep, ctx: RequestContext) -> list[str]:
    """``get_block_ids_for_computed_tokens(r, n)`` -- the blocks a KV
    connector saves when ``r`` finishes -- are, per group, the leading
    blocks of ``r``'s own table: for attention, the blocks of its ``n``
    computed tokens and no more, holding their KV (as the shadow records;
    positions out of the window may be null); for the other kinds the
    whole table."""
    if step.op != "get_block_ids_for_computed_tokens" or step.error is not None or ctx.layout is None:
        return []
    rid, n = step.args["request_id"], step.args["num_computed_tokens"]
    tables, problems = _tables_of(step.before, rid, len(ctx.layout.views)), []
    for g, (group, saved, table) in enumerate(zip(ctx.layout.views, step.result, tables, strict=True)):
        want = blocks_to_save(table, group.kind, group.block_size, n)
        if list(saved) != want:
            problems.append(f"group {g}: saves {list(saved)} for {n} tokens, not {want} of {rid}'s table "
                            f"{list(table)}")
        elif group.kind in ATTENTION_KINDS and ctx.shadow is not None and rid in ctx.requests:
            problems += [f"group {g}: {p}" for p in ctx.shadow.backs(g, saved, ctx.requests[rid], n)]
    return problems


@step_rule("no-eviction-in-use")
def no_eviction_in_use(step: ManagerStep, ctx: RequestContext) -> list[str]:
    """No operation but ``evict_blocks`` / ``reset_prefix_cache`` makes a
    block in use forget its hash: neither a block that stays in the same slot,
    nor a hit that ``allocate_slots`` takes (all groups' hits are taken before
    any group allocates for external tokens)."""
    if step.error is not None or step.op in ("evict_blocks", "reset_prefix_cache"):
        return []
    def stays(rid: str, g: int, i: int, b: int) -> bool:
        tables = step.after.tables.get(rid)
        return tables is not None and i < len(tables[g]) and tables[g][i] == b

    protected = {b for rid, g, i, b in slots(step.before) if stays(rid, g, i, b)}
    if step.op == "allocate_slots" and step.result is not None and step.args.get("new_computed_blocks"):
        rid = step.args["request"].request_id
        for g, blocks in enumerate(step.args["new_computed_blocks"]):
            protected |= {b for i, b in enumerate(blocks) if b != NULL and stays(rid, g, i, b)}
    before_keys, after_keys = step.before.pool.key_of, step.after.pool.key_of
    return [f"block {b} in use lost its hash during {step.op}"
            for b in sorted(protected) if b in before_keys and after_keys.get(b) != before_keys[b]]


def _any_order(pool: PoolSnapshot) -> PoolSnapshot:
    """The pool with its free queue as a set: what is free, not in which order."""
    return replace(pool, free=tuple(sorted(pool.free)))


def _after_frees(before: PoolSnapshot, calls: list[list[int]], caching: bool = True,
                 release: Release = releases.REFERENCE) -> PoolSnapshot:
    """The pool after ``free_blocks`` of each call in turn (null entries
    skipped): ref counts drop, blocks reaching 0 join the free queue --
    unhashed ones at the head, cached ones at the tail (:func:`requeue`)."""
    ref, free = list(before.ref), list(before.free)
    for call in calls:
        plain, cached = [], []
        for b in call:
            if b == NULL:
                continue
            ref[b] -= 1
            if ref[b] == 0:
                (cached if b in before.key_of else plain).append(b)
        free = requeue(free, plain, cached, caching, release)
    return PoolSnapshot(before.num_blocks, tuple(ref), tuple(free), before.key_of, before.table, before.partial_of)


@step_rule("free-order")
def free_order(step: ManagerStep, ctx: RequestContext) -> list[str]:
    """Freed blocks go back tail-first within each group, group by group:
    ``free`` releases each table from its last block to its first; removing
    skipped blocks releases each run of consecutive positions from its last
    block, the latest run first.  Blocks without a hash go to the head of the
    free queue (reused first), cached ones to the tail (LRU).  An allocation
    that releases out-of-window blocks and then refuses releases them so too."""
    refused_allocation = step.op == "allocate_slots" and step.result is None  # it may release, then refuse
    if step.error is not None or step.op not in ("free", "remove_skipped_blocks") and not refused_allocation:
        return []
    if step.op == "free":
        rid = getattr(step.args["request"], "request_id", None)
        calls = [list(reversed(t)) for t in step.before.tables.get(rid, ())]
    elif refused_allocation:
        rid = getattr(step.args["request"], "request_id", None)
        calls = _release_calls(step.before.tables.get(rid, ()), step.after.tables.get(rid, ()))
    else:
        rid = step.args["request_id"]
        calls = _release_calls(step.before.tables.get(rid, ()), step.after.tables.get(rid, ()))
    expected = _after_frees(step.before.pool, calls, ctx.layout is None or ctx.layout.enable_caching,
                            ctx.release).free
    if expected == step.after.pool.free:
        return []
    return [f"after {step.op} the free queue is {list(step.after.pool.free)}, expected {list(expected)}"]


# --- entry points ---------------------------------------------------------------------------------------------------


def _context(layout, requests, shadow, pins, ctx) -> RequestContext:
    if ctx is not None:
        return ctx
    return RequestContext(layout=layout, requests=requests or {}, shadow=shadow, pins=pins or {})


_OWN_REF_CONSERVATION = frozenset({"ref-conservation"})


def check_request_state(
    snap: ManagerSnapshot,
    layout: Layout | None = None,
    requests: Mapping[str, Any] | None = None,
    shadow: Shadow | None = None,
    pins: Mapping[int, int] | None = None,
    ctx: RequestContext | None = None,
) -> list[Violation]:
    """Every state rule against one manager snapshot: the pool's own rules
    (:mod:`kvspec.spec.rules`, ref counts against the tables) and the
    request-level ones above."""
    ctx = _context(layout, requests, shadow, pins, ctx)
    out = pool_rules.check_state(snap.pool, leave_out=_OWN_REF_CONSERVATION)  # judged below, with the holders
    for name, fns in REQUEST_STATE_RULES.items():
        out += [Violation(name, p) for fn in fns for p in fn(snap, ctx)]
    return out


def check_request_step(
    step: ManagerStep,
    layout: Layout | None = None,
    requests: Mapping[str, Any] | None = None,
    shadow: Shadow | None = None,
    ctx: RequestContext | None = None,
) -> list[Violation]:
    """Every step rule against one manager operation."""
    ctx = _context(layout, requests, shadow, None, ctx)
    return [Violation(name, p) for name, fns in REQUEST_STEP_RULES.items() for fn in fns for p in fn(step, ctx)]


__all__ = [
    "REQUEST_STATE_RULES",
    "REQUEST_STEP_RULES",
    "GroupView",
    "Layout",
    "ManagerStep",
    "RequestContext",
    "Shadow",
    "check_request_state",
    "check_request_step",
    "group_can_serve",
    "oracle_hit_length",
]
