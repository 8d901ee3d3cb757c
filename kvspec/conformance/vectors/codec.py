"""Conformance vectors: the spec's behaviour as language-neutral JSON files.

A *vector* is one case: a configuration, then operations with their
arguments, and after each the outcome the spec gives -- the result or the
kind of refusal, the events, and the parts of the state that changed.  Any
implementation, in any language, replays the operations and compares.  The
format is documented in ``docs/VECTORS.md``; this module writes and reads it.

- :func:`generate` derives a corpus from the spec: hand-written edge cases
  (:mod:`kvspec.conformance.vector_cases`), the conformance machines' walks
  over every layout with the spec as the target (recorded by
  :class:`Recorder`), and every finding's trace.
- :func:`check` replays a corpus against a Python target and reports every
  difference; a file it cannot read is a failure, not a skip.

Values that JSON lacks are tagged: ``{"bytes": hex}``, ``{"set": [...]}``,
``{"int": "decimal"}`` (integers beyond 2**53, which JavaScript cannot hold),
``{"lora": [name, id, path]}``, ``{"request": id}``, ``{"mm": [identifier,
offset, length]}``; events are ``{"event": "stored" | "removed" | "cleared",
...fields}``.  Tuples are lists.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvspec.conformance.vectors.steps import states
from kvspec.hashing import get_request_block_hasher, rooted_at
from kvspec.kv_cache_interface import KVCacheSpec
from kvspec.request import LoRARequest, MultiModalFeatureSpec, PlaceholderRange, Request, RequestStatus
from kvspec.spec import releases
from kvspec.spec.interface import (
    NULL_BLOCK_ID,
    Cleared,
    ManagerQueries,
    ManagerSnapshot,
    ManagerTarget,
    PoolSnapshot,
    PoolTarget,
    Removed,
    Stored,
    comparable,
)
from kvspec.spec.request_rules import shared_prefix

FORMAT_VERSION = 1
HASH_SEED = "0"
"""Every vector's hash chains are rooted as under ``PYTHONHASHSEED=0``."""
PROTOCOLS = {"pool": PoolTarget, "manager": ManagerTarget}
SCOPES = (*PROTOCOLS, "offload")  # offload: an offloading tier (chapter 11; vectors.offload records and replays it)
QUERIES = {"manager": ManagerQueries}  # optional operations, recorded where the recording target has them
EVENT_TYPES = {"stored": Stored, "removed": Removed, "cleared": Cleared}
MANAGER_ANNOTATIONS = ("spec_kind", "sliding_window")  # what a manager says of a Stored event's group; absent: unset
SAFE_INT = 2**53
CORPUS_FILES = ("index.json", "coverage.json")  # what a corpus holds beside its vectors


class VectorError(ValueError):
    """A vector file that cannot be read: not JSON, another format, or a
    value this version does not know."""


# --- values -----------------------------------------------------------------------------------


def to_json(value: Any) -> Any:
    """A Python value as the vectors' JSON (see the module docstring)."""
    if value is None or isinstance(value, (bool, str, float)):
        return value
    if isinstance(value, int):
        return value if -SAFE_INT < value < SAFE_INT else {"int": str(value)}
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": bytes(value).hex()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return {"set": sorted(to_json(v) for v in value)}
    if isinstance(value, Request):
        return {"request": value.request_id}
    if isinstance(value, LoRARequest):
        return {"lora": [value.lora_name, value.lora_int_id, value.lora_path]}
    if isinstance(value, MultiModalFeatureSpec):
        return {"mm": [value.identifier, value.mm_position.offset, value.mm_position.length]}
    if isinstance(value, (Stored, Removed, Cleared)):
        name = next(k for k, t in EVENT_TYPES.items() if isinstance(value, t))
        return {"event": name, **{f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)
                                  if not (f.name in MANAGER_ANNOTATIONS and getattr(value, f.name) is None)}}
    raise VectorError(f"a {type(value).__name__} cannot be written in a vector: {value!r}")


