"""Chapter 10: any engine's prefix cache, seen through what its blocks hold.

Chapters 1-9 observe a pool the way vLLM keeps one: ref counts, a null
block, a free queue, a table of chain hashes.  Other engines keep the same
thing differently -- SGLang a radix tree of token runs whose nodes carry
lock counts, LMDeploy a trie of blocks with one root per LoRA adapter -- and
have no null block, no free *queue* (a stack, or a free list), and no hash
at all: a node is named by its path from the root.  Their rules are the
same ones.  This chapter states them over an observation every such engine
can give, the **content view**:

- ``blocks``: the ids of the usable blocks, as the engine numbers them
  (SGLang: pages, a page of one token being a block of size 1, from id 1:
  id 0 is its padding slot; vLLM: 1 .. n - 1 beside the null block;
  LMDeploy: 0 .. n - 1);
- ``free``: the blocks the engine can hand out without evicting anything;
- ``tables``: each running request's blocks, position by position -- block
  ``i`` holds tokens ``i*B .. (i+1)*B - 1`` of the request; ``None`` at a
  position whose block the engine released (it left a sliding window);
- ``holds``: the engine's own count of the requests holding each block (a
  radix node's lock count, a trie block's ref count less the trie's own
  reference) -- what ref-conservation judges;
- ``cached``: the blocks the prefix index can serve, each with its
  **content key** ``(tenant, tokens)``: the tenant (LoRA adapter, cache
  salt or namespace; ``None`` for none) and every token from the start of
  the sequence through the block's last slot.  A chain hash names exactly
  this (chapter 1.1): two blocks with equal keys hold the same KV, wherever
  the engine keeps the name.

The **content** a block holds is what was written into it: the machine
driving the engine plays the model runner and records, for each block, the
key of the tokens a request wrote there (:class:`Written`).  Every rule
below compares the view with that record.  They are the catalogue's rules
(:mod:`kvspec.spec.catalogue`), stated for this view; the statements are
unchanged, only what is observed differs.

What this view cannot see, and therefore does not judge: the order of
reuse and eviction (free-order: each engine's policy), the null block
(null-exclusion: none of these engines has one), reset, and the events'
format.  Hit optimality is judged (at L2) against the longest prefix the
view's ``cached`` index could serve before the lookup, under the engine's
own cap (a request always recomputes at least one token; an engine may cap
further, and says how: :attr:`CacheLayout.max_hit`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from kvspec.spec.rules import Violation

CACHE_RULES = ("ref-conservation", "free-queue-consistency", "hash-map-consistency", "content-soundness",
               "no-aliasing", "tenant-isolation", "hit-soundness", "no-eviction-in-use", "allocation-accounting",
               "hit-optimality")
"""The catalogue's rules this chapter judges.  Not judged: null-exclusion
(no null block), free-order (each engine's policy), reset and
block-size-coherence (one block size)."""

Key = tuple[Any, tuple[int, ...]]
"""A content key: ``(tenant, tokens from the sequence's start through the block's end)``."""


def content_key(tenant: Any, tokens: Sequence[int], end: int) -> Key:
    """The key of a block whose last slot holds token ``end - 1`` of a
    sequence ``tokens`` of ``tenant``: the KV of a token depends on every
    token before it and on the tenant, so this names the block's content."""
    return (tenant, tuple(tokens[:end]))


@dataclass(frozen=True)
class CacheView:
    """Everything observable about an engine's cache between two operations."""

    blocks: frozenset[int]
    block_size: int
    free: frozenset[int]
    tables: Mapping[str, tuple[int | None, ...]] = field(hash=False)
    holds: Mapping[int, int] = field(hash=False)
    cached: Mapping[int, Key] = field(hash=False)

    def held(self) -> Counter[int]:
        """How many (request, position) slots hold each block."""
        return Counter(b for table in self.tables.values() for b in table if b is not None)


@dataclass(frozen=True)
class GroupedView:
    """The content view of an engine that keeps several groups of blocks per
    request -- a hybrid model's full-attention pool beside its sliding-window
    (or recurrent-state) pool, each token with a slot in each (chapter 10,
    "Several groups per request").  ``groups`` names each group's own
    :class:`CacheView` -- its blocks, free blocks, a request's row in that
    group (``None`` where the group does not hold the position: a window
    released it), its hold counts and its index -- and ``windows`` the
    window a group's reads are limited to (``None``: every position is
    read).  Block ids are distinct across groups (an adapter names them
    ``(group, id)``): the model runner's record is one map.

    Every state rule holds in every group, judged with the group's window.
    A hit is one length for every group: it is sound when every group's
    blocks the next token reads are the request's own, and optimal when no
    longer length is served by every group at once.  The properties below
    are the groups together, for what reads a view whole (coverage, a
    request's slots): ``tables`` is the first group's, whose rows have a
    block at every position."""

    groups: Mapping[str, CacheView] = field(hash=False)
    windows: Mapping[str, int | None] = field(hash=False)

    @property
    def block_size(self) -> int:
        return self._first.block_size

    @property
    def _first(self) -> CacheView:
        return next(iter(self.groups.values()))

    @property
    def blocks(self) -> frozenset[Any]:
        return frozenset().union(*(g.blocks for g in self.groups.values()))

    @property
    def free(self) -> frozenset[Any]:
        return frozenset().union(*(g.free for g in self.groups.values()))

    @property
    def tables(self) -> Mapping[str, tuple[Any, ...]]:
        return self._first.tables

    @property
    def holds(self) -> Mapping[Any, int]:
        return {b: n for g in self.groups.values() for b, n in g.holds.items()}

    @property
    def cached(self) -> Mapping[Any, Key]:
        return {b: k for g in self.groups.values() for b, k in g.cached.items()}

    def held(self) -> Counter[Any]:
        return sum((g.held() for g in self.groups.values()), Counter())

    def each(self) -> list[tuple[str, CacheView, int | None]]:
        """Each group: its name, its view and its window."""
        return [(name, view, self.windows.get(name)) for name, view in self.groups.items()]


def groups_of(view: CacheView | GroupedView, window: int | None = None) -> list[tuple[str, CacheView, int | None]]:
    """A view's groups, each with its window: one (``window``) for a plain view."""
    return view.each() if isinstance(view, GroupedView) else [("", view, window)]


def _in_group(name: str, found: list[Violation]) -> list[Violation]:
    return [Violation(v.rule, f"[{name}] {v.message}") if name else v for v in found]


@runtime_checkable
class CacheTarget(Protocol):
    """An engine's prefix cache and allocator, driven as its scheduler
    drives them, one request at a time.  Every request's tokens are
    computed as soon as it has slots for them (the model runner is not
    modelled beyond writing their KV).

    An operation that cannot be done for lack of memory returns ``None`` /
    ``False``: the request then holds nothing, and no other request's
    blocks changed (an engine may have evicted unheld cached blocks
    trying).  The machine sends only what a scheduler sends: no bad input.
    """

    block_size: int

    def admit(self, request_id: str, tokens: Sequence[int], tenant: Any) -> int | None:
        """Requires: ``request_id`` is not running.  Guarantees: the longest
        prefix the cache serves (a multiple of ``block_size``, at most
        ``len(tokens) - 1``) is taken as the hit, blocks for the rest are
        allocated -- evicting unheld cached blocks if the engine must -- and
        the hit length in tokens is returned; ``None`` when the rest does
        not fit even after eviction (nothing changed)."""

    def append(self, request_id: str, tokens: Sequence[int]) -> bool:
        """Requires: ``request_id`` is running.  Guarantees: the request
        grows by ``tokens`` (a decode step or a prefill chunk), with slots
        for them; ``False`` when they do not fit: the engine preempted the
        request, and (the client giving it up) it holds nothing."""

    def cache(self, request_id: str) -> None:
        """The request's full blocks so far enter the prefix index (a
        chunked prefill's insertion); the request keeps running."""

    def finish(self, request_id: str) -> None:
        """The request ends: its full blocks enter the index, it holds nothing."""

    def preempt(self, request_id: str) -> None:
        """The request is preempted (retracted): it holds nothing; what stays
        cached is the engine's policy."""

    def evict(self, num_blocks: int) -> int:
        """Evict up to ``num_blocks`` cached blocks nobody holds; the number evicted."""

    def view(self) -> CacheView:
        """The content view now."""


@dataclass(frozen=True)
class CacheLayout:
    """One configuration of an engine's cache, as a conformance run builds it.

    ``tenants`` are the tenants requests are drawn from (``None``: no
    adapter); ``window`` a sliding window in tokens (blocks wholly before
    it are no longer read, so their content is not judged); ``max_hit`` an
    engine's own cap on a hit, in tokens (``None``: the rule's own,
    ``len(tokens) - 1``); ``groups`` the groups each request has a row in
    when it has several (a hybrid model's ``("full", "swa")``: the window
    is the ``swa`` group's; the view is then a :class:`GroupedView`), empty
    for one."""

    name: str
    block_size: int
    num_blocks: int
    tenants: tuple[Any, ...] = (None,)
    window: int | None = None
    max_hit: int | None = None
    groups: tuple[str, ...] = ()
    description: str = ""
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)


