"""The pool-level conformance machine.

A Hypothesis ``RuleBasedStateMachine`` plays the part of the managers above
the pool: *owners* (a request's slots in one KV-cache group) look up their
prefix, take hits, allocate, cache their full blocks and partial entries
(prefixes ending inside a block), replace blocks with the null placeholder,
and free in request order or reversed; meanwhile blocks are evicted by id,
the cache is reset, and bad input is thrown at the pool.

Every operation is applied to the **target** and, in lockstep mode, to the
**spec** model too.  After each operation:

- the results (or refusals) of target and spec must be equal, and so must
  their snapshots and the events they emitted (lockstep);
- every rule of :mod:`kvspec.spec.rules` must hold: the step rules for the
  operation, the state rules for the state after it -- with the machine's
  ledger of who holds what as the ground truth for ref counts, and a shadow of
  what each block holds as the ground truth for hits.

Usage::

    setup = PoolSetup(target_factory=ImplPoolTarget, layout=LAYOUTS["two-groups"])
    log = SearchLog()                               # what the runs report
    run_state_machine_as_test(lambda: PoolMachine(setup, log), settings=load_profile("ci"))

or ``run_state_machine_as_test(pool_machine(ImplPoolTarget), ...)``: the
same, a factory with its own log (``.log``).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from kvspec.conformance.machines.configurations import construct_badly, pool_variants, sendable
from kvspec.conformance.machines.machinery import (
    MM_PLACEHOLDER,
    CheckingMachine,
    ConformanceError,
    MachineFactory,
    MachineSetup,
    PerMachine,
    Refused,
    SearchLog,
    call,
    describe_call,
    describe_outcome,
    one_of,
)
from kvspec.conformance.trace import recorded
from kvspec.hashing import block_hashes_for_size, get_request_block_hasher
from kvspec.request import LoRARequest, MultiModalFeatureSpec, PlaceholderRange, Request
from kvspec.spec.interface import NULL_BLOCK_ID, PoolTarget
from kvspec.spec.pool import SpecBlockPool
from kvspec.spec.releases import Release, as_release
from kvspec.spec.rules import (
    EventMirror,
    Step,
    Violation,
    check_events,
    check_state,
    check_step,
    stored_events_describe_requests,
)

__all__ = ["LAYOUTS", "ConformanceError", "PoolLayout", "PoolMachine", "PoolSetup", "Refused", "holds_delta",
           "pool_machine", "step_violations"]


@dataclass
class Owner:
    """One request's slots in one group, as the managers above would keep them."""

    request: Request
    group: int
    block_size: int
    blocks: list[int] = field(default_factory=list)
    num_cached: int = 0
    took_new: bool = False  # hits only extend a table that has no fresh blocks yet

    def prefix_key(self, i: int) -> tuple[Any, ...]:
        """What block ``i`` must hold: the group, the extra keys (the images
        among them: where each starts), and every token up to the end of the block."""
        return self.content((i + 1) * self.block_size)

    def content(self, end: int) -> tuple[Any, ...]:
        """The first ``end`` tokens with what else names them: group, salt, LoRA, images."""
        r = self.request
        lora = r.lora_request.lora_name if r.lora_request else None
        images = tuple((f.identifier, f.mm_position.offset) for f in r.mm_features if f.mm_position.offset < end)
        return (self.group, r.cache_salt, lora, images, tuple(r.all_token_ids[:end]))

    def num_full(self) -> int:
        return min(len(self.blocks), len(self.request.all_token_ids) // self.block_size)


@dataclass
class PoolLayout:
    """The pool a machine builds: its size, hash granularity, and groups."""

    num_blocks: int = 12
    hash_block_size: int = 2
    group_block_sizes: tuple[int, ...] = (2, 4)
    enable_caching: bool = True
    events: bool = True

    def make_target(self, factory: Callable[..., Any]) -> Any:
        """``factory(num_blocks, enable_caching, hash_block_size, enable_kv_cache_events)``."""
        return factory(self.num_blocks, self.enable_caching, self.hash_block_size, self.events)


Call = Callable[[Any], Any]

LAYOUTS: dict[str, PoolLayout] = {
    "two-groups": PoolLayout(num_blocks=12, hash_block_size=2, group_block_sizes=(2, 4)),
    "tiny-pool": PoolLayout(num_blocks=4, hash_block_size=1, group_block_sizes=(1, 2)),
    "one-group-no-events": PoolLayout(num_blocks=16, hash_block_size=2, group_block_sizes=(2,), events=False),
    "caching-off": PoolLayout(num_blocks=8, hash_block_size=2, group_block_sizes=(2,), enable_caching=False),
    "wide-blocks": PoolLayout(num_blocks=10, hash_block_size=1, group_block_sizes=(4,)),
}
"""The pools every conformance run builds: two groups of different block
sizes, a pool so small that every allocation evicts, one group without
events, prefix caching off, and blocks of four hash blocks (three places
inside each where a partial entry can end: a longer one replaces a shorter
one, a shorter one sits beside it)."""


@dataclass(frozen=True, kw_only=True)
class PoolSetup(MachineSetup):
    """What a :class:`PoolMachine` checks, and how.

    ``target_factory(num_blocks, enable_caching, hash_block_size,
    enable_kv_cache_events)`` must return a :class:`PoolTarget`; ``layout``
    is the pool it builds.  With ``lockstep`` every operation goes to the
    spec's pool too -- or to ``spec_factory``'s, named ``partner`` in
    reports (a fork's upstream, :mod:`kvspec.conformance.targets.remote`).
    ``avoid`` names inputs the machine does not send (see
    :mod:`kvspec.conformance.findings`): ``"bad-input:KIND"`` for a kind of
    :meth:`PoolMachine.bad_input`.  ``release``: the vLLM release whose
    rules judge; the spec's pool, the requests' hashes and the rules follow
    it.  ``variants``: the layout's incoherent configurations
    (:func:`pool_variants`), made once per setup."""

    target_factory: Callable[..., PoolTarget]
    layout: PoolLayout = field(default_factory=PoolLayout)
    lockstep: bool = True
    spec_factory: Callable[..., PoolTarget] | None = None
    release: Release = field(default_factory=lambda: as_release(None))
    variants: tuple[Any, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "variants", pool_variants(self.layout))


class PoolMachine(CheckingMachine):
    """The pool machine (see the module's docstring), configured by a
    :class:`PoolSetup`, reporting to a :class:`SearchLog`."""

    scope = "pool"
    setup: PoolSetup

    def __init__(self, setup: PoolSetup, log: SearchLog | None = None) -> None:
        super().__init__(setup, log)
        layout, release = setup.layout, setup.release
        self.layout = layout
        self.target = layout.make_target(setup.target_factory)
        self.spec = layout.make_target(setup.spec_factory or functools.partial(SpecBlockPool, release=release)) \
            if setup.lockstep else None
        self.owners: list[Owner] = []
        self.shadow: dict[int, tuple[Any, ...]] = {}
        self.mirror = EventMirror()
        self.hasher = get_request_block_hasher(layout.hash_block_size, release=release)
        self.next_id = 0
        self.configured = False  # whether this run built its incoherent configuration (configure)
        # partial-block entries: called where the target has them (a fork may predate them)
        self.partial_entries = layout.enable_caching and getattr(self.target, "offers_partial_entries", True) \
            and callable(getattr(self.target, "cache_partial_block", None))
        # Who holds what, by the interface's own accounting: an allocation
        # or a touch adds a hold, a free removes one.
        self.ledger: Counter[int] = Counter()

    # --- the step: apply, compare, check ---------------------------------

    def apply(self, op: str, *args: Any, must_refuse: str | None = None) -> Any:
        """Apply ``op(*args)`` to the target (and the spec), check every
        rule, and return the target's result (or raise its refusal as
        ``Refused``).  ``must_refuse``: the call is one the target must
        refuse, by that rule unless the spec names another."""
        release = self.setup.release
        before = self.target.snapshot()
        where = describe_call(op, args)
        with self.calling(where):
            result, error = call(getattr(self.target, op), args)
        self.record(where, describe_outcome(result, error))
        if error is not None and not isinstance(error, (ValueError, TypeError)):
            self.fail(divergence=f"{where} crashed with {error!r}; a refusal must raise ValueError or TypeError")
        if must_refuse and error is None:
            self.accepted_what_must_be_refused(where, self.in_lockstep(op, args), must_refuse)
        after = self.target.snapshot()
        self.cover(op, result, error, after)
        events = self.target.take_events()
        spec_outcome = self.in_lockstep(op, args)
        step = Step(op, args, before, after, result, error, self.layout.enable_caching, release)
        problems = step_violations(step, events, self.ledger, self.mirror if self.layout.events else None)
        if events:  # the owners' requests are gathered only when there is an event to hold to them
            problems += [Violation("hash-map-consistency", p) for p in stored_events_describe_requests(
                events, self.requests_by_group(), self.layout.hash_block_size, release)]
        self.judge(where, problems, (result, error, after, events), spec_outcome)
        if error is not None:
            raise Refused(error)
        return result

    def requests_by_group(self) -> dict[int, list[Request]]:
        """The owners' requests, by group: what a Stored event may describe."""
        out: dict[int, list[Request]] = {}
        for o in self.owners:
            out.setdefault(o.group, []).append(o.request)
        return out

    def holders(self) -> Counter[int]:
        """What the owners hold -- must always equal the ledger."""
        return Counter(b for o in self.owners for b in o.blocks if b != NULL_BLOCK_ID)

    # --- owners -------------------------------------------------------------------

    def pick(self, data: st.DataObject) -> Owner:
        return self.owners[data.draw(st.integers(0, len(self.owners) - 1), label="owner")]

    def hashes(self, owner: Owner):
        return block_hashes_for_size(owner.request.block_hashes, self.layout.hash_block_size, owner.block_size)

    @rule(data=st.data())
    @recorded
    def admit(self, data: st.DataObject) -> None:
        """A request arrives in some group -- tokens from a tiny alphabet so
        prefixes are shared, sometimes a salt, a LoRA or images (which an
        event's extra keys must name).  It takes every
        block of its cached prefix (a hit each), allocates the rest, and
        caches its full blocks; if the pool is short it lets its hits go."""
        group = data.draw(st.integers(0, len(self.layout.group_block_sizes) - 1), label="group")
        size = self.layout.group_block_sizes[group]
        tokens = data.draw(st.lists(st.integers(0, 1), min_size=1, max_size=3 * size), label="tokens")
        salt = data.draw(one_of((None, None, "s1")), label="salt")
        lora = data.draw(one_of((None, None, LoRARequest("adapter-a", 1))), label="lora")
        images, at = [], 0
        for _ in range(data.draw(one_of((0, 0, 1, 2)), label="images")):  # an event names each it overlaps
            if at >= len(tokens):
                break
            start = data.draw(st.integers(at, len(tokens) - 1), label="image start")
            length = data.draw(st.integers(1, len(tokens) - start), label="image length")
            tokens[start:start + length] = [MM_PLACEHOLDER] * length
            images.append(MultiModalFeatureSpec(data.draw(one_of(("image-a", "image-b")), label="image id"),
                                                PlaceholderRange(start, length)))
            at = start + length
        self.next_id += 1
        request = Request(f"r{self.next_id}", tokens, cache_salt=salt, lora_request=lora, mm_features=images,
                          block_hasher=self.hasher)
        owner = Owner(request, group, size)
        self.owners.append(owner)
        if self.layout.enable_caching:
            self.take_hits(owner)
        needed = -(-len(tokens) // size) - len(owner.blocks)
        if not self.allocate_for(owner, needed):
            self.owners.remove(owner)
            self.apply("free_blocks", owner.blocks[::-1])
            return
        self.write(owner, owner.num_cached * size, len(tokens))
        self.cache(owner, data)

    def take_hits(self, owner: Owner) -> None:
        for i, block_hash in enumerate(self.hashes(owner)):
            found = self.apply("get_cached_block", block_hash, [owner.group])
            if found is None:
                break
            (block,) = found
            if self.shadow.get(block) != owner.prefix_key(i):
                self.fail([Violation("content-soundness", f"block {block} was hit for content it does not hold")])
            self.apply("touch", [block])
            owner.blocks.append(block)
            owner.num_cached = len(owner.blocks)
        if self.partial_entries:
            self.look_up_partial(owner)

    def partial_boundaries(self, owner: Owner, start: int) -> list[int]:
        """The prefix lengths from ``start`` on that end inside one of the
        owner's blocks at a hash-block boundary: where a partial entry may be."""
        hbs, size, n = self.layout.hash_block_size, owner.block_size, len(owner.request.all_token_ids)
        first = start // hbs + 1
        return [k * hbs for k in range(first, n // hbs + 1) if (k * hbs) % size]

    def look_up_partial(self, owner: Owner) -> None:
        """The longest prefix ending inside the block after the owner's full
        hits, looked up as a partial entry: a block found must hold that
        prefix (the owner does not take it -- writing past a shared
        prefix would need a copy, which this pool's managers never make)."""
        size = owner.block_size
        inside = [t for t in self.partial_boundaries(owner, len(owner.blocks) * size)
                  if t < (len(owner.blocks) + 1) * size]
        if not inside:
            return
        t = inside[-1]
        found = self.apply("get_cached_block", owner.request.block_hashes[t // self.layout.hash_block_size - 1],
                           [owner.group])
        if found is None:
            return
        (block,) = found
        if not self.holds_prefix(block, owner, t):
            self.fail([Violation("content-soundness",
                                 f"block {block} was hit for a {t}-token prefix it does not hold")])

    def holds_prefix(self, block: int, owner: Owner, t: int) -> bool:
        """Whether ``block`` holds the owner's first ``t`` tokens' block: the
        same group and tenant, those tokens written, at that position."""
        held = self.shadow.get(block)
        if held is None or len(held[4]) < t or (len(held[4]) - 1) // owner.block_size != t // owner.block_size:
            return False
        group, salt, lora, images, tokens = held
        cut = (group, salt, lora, tuple(i for i in images if i[1] < t), tokens[:t])
        return cut == owner.content(t)

    def allocate_for(self, owner: Owner, n: int) -> bool:
        try:
            new = self.apply("get_new_blocks", n)
        except Refused:
            return False
        owner.blocks.extend(new)
        return True

    def write(self, owner: Owner, start: int, end: int) -> None:
        """Tokens ``[start, end)`` are written into the owner's blocks: the
        shadow records, per block, the content it now holds."""
        size = owner.block_size
        for i in range(start // size, -(-end // size)):
            if owner.blocks[i] != NULL_BLOCK_ID:
                self.shadow[owner.blocks[i]] = owner.prefix_key(i)

    def cache(self, owner: Owner, data: st.DataObject) -> None:
        """Cache the owner's newly full blocks, perhaps through a mask."""
        num_full = owner.num_full()
        if not self.layout.enable_caching or num_full <= owner.num_cached:
            return
        n_new = num_full - owner.num_cached
        mask = data.draw(st.none() | st.lists(st.booleans(), min_size=n_new, max_size=n_new), label="mask")
        self.apply(
            "cache_full_blocks", owner.request, list(owner.blocks), owner.num_cached,
            num_full, owner.block_size, owner.group, mask,
        )
        owner.num_cached = num_full

    @precondition(lambda self: self.owners)
    @rule(data=st.data())
    @recorded
    def decode(self, data: st.DataObject) -> None:
        """An owner appends tokens; a new block when the last is full; the
        blocks that filled up are cached (their parent is the last cached)."""
        owner = self.pick(data)
        more = data.draw(st.lists(st.integers(0, 1), min_size=1, max_size=owner.block_size + 1), label="more")
        request = owner.request
        start = request.num_tokens
        needed = -(-(start + len(more)) // owner.block_size) - len(owner.blocks)
        if needed > self.target.get_num_free_blocks():
            return  # the scheduler would preempt; refusals are exercised elsewhere
        request.append_output_token_ids(more)
        if needed > 0 and not self.allocate_for(owner, needed):
            self.fail(divergence=f"get_new_blocks({needed}) refused with enough blocks free")
        self.write(owner, start, request.num_tokens)
        self.cache(owner, data)

    @precondition(lambda self: self.partial_entries and any(o.block_size > self.layout.hash_block_size
                                                             for o in self.owners))
    @rule(data=st.data())
    @recorded
    def cache_partial(self, data: st.DataObject) -> None:
        """An owner makes one of its blocks a hit for a prefix that ends
        inside it -- its partly written last block, or a boundary inside
        a full one (a further entry the block owns)."""
        owners = [o for o in self.owners if o.block_size > self.layout.hash_block_size]
        owner = owners[data.draw(st.integers(0, len(owners) - 1), label="owner")]
        boundaries = self.partial_boundaries(owner, 0)
        if "partial-entry:earlier-image" in self.avoid:  # F11: vLLM 0.25.1's event leaves such an image out
            hbs = self.layout.hash_block_size
            boundaries = [t for t in boundaries if not earlier_image_in(owner.request, t - hbs, t)]
        if not boundaries:
            return
        t = data.draw(one_of(tuple(boundaries)), label="num_tokens")
        self.apply("cache_partial_block", owner.request, owner.blocks[t // owner.block_size], t,
                   owner.group, owner.block_size)

    @precondition(lambda self: any(b != NULL_BLOCK_ID for o in self.owners for b in o.blocks))
    @rule(data=st.data())
    @recorded
    def null_out(self, data: st.DataObject) -> None:
        """An owner's oldest real block leaves its window: it is freed and
        the slot keeps the null placeholder."""
        owner = self.pick(data)
        for i, b in enumerate(owner.blocks):
            if b != NULL_BLOCK_ID:
                self.apply("free_blocks", [b])
                owner.blocks[i] = NULL_BLOCK_ID
                return

    @precondition(lambda self: self.owners)
    @rule(data=st.data(), reverse=st.booleans())
    @recorded
    def finish(self, data: st.DataObject, reverse: bool) -> None:
        """An owner frees all its slots, tail first (as managers do) or in order."""
        owner = self.pick(data)
        blocks = owner.blocks[::-1] if reverse else list(owner.blocks)
        self.owners.remove(owner)
        self.apply("free_blocks", blocks)

    # --- the pool's own operations --------------------------------------------------

    @rule(ids=PerMachine(lambda self: st.sets(st.integers(0, self.layout.num_blocks - 1), max_size=3),
                     like=st.sets(st.integers(0, 1), max_size=3)),
      reset=st.integers(0, 3))
    @recorded
    def evict(self, ids: set[int], reset: int) -> None:
        """A connector reports blocks stale: their hashes go.  Now and then
        the whole prefix cache is reset instead (refused while in use)."""
        if reset == 3:
            self.apply("reset_prefix_cache")
        else:
            self.apply("evict_blocks", sorted(ids))

    @precondition(lambda self: self.layout.enable_caching)
    @rule(data=st.data())
    @recorded
    def lookup_across_groups(self, data: st.DataObject) -> None:
        """A lookup in every group at once hits only if all groups hit."""
        if not self.owners:
            return
        owner = self.pick(data)
        hashes = owner.request.block_hashes
        if hashes:
            i = data.draw(st.integers(0, len(hashes) - 1), label="block")
            self.apply("get_cached_block", hashes[i], list(range(len(self.layout.group_block_sizes))))

    @precondition(lambda self: not self.configured)
    @rule(data=st.data())
    @recorded
    def configure(self, data: st.DataObject) -> None:
        """Once per run: a pool built with no room for the null block, or
        with a hash block size that is not positive, is refused, as the
        spec refuses it."""
        self.configured = True
        names = sendable(self.setup.variants, self.avoid)
        if names:
            name = data.draw(one_of(names), label="configuration")
            construct_badly(self, self.setup.variants, name, SpecBlockPool, self.setup.target_factory)

    @rule(
        op=st.sampled_from(["too_many", "negative", "bad_free", "bad_evict", "bad_hash", "bool_count",
                            "bad_cache", "bad_group"]),
        k=st.integers(1, 3),
    )
    @recorded
    def bad_input(self, op: str, k: int) -> None:
        """Impossible requests are refused and change nothing."""
        if f"bad-input:{op}" in self.avoid:
            return
        call = self.bad_cache_call(k) if op == "bad_cache" else self.bad_call(op, k)
        if call is None:
            return
        name, *args = call
        # the kinds added after F1-F3's traces were recorded: their acceptance is the verdict
        checked = {"bad_cache": "allocation-accounting", "bad_group": "hash-map-consistency"}.get(op)
        if op == "bad_cache" and not self.layout.enable_caching:
            checked = "hash-map-consistency"  # a pool that does not cache keys nothing
        try:
            self.apply(name, *args, must_refuse=checked)
        except Refused:
            return
        self.fail(divergence=f"{name}{tuple(args)} was accepted; it must be refused")

    def bad_call(self, op: str, k: int) -> tuple[Any, ...]:
        """The impossible call of kind ``op`` (all but ``bad_cache``)."""
        n = self.layout.num_blocks
        held = self.holders()
        unheld = [b for b in range(1, n) if held[b] == 0]
        calls = {
            "too_many": ("get_new_blocks", self.target.get_num_free_blocks() + k),
            "negative": ("get_new_blocks", -k),
            "bool_count": ("get_new_blocks", True),
            # a block nobody holds, after k - 1 held ones: the refusal must give those back their references
            "bad_free": ("free_blocks", [b for b in range(1, n) if held[b]][: k - 1] + unheld[:1])
            if unheld else ("get_new_blocks", True),
            "bad_evict": ("evict_blocks", [n - 1 + k]),
            "bad_hash": ("get_cached_block", "not-bytes", [0]),
            # a group id that is no 4-byte unsigned int: too big, not an int, negative
            "bad_group": ("get_cached_block", bytes(32), [{1: 2**32, 2: "0", 3: -1}[k]]),
        }
        return calls[op]

    def bad_cache_call(self, k: int) -> tuple[Any, ...] | None:
        """A ``cache_full_blocks`` the pool must refuse, on a held block
        that carries no key (none: nothing to send): a negative
        ``num_cached_blocks`` (k=1), one block twice (k=2), a block more
        than the request has hashes for (k=3) -- and, whatever k, a
        well-formed call to a pool with caching off."""
        after = self.target.snapshot()
        fresh = sorted(b for b in after.held() if b not in after.key_of and b not in after.partial_of)
        if not fresh:
            return None
        size = self.layout.group_block_sizes[0]
        if not self.layout.enable_caching:
            whole = Request("bad", list(range(size)), block_hasher=self.hasher)
            return ("cache_full_blocks", whole, fresh[:1], 0, 1, size, 0)
        if k == 3:
            short = Request("bad", list(range(size - 1)), block_hasher=self.hasher)  # not one whole block
            return ("cache_full_blocks", short, fresh[:1], 0, 1, size, 0)
        request = Request("bad", list(range(2 * size)), block_hasher=self.hasher)
        if k == 1:
            return ("cache_full_blocks", request, fresh[:1], -1, 1, size, 0)
        return ("cache_full_blocks", request, [fresh[0], fresh[0]], 0, 2, size, 0)

    @invariant()
    def counts_agree(self) -> None:
        """The free count is the queue's length, and the owners hold what
        the ledger says (a check on the machine itself)."""
        with self.guarded():
            if self.target.get_num_free_blocks() != len(self.target.snapshot().free):
                self.fail([Violation("free-queue-consistency", "free count != queue length")])
        assert +self.ledger == self.holders(), "machine bug: ledger and owners disagree"

    def teardown(self) -> None:
        # Drain every owner; a correct pool ends with all blocks free.
        if not self.teardown_begins():
            return
        with self.guarded():
            for owner in list(self.owners):
                self.owners.remove(owner)
                try:
                    self.apply("free_blocks", owner.blocks[::-1])
                except Refused as refused:
                    self.fail(divergence=f"final free refused: {refused}")
            free = self.target.get_num_free_blocks()
            if free != self.layout.num_blocks - 1:
                self.fail([Violation("ref-conservation", f"{free} blocks free after every owner left")])



def pool_machine(
    target_factory: Callable[..., PoolTarget],
    layout: PoolLayout | None = None,
    *,
    lockstep: bool = True,
    ignore_rules: frozenset[str] = frozenset(),
    avoid: frozenset[str] = frozenset(),
    spec_factory: Callable[..., PoolTarget] | None = None,
    partner: str = "spec",
    release: Release | str | None = None,
    layout_name: str = "",
) -> MachineFactory:
    """A factory of :class:`PoolMachine` checking pools made by
    ``target_factory`` (the arguments: :class:`PoolSetup`'s), with a fresh
    :class:`SearchLog`: what ``run_state_machine_as_test`` and
    :func:`kvspec.conformance.runner.run_layout` take."""
    setup = PoolSetup(target_factory=target_factory, layout=layout or PoolLayout(), lockstep=lockstep,
                      ignore_rules=frozenset(ignore_rules), avoid=frozenset(avoid), spec_factory=spec_factory,
                      partner=partner, release=as_release(release), layout_name=layout_name)
    return MachineFactory(PoolMachine, setup, name=f"PoolMachine_{getattr(target_factory, '__name__', 'target')}")


def earlier_image_in(request: Request, start: int, end: int) -> bool:
    """Whether tokens ``[start, end)`` overlap an image that is not the request's last."""
    return any(f.mm_position.offset < end and start < f.mm_position.offset + f.mm_position.length
               for f in request.mm_features[:-1])


def step_violations(
    step: Step, events: list[Any], ledger: Counter[int], mirror: EventMirror | None
) -> list[Violation]:
    """Every pool rule after one operation: the step rules, the state rules
    with ``ledger`` (who holds what, updated here by a successful step) as the
    truth for ref counts, and -- with a ``mirror`` of the events so far,
    updated here with ``events`` -- the event rule."""
    if step.error is None:
        ledger.update(holds_delta(step.op, step.args, step.result))
    problems = check_step(step) + check_state(step.after, ledger)
    if mirror is not None:
        mirror.apply(events)
        problems += check_events(step.after, mirror)
    return problems


def holds_delta(op: str, args: tuple[Any, ...], result: Any) -> Counter[int]:
    """How a successful operation changes who holds what (null excluded)."""
    if op == "get_new_blocks":
        return Counter(result)
    if op == "touch":
        return Counter(b for b in args[0] if b != NULL_BLOCK_ID)
    if op == "free_blocks":
        return Counter({b: -n for b, n in Counter(args[0]).items() if b != NULL_BLOCK_ID})
    return Counter()
