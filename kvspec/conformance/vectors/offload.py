"""Conformance vectors of an offloading tier (spec/README.md chapter 11).

The ``offload`` scope: a vector's ``config`` is the tier's construction
(``num_blocks``, ``cache_policy``, ``enable_events``, ``store_threshold``,
``max_tracker_size``), its steps the connector's calls in plain form (the
offload machine's, :mod:`kvspec.conformance.targets.offload`) with the
spec's answer, and its state the tier's snapshot (``entries``,
``evictable``, ``num_evictable``, ``policy``).  Events are not a side
channel here: ``take_events`` is an operation, and its result is the events.

Three sources, every vector recorded from the spec's tier
(:class:`~kvspec.spec.tiers.SpecOffloadingManager`):

- hand-written cases (:data:`OFFLOAD_CASES`), one or more per tier rule;
- walks of the offload machine over its layouts (``OFFLOAD_LAYOUTS``);
- the offload findings' traces (F17, F18) replayed on the spec.

This module knows the format's values it needs itself (keys as ``{"bytes":
hex}``): ``codec`` dispatches an offload vector here, and ``corpus`` records
the vectors (:func:`~kvspec.conformance.vectors.corpus.offload_case_vector`
and its siblings), so that nothing here imports either.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvspec.conformance.machines.offload import OffloadLayout
from kvspec.conformance.targets.offload import TierTarget
from kvspec.conformance.vectors.steps import refused, states
from kvspec.spec import tiers
from kvspec.spec.tiers import SpecOffloadingManager, TierSnapshot

SCOPE = "offload"
OPERATIONS = ("lookup", "prepare_load", "touch", "complete_load", "prepare_store", "complete_store",
              "reset_cache", "take_events")
"""The tier's operations a vector records, by :class:`TierTarget`'s names and parameters."""


def encode(value: Any) -> Any:
    """A plain-form value as the vectors' JSON (codec's ``to_json`` for the
    values a tier answers: keys as ``{"bytes": hex}``, tuples as lists)."""
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": bytes(value).hex()}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    raise ValueError(f"a {type(value).__name__} is not a tier's value: {value!r}")


def decode(value: Any) -> Any:
    """The inverse of :func:`encode`."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if isinstance(value, dict):
        if set(value) != {"bytes"}:
            raise ValueError(f"unknown tagged value in an offload vector: {value!r}")
        return bytes.fromhex(value["bytes"])
    return value


def tier_state(snap: TierSnapshot) -> dict[str, Any]:
    """A tier's state as a vector records it: each held key (hex) with its
    block and ref count (-1: pending), the evictable keys (sorted), the
    tier's own count of them, and the policy's order -- LRU's evictable
    keys least recent first, or ARC's T1, T2, B1, B2 (oldest first) and
    T1's target."""
    entries = {k.hex(): [b, r] for k, (b, r) in sorted(snap.entries.items())}
    order = snap.policy
    if len(order) == 1:
        policy: dict[str, Any] = {"lru": [k.hex() for k in order[0]]}
    elif len(order) == 5:
        policy = {name: [k.hex() for k in keys] for name, keys in zip(("t1", "t2", "b1", "b2"), order[:4], strict=True)}
        policy["target"] = float(order[4])
    else:
        policy = {}
    return {"entries": entries, "evictable": sorted(k.hex() for k in snap.evictable),
            "num_evictable": snap.num_evictable, "policy": policy}


def config_of(layout: OffloadLayout) -> dict[str, Any]:
    return dict(layout.options())