def from_json(value: Any, requests: dict[str, Request] | None = None) -> Any:
    """The inverse of :func:`to_json`; ``{"request": id}`` is looked up in
    ``requests``.  Lists come back as lists."""
    if isinstance(value, list):
        return [from_json(v, requests) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        (tag, inner), = value.items()
        if tag == "bytes":
            return bytes.fromhex(inner)
        if tag == "set":
            return {from_json(v, requests) for v in inner}
        if tag == "int":
            return int(inner)
        if tag == "lora":
            return LoRARequest(*inner)
        if tag == "mm":
            return MultiModalFeatureSpec(inner[0], PlaceholderRange(inner[1], inner[2]))
        if tag == "request":
            if requests is None or inner not in requests:
                raise VectorError(f"an argument names request {inner!r}, which the vector never describes")
            return requests[inner]
    if "event" in value:
        kind = EVENT_TYPES.get(value["event"])
        if kind is None:
            raise VectorError(f"unknown event type {value['event']!r}")
        return kind(**{k: _as_tuples(from_json(v, requests)) for k, v in value.items() if k != "event"})
    raise VectorError(f"unknown tagged value {value!r}")


def _as_tuples(value: Any) -> Any:
    """Lists as tuples, all the way down: events hold tuples."""
    return tuple(_as_tuples(v) for v in value) if isinstance(value, list) else value


# --- observations -----------------------------------------------------------------------------


def pool_state(snap: PoolSnapshot) -> dict[str, Any]:
    """A pool's state as a vector records it: ref counts (the null block's
    as 0: it is not maintained), the free queue head first, each cached
    block's key, the table (key -> blocks, oldest first) and each block's
    partial entries (sorted: they are a set)."""
    return {
        "ref": [0, *snap.ref[1:]],
        "free": list(snap.free),
        "cached": {str(b): k.hex() for b, k in sorted(snap.key_of.items())},
        "table": {k.hex(): list(v) for k, v in sorted(snap.table.items())},
        "partial": {str(b): sorted(k.hex() for k in keys) for b, keys in sorted(snap.partial_of.items())},
    }


def state_of(snap: PoolSnapshot | ManagerSnapshot) -> dict[str, Any]:
    """The recorded state: a pool's, plus each request's block table at manager scope."""
    if isinstance(snap, ManagerSnapshot):
        tables = {rid: [list(g) for g in groups] for rid, groups in sorted(snap.tables.items())}
        return {**pool_state(snap.pool), "tables": tables}
    return pool_state(snap)


def changed(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The components of ``after`` that differ from ``before``: a vector
    records only those (a missing component is unchanged)."""
    return {k: v for k, v in after.items() if before.get(k) != v}


def refusal_kind(error: BaseException) -> str:
    """How a refusal is recorded: ``TypeError`` or ``ValueError`` (kvspec's
    rule errors are subclasses of these)."""
    return "TypeError" if isinstance(error, TypeError) else "ValueError"


# --- requests ---------------------------------------------------------------------------------


def request_identity(request: Request) -> dict[str, Any]:
    """What never changes about a request: its prompt and cache identity."""
    embeds = request.prompt_embeds
    return {
        "prompt_token_ids": list(request.prompt_token_ids),
        "prompt_embeds": None if embeds is None else [to_json(bytes(row)) for row in embeds],
        "cache_salt": request.cache_salt,
        "lora": to_json(request.lora_request),
        "mm_features": to_json(request.mm_features),
        "skip_reading_prefix_cache": request.skip_reading_prefix_cache,
    }


def request_progress(request: Request) -> dict[str, Any]:
    """What the scheduler changes between operations, and the block hashes
    that follow from the tokens (for replayers that do not hash)."""
    return {
        "output_token_ids": list(request.output_token_ids),
        "num_computed_tokens": request.num_computed_tokens,
        "spec_token_ids": list(request.spec_token_ids),
        "status": request.status.name,
        "num_preemptions": request.num_preemptions,
        "block_hashes": [h.hex() for h in request.block_hashes],
    }


def build_request(rid: str, identity: dict[str, Any], hash_block_size: int,
                  release: releases.Release = releases.REFERENCE) -> Request:
    embeds = identity.get("prompt_embeds")
    return Request(
        rid,
        identity["prompt_token_ids"],
        cache_salt=identity.get("cache_salt"),
        lora_request=from_json(identity.get("lora")),
        mm_features=from_json(identity.get("mm_features") or []),
        prompt_embeds=None if embeds is None else from_json(embeds),
        skip_reading_prefix_cache=identity.get("skip_reading_prefix_cache", False),
        block_hasher=get_request_block_hasher(hash_block_size, release=release),
    )


def bring_up_to_date(request: Request, progress: dict[str, Any]) -> str | None:
    """Set ``request`` to the recorded progress; a description of what
    cannot be reproduced (tokens taken back, other hashes), or ``None``."""
    outputs = progress["output_token_ids"]
    have = list(request.output_token_ids)
    if outputs[: len(have)] != have:
        return f"request {request.request_id}: recorded outputs {outputs} do not extend {have}"
    if len(outputs) > len(have):
        request.append_output_token_ids(outputs[len(have):])
    request.num_computed_tokens = progress["num_computed_tokens"]
    request.spec_token_ids = list(progress["spec_token_ids"])
    request.status = RequestStatus[progress["status"]]
    request.num_preemptions = progress["num_preemptions"]
    hashes = [h.hex() for h in request.block_hashes]
    if hashes != progress["block_hashes"]:
        return (f"request {request.request_id}: block hashes {hashes} differ from the recorded "
                f"{progress['block_hashes']}")
    return None


# --- layouts ----------------------------------------------------------------------------------


def config_of(scope: str, layout: Any, events: bool = True,
              release: releases.Release = releases.REFERENCE) -> dict[str, Any]:
    """A layout as a vector's ``config``: the pool's constructor arguments,
    or a manager layout's groups (each spec by type and fields); ``release``
    when the release judged is not the base (spec/releases/)."""
    release = {} if release.is_base else {"release": release.known}
    if scope == "pool":
        return {"hash_seed": HASH_SEED, **release, "num_blocks": layout.num_blocks,
                "enable_caching": layout.enable_caching, "hash_block_size": layout.hash_block_size,
                "enable_kv_cache_events": layout.events, "group_block_sizes": list(layout.group_block_sizes)}
    groups = [{"type": type(g).__name__, **{f.name: getattr(g, f.name) for f in dataclasses.fields(g)}}
              for g in layout.groups]
    return {"hash_seed": HASH_SEED, **release, "num_blocks": layout.num_blocks, "max_model_len": layout.max_model_len,
            "enable_caching": layout.enable_caching, "use_eagle": layout.use_eagle,
            "eagle_groups": list(layout.eagle_groups), "enable_kv_cache_events": events,
            "scheduler_block_size": layout.scheduler_block_size, "hash_block_size": layout.hash_block_size,
            "groups": groups, **layout.target_options()}


def target_of(scope: str, config: dict[str, Any], factory: Callable[..., Any]) -> Any:
    """The target ``factory`` builds for a vector's ``config``."""
    if scope == "pool":
        return factory(config["num_blocks"], config["enable_caching"], config["hash_block_size"],
                       config["enable_kv_cache_events"])
    from kvspec import kv_cache_interface
    from kvspec.spec.layout import Layout

    groups = []
    for g in config["groups"]:
        spec_type = getattr(kv_cache_interface, g["type"], None)
        if not (isinstance(spec_type, type) and issubclass(spec_type, KVCacheSpec)):
            raise VectorError(f"unknown KV-cache spec type {g['type']!r}")
        groups.append(spec_type(**{k: v for k, v in g.items() if k != "type"}))
    layout = Layout(tuple(groups), num_blocks=config["num_blocks"], max_model_len=config["max_model_len"],
                    enable_caching=config["enable_caching"], use_eagle=config["use_eagle"],
                    eagle_groups=tuple(config["eagle_groups"]),
                    given_scheduler_block_size=config["scheduler_block_size"],
                    given_hash_block_size=config["hash_block_size"],
                    retention_interval=config.get("retention_interval"),
                    dcp_world_size=config.get("dcp_world_size", 1), pcp_world_size=config.get("pcp_world_size", 1),
                    max_num_batched_tokens=config.get("max_num_batched_tokens"),
                    watermark=config.get("watermark", 0.0),
                    release=releases.judged(config.get("release", releases.BASE)))
    return layout.make_target(factory, config["enable_kv_cache_events"])


# --- recording --------------------------------------------------------------------------------


def optional_query(scope: str, op: str) -> bool:
    """Whether ``op`` is one of the scope's optional queries (a target may lack it)."""
    return not hasattr(PROTOCOLS[scope], op) and hasattr(QUERIES.get(scope), op)


def named_arguments(scope: str, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``args``/``kwargs`` by the parameter names of the target protocol's ``op``."""
    method = getattr(PROTOCOLS[scope], op, None) or getattr(QUERIES.get(scope), op, None)
    if method is None:
        raise VectorError(f"{op!r} is not an operation of the {scope} target protocol")
    bound = inspect.signature(method).bind(None, *args, **kwargs)
    return {k: v for k, v in bound.arguments.items() if k != "self"}


@dataclass
class Vector:
    """One case being recorded (see docs/VECTORS.md for the file format)."""

    name: str
    scope: str
    config: dict[str, Any]
    description: str = ""
    findings: list[str] = field(default_factory=list)
    initial_state: dict[str, Any] = field(default_factory=dict)
    requests: dict[str, dict[str, Any]] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    refused: str | None = None  # a configuration the target must refuse to be built with: the rule it breaks
    refused_with: str | None = None  # ... and the error it must raise (refusal_kind)

    def to_dict(self) -> dict[str, Any]:
        refused = {} if self.refused is None else {"refused": self.refused, "refused_with": self.refused_with}
        return {"kvspec_vectors": FORMAT_VERSION, "name": self.name, "scope": self.scope,
                "description": self.description, "findings": self.findings, "rules": sorted(exercised(self)),
                "config": self.config, **refused, "initial_state": self.initial_state, "requests": self.requests,
                "steps": self.steps}


class Recorder:
    """A target that records every operation sent through it into a
    :class:`Vector`: the arguments by name, the requests' progress, the
    outcome, the state that changed and the events."""

    # Not recorded: what the state already says (the free count), and the snapshot and events themselves.
    # Usage is recorded although the ledger implies it: it is a float a port computes, and reports.  The
    # common prefix is recorded as a bound (``at_most``): its contract is soundness, so a vector holds a
    # target to the tables, not to the spec's exact count.
    RECORDED = frozenset(n for p in (*PROTOCOLS.values(), *QUERIES.values())
                         for n, _ in inspect.getmembers(p, inspect.isfunction)
                         if not n.startswith("_")) - {"snapshot", "take_events", "get_num_free_blocks"}
    BOUNDED = frozenset({"get_num_common_prefix_blocks"})

    def __init__(self, inner: Any, vector: Vector):
        self._inner = inner
        self.vector = vector
        self._state = state_of(inner.snapshot())
        vector.initial_state = self._state
        self._events: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in self.RECORDED or not callable(attr):
            return attr

        @functools.wraps(attr)  # callers that inspect the signature see the target's
        def recorded(*args: Any, **kwargs: Any) -> Any:
            return self._record(name, attr, args, kwargs)

        return recorded

    def _record(self, op: str, method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        named = named_arguments(self.vector.scope, op, args, kwargs)
        step: dict[str, Any] = {"op": op, "args": {k: to_json(v) for k, v in named.items()}}
        requests = [v for v in named.values() if isinstance(v, Request)]
        for request in requests:
            self.vector.requests.setdefault(request.request_id, request_identity(request))
        if requests:
            step["progress"] = {r.request_id: request_progress(r) for r in requests}
        result, error = None, None
        try:
            result = method(*args, **kwargs)
        except (ValueError, TypeError) as e:
            error = e
        snap = self._inner.snapshot()
        if error is not None:
            step["refused"] = refusal_kind(error)
        elif op in self.BOUNDED:
            step["at_most"] = shared_prefix(snap.tables, named["running_request_id"], len(result))
        else:
            step["result"] = to_json(result)
        after = state_of(snap)
        if delta := changed(self._state, after):
            step["state"] = delta
        self._state = after
        events = self._inner.take_events()
        if events:
            step["events"] = [to_json(e) for e in events]
        self._events += events
        self.vector.steps.append(step)
        if error is not None:
            raise error
        return result

    def take_events(self) -> list[Any]:
        events, self._events = self._events, []
        return events

    def snapshot(self) -> Any:
        return self._inner.snapshot()


# --- what a vector exercises ------------------------------------------------------------------


def exercised(vector: Vector) -> set[str]:
    """The rules a vector puts to the test: those whose predicate can fail
    on one of its steps because the step does what the rule is about (a
    shared block, a hit, an eviction, a refusal, a free of several blocks,
    a reset, a tenant's prefix, external tokens, a window's release ...).
    Every rule is *checked* on every step; this says where it *matters*."""
    if vector.refused is not None:
        return {vector.refused}
    if vector.scope == "offload":
        from kvspec.conformance.vectors import offload

        return offload.exercised(vector)
    rules: set[str] = set()
    sizes = {g["block_size"] for g in vector.config.get("groups", [])} | set(vector.config.get("group_block_sizes", []))
    if len(sizes) > 1 or any(s != vector.config["hash_block_size"] for s in sizes):
        rules.add("block-size-coherence")
    if any(i.get("cache_salt") or i.get("lora") for i in vector.requests.values()):
        rules.add("tenant-isolation")
    for before, step, after in states(vector):
        op, args = step["op"], step["args"]
        if "refused" in step or (op == "allocate_slots" and step.get("result") is None):
            rules.add("allocation-accounting")
        if op in ("get_new_blocks", "allocate_slots") and before["free"] and after["free"] != before["free"]:
            rules.add("allocation-accounting")
        if any(n > 1 for n in after["ref"]):
            rules.add("ref-conservation")
        taken = set(before["free"]) - set(after["free"])
        if taken and any(before["free"].index(b) >= len(taken) for b in taken):
            rules.add("free-queue-consistency")  # taken from inside the queue: a hit on a free cached block
        if set(before["cached"]) - set(after["cached"]):
            rules.add("hash-map-consistency")
        if after["cached"] != before["cached"] and len(after["table"]) < len(after["cached"]):
            rules.add("hash-map-consistency")  # two blocks under one key
        returned = [b for b in after["free"] if b not in before["free"]]
        if len(returned) > 1:
            rules.add("free-order")
        if op == "reset_prefix_cache":
            rules.add("reset")
        hit = (op == "get_cached_block" and step.get("result") is not None) or (
            op == "get_computed_blocks" and isinstance(step.get("result"), list) and step["result"][1] > 0)
        if hit:
            rules |= {"content-soundness", "no-aliasing", "hit-soundness"}
        if op == "get_computed_blocks":
            rules.add("hit-optimality")
        if op == "get_num_common_prefix_blocks" and any(step.get("at_most", ())):
            rules.add("no-aliasing")  # a shared prefix a target could over-count
        if any(0 in g for t in after.get("tables", {}).values() for g in t) or (
                op == "free_blocks" and NULL_BLOCK_ID in args.get("block_ids", [])):
            rules |= {"null-exclusion", "content-soundness"}
        if op == "allocate_slots" and args.get("num_external_computed_tokens", 0) and any(
                args.get("new_computed_blocks") or []):
            rules.add("no-eviction-in-use")
    return rules


CHAPTERS: dict[str, str] = {
    "1": "The pool", "1.1": "Hashing", "2": "One full-attention group", "3": "Windows", "4": "Several groups",
    "5": "Mamba", "6": "EAGLE", "7": "External tokens", "8": "Cross attention", "9": "Releases",
    "11": "Tiers",
}
"""spec/README.md's chapters (and the hashing section), by number."""


def chapters(vector: Vector) -> set[str]:
    """The chapters of spec/README.md a vector needs a port to have read:
    the pool's for every vector (a manager stands on it), hashing's where a
    block is stored under a key (a Stored event carries the key's bytes),
    one per attention kind among its groups, several groups', EAGLE's,
    external tokens' where a step takes connector tokens, and releases'
    where it judges a release after the base; an offloading tier's, chapter
    11's alone."""
    if vector.scope == "offload":
        return {"11"}
    found = {"1"}
    groups = vector.config.get("groups", [])  # a manager's; a pool vector has none
    for group in groups:
        kind = group.get("type", "")
        if kind in ("FullAttentionSpec", "MLAAttentionSpec") and group.get("sliding_window") is None:
            found.add("2")
        elif "Mamba" in kind:
            found.add("5")
        elif "CrossAttention" in kind:
            found.add("8")
        else:  # sliding window, chunked local, full attention with a window (R-SWA)
            found.add("3")
    if len(groups) > 1:
        found.add("4")
    if vector.config.get("use_eagle"):
        found.add("6")
    if vector.config.get("release"):
        found.add("9")
    for step in vector.steps:
        if any(e.get("event") == "stored" for e in step.get("events", [])):
            found.add("1.1")
        if step["op"] == "allocate_slots" and step["args"].get("num_external_computed_tokens"):
            found.add("7")
    return found


# --- reading and checking ---------------------------------------------------------------------


def read(path: Path) -> dict[str, Any]:
    """A vector file, checked for the format's version and required keys."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise VectorError(f"{path}: not a readable JSON file ({error})") from None
    if not isinstance(doc, dict) or doc.get("kvspec_vectors") != FORMAT_VERSION:
        raise VectorError(f"{path}: not a kvspec vector of format {FORMAT_VERSION} "
                          f"(\"kvspec_vectors\": {doc.get('kvspec_vectors') if isinstance(doc, dict) else None!r})")
    missing = [k for k in ("name", "scope", "config", "initial_state", "requests", "steps") if k not in doc]
    if missing:
        raise VectorError(f"{path}: missing {', '.join(missing)}")
    if doc["scope"] not in SCOPES:
        raise VectorError(f"{path}: unknown scope {doc['scope']!r}")
    return doc


def write(vector: Vector, path: Path) -> None:
    """One top-level field, then one step, per line: a diff between two
    corpora reads step by step."""
    doc = vector.to_dict()
    steps = doc.pop("steps")
    compact = {"separators": (",", ":")}
    head = ",\n".join(f" {json.dumps(k)}: {json.dumps(v, **compact)}" for k, v in doc.items())
    body = ",\n".join("  " + json.dumps(s, **compact) for s in steps)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{{\n{head},\n \"steps\": [\n{body}\n ]\n}}\n")


def _replay_refusal(scope: str, config: dict[str, Any], rule: str, kind: str | None,
                    factory: Callable[..., Any]) -> list[str]:
    """A configuration vector: building the target must be refused, with
    the error ``kind`` names (any refusal where the vector names none)."""
    from kvspec.conformance.machines.configurations import build_outcome

    outcome, got = build_outcome(lambda: target_of(scope, config, factory))
    if outcome == "refused":
        asserted = isinstance(got.__cause__, AssertionError)  # an adapter's reading of an assert, which has no kind
        if kind is not None and not asserted and refusal_kind(got) != kind:
            return [f"construction: refused with {type(got).__name__} ({got}), expected a {kind} ({rule})"]
        return []
    if outcome == "crashed":
        return [f"construction: raised {type(got).__name__}: {got}; a refusal must raise ValueError or TypeError"]
    return [f"construction: built a {type(got).__name__}; the configuration breaks {rule} and must be refused"]


def vector_release(doc: dict[str, Any]) -> releases.Release:
    """The release whose rules a vector was written under (its config's
    ``release``; none: the base)."""
    return releases.judged(doc["config"].get("release", releases.BASE))


def for_release(factory: Callable[..., Any], release: releases.Release) -> Callable[..., Any]:
    """``factory`` building for ``release``: a factory bound to a release
    (``functools.partial(..., release=...)``, as :func:`targets_for` gives
    the spec and impl) is bound to this one; any other is as it is (vLLM is
    the release it is)."""
    if isinstance(factory, functools.partial) and "release" in factory.keywords:
        return functools.partial(factory.func, *factory.args, **{**factory.keywords, "release": release})
    return factory


def replay_vector(doc: dict[str, Any], factory: Callable[..., Any]) -> list[str]:
    """Replay one vector against a target built by ``factory`` (built for
    the vector's release where it is bound to one: :func:`for_release`);
    every observation that differs, as one line each (empty: it conforms)."""
    scope, config = doc["scope"], doc["config"]
    release = vector_release(doc)
    factory = for_release(factory, release)
    if "refused" in doc:
        return _replay_refusal(scope, config, doc["refused"], doc.get("refused_with"), factory)
    if scope == "offload":
        from kvspec.conformance.vectors import offload

        return offload.replay(doc, factory)
    target = target_of(scope, config, factory)
    expected = dict(doc["initial_state"])
    got = state_of(target.snapshot())
    problems = [f"initial state: {component} is {got.get(component)}, expected {value}"
                for component, value in expected.items() if got.get(component) != value]
    requests: dict[str, Request] = {}
    for i, step in enumerate(doc["steps"], 1):
        where = f"step {i} {step['op']}"
        for rid, progress in step.get("progress", {}).items():
            if rid not in requests:
                requests[rid] = build_request(rid, doc["requests"][rid], config["hash_block_size"], release)
            if (problem := bring_up_to_date(requests[rid], progress)) is not None:
                return [*problems, f"{where}: {problem}"]
        method = getattr(target, step["op"], None)
        if method is None and optional_query(scope, step["op"]):
            continue  # a query the target does not offer: it changes nothing, so nothing is missed after it
        if method is None:
            return [*problems, f"{where}: the target has no operation {step['op']!r}"]
        kwargs = {k: from_json(v, requests) for k, v in step["args"].items()}
        try:
            result, error = method(**kwargs), None
        except (ValueError, TypeError) as e:
            result, error = None, e
        except Exception as e:  # a crash is an observation too: it ends the replay
            return [*problems, f"{where}: crashed with {type(e).__name__}: {e}"]
        problems += _outcome_differences(where, step, result, error)
        expected.update(step.get("state", {}))
        got = state_of(target.snapshot())
        problems += [f"{where}: {component} is {got.get(component)}, expected {value}"
                     for component, value in expected.items() if got.get(component) != value]
        events = [to_json(e) for e in target.take_events()]
        if comparable(events) != comparable(step.get("events", [])):
            problems.append(f"{where}: events {events}, expected {step.get('events', [])}")
        if problems:
            return problems  # later steps would only repeat the first difference
    return problems


def _outcome_differences(where: str, step: dict[str, Any], result: Any, error: BaseException | None) -> list[str]:
    if "refused" in step:
        if error is None:
            return [f"{where}: accepted (returned {to_json(result)}), expected a {step['refused']} refusal"]
        if not isinstance(error, (ValueError, TypeError)):  # as the machines judge it: a crash, not a refusal
            return [f"{where}: raised {type(error).__name__}: {error}; a refusal must raise ValueError or TypeError "
                    f"(expected {step['refused']})"]
        if refusal_kind(error) != step["refused"]:
            return [f"{where}: refused with {type(error).__name__}, expected {step['refused']}"]
        return []
    if "at_most" in step:
        return _bound_differences(where, step["at_most"], result, error)
    if error is not None:
        return [f"{where}: refused ({type(error).__name__}: {error}), expected {step['result']}"]
    if to_json(result) != step["result"]:
        return [f"{where}: returned {to_json(result)}, expected {step['result']}"]
    return []


def _bound_differences(where: str, bound: list[int], result: Any, error: BaseException | None) -> list[str]:
    """A bounded observation: one count per entry of ``bound``, each from 0 to it."""
    if error is not None:
        return [f"{where}: refused ({type(error).__name__}: {error}), expected counts of at most {bound}"]
    counts = to_json(result)
    if not isinstance(counts, list) or len(counts) != len(bound) or not all(
            type(n) is int and 0 <= n <= most for n, most in zip(counts, bound, strict=True)):
        return [f"{where}: returned {counts}, expected {len(bound)} counts, each from 0 to {bound}"]
    return []


@dataclass
class CheckReport:
    """The outcome of :func:`check`: files read, and per file its differences."""

    files: list[Path] = field(default_factory=list)
    unreadable: dict[Path, str] = field(default_factory=dict)
    differences: dict[Path, list[str]] = field(default_factory=dict)
    known: dict[Path, str] = field(default_factory=dict)  # a vector of known findings that diverged, as expected
    skipped: dict[Path, str] = field(default_factory=dict)  # another scope than the target's

    @property
    def ok(self) -> bool:
        return not self.unreadable and not self.differences and bool(self.files)


def vector_files(root: Path) -> list[Path]:
    """Every ``*.json`` file under ``root`` but the corpus's own
    ``index.json`` and ``coverage.json``."""
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*.json") if p.name not in CORPUS_FILES)


def targets_for(target: str, scopes: list[str]) -> dict[str, Callable[..., Any]]:
    """The factories a check replays ``target`` through, per scope; a
    target that cannot replay the vectors here raises ``SetupError``."""
    from kvspec.conformance.runner import check_target
    from kvspec.errors import SetupError

    if ":" in target and len(scopes) > 1:
        raise SetupError("a module:factory target serves one scope: add --scope pool or --scope manager")
    if target == "vllm" and os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        raise SetupError(f"vectors are hashed as under PYTHONHASHSEED={HASH_SEED}, and vLLM roots its hashes "
                         f"at start-up: run with PYTHONHASHSEED={HASH_SEED}")
    from kvspec.conformance.runner import RELEASED_TARGETS

    factories = {scope: check_target(target, scope) for scope in scopes}
    if target in RELEASED_TARGETS:  # built for each vector's release (for_release)
        factories = {scope: f if scope == "offload" else functools.partial(f, release=releases.REFERENCE)
                     for scope, f in factories.items()}  # the tier has one model, 0.25.1's
    return factories


def check(root: Path, factories: dict[str, Callable[..., Any]], known_findings: frozenset[str] = frozenset(),
          on_file: Callable[[Path, list[str], list[str]], None] | None = None) -> CheckReport:
    """Replay every vector under ``root`` against the target of its scope
    (``factories``: scope -> factory; a scope without one is skipped, and
    said).  A vector that exercises a finding in ``known_findings`` may
    diverge.  ``on_file(path, differences, known findings it diverged as)``
    follows the replay file by file.  Hash chains are rooted at
    :data:`HASH_SEED` throughout."""
    report = CheckReport()
    for path in vector_files(root):
        report.files.append(path)
        try:
            doc = read(path)
        except VectorError as error:
            report.unreadable[path] = str(error)
            continue
        factory = factories.get(doc["scope"])
        if factory is None:
            report.skipped[path] = f"no {doc['scope']} target"
            continue
        try:
            with rooted_at(doc["config"].get("hash_seed", HASH_SEED)):
                problems = replay_vector(doc, factory)
        except (VectorError, KeyError, IndexError, ValueError) as error:  # ValueError: a release no version
            report.unreadable[path] = f"{path}: malformed vector ({type(error).__name__}: {error})"
            continue
        findings = sorted(set(doc.get("findings", [])) & known_findings) if problems else []
        if findings:
            report.known[path] = f"{', '.join(findings)}: {problems[0]}"
        elif problems:
            report.differences[path] = problems
        if on_file:
            on_file(path, problems, findings)
    return report