Written = dict[int, Key]
"""The model runner's record: the key of the tokens last written into each block."""


# --- state rules ------------------------------------------------------------------------------


def ref_conservation(view: CacheView) -> list[str]:
    """ref-conservation: a block's hold count is the number of request
    slots that hold it; it is never negative."""
    held = view.held()
    problems = [f"block {b} holds {n}, but {held.get(b, 0)} request slots hold it"
                for b, n in sorted(view.holds.items()) if n != held.get(b, 0)]
    problems += [f"block {b} is in {held[b]} request slots, but its hold count is 0"
                 for b in sorted(held) if b not in view.holds]
    return problems


def free_consistency(view: CacheView) -> list[str]:
    """free-queue-consistency: a free block is held by no request and
    served by no index entry; every block is free, held or cached -- none
    is lost."""
    held = view.held()
    problems = [f"free block {b} is held by a request" for b in sorted(view.free) if b in held]
    problems += [f"free block {b} is still cached" for b in sorted(view.free) if b in view.cached]
    problems += [f"block id {b} is no usable block" for b in sorted((set(held) | set(view.cached) | view.free)
                                                                     - view.blocks)]
    lost = view.blocks - view.free - set(held) - set(view.cached)
    if lost:
        problems.append(f"blocks {sorted(lost)[:8]} are neither free, held nor cached: lost to the pool")
    return problems


