"""The offload machine: any offloading tier (spec chapter 11).

A Hypothesis state machine plays vLLM's offloading connector over an
``OffloadingManager`` -- the spec's, impl's, vLLM's ``CPUOffloadingManager``
with LRU or ARC, or a ``module:factory``'s -- called directly: it looks keys
up, prepares and completes loads of stored keys (several in flight), prepares
stores and completes them (successfully or not), touches keys, takes the
events and resets the tier.  It keeps the caller's
:class:`~kvspec.spec.tiers.Ledger` from the answers alone, and after every
operation judges the step and the tier's state by chapter 11's rules; at L2
the evictions against the spec model's (the policy), at L3 every answer and
the whole state.

The machine is one module-level class, :class:`OffloadMachine`; a run's
machine is a subclass that fixes its target, layout and level
(:func:`offload_machine`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from kvspec.conformance.machines.machinery import (
    CheckingMachine,
    MachineFactory,
    MachineSetup,
    SearchLog,
    Violation,
    call,
    describe_call,
    describe_outcome,
)
from kvspec.conformance.targets.offload import spec_tier, wrap
from kvspec.conformance.trace import recorded
from kvspec.spec import tiers


@dataclass(frozen=True)
class OffloadLayout:
    """A tier to search: its size and policy, and how many keys one call names."""

    name: str
    num_blocks: int
    cache_policy: str = "lru"
    store_threshold: int = 1
    max_tracker_size: int = 64_000
    max_keys: int = 3
    num_keys: int = 10
    description: str = ""

    def options(self) -> dict[str, Any]:
        """The keyword arguments a tier factory is built with."""
        return {"num_blocks": self.num_blocks, "cache_policy": self.cache_policy, "enable_events": True,
                "store_threshold": self.store_threshold, "max_tracker_size": self.max_tracker_size}


OFFLOAD_LAYOUTS: dict[str, OffloadLayout] = {
    layout.name: layout for layout in (
        OffloadLayout("lru", num_blocks=6, description="6 blocks, least recently used evicted first"),
        OffloadLayout("arc", num_blocks=6, cache_policy="arc", description="6 blocks, adaptive replacement (ARC)"),
        OffloadLayout("store-threshold-2", num_blocks=6, store_threshold=2,
                      description="a key is stored only once looked up twice"),
        OffloadLayout("threshold-small-tracker", num_blocks=1, store_threshold=2, max_tracker_size=2, num_keys=3,
                      description="store threshold 2 with lookups counted for 2 keys: a held key's count is "
                      "forgotten"),
        OffloadLayout("tiny-tier", num_blocks=2, max_keys=4, num_keys=6,
                      description="2 blocks, calls of up to 4 keys: every store evicts"),
        OffloadLayout("tiny-tier-arc", num_blocks=2, cache_policy="arc", max_keys=4, num_keys=6,
                      description="2 blocks under ARC, calls of up to 4 keys: every store evicts"),
    )
}
"""The offload scope's layouts."""


def key_of(i: int) -> bytes:
    """Key ``i``: a block hash of 4 bytes and group 0 (vLLM's ``make_offload_key``)."""
    return bytes([0xA0 + i]) * 4 + (0).to_bytes(4, "big")


@dataclass(frozen=True, kw_only=True)
class OffloadSetup(MachineSetup):
    """What an :class:`OffloadMachine` checks, and how: ``factory(**layout.options())``
    builds the manager; the policy is judged (L2 and L3: the evictions
    against the spec model's) unless the rules ignored leave it out;
    ``lockstep`` (L3): every answer and the state against the spec model's."""

    factory: Callable[..., Any] = spec_tier
    layout: OffloadLayout = OFFLOAD_LAYOUTS["lru"]
    lockstep: bool = False

    @property
    def policy_judged(self) -> bool:
        return "tier-policy" not in self.ignore_rules