def named_arguments(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    if op not in OPERATIONS:
        raise ValueError(f"{op!r} is not an operation of an offloading tier")
    bound = inspect.signature(getattr(TierTarget, op)).bind(None, *args, **kwargs)
    return {k: v for k, v in bound.arguments.items() if k != "self"}


class OffloadRecorder(TierTarget):
    """The spec's tier in plain form, recording every operation into a
    vector: the arguments by name, the result or refusal, the state that
    changed.  A :class:`TierTarget` itself, so the offload machine drives
    it as it is."""

    def __init__(self, manager: Any, vector: Any) -> None:
        super().__init__(manager)
        self.vector = vector
        self._state = tier_state(self.snapshot())
        vector.initial_state = self._state

    def _record(self, op: str, *args: Any) -> Any:
        named = named_arguments(op, args, {})
        step: dict[str, Any] = {"op": op, "args": {k: encode(v) for k, v in named.items()}}
        result, error = None, None
        try:
            result = getattr(TierTarget, op)(self, *args)
        except (ValueError, TypeError) as e:
            error = e
        if error is not None:
            step["refused"] = refusal_kind(error)
        else:
            step["result"] = encode(result)
        after = tier_state(self.snapshot())
        if delta := {k: v for k, v in after.items() if self._state.get(k) != v}:
            step["state"] = delta
        self._state = after
        self.vector.steps.append(step)
        if error is not None:
            raise error
        return result

    def lookup(self, key: bytes) -> str:
        return self._record("lookup", key)

    def prepare_load(self, keys: list[bytes]) -> list[int]:
        return self._record("prepare_load", keys)

    def touch(self, keys: list[bytes]) -> None:
        return self._record("touch", keys)

    def complete_load(self, keys: list[bytes]) -> None:
        return self._record("complete_load", keys)

    def prepare_store(self, keys: list[bytes]) -> tuple[list[bytes], list[int], list[bytes]] | None:
        return self._record("prepare_store", keys)

    def complete_store(self, keys: list[bytes], success: bool) -> None:
        return self._record("complete_store", keys, success)

    def reset_cache(self) -> None:
        return self._record("reset_cache")

    def take_events(self) -> list[tuple[bool, tuple[bytes, ...]]]:
        return self._record("take_events")


# --- replaying ----------------------------------------------------------------------------------


def replay(doc: dict[str, Any], factory: Callable[..., Any]) -> list[str]:
    """Replay one offload vector against the tier ``factory(**config)``
    builds (a :class:`TierTarget`): every difference, one line each.  Each
    step is also judged by chapter 11's rules, as the offload machine judges
    it (a ledger kept from the target's own answers; tier-policy against
    the evictions the vector records): a difference that breaks a rule is
    reported under the rule's name first."""
    target = factory(**doc["config"])
    expected = dict(doc["initial_state"])
    snap = target.snapshot()
    got = tier_state(snap)
    problems = [f"initial state: {c} is {got.get(c)}, expected {v}" for c, v in expected.items() if got.get(c) != v]
    ledger = tiers.Ledger()
    for i, step in enumerate(doc["steps"], 1):
        where = f"step {i} {step['op']}"
        if step["op"] not in OPERATIONS:
            raise ValueError(f"{step['op']!r} is not an operation of an offloading tier")
        kwargs = {k: decode(v) for k, v in step["args"].items()}
        try:
            result, error = getattr(target, step["op"])(**kwargs), None
        except (ValueError, TypeError) as e:
            result, error = None, e
        except Exception as e:  # a crash ends the replay
            return [*problems, f"{where}: crashed with {type(e).__name__}: {e}"]
        before, snap = snap, target.snapshot()
        judged = _judged(step, kwargs, ledger, before, snap, result, error)
        if not doc["config"].get("enable_events", False):  # events off: the tier owes none (tier-events is moot)
            judged = [(rule, p) for rule, p in judged if rule != "tier-events"]
        problems += [f"{where}: {rule}: {p}" for rule, p in judged]
        problems += _outcome_differences(where, step, result, error)
        expected.update(step.get("state", {}))
        got = tier_state(snap)
        problems += [f"{where}: {c} is {got.get(c)}, expected {v}" for c, v in expected.items() if got.get(c) != v]
        if problems:
            return problems
    return problems


def _judged(step: dict[str, Any], kwargs: dict[str, Any], ledger: tiers.Ledger, before: TierSnapshot,
            after: TierSnapshot, result: Any, error: BaseException | None) -> list[tuple[str, str]]:
    """Chapter 11's rules on one replayed step (``ledger`` settled after)."""
    op = step["op"]
    args = tuple(kwargs[name] for name in named_arguments(op, (), kwargs))
    if error is not None:  # a refusal: nothing may change (the rules of the state, and the state compared)
        return tiers.check_tier_state(after, ledger)
    due = None
    found: list[tuple[str, str]] = []
    if op == "prepare_store" and "result" in step:
        due = None if step["result"] is None else [decode(k) for k in step["result"][2]]
        if (result is None) != (step["result"] is None):
            found.append(("tier-policy", f"prepare_store gave {'up' if result is None else 'blocks'}; the policy "
                                         f"{'gives up' if step['result'] is None else 'finds blocks'}"))
    found += tiers.check_tier_step(tiers.TierStep(op, args, ledger, before, after, result, None), due)
    tiers.settle(ledger, op, args, result)
    return found + tiers.check_tier_state(after, ledger)


def refusal_kind(error: BaseException) -> str:
    return "TypeError" if isinstance(error, TypeError) else "ValueError"


def _outcome_differences(where: str, step: dict[str, Any], result: Any, error: BaseException | None) -> list[str]:
    """The result or the refusal against the step's (as codec judges a pool's or a manager's)."""
    if "refused" in step:
        if error is None:
            return [f"{where}: accepted (returned {encode(result)}), expected a {step['refused']} refusal"]
        if refusal_kind(error) != step["refused"]:
            return [f"{where}: refused with {type(error).__name__}, expected {step['refused']}"]
        return []
    if error is not None:
        return [f"{where}: refused ({type(error).__name__}: {error}), expected {step['result']}"]
    if encode(result) != step["result"]:
        return [f"{where}: returned {encode(result)}, expected {step['result']}"]
    return []


# --- what a vector exercises ----------------------------------------------------------------------


def exercised(vector: Any) -> set[str]:
    """The tier rules whose predicates a step puts to the test (every rule is
    checked on every step; this says where one matters): a lookup that
    finds a key, a load, a store given blocks, a failed store
    (tier-content-soundness); a load begun or ended, a key pending
    (tier-ref-conservation); a store that evicts or gives up, a key made
    busy or idle (tier-eviction); events taken (tier-events); an eviction
    that chose among more evictable keys than it took (tier-policy)."""
    rules: set[str] = set()
    for before, step, after in states(vector):
        op, args, result = step["op"], step["args"], step.get("result")
        if "refused" in step:
            rules.add("tier-ref-conservation" if op == "complete_load" else "tier-content-soundness")
            continue
        if (op == "lookup" and result != "MISS") or op == "prepare_load":
            rules.add("tier-content-soundness")
        if op == "complete_store" and not args.get("success", True) and after["entries"] != before["entries"]:
            rules.add("tier-content-soundness")  # a failed store: its key is dropped, never served
        if op in ("prepare_load", "complete_load") or any(r == -1 for _, r in after["entries"].values()):
            rules.add("tier-ref-conservation")
        if after["evictable"] != before["evictable"]:
            rules.add("tier-eviction")
        if op == "prepare_store":
            if result is None:
                rules |= {"tier-eviction", "tier-policy"}  # giving up is the policy's answer too (F18)
            else:
                to_store, _, evicted = result
                if to_store:
                    rules |= {"tier-content-soundness", "tier-ref-conservation"}
                if evicted:
                    rules.add("tier-eviction")
                    asked = {k["bytes"] for k in args["keys"]}
                    if len([k for k in before["evictable"] if k not in asked]) > len(evicted):
                        rules.add("tier-policy")
        if op == "take_events" and result:
            rules.add("tier-events")
    return rules


# --- hand-written cases ---------------------------------------------------------------------------


@dataclass
class OffloadCase:
    """A scripted tier case: ``run(tier, k)`` drives a recording tier in
    plain form; ``k(i)`` is key ``i`` (the machine's ``key_of``)."""

    name: str
    description: str
    layout: OffloadLayout
    run: Callable[[Any, Callable[[int], bytes]], None]
    findings: tuple[str, ...] = ()


def _store(t: Any, keys: list[bytes], success: bool = True) -> Any:
    out = t.prepare_store(keys)
    if out is not None and out[0]:
        t.complete_store(out[0], success)
    return out


def _lru_eviction(t, k):
    _store(t, [k(0), k(1), k(2)])
    t.take_events()  # one stored event, the three keys in order
    t.touch([k(0)])  # 0 most recent: 1 is now the least recent
    t.prepare_store([k(3)])  # evicts 1, its block reused
    t.lookup(k(1))
    t.complete_store([k(3)], True)
    t.take_events()  # removed [1], then stored [3]
    t.touch([k(2), k(3)])  # the first most recent: order 0, 3, 2
    t.prepare_store([k(4), k(5)])  # evicts 0, 3


def _lru_loads_protect(t, k):
    _store(t, [k(0), k(1)])
    t.prepare_load([k(0)])
    t.prepare_load([k(0)])  # two loads in flight: ref 2, not evictable
    t.prepare_store([k(2)])  # only 1 is evictable
    t.complete_load([k(0)])
    t.prepare_store([k(3)])  # 0 still loaded once, 2 pending: nothing to evict
    t.complete_load([k(0)])  # 0 idle again, most recent
    t.complete_store([k(2)], True)
    t.prepare_store([k(3)])  # 0 was freed before 2 completed: 0 is evicted
    t.take_events()


def _pending_and_failed(t, k):
    t.prepare_store([k(0), k(1)])
    t.lookup(k(0))  # HIT_PENDING
    refused(t.prepare_load, [k(0)])  # a pending key cannot be loaded
    t.complete_store([k(0)], False)  # failed: dropped, its block freed
    t.lookup(k(0))  # MISS
    refused(t.prepare_load, [k(0)])
    t.complete_store([k(1), k(5)], True)  # 5 was never pending: left as it is
    t.complete_store([k(1)], False)  # 1 is not pending any more: left as it is
    t.prepare_store([k(2), k(3)])  # a fresh block, then the one 0 freed
    t.take_events()  # only 1's store made a key readable


def _refusals(t, k):
    refused(t.prepare_load, [k(0)])
    _store(t, [k(0)])
    refused(t.complete_load, [k(0)])  # no load in flight
    t.prepare_load([k(0)])
    t.complete_load([k(0)])
    refused(t.complete_load, [k(0)])


def _store_gives_up(t, k):
    _store(t, [k(0), k(1)])
    t.prepare_load([k(0)])
    t.prepare_store([k(2), k(3)])  # one free block lacking, only 1 evictable: but 2 are lacking
    t.prepare_store([k(1), k(2)])  # 1 is asked for, so not evictable here: gives up
    t.prepare_store([k(2)])  # evicts 1
    t.prepare_store([k(3)])  # 0 loaded, 2 pending: gives up, nothing changes
    t.prepare_store([k(0), k(2)])  # every key held: nothing to store, nothing evicted
    t.complete_load([k(0)])
    t.complete_store([k(2)], True)
    t.take_events()


def _reset(t, k):
    _store(t, [k(0), k(1)])
    t.prepare_store([k(2)])
    t.reset_cache()  # the tier is empty, every block free again; no event
    t.lookup(k(0))
    t.take_events()  # the stored event of before the reset is still owed
    t.prepare_store([k(3), k(4), k(5)])  # fresh blocks from 0 again


def _arc_t1_to_t2(t, k):
    _store(t, [k(0), k(1), k(2)])  # T1: 0, 1, 2
    t.prepare_store([k(3)])  # pending in T1
    t.touch([k(3), k(1)])  # 1 ready: to T2; 3 pending: stays in T1, most recent
    t.touch([k(1)])  # a T2 key: most recent of T2
    t.touch([k(9)])  # unknown: ignored
    t.complete_store([k(3)], True)
    t.prepare_store([k(4), k(5)])  # T1 (0, 2, 3) is at least its target 0: T1's oldest go to B1
    t.take_events()


def _arc_ghosts_adapt(t, k):
    _store(t, [k(0), k(1), k(2)])
    t.touch([k(1), k(2)])  # T2: 2, 1 (walked last to first)
    _store(t, [k(3)])  # evicts T1's 0 into B1
    t.touch([k(0)])  # a B1 ghost: T1's target grows by 1
    _store(t, [k(4)])  # T1 (3) is not under target 1: T1's 3 goes to B1
    t.touch([k(4)])  # T2: 2, 1, 4
    _store(t, [k(5)])  # T1 (empty) under target 1: T2's oldest, 2, to B2
    t.touch([k(2)])  # a B2 ghost: the target shrinks to 0
    t.touch([k(3), k(0)])  # B1 ghosts: the target grows (B2/B1 = 1/2, so by 1 each)
    _store(t, [k(6)])  # T1 (5) under target 2: T2's oldest, 1
    t.prepare_store([k(0)])  # a ghost stored again: it leaves B1 for T1
    t.take_events()


def _arc_falls_back_to_t1(t, k):
    _store(t, [k(0), k(1)])
    t.touch([k(0)])  # T2: 0
    _store(t, [k(2)])  # evicts T1's 1 into B1
    t.touch([k(1)])  # B1 ghost: target 1
    t.prepare_load([k(0)])  # T2's only key busy
    t.prepare_store([k(3)])  # T1 (2) is not under target 1: T1's 2 evicted
    t.complete_store([k(3)], True)
    t.touch([k(2)])  # B1 ghost again: target 2
    t.prepare_store([k(4)])  # T1 (3) under target 2, T2 has nothing evictable: T1's 3 (F18: vLLM 0.25.1 gives up)
    t.complete_load([k(0)])
    t.take_events()


def _threshold(t, k):
    t.prepare_store([k(0)])  # asked once by no lookup: not stored
    t.lookup(k(0))
    t.prepare_store([k(0), k(1)])  # 0 asked once: still not stored
    t.lookup(k(1))
    t.lookup(k(0))
    t.prepare_store([k(0), k(1)])  # 0 asked twice: stored; 1 once: not
    t.complete_store([k(0)], True)
    t.lookup(k(0))  # HIT (and counted)
    t.take_events()


def _threshold_tracker_forgets(t, k):
    t.lookup(k(0))
    t.lookup(k(0))
    _store(t, [k(0)])  # stored, the tier's only block
    t.lookup(k(1))
    t.lookup(k(2))  # the tracker holds 2 keys: 0's count is forgotten
    t.lookup(k(1))
    t.prepare_store([k(0), k(1)])  # 1 passes, 0 is held and asked: not evictable here -- gives up (F17)
    t.take_events()


def _events_off(t, k):
    _store(t, [k(0), k(1)])
    t.prepare_store([k(2)])
    t.take_events()  # events disabled: always none


def _tier(name: str, num_blocks: int, cache_policy: str = "lru", **kw: Any) -> OffloadLayout:
    return OffloadLayout(name, num_blocks=num_blocks, cache_policy=cache_policy, **kw)


OFFLOAD_CASES: tuple[OffloadCase, ...] = (
    OffloadCase("lru-eviction", "LRU: a touch makes a key most recent, a store evicts the least recent, the "
                "first key of a touch ends most recent", _tier("lru-3", 3), _lru_eviction),
    OffloadCase("lru-loads-protect", "a key with loads in flight is not evictable; its last load completing makes "
                "it the most recent", _tier("lru-2", 2), _lru_loads_protect),
    OffloadCase("pending-and-failed-stores", "a pending key answers HIT_PENDING and cannot be loaded; a failed "
                "store drops its key and frees its block; completing what is not pending changes nothing",
                _tier("lru-4", 4), _pending_and_failed),
    OffloadCase("refusals", "a load of a key not stored, a completion with no load in flight: refused, nothing "
                "changes", _tier("lru-2", 2), _refusals),
    OffloadCase("store-gives-up", "a store gives up, changing nothing, exactly when the evictable keys not asked "
                "for are too few; a store of held keys alone stores nothing", _tier("lru-2", 2), _store_gives_up),
    OffloadCase("reset", "a reset empties the tier and frees every block (no event)", _tier("lru-3", 3), _reset),
    OffloadCase("arc-t1-to-t2", "ARC: a touched ready key moves from T1 to T2, a pending one stays in T1; a store "
                "evicts T1's oldest into B1", _tier("arc-4", 4, "arc"), _arc_t1_to_t2),
    OffloadCase("arc-ghosts-adapt", "ARC: touching a B1 ghost grows T1's target, a B2 ghost shrinks it; below "
                "its target T1 is spared and T2's oldest goes to B2; a ghost stored again leaves its list",
                _tier("arc-3", 3, "arc"), _arc_ghosts_adapt),
    OffloadCase("arc-falls-back-to-t1", "ARC: T1 under its target and nothing evictable in T2 -- the store "
                "evicts from T1 rather than give up (vLLM 0.25.1 gives up: F18)", _tier("arc-2", 2, "arc"),
                _arc_falls_back_to_t1, ("F18",)),
    OffloadCase("store-threshold", "store threshold 2: a key is stored only once looked up twice",
                _tier("threshold-2", 4, store_threshold=2), _threshold),
    OffloadCase("threshold-tracker-forgets", "store threshold 2, a tracker of 2 keys: a held key whose count was "
                "forgotten is still protected from the store that asks for it (vLLM 0.25.1 evicts it: F17)",
                _tier("threshold-small-tracker", 1, store_threshold=2, max_tracker_size=2),
                _threshold_tracker_forgets, ("F17",)),
    OffloadCase("events-off", "events disabled: take_events gives none", _tier("lru-2", 2), _events_off),
)


def case_config(case: OffloadCase) -> dict[str, Any]:
    """A case's tier configuration (events on, but for the case about them off)."""
    config = config_of(case.layout)
    if case.name == "events-off":
        config["enable_events"] = False
    return config


def recording(vector: Any, **options: Any) -> OffloadRecorder:
    """The spec's tier built with ``options``, recording into ``vector``."""
    return OffloadRecorder(SpecOffloadingManager(**options), vector)