def index_holds_what_it_names(view: CacheView, written: Written) -> list[str]:
    """hash-map-consistency: every cached block holds exactly the content
    its key names -- a whole block of tokens of that tenant's sequence."""
    problems = []
    for b, key in sorted(view.cached.items()):
        tokens = key[1]
        if not tokens or len(tokens) % view.block_size:
            problems.append(f"cached block {b}'s key covers {len(tokens)} tokens, not whole blocks of "
                            f"{view.block_size}")
        elif written.get(b) != key:
            problems.append(f"cached block {b} is served as {describe_key(key)} but holds "
                            f"{describe_key(written.get(b))}")
    return problems


def computed_content_sound(view: CacheView, requests: Mapping[str, tuple[Any, Sequence[int]]],
                           written: Written, window: int | None = None) -> list[str]:
    """content-soundness: every full block a running request still reads
    holds its own tokens and tenant (``requests``: each one's tenant and
    tokens so far, all computed)."""
    problems = []
    B = view.block_size  # noqa: N806 (the spec's name for the block size)
    for request_id, (tenant, tokens) in requests.items():
        table = view.tables.get(request_id, ())
        if len(table) * B < len(tokens):
            problems.append(f"{request_id} has {len(tokens)} tokens but slots for {len(table) * B}")
            continue
        for i in range(first_read(len(tokens), B, window), len(tokens) // B):
            want = content_key(tenant, tokens, (i + 1) * B)
            if written.get(table[i]) != want:
                problems.append(f"{request_id}'s block {table[i]} at position {i} holds "
                                f"{describe_key(written.get(table[i]))}, not its own {describe_key(want)}")
                break
    return problems


def shared_within_content(view: CacheView, requests: Mapping[str, tuple[Any, Sequence[int]]]) -> list[Violation]:
    """no-aliasing and tenant-isolation: a block two requests hold is one
    the index serves, at the same position of both, for the same tenant and
    the same tokens."""
    where: dict[int, list[tuple[str, int]]] = {}
    for request_id, table in view.tables.items():
        for i, b in enumerate(table):
            if b is not None:
                where.setdefault(b, []).append((request_id, i))
    problems = []
    for b, slots in sorted(where.items()):
        if len(slots) < 2:
            continue
        (first, i), *others = slots
        for other, j in others:
            if requests[first][0] != requests[other][0]:
                problems.append(Violation("tenant-isolation", f"block {b} is shared by {first} (tenant "
                                          f"{requests[first][0]!r}) and {other} (tenant {requests[other][0]!r})"))
            elif i != j or content_key(*requests[first], (i + 1) * view.block_size) != \
                    content_key(*requests[other], (j + 1) * view.block_size):
                problems.append(Violation("no-aliasing", f"block {b} is position {i} of {first} and position {j} "
                                          f"of {other}, whose contents differ"))
    return problems


def first_read(num_tokens: int, block_size: int, window: int | None) -> int:
    """The first table position the request's next token (token
    ``num_tokens``) reads: 0, or with a sliding window of ``window`` tokens
    the block of token ``num_tokens - window + 1``."""
    return 0 if window is None else max(0, num_tokens - window + 1) // block_size


def check_view(view: CacheView | GroupedView, requests: Mapping[str, tuple[Any, Sequence[int]]], written: Written,
               window: int | None = None) -> list[Violation]:
    """Every state rule of this chapter, on one view (on each group of a grouped one, with its window)."""
    if isinstance(view, GroupedView):
        return [v for name, group, w in view.each() for v in _in_group(name, check_view(group, requests, written, w))]
    out = [Violation("ref-conservation", p) for p in ref_conservation(view)]
    out += [Violation("free-queue-consistency", p) for p in free_consistency(view)]
    out += [Violation("hash-map-consistency", p) for p in index_holds_what_it_names(view, written)]
    out += [Violation("content-soundness", p) for p in computed_content_sound(view, requests, written, window)]
    return out + shared_within_content(view, requests)


# --- step rules -------------------------------------------------------------------------------


def servable(view: CacheView, tenant: Any, tokens: Sequence[int], cap: int) -> int:
    """The longest prefix, in tokens, that ``view``'s index serves for a
    sequence: whole blocks, each cached under the sequence's own key, from
    the first on, no longer than ``cap``."""
    keys = set(view.cached.values())
    B = view.block_size  # noqa: N806
    n = 0
    while n + B <= cap and content_key(tenant, tokens, n + B) in keys:
        n += B
    return n


def servable_groups(view: GroupedView, tenant: Any, tokens: Sequence[int], cap: int) -> int:
    """The longest prefix, in tokens, every group of ``view`` serves at once:
    whole blocks up to ``cap``, each group holding, cached under the
    sequence's own keys, every block the next token would read (from its
    window's first on).  Not monotone -- a window's group may serve a long
    prefix and not a shorter one, whose window falls where it holds
    nothing -- so each length is tried."""
    B = view.block_size  # noqa: N806
    keys = {name: set(group.cached.values()) for name, group in view.groups.items()}
    best = 0
    for n in range(B, cap + 1, B):
        if all(content_key(tenant, tokens, (i + 1) * B) in keys[name]
               for name, _, w in view.each() for i in range(first_read(n, B, w), n // B)):
            best = n
    return best


def hit_cap(num_tokens: int, block_size: int, engine_cap: int | None = None) -> int:
    """The most a hit may cover: at most ``num_tokens - 1`` (one token is
    always computed, to sample from), whole blocks, and the engine's cap."""
    cap = (num_tokens - 1) // block_size * block_size
    return cap if engine_cap is None else min(cap, engine_cap // block_size * block_size)


def admission(before: CacheView | GroupedView, after: CacheView | GroupedView, request_id: str, tenant: Any,
              tokens: Sequence[int], hit: int | None, written: Written, engine_cap: int | None = None,
              window: int | None = None) -> list[Violation]:
    """The rules of one admission.

    - allocation-accounting: refused (``None``), the request holds
      nothing (what it tried changed no other request; an engine may have
      evicted unheld cached blocks on the way); accepted, it has slots for
      every token.
    - hit-soundness: the hit is whole blocks, at most the cap, and each hit
      block the next token reads (all of them, without a window) holds the
      request's own content and was served by the index.
    - no-eviction-in-use: every block taken fresh was held by nobody
      before -- or is the indexed block of this very content at this very
      position (an engine may merge identical blocks when it indexes them,
      and the request then recomputes what the block holds).
    - hit-optimality: the hit is the longest the index served before.

    A grouped view: each group judged so, with its window, but for
    hit-optimality, judged once -- the longest length every group served
    at once (:func:`servable_groups`).
    """
    if isinstance(before, GroupedView):
        out = []
        for name, group, w in before.each():
            found = admission(group, after.groups[name], request_id, tenant, tokens, hit, written, engine_cap, w)
            out += _in_group(name, [v for v in found if v.rule != "hit-optimality"])
        if isinstance(hit, int) and not out:
            best = servable_groups(before, tenant, tokens, hit_cap(len(tokens), before.block_size, engine_cap))
            if hit < best:
                out.append(Violation("hit-optimality", f"{request_id} hit {hit} tokens; every group served {best}"))
        return out
    if hit is None:  # not admitted: it holds nothing (an engine may have evicted unheld blocks trying)
        return [Violation("allocation-accounting", f"{request_id} was refused but holds {after.tables[request_id]}")] \
            if after.tables.get(request_id) else []
    out = []
    B = before.block_size  # noqa: N806
    cap = hit_cap(len(tokens), B, engine_cap)
    table = after.tables.get(request_id, ())
    if not isinstance(hit, int) or hit < 0 or hit % B or hit > cap:
        out.append(Violation("hit-soundness", f"{request_id}'s hit of {hit!r} tokens is not whole blocks of "
                             f"{B} within {cap}"))
        return out
    if len(table) * B < len(tokens):
        out.append(Violation("allocation-accounting", f"{request_id} was admitted with {len(tokens)} tokens "
                             f"but slots for {len(table) * B}"))
        return out
    for i in range(first_read(hit, B, window), hit // B):
        want = content_key(tenant, tokens, (i + 1) * B)
        if written.get(table[i]) != want or before.cached.get(table[i]) != want:
            out.append(Violation("hit-soundness", f"{request_id}'s hit block {table[i]} at position {i} holds "
                                 f"{describe_key(written.get(table[i]))}, not {describe_key(want)}"))
            break
    held = before.held()
    for i, b in enumerate(table[hit // B:], hit // B):
        # A block another request holds may be given again only as the same content at the same place: an
        # engine that merges identical blocks when it indexes them (LMDeploy) hands out the indexed copy.
        if b is not None and b in held and before.cached.get(b) != content_key(tenant, tokens, (i + 1) * B):
            out.append(Violation("no-eviction-in-use", f"{request_id} was given block {b} at position {i}, held by "
                                 f"another request for {describe_key(before.cached.get(b) or written.get(b))}"))
            break
    best = servable(before, tenant, tokens, cap)
    if hit < best:
        out.append(Violation("hit-optimality", f"{request_id} hit {hit} tokens; the index served {best}"))
    return out


def unchanged_holders(before: CacheView, after: CacheView, op: str, running: Sequence[str]) -> list[Violation]:
    """no-eviction-in-use: an eviction (or another request's operation)
    leaves every other running request's blocks where they were (in every
    group of a grouped view)."""
    if isinstance(before, GroupedView):
        return [v for name, group, _ in before.each()
                for v in _in_group(name, unchanged_holders(group, after.groups[name], op, running))]
    return [Violation("no-eviction-in-use", f"{op} changed {r}'s blocks: {before.tables[r]} -> "
                      f"{after.tables.get(r)}")
            for r in running if after.tables.get(r) != before.tables.get(r)]


def describe_key(key: Key | None) -> str:
    """A key as a report shows it: tenant and the last few tokens."""
    if key is None:
        return "nothing written"
    tenant, tokens = key
    shown = ("...," if len(tokens) > 6 else "") + ",".join(map(str, tokens[-6:]))
    return f"{'' if tenant is None else f'{tenant}:'}[{shown}] ({len(tokens)} tokens)"