class OffloadMachine(CheckingMachine):
    """Drives one tier, configured by an :class:`OffloadSetup`, reporting to a :class:`SearchLog`."""

    scope = "offload"
    swarm_options = ("reset",)
    setup: OffloadSetup

    def __init__(self, setup: OffloadSetup | None = None, log: SearchLog | None = None) -> None:
        setup = setup if setup is not None else OffloadSetup()
        super().__init__(setup, log)
        self.factory, self.layout = setup.factory, setup.layout
        self.policy_judged, self.lockstep = setup.policy_judged, setup.lockstep
        self.target = wrap(self.factory(**self.layout.options()))
        self.spec = spec_tier(**self.layout.options()) if self.policy_judged or self.lockstep else None
        self.keys = [key_of(i) for i in range(self.layout.num_keys)]
        self.ledger = tiers.Ledger()
        self.loads: list[tuple[bytes, ...]] = []  # loads in flight
        self.stores: list[tuple[bytes, ...]] = []  # stores in flight
        with self.calling("snapshot()"):
            self.last = self.target.snapshot()

    # --- one operation -------------------------------------------------------------------

    def apply(self, op: str, *args: Any) -> Any:
        """Send ``op`` to the target (and the spec), judge the step, settle the ledger."""
        before = self.last
        where = describe_call(op, args)
        with self.calling(where):
            result, error = call(getattr(self.target, op), args)
        self.record(where, describe_outcome(result, error))
        if error is not None:  # the machine sends only what the spec allows: any raise is the target's failure
            self.fail(divergence=f"{where}: the target raised {type(error).__name__}: {error}; the spec allows "
                                 f"the call (it is the target's failure)")
        spec_result, spec_after = None, None
        if self.spec is not None:
            spec_result, spec_error = call(getattr(self.spec, op), args)
            if spec_error is not None:
                raise spec_error  # the machine's own mistake: it sent what the spec refuses
            spec_after = self.spec.snapshot()
        with self.calling("snapshot()"):
            after = self.target.snapshot()
        self.last = after
        step = tiers.TierStep(op, args, self.ledger, before, after, result, None)
        due = spec_result[2] if op == "prepare_store" and self.policy_judged and spec_result is not None else None
        problems = [Violation(rule, p) for rule, p in tiers.check_tier_step(step, due)]
        if op == "prepare_store" and self.policy_judged and (result is None) != (spec_result is None):
            problems.append(Violation("tier-policy", f"{where} gave {'up' if result is None else 'blocks'}; "
                                      f"the policy {'gives up' if spec_result is None else 'finds blocks'}"))
        tiers.settle(self.ledger, op, args, result)
        problems += [Violation(rule, p) for rule, p in tiers.check_tier_state(after, self.ledger)]
        if problems:  # the rules first, then the comparison with the spec
            self.fail(problems)
        if self.lockstep:
            self.compare(where, result, spec_result, after, spec_after)
        self.cover(op, result, after)
        return result

    def compare(self, where: str, result: Any, spec_result: Any, after: tiers.TierSnapshot,
                spec_after: tiers.TierSnapshot) -> None:
        if result != spec_result:
            self.fail(divergence=f"{where}: target returned {describe_outcome(result, None)}, spec "
                                 f"{describe_outcome(spec_result, None)}")
        mine, theirs = asdict(after), asdict(spec_after)
        differ = [name for name in mine if mine[name] != theirs[name]]
        if differ:
            shown = "\n".join(f"  {name}:\n    target {mine[name]!r}\n    spec   {theirs[name]!r}" for name in differ)
            self.fail(divergence=f"{where}: tiers differ in {', '.join(differ)}\n{shown}")

    def cover(self, op: str, result: Any, snap: tiers.TierSnapshot) -> None:  # type: ignore[override]
        used = len(snap.entries)
        fill = "empty" if used == 0 else "full" if used == snap.num_blocks else "some"
        self.aim("blocks in use", used)
        self.aim("loads in flight", len(self.loads))
        self.log.reached.add((op, "none" if result is None else "ok", fill, min(len(snap.evictable), 3),
                              min(len(self.stores), 2)))

    def some_keys(self, data: st.DataObject, pool: list[bytes], label: str) -> list[bytes]:
        """Distinct keys of ``pool``, drawn as their numbers (a trace saves numbers)."""
        numbers = [self.keys.index(k) for k in pool]
        most = min(self.layout.max_keys, len(pool))
        drawn = data.draw(st.lists(st.sampled_from(numbers), min_size=1, max_size=most, unique=True), label=label)
        return [self.keys[i] for i in drawn]

    # --- the connector's operations --------------------------------------------------------

    @rule(data=st.data())
    @recorded
    def lookup(self, data: st.DataObject) -> None:
        """The scheduler asks whether a key is in the tier."""
        key = self.keys[data.draw(st.integers(0, len(self.keys) - 1), label="key")]
        self.apply("lookup", key)

    @rule(data=st.data())
    @recorded
    def touch(self, data: st.DataObject) -> None:
        """A request's keys are used (the first most recently)."""
        self.apply("touch", self.some_keys(data, self.keys, "keys"))

    @precondition(lambda self: self.ledger.stored)
    @rule(data=st.data())
    @recorded
    def prepare_load(self, data: st.DataObject) -> None:
        """A load of stored keys begins."""
        keys = self.some_keys(data, sorted(self.ledger.stored), "keys")
        self.apply("prepare_load", keys)
        self.loads.append(tuple(keys))

    @precondition(lambda self: self.loads)
    @rule(data=st.data())
    @recorded
    def complete_load(self, data: st.DataObject) -> None:
        """A load in flight ends."""
        keys = self.loads.pop(data.draw(st.integers(0, len(self.loads) - 1), label="load"))
        self.apply("complete_load", list(keys))

    @rule(data=st.data())
    @recorded
    def prepare_store(self, data: st.DataObject) -> None:
        """A request's computed blocks are to be offloaded."""
        keys = self.some_keys(data, self.keys, "keys")
        result = self.apply("prepare_store", keys)
        if result is not None and result[0]:
            self.stores.append(tuple(result[0]))

    @rule(data=st.data())
    @recorded
    def request(self, data: st.DataObject) -> None:
        """A scheduler step for one request: its keys are looked up in order
        (each ask counts toward the store threshold), its blocks are
        offloaded, and the connector takes the tier's events (as it does
        every step)."""
        keys = self.some_keys(data, self.keys, "keys")
        for key in keys:
            self.apply("lookup", key)
        result = self.apply("prepare_store", keys)
        if result is not None and result[0]:
            self.stores.append(tuple(result[0]))
        self.apply("take_events")

    @precondition(lambda self: self.stores)
    @rule(data=st.data())
    @recorded
    def complete_store(self, data: st.DataObject) -> None:
        """A store in flight ends, successfully or not."""
        keys = self.stores.pop(data.draw(st.integers(0, len(self.stores) - 1), label="store"))
        success = data.draw(st.sampled_from((True, True, False)), label="success")
        self.apply("complete_store", list(keys), success)

    @rule()
    @recorded
    def take_events(self) -> None:
        """The connector takes the tier's events."""
        self.apply("take_events")

    @precondition(lambda self: not self.off("reset"))
    @rule()
    @recorded
    def reset_cache(self) -> None:
        """The tier is reset; transfers in flight are abandoned (their
        completions never arrive: the scheduler's promise)."""
        self.apply("reset_cache")
        self.loads.clear()
        self.stores.clear()

    @invariant()
    def rules_hold(self) -> None:
        """Every state rule of chapter 11 after each operation."""
        with self.guarded():
            found = tiers.check_tier_state(self.last, self.ledger)
            if found:
                self.fail([Violation(rule, p) for rule, p in found])

    def teardown(self) -> None:
        if not self.teardown_begins():
            return
        with self.guarded():
            while self.loads:
                self.apply("complete_load", list(self.loads.pop()))
            while self.stores:
                self.apply("complete_store", list(self.stores.pop()), True)
            self.apply("take_events")
            found = tiers.check_tier_state(self.last, self.ledger)
            if found:
                self.fail([Violation(rule, p) for rule, p in found])


def offload_machine(factory: Callable[..., Any], layout: OffloadLayout, *, ignore_rules: frozenset[str] = frozenset(),
                    avoid: frozenset[str] = frozenset(), lockstep: bool = False,
                    layout_name: str = "") -> MachineFactory:
    """A factory of :class:`OffloadMachine` for one target, layout and
    level (the arguments: :class:`OffloadSetup`'s), with a fresh :class:`SearchLog`."""
    setup = OffloadSetup(factory=factory, layout=layout, lockstep=lockstep, ignore_rules=frozenset(ignore_rules),
                         avoid=frozenset(avoid), layout_name=layout_name)
    return MachineFactory(OffloadMachine, setup, name=f"OffloadMachine_{layout.name.replace('-', '_')}")
