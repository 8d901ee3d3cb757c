"""Running the conformance machines: targets by name, levels, searches
sized by examples or by seconds, and replays of saved traces.

This is the engine behind ``kvspec conform`` and ``kvspec replay``; it knows
nothing of command lines.  Anything that stops a run before it starts (an
unknown target, a module that does not import, vLLM missing) raises
:class:`SetupError` with one sentence that says what to do.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import logging
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hypothesis import seed as hypothesis_seed
from hypothesis import settings
from hypothesis.reporting import current_reporter, with_reporter
from hypothesis.stateful import INVARIANT_MARKER, RULE_MARKER

from kvspec.conformance.machines.cache import CACHE_LAYOUTS, cache_machine
from kvspec.conformance.machines.catalogue import CATALOGUE, LATER
from kvspec.conformance.machines.configurations import refusal, takes_keyword
from kvspec.conformance.machines.layouts import LATER_LAYOUTS, MANAGER_LAYOUTS
from kvspec.conformance.machines.machinery import (
    BudgetSpent,
    CheckingMachine,
    ConformanceError,
    Machines,
    SearchLog,
    in_final_replay,
    missing_dependency,
    stopped_on,
)
from kvspec.conformance.machines.manager import manager_machine
from kvspec.conformance.machines.offload import OFFLOAD_LAYOUTS, offload_machine
from kvspec.conformance.machines.pool import LAYOUTS, pool_machine
from kvspec.conformance.machines.scheduler import SCHEDULER_LAYOUTS, engine_of, scheduler_machine
from kvspec.conformance.report import LayoutResult
from kvspec.conformance.settings import example_database, run_machine
from kvspec.conformance.targets.cache import impl_cache_target, spec_cache_target
from kvspec.conformance.targets.manager import ImplManagerTarget
from kvspec.conformance.targets.offload import impl_tier, spec_tier, vllm_tier, wrap
from kvspec.conformance.targets.pool import ImplPoolTarget, SpecPoolTarget, VllmApiPoolTarget
from kvspec.conformance.targets.remote import Child as RemoteChild
from kvspec.conformance.targets.remote import RemoteFactory
from kvspec.conformance.targets.spec_manager import SpecManagerTarget
from kvspec.conformance.trace import ReplayData, Trace, TraceEnd, TraceError, TraceMismatch
from kvspec.conformance.vllm import compat
from kvspec.conformance.vllm.targets import VllmManagerTarget, VllmPoolTarget, refusal_of
from kvspec.errors import HarnessError, HarnessFault, SetupError, TargetImportError
from kvspec.kv_cache_interface import AttentionKind, attention_kind
from kvspec.spec import releases
from kvspec.spec.catalogue import LEVELS, TIER_LEVELS, TIER_RULES
from kvspec.spec.engines import CACHE_RULES, CacheLayout
from kvspec.spec.layout import Layout

SCOPES = ("pool", "manager", "scheduler", "cache", "offload")
BLOCK_SCOPES = ("pool", "manager")
"""The scopes every target has (and the conformance vectors cover): the
block manager called directly.  The scheduler scope drives vLLM's own
scheduler, over vLLM's block manager or kvspec's (the drop-in); the offload
scope an offloading tier (spec chapter 11), part of ``all`` for kvspec's
own targets (:func:`scopes_for`)."""
SCHEDULER_TARGETS = ("vllm", "impl")
ENGINE_TARGETS = ("sglang", "lmdeploy")
"""Engines of other designs: judged at cache scope only (spec chapter 10)."""


def scopes_for(target: str) -> list[str]:
    """The scopes ``--scope all`` runs for ``target``: the block-manager
    scopes; the scheduler scope where the target runs under a scheduler --
    vLLM, or kvspec's implementation where a vLLM it can go into is
    installed (the drop-in: :data:`kvspec.dropin_releases.API`); and the
    offload tier (chapter 11) for kvspec's own targets.  vLLM's tier is
    asked for by name (``--scope offload``): its API moved between the
    releases the drop-in knows, and chapter 11 models 0.25.1's.  An engine
    of another design (SGLang, LMDeploy) has the cache scope alone; a
    ``module:factory`` target, the scopes its factory builds (a pool's)."""
    if target in ENGINE_TARGETS:
        return ["cache"]
    scopes = list(BLOCK_SCOPES)
    if target == "vllm" or (target == "impl" and vllm_importable() and dropin_refusal() is None):
        scopes.append("scheduler")
    if target in ("impl", "spec"):
        scopes.append("offload")
    return scopes


def dropin_refusal() -> str | None:
    """Why the drop-in does not go into the installed vLLM (``None``: it does)."""
    from kvspec import dropin
    from kvspec.conformance.vllm import installed

    try:
        dropin.check_release(installed.version())
    except dropin.DropinError as error:
        return str(error)
    return None


def vllm_importable() -> bool:
    """Whether vLLM's scheduler imports here (without importing it when it is absent)."""
    from kvspec.conformance.vllm import installed

    return installed.scheduler_importable()


def rules_checked(scope: str, level: str) -> list[str]:
    """The rules a machine checks at ``scope`` and ``level``, by name
    (``spec-equivalence`` stands for the lockstep comparison, ``clean-refusal``
    for "a refusal raises ValueError/TypeError and nothing else").  At
    scheduler scope every state rule is checked after every engine step,
    with what each step reads (content-soundness) and the slots of what it
    schedules (allocation-accounting); nothing runs in lockstep."""
    from kvspec.spec import request_rules, rules

    if scope == "cache":  # chapter 10's rules; no lockstep (L3 judges what L2 does)
        return sorted(set(CACHE_RULES) - LEVELS[level])
    if scope == "offload":  # chapter 11's rules; L3 in lockstep with the spec's tier
        return sorted(set(TIER_RULES) - TIER_LEVELS[level]) + (["spec-equivalence"] if level == "L3" else [])
    if scope == "pool":
        names = set(rules.STATE_RULES) | set(rules.STEP_RULES) | {"content-soundness"}
    elif scope == "manager":
        names = set(request_rules.REQUEST_STATE_RULES) | set(request_rules.REQUEST_STEP_RULES)
        names.add("hash-map-consistency")  # the events must replay to the pool's table
    else:
        names = set(request_rules.REQUEST_STATE_RULES) | set(rules.STATE_RULES)
        return sorted((names | {"content-soundness", "allocation-accounting"}) - LEVELS[level])
    names -= LEVELS[level]
    return sorted(names) + ["clean-refusal"] + (["spec-equivalence"] if level == "L3" else [])


def compared(scope: str, level: str, against: str | None) -> list[str]:
    """What a run checks at ``scope``: :func:`rules_checked`, where a run
    against an upstream (``--against``) compares with that upstream
    (``upstream-equivalence``) instead of the spec -- at pool and manager
    scope; the scheduler scope has no lockstep."""
    checked = rules_checked(scope, level)
    if not against or scope == "scheduler":
        return checked
    return [r for r in checked if r != "spec-equivalence"] + ["upstream-equivalence"]


# --- targets -------------------------------------------------------------------------------


def require_vllm(who: str = "the vllm target") -> None:
    """vLLM must import, and its hash chains must share kvspec's root: both
    derive it from ``PYTHONHASHSEED``; unset, it is set to ``0`` here (only
    the chains' root depends on it, not Python's own ``hash``)."""
    from kvspec.conformance.vllm import installed

    error = installed.import_error()
    if error is not None and not missing_dependency(error, "vllm"):
        raise TargetImportError("vllm", error)  # installed, and its code fails: the target's failure
    if error is not None:
        problem = f"{type(error).__name__}: {error}"
        raise SetupError(
            f"{who} needs vLLM {compat.REFERENCE_RELEASE} importable in this Python ({problem}); "
            "install it with tools/install_vllm.sh and run kvspec from that environment"
        )

    from kvspec import hashing

    if os.environ.get("PYTHONHASHSEED") is None:
        os.environ["PYTHONHASHSEED"] = "0"
        hashing.init_none_hash()


def engine_factory(engine: str) -> Callable[[CacheLayout], Any]:
    """The cache-scope factory of an engine of another design (imported when first built)."""

    def make(layout: CacheLayout) -> Any:
        from kvspec.conformance import engines

        return engines.target(engine, layout)

    make.__name__ = engine
    return make


TARGETS: dict[str, dict[str, Callable[..., Any]]] = {
    "pool": {"spec": SpecPoolTarget, "impl": ImplPoolTarget, "vllm": VllmPoolTarget},
    "manager": {"spec": SpecManagerTarget, "impl": ImplManagerTarget, "vllm": VllmManagerTarget},
    "cache": {"spec": spec_cache_target, "impl": impl_cache_target,
              **{name: engine_factory(name) for name in ENGINE_TARGETS}},
    "offload": {"spec": spec_tier, "impl": impl_tier, "vllm": vllm_tier},
}
"""The built-in targets per scope; anything else is ``module:factory``."""

RELEASED_TARGETS = frozenset({"spec", "impl"})
"""The built-in targets built for the release judged (their factories take
``release=``): the spec, and impl with that release's deltas.  vLLM is the
release it is; a ``module:factory`` target is called as it was written."""


def default_release(target: str | Callable[..., Any], scope: str | None = None) -> releases.Release:
    """The release a run of ``target`` at ``scope`` judges by when none is
    asked: the installed vLLM's for the vllm target and under vLLM's
    scheduler, else the reference release.  (The gate resolves its run's
    release itself: :func:`kvspec.conformance.gate.judge_by`.)"""
    if target == "vllm" or scope == "scheduler":
        from kvspec.conformance.vllm import installed

        return releases.judged(installed.version())
    return releases.REFERENCE


def resolve_target(name: str, scope: str) -> Callable[..., Any]:
    """``impl``, ``spec``, ``vllm``, an engine or ``module:factory``.  At pool scope the
    factory takes ``(num_blocks, enable_caching, hash_block_size,
    enable_kv_cache_events)`` and returns a :class:`PoolTarget` or a pool with
    vLLM's BlockPool API; at manager scope it takes a layout's
    ``target_args()`` and returns a :class:`ManagerTarget`; at cache scope
    it takes a :class:`CacheLayout` and returns a :class:`CacheTarget`."""
    known = TARGETS[scope]
    if name == "vllm" and scope != "cache":
        require_vllm()
    if name in ENGINE_TARGETS:
        if scope != "cache":
            raise SetupError(f"{name} is judged at cache scope only (its design has no vLLM API): --scope cache")
        from kvspec.conformance import engines

        engines.require(name)
    if name in known:
        return known[name]
    if ":" not in name:
        raise SetupError(f"unknown target {name!r}: use one of {sorted(known)} or module:factory")
    module_name, _, attr = name.partition(":")
    if os.getcwd() not in sys.path:  # like `python -m`: modules next to the user resolve
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        if not missing_dependency(error, module_name.partition(".")[0]):
            raise TargetImportError(name, error) from None  # the module is there and fails: the target's failure
        raise SetupError(f"cannot import target module {module_name!r}: {error}") from None
    except (Exception, SystemExit) as error:  # the module itself fails: a syntax error, a raise, sys.exit
        raise TargetImportError(name, error) from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise SetupError(f"module {module_name!r} has no callable {attr!r}")

    def make(*args: Any, **options: Any) -> Any:
        try:
            target = factory(*args, **options)
        except AssertionError as error:  # vLLM checks its constructors' sizes by assertion: its refusal
            if findings_target(name, scope) == "vllm":
                raise refusal_of(error) from error
            raise
        if target is None:
            raise SetupError(f"target factory {name} returned None")
        if scope == "offload":  # an OffloadingManager: vLLM's class read through the seam, any other by its state
            return wrap(target)
        if scope == "pool" and not hasattr(target, "snapshot"):
            missing = [a for a in BLOCK_POOL_API if not hasattr(target, a)]
            if missing:
                raise SetupError(f"target factory {name} returned a {type(target).__name__}, which is neither a "
                                 f"PoolTarget nor a pool with vLLM's BlockPool API (it lacks {', '.join(missing)})")
            # a pool of vLLM's class is read as vLLM's own is, with the same translations
            return VllmPoolTarget.wrapping(target) if builds_vllm(target) else VllmApiPoolTarget(target)
        return target

    make.__name__ = attr
    make.__wrapped__ = factory  # type: ignore[attr-defined]  # inspect.signature reads the factory's own
    return make


def layout_unsupported(target: str, scope: str, name: str, release: releases.Release = releases.REFERENCE,
                       factory: Callable[..., Any] | None = None) -> str | None:
    """Why a layout is not searched, or ``None``: the release judged has no
    such configuration (:meth:`kvspec.spec.releases.Release.unsupported`),
    the spec does not model what the release does there
    (:meth:`kvspec.spec.releases.Release.not_modelled`), or a
    ``module:factory`` target cannot be given a manager layout's options
    (its factory takes no such keyword).  Such a layout is skipped with that
    reason, never judged: a configuration the target does not offer, or
    one the spec cannot judge yet, is no failure of it.  ``release``: the
    release judged; ``factory`` is the target's, where it is resolved
    already (:class:`Target`)."""
    if (why := release.unsupported(_mamba_modes(scope, name)) or release.not_modelled(f"{scope}/{name}")) is not None:
        return why
    if scope == "manager" and (why := _spec_refusal(name, release)) is not None:
        return why
    if scope == "cache":
        factory = factory or resolve_target(target, scope)
        unsupported = (getattr(getattr(factory, "__wrapped__", None), "unsupported", None)
                       or _engine_unsupported(target) or getattr(factory, "unsupported", None))
        return unsupported(CACHE_LAYOUTS[name]) if unsupported is not None else None
    if scope != "manager" or target in TARGETS[scope]:
        return None
    factory = factory or resolve_target(target, scope)
    missing = [k for k in manager_layout(name).target_options() if not takes_keyword(factory, k)]
    return f"the target factory takes no {', '.join(missing)} keyword" if missing else None


def _engine_unsupported(target: str) -> Callable[[CacheLayout], str | None] | None:
    """An engine's own ``unsupported(layout)``: the layouts it has no such configuration for."""
    if target not in ENGINE_TARGETS:
        return None
    from kvspec.conformance import engines

    return functools.partial(engines.unsupported, target)


def _spec_refusal(name: str, release: releases.Release = releases.REFERENCE) -> str | None:
    """Why the spec of ``release`` refuses to build the manager layout
    ``name`` (a layout of a later release: :data:`LATER_LAYOUTS`), or
    ``None``."""
    if name not in LATER_LAYOUTS:
        return None
    spec = functools.partial(SpecManagerTarget, release=release)
    if (refused := refusal(LATER_LAYOUTS[name].for_release(release), spec)) is None:
        return None
    return f"vLLM {release.version} has no such configuration: {refused}"


def _mamba_modes(scope: str, name: str) -> set[str]:
    """The cache modes of a layout's Mamba groups, where prefix caching is on."""
    if scope in ("pool", "cache", "offload"):
        return set()
    if scope == "scheduler":
        layout = SCHEDULER_LAYOUTS[name]
    else:
        layout = manager_layout(name)
    return set(layout.mamba_cache_modes) if layout.enable_caching else set()


BLOCK_POOL_API = ("get_new_blocks", "touch", "free_blocks", "get_cached_block", "cache_full_blocks", "blocks",
                  "num_gpu_blocks", "hash_block_size")
"""What the adapter for vLLM's ``BlockPool`` API reads."""

REQUIRED_OPERATIONS = {
    "pool": ("get_new_blocks", "touch", "free_blocks", "get_cached_block", "cache_full_blocks", "snapshot"),
    "manager": ("get_computed_blocks", "allocate_slots", "free", "cache_blocks", "snapshot"),
    "cache": ("admit", "append", "cache", "finish", "preempt", "evict", "view"),
    "offload": ("lookup", "prepare_load", "touch", "complete_load", "prepare_store", "complete_store",
                "take_events", "reset_cache", "snapshot"),
}


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _build(factory: Callable[..., Any], scope: str) -> Any:
    """One target of ``scope`` built for its first layout (or the error)."""
    try:
        if scope == "cache":
            return factory(next(iter(CACHE_LAYOUTS.values())))
        if scope == "offload":
            return factory(**next(iter(OFFLOAD_LAYOUTS.values())).options())
        layout = next(iter(LAYOUTS.values())) if scope == "pool" else MANAGER_LAYOUTS["full"]
        return layout.make_target(factory)
    except SetupError:
        raise
    except (Exception, SystemExit) as error:
        return error


VLLM_CODE = ("vllm.", "kvspec.conformance.vllm.")
"""Module prefixes of vLLM's classes and of kvspec's adapters of them."""


def builds_vllm(target: Any) -> bool:
    """Whether a built target runs vLLM's code: it is, or directly holds, an
    instance of a class of vLLM's (or of kvspec's adapter of one) -- a
    subclass or a patched copy's class included, wherever it was defined,
    as long as one of its bases is vLLM's."""

    def is_vllm(obj: Any) -> bool:
        return any(c.__module__.startswith(VLLM_CODE) for c in type(obj).__mro__)

    return is_vllm(target) or any(is_vllm(v) for v in getattr(target, "__dict__", {}).values())


def findings_target(name: str, scope: str) -> str:
    """Whose known findings a target at ``scope`` inherits: ``vllm`` for the
    vllm target and for a ``module:factory`` whose targets are vLLM's code
    (:func:`builds_vllm`: a fork's patched classes, a subclass, kvspec's
    adapter around them) -- so that ``--known-findings`` steers around
    upstream's findings and labels them, and the hash chains share vLLM's
    root (``PYTHONHASHSEED``, set as for the vllm target); else ``name``."""
    return _findings_of(name, scope, None)


def _findings_of(name: str, scope: str, factory: Callable[..., Any] | None) -> str:
    """:func:`findings_target`, of ``factory`` when the target is resolved
    already; once a process for each target and scope (:data:`_WHOSE`)."""
    if ":" not in name or scope in ("scheduler", "cache", "offload"):
        return name
    if (name, scope) not in _WHOSE:
        built = _build(factory or resolve_target(name, scope), scope)
        if isinstance(built, BaseException) or not builds_vllm(built):
            _WHOSE[name, scope] = name
        else:
            require_vllm(f"target {name} (vLLM's classes)")
            _WHOSE[name, scope] = "vllm"
    return _WHOSE[name, scope]


_WHOSE: dict[tuple[str, str], str] = {}
"""Whose findings each ``module:factory`` target inherits, per scope: judged once a process."""


@functools.cache
def upstream(against: str) -> RemoteChild:
    """The upstream vLLM a fork runs in lockstep with (``--against``): its
    child process, started once per process (a forked worker starts its
    own), the hash chains rooted as the target's."""
    from kvspec import hashing
    from kvspec.conformance.vllm import upstream as vllm_upstream

    if os.environ.get("PYTHONHASHSEED") is None:  # the child gets the same root (upstream.interpreter)
        os.environ["PYTHONHASHSEED"] = "0"
        hashing.init_none_hash()
    return vllm_upstream.start(against)


def check_scheduler_target(name: str) -> str:
    """At scheduler scope the target is the block manager under vLLM's
    scheduler: ``vllm`` (its own) or ``impl`` (kvspec's, the drop-in)."""
    if name not in SCHEDULER_TARGETS:
        raise SetupError(f"the scheduler scope runs vLLM's scheduler over vLLM's block manager (--target vllm) or "
                         f"kvspec's (--target impl, the drop-in); it has no target {name!r}")
    require_vllm("the scheduler scope (vLLM's own scheduler)")
    if name == "impl" and (refusal := dropin_refusal()) is not None:  # kvspec's manager goes in by the drop-in
        raise SetupError(f"the scheduler scope with --target impl: {refusal}")
    return name


def check_target(name: str, scope: str) -> Callable[..., Any]:
    """The target's factory (:func:`resolve_target`), built once before a
    run: a factory that raises, returns nothing or builds the other scope's
    kind of target stops the run before it starts, with one line that says so."""
    if scope == "scheduler":
        return check_scheduler_target(name)
    factory = resolve_target(name, scope)
    if name in TARGETS[scope]:
        return factory
    target = _build(factory, scope)
    missing = [] if isinstance(target, BaseException) else \
        [op for op in REQUIRED_OPERATIONS[scope] if not callable(getattr(target, op, None))]
    if not isinstance(target, BaseException) and not missing:
        return factory
    other = "manager" if scope == "pool" else "pool"
    found = _build(resolve_target(name, other), other)
    hint = ""
    if not isinstance(found, BaseException) and all(callable(getattr(found, op, None))
                                                      for op in REQUIRED_OPERATIONS[other]):
        hint = f"; it builds a {other} target: run with --scope {other}"
    if isinstance(target, BaseException):
        raise SetupError(f"target {name} could not build a {scope} target: {_one_line(target)}{hint}")
    raise SetupError(f"target {name} built a {type(target).__name__}, which is no {scope} target "
                     f"(it lacks {', '.join(missing)}){hint}")


@dataclass
class Target:
    """``--target`` resolved once for a run (:func:`resolve`): its name and
    each scope's checked factory (at scheduler scope the name itself: vLLM's
    scheduler builds the manager).  It travels to a worker process without
    its factories (a ``module:factory`` is a closure); there each scope's is
    resolved once, when first asked."""

    name: str
    factories: dict[str, Callable[..., Any] | str] = field(default_factory=dict, repr=False, compare=False)

    def factory(self, scope: str) -> Callable[..., Any] | str:
        if scope not in self.factories:
            self.factories[scope] = check_scheduler_target(self.name) if scope == "scheduler" else \
                resolve_target(self.name, scope)
        return self.factories[scope]

    def findings_of(self, scopes: list[str] | tuple[str, ...]) -> str:
        """Whose known findings the target inherits at ``scopes`` (:func:`findings_target`)."""
        whose = (_findings_of(self.name, scope, self.factory(scope) if scope in BLOCK_SCOPES else None)
                 for scope in scopes)
        return next((found for found in whose if found != self.name), self.name)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "factories": {}}


def resolve(name: str, scopes: list[str] | tuple[str, ...]) -> Target:
    """``--target name`` at ``scopes``, each scope's factory checked
    (:func:`check_target`: an unusable target stops the run before it
    starts) -- the one resolution of a run."""
    return Target(name, {scope: check_target(name, scope) for scope in scopes})


def layout_names(scope: str, release: releases.Release = releases.REFERENCE) -> list[str]:
    """The layouts a scope runs by default (the model layouts are chosen by
    name): a later release's manager layouts where ``release`` (the release
    judged) has them."""
    return [*CATALOGUE[scope], *(name for name in LATER.get(scope, ()) if _spec_refusal(name, release) is None)]


def model_layout_names() -> list[str]:
    """``model:<name>``: the manager layouts of real architectures (kvspec.models), tiny scale."""
    from kvspec.models.architectures import model_layout_names as names

    return names()


def is_layout(scope: str, name: str) -> bool:
    """Whether ``name`` is a layout of ``scope`` in any release (one the
    release judged does not have is skipped with the reason)."""
    return name in layout_names(scope) or (scope == "manager" and (name in LATER_LAYOUTS or
                                                                   name in model_layout_names()))


def describe_layout(scope: str, name: str) -> str:
    """A layout's parameters in a line, for a failure's message: the
    groups' kinds, block sizes, windows and modes, the pool, the options
    that are not the defaults."""
    if scope == "pool" and name in LAYOUTS:
        p = LAYOUTS[name]
        sizes = " and ".join(map(str, p.group_block_sizes))
        return (f"{p.num_blocks} blocks, hash blocks of {p.hash_block_size}, groups of {sizes} tokens"
                + ("" if p.events else ", no events") + ("" if p.enable_caching else ", caching off"))
    if scope == "offload" and name in OFFLOAD_LAYOUTS:
        o = OFFLOAD_LAYOUTS[name]
        return (f"{o.num_blocks} blocks, {o.cache_policy}, store threshold {o.store_threshold}, lookups counted for "
                f"{o.max_tracker_size} keys, calls of up to {o.max_keys} of {o.num_keys} keys")
    if scope not in ("manager", "scheduler"):
        return name
    layout = SCHEDULER_LAYOUTS[name] if scope == "scheduler" else manager_layout(name)
    groups = " + ".join(_describe_group(g) for g in layout.groups)
    options = [f"{layout.num_blocks} blocks", f"max_model_len {layout.max_model_len}"]
    options += ["caching off"] * (not layout.enable_caching) + ["EAGLE"] * layout.use_eagle
    options += [f"retention {layout.retention_interval}"] * (layout.retention_interval is not None)
    options += [f"dcp {layout.dcp_world_size}"] * (layout.dcp_world_size > 1)
    options += [f"pcp {layout.pcp_world_size}"] * (layout.pcp_world_size > 1)
    options += [f"{layout.max_num_batched_tokens} tokens a step"] * (layout.max_num_batched_tokens is not None)
    return f"{groups}; {', '.join(options)}"


def _describe_group(spec: Any) -> str:
    """``swa(B=2, window 4)``: a group's kind, block size and what else sizes it."""
    kind = attention_kind(spec)
    extra = {AttentionKind.SLIDING_WINDOW: lambda: f", window {spec.sliding_window}",
             AttentionKind.RSWA: lambda: f", window {spec.rswa_window}",
             AttentionKind.CHUNKED_LOCAL_ATTENTION: lambda: f", chunk {spec.attention_chunk_size}",
             AttentionKind.MAMBA: lambda: f", {spec.mamba_cache_mode}"
             + (f", {spec.num_speculative_blocks} draft blocks" if spec.num_speculative_blocks else "")}
    return f"{kind or type(spec).__name__}(B={spec.block_size}{extra.get(kind, str)()})"


def manager_layout(name: str) -> Layout:
    """A conformance layout by name, or ``model:<architecture>``: the
    model's groups at the tiny scale (kvspec.models.architectures.setup)."""
    if name in MANAGER_LAYOUTS:
        return MANAGER_LAYOUTS[name]
    if name in LATER_LAYOUTS:
        return LATER_LAYOUTS[name]
    if name in model_layout_names():
        from kvspec.models.architectures import setup

        return setup(name.removeprefix("model:")).layout
    raise SetupError(f"no manager layout named {name!r}: use one of {layout_names('manager')} "
                     f"or {', '.join(model_layout_names())}")


def check_layout(scope: str, layout: str) -> None:
    """A :class:`SetupError` unless ``layout`` is one of ``scope``'s (:func:`is_layout`)."""
    if scope not in SCOPES:
        raise SetupError(f"unknown scope {scope!r}: use one of {SCOPES}")
    if not is_layout(scope, layout):
        extra = f" or {', '.join(model_layout_names())}" if scope == "manager" else ""
        raise SetupError(f"no {scope} layout named {layout!r}: use one of {layout_names(scope)}{extra}")


def machine_for(
    scope: str, layout: str, target: str | Callable[..., Any], level: str, avoid: frozenset[str] = frozenset(),
    against: str | None = None, release: releases.Release | str | None = None, *, checked: bool = False,
    factory: Callable[..., Any] | None = None,
) -> Machines:
    """The machines checking ``target`` (a name for
    :func:`resolve_target`, or a factory) over one layout at ``level``, not
    sending the inputs named in ``avoid`` -- and, with ``against`` (an
    upstream vLLM, :func:`upstream`), in lockstep with that upstream instead
    of the spec, at pool and manager scope.  ``release``: the vLLM release
    whose rules judge (default the reference release, 0.25.1): the machine,
    the spec it runs in lockstep with and the built-in spec and impl
    targets are built for it; ``None``: :func:`default_release`.
    ``checked``: the scope and layout are a plan's, validated when it was
    made (the gate's); ``factory``: the target's, resolved already (the
    run's :class:`Target`), never resolved again here."""
    if scope not in SCOPES:
        raise SetupError(f"unknown scope {scope!r}: use one of {SCOPES}")
    if level not in LEVELS:
        raise SetupError(f"unknown level {level!r}: use one of {sorted(LEVELS)}")
    if not checked:
        check_layout(scope, layout)
    lockstep, ignore = level == "L3", LEVELS[level]
    if scope == "scheduler":
        if not isinstance(target, str):
            raise SetupError("the scheduler scope takes a target by name: vllm or impl")
        target = check_scheduler_target(target)
        release = releases.as_release(release) if release is not None else default_release(target, scope)
        machine = scheduler_machine(SCHEDULER_LAYOUTS[layout].for_release(release), target=target,
                                    engine=engine_of(layout), ignore_rules=ignore, avoid=avoid)
        machine.layout_name = layout
        return machine
    if factory is None:
        factory = resolve_target(target, scope) if isinstance(target, str) else target
    if scope == "offload":
        if against:
            raise SetupError("--against runs in lockstep at pool and manager scope; the offload scope has none")
        machine = offload_machine(factory, OFFLOAD_LAYOUTS[layout], ignore_rules=TIER_LEVELS[level], avoid=avoid,
                                  lockstep=lockstep)
        machine.layout_name = layout
        return machine
    release = releases.as_release(release) if release is not None else default_release(target, scope)
    if isinstance(target, str) and target in RELEASED_TARGETS:
        factory = functools.partial(factory, release=release)
    if scope == "cache":
        if against:
            raise SetupError("--against runs in lockstep at pool and manager scope; the cache scope has none")
        machine = cache_machine(factory, CACHE_LAYOUTS[layout], ignore_rules=ignore, avoid=avoid)
        machine.layout_name = layout
        return machine
    partner, name = (RemoteFactory(upstream(against), scope), "upstream") if against else (None, "spec")
    if scope == "pool":
        machine = pool_machine(factory, LAYOUTS[layout], lockstep=lockstep or partner is not None,
                               ignore_rules=ignore, avoid=avoid, spec_factory=partner, partner=name, release=release)
    else:
        spec = partner or (functools.partial(SpecManagerTarget, release=release) if lockstep else None)
        machine = manager_machine(
            factory, manager_layout(layout), spec_factory=spec, ignore_rules=ignore, avoid=avoid, partner=name,
            release=release,
        )
    machine.layout_name = layout
    return machine


# --- searching -------------------------------------------------------------------------------


@dataclass
class Search:
    """How long to search one layout: ``examples`` runs under ``profile``, or
    batches of ``batch`` runs until ``seconds`` are spent.  ``seed`` makes a
    search repeatable (otherwise the profile decides: ``ci`` is fixed)."""

    profile: settings
    examples: int | None = None
    seconds: float | None = None
    seed: int | None = None
    batch: int = 10
    deadline: float | None = None  # time.perf_counter() by which the layout, shrinking included, must end
    database: str | None = None  # a directory of Hypothesis's examples: past failures are replayed first
    # Told at the first failing check, before shrinking: the failing run as
    # it happened, and the failure.
    on_first_failure: Callable[[Trace, Exception], None] | None = None
    swarm: bool = False  # each batch after the first leaves a random subset of the optional inputs out, and
    # Hypothesis's targeting leans toward deep states (CheckingMachine.steer)


def _factory(machine: Machines, seed: int | None) -> Callable[[], CheckingMachine]:
    """``machine`` as the factory Hypothesis runs: a function, not the class.
    Hypothesis digests its factory's source on every call (the database key,
    the derandomized seed), and a class's source means parsing its whole
    module -- about 0.1 s a batch, a tenth of a budgeted search.  The digest
    is told the scope and layout, so that each layout has its own key in the
    example database and, derandomized, its own examples."""

    def make() -> CheckingMachine:
        return machine()

    # Hypothesis's hook for telling apart tests of one source (it uses it for pytest's parametrize).
    make._hypothesis_internal_add_digest = f"{machine.scope}/{machine.layout_name}".encode()
    if seed is not None:
        hypothesis_seed(seed)(make)
    return make


def hypothesis_factory(machine: Machines) -> Callable[[], CheckingMachine]:
    """``machine`` as the factory the gate's search hands Hypothesis: whatever
    runs a state machine test of it (HypoFuzz's campaigns, ``kvspec fuzz``)
    keys the example database as the gate does for its layout, so that
    ``kvspec conform --database`` replays what they saved."""
    return _factory(machine, None)


def run_layout(machine: Machines, search: Search, progress: Progress | None = None) -> LayoutResult:
    """Search one layout for a failure; on one, keep the broken rules, the
    divergence and the minimal failing trace."""
    start = time.perf_counter()
    if progress:
        progress.begin(machine, search)
    failure: BaseException | None = None
    shrinking = _ShrinkWatch()
    log = machine.log  # what the runner tells the search's machines, and what they report
    if search.on_first_failure is not None:
        def tell(m: CheckingMachine, error: ConformanceError) -> None:
            search.on_first_failure(m.trace, error)

        log.on_first_failure = tell
    if search.deadline is not None:
        log.shrink_deadline = search.deadline
        log.search_deadline = min(search.deadline, start + search.seconds) if search.seconds else search.deadline
    try:
        with shrinking_limited_to(max(30.0, search.seconds) if search.seconds else 120.0), \
                with_reporter(shrinking.report), _hard_stop_at(search.deadline, lambda: log):
            for batch, (batch_settings, batch_seed) in enumerate(_batches(search, start)):
                if search.deadline is not None:  # a failure found now may shrink until the deadline, no later
                    _limit_shrinking(search.deadline - time.perf_counter())
                log.steering = search.swarm  # budgeted: lean toward deep states; sized by examples: as it was
                if search.swarm and batch_seed is not None:
                    log.swarm_off = swarm_subset(machine.swarm_options, batch_seed) if batch else frozenset()
                run_machine(_factory(machine, batch_seed), batch_settings)
    except BudgetSpent:
        if log.hung_in is not None:  # the target never returned: a hang is a failure, with the run so far
            failure = ConformanceError(divergence=f"{log.hung_in} did not return before the budget ran out "
                                                  f"({HANGS})")
            log.last_trace.record_failure([], str(failure))
        elif log.best_failure is not None:  # time ran out while shrinking: report the smallest run so far
            log.last_trace, failure = log.best_failure
            shrinking.stopped = True
    except HarnessFault as fault:  # kvspec's own harness raised: a usage/environment error, not the target's
        raise HarnessError(str(fault)) from None
    except ConformanceError as error:
        failure = error
    except Exception as error:  # the target (or the machine) raised where no refusal was possible
        failure = error
    finally:
        if progress:
            progress.end()
    seconds = time.perf_counter() - start
    result = LayoutResult(machine.scope, machine.layout_name, log.steps_run, seconds, failure is None,
                          examples=log.examples_run)
    result.distinct_states = log.states_reached()
    result.began = start  # the clock's reading; the command makes it relative to its own start
    if failure is not None:
        result.first_failure_at = log.first_failure_at
        result.first_failure_example = log.first_failure_example
    if isinstance(failure, ConformanceError):
        result.rules = sorted({v.rule for v in failure.violations})
        result.details = str(failure).splitlines()
    elif failure is not None:
        result.details = [stopped_on(failure)]
    if failure is not None:
        result.trace = log.last_trace
        result.shrinking_stopped = shrinking.stopped
        result.parameters = describe_layout(machine.scope, machine.layout_name)
    return result


def swarm_subset(options: tuple[str, ...], seed: int) -> frozenset[str]:
    """The inputs one swarm batch leaves out: each option with probability
    one half, drawn from ``seed`` (so a seed repeats its batches)."""
    rng = random.Random(seed)
    return frozenset(o for o in options if rng.random() < 0.5)


class _ShrinkWatch:
    """Hypothesis's reporter, minus its warning that shrinking took "more
    than five minutes": under a budget the limit is kvspec's own, and the
    report says "shrinking stopped at the budget" instead."""

    def __init__(self) -> None:
        self.stopped = False
        self.default = current_reporter()

    def report(self, message: Any) -> None:
        if "working to shrink a failing example" in str(message):
            self.stopped = True
            return
        self.default(message)


HANGS = "the target hangs"
"""How a run or a replay that a call never returned from ends its account."""

HARD_STOP_GRACE = 0.25  # seconds past the deadline before the alarm interrupts whatever runs
HANG_AFTER = 2.0
"""Seconds a call into the target must have run, when the time is up, to be
judged a hang.  A younger call is waited for (a starved process -- a loaded
CI machine, ``nice`` -- makes microsecond calls take tenths of a second,
and the alarm landed in one that would have returned); once it returns, the
run stops before its next operation, as budgets end."""


@contextlib.contextmanager
def _hard_stop_at(deadline: float | None, log: Callable[[], SearchLog | None] = lambda: None) -> Iterator[None]:
    """Raise :class:`BudgetSpent` wherever the run is once ``deadline`` (plus
    a grace) has passed -- the machine checks the time before every
    operation, but Hypothesis's shrinker can work for seconds on its own
    between two runs of the machine.  A SIGALRM timer, re-armed until the
    run has stopped; so only in the main thread of a POSIX process;
    elsewhere the machine's own checks remain.  ``log()``: the running
    search's log, whose call in flight is waited for until it is
    :data:`HANG_AFTER` seconds old."""
    usable = deadline is not None and hasattr(signal, "setitimer") and \
        threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        # Again and again until the run has stopped: a signal handler's exception can land where Python
        # swallows it (a gc callback, a __del__: "Exception ignored in ..."), and the run would go on.
        signal.setitimer(signal.ITIMER_REAL, HARD_STOP_GRACE)
        if in_final_replay():  # let the failure's report run finish: one example
            return
        running = log()
        since = running.calling_since if running is not None else None
        if since is not None and (age := time.perf_counter() - since) < HANG_AFTER:
            signal.setitimer(signal.ITIMER_REAL, HANG_AFTER - age)  # slow, perhaps; a hang only once that old
            return
        raise BudgetSpent

    def unraisable(event: Any) -> None:
        # A stop swallowed where Python cannot raise comes again (above): not worth a traceback on stderr.
        if not isinstance(event.exc_value, BudgetSpent):
            hook(event)

    previous, hook = signal.signal(signal.SIGALRM, stop), sys.unraisablehook
    sys.unraisablehook = unraisable
    signal.setitimer(signal.ITIMER_REAL, max(deadline - time.perf_counter(), 0) + HARD_STOP_GRACE)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        sys.unraisablehook = hook


def _limit_shrinking(seconds: float) -> None:
    """Let a failure found from now on shrink for ``seconds`` at most (inside
    :func:`shrinking_limited_to`, which restores the default)."""
    engine = _shrink_engine()
    if engine is not None:
        engine.MAX_SHRINKING_SECONDS = max(0.5, seconds)


@contextlib.contextmanager
def shrinking_limited_to(seconds: float) -> Iterator[None]:
    """Bound the time Hypothesis spends shrinking a failure (it allows five
    minutes, far past a budgeted run's share; a slow target, vLLM, can use
    them all): two minutes, or a budgeted layout's share (at least 30 s).
    Hypothesis has no setting for this; its engine's module constant is the
    only handle, and when a release renames it the default simply stays."""
    engine = _shrink_engine()
    if engine is None:
        yield
        return
    default = engine.MAX_SHRINKING_SECONDS
    engine.MAX_SHRINKING_SECONDS = min(default, seconds)
    try:
        yield
    finally:
        engine.MAX_SHRINKING_SECONDS = default


def _shrink_engine() -> Any:
    """Hypothesis's engine module, if it still has the shrinking limit."""
    engine = importlib.import_module("hypothesis.internal.conjecture.engine")
    return engine if hasattr(engine, "MAX_SHRINKING_SECONDS") else None


def _batches(search: Search, start: float):
    """(settings, seed) for each Hypothesis run of a search."""
    database = example_database(search.database)
    if search.seconds is None:
        overrides = {"max_examples": search.examples} if search.examples else {}
        if database is not None:
            overrides["database"] = database
        yield settings(search.profile, **overrides), search.seed
        return
    base = search.seed if search.seed is not None else int.from_bytes(os.urandom(4), "big")
    search.seed = base
    batch = 0
    while time.perf_counter() - start < search.seconds and (
            search.deadline is None or time.perf_counter() < search.deadline):
        yield settings(search.profile, max_examples=search.batch, derandomize=False, database=database), base + batch
        batch += 1


def quiet_loggers() -> None:
    """Keep kvspec's and the engines' log lines out of a run's output: only
    their errors, and those on stderr -- vLLM writes its log to stdout,
    which is kvspec's verdict (its error lines for every failed load a
    search plays would bury the table)."""
    for noisy in ("kvspec", "vllm", "lmdeploy", "sglang"):
        logger = logging.getLogger(noisy)
        logger.setLevel(logging.ERROR)
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream in (sys.stdout, sys.__stdout__):
                handler.setStream(sys.stderr)


class Progress:
    """A one-line progress bar on a terminal: the layout, how far its search
    is (examples or seconds), and operations so far."""

    def __init__(self, stream: Any = None, interval: float = 0.5):
        self.stream = stream or sys.stderr
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def begin(self, machine: Machines, search: Search) -> None:
        self.machine, self.search, self.start = machine, search, time.perf_counter()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    position: tuple[int, int, float, float | None] | None = None  # (layout i, of n, run start, run deadline)

    def _line(self) -> str:
        m, s = self.machine, self.search
        now = time.perf_counter()
        elapsed = now - self.start
        if s.seconds:
            done = elapsed / s.seconds
        else:
            done = m.log.examples_run / (s.examples or s.profile.max_examples)
        done = min(done, 1.0)
        bar = "#" * int(done * 20) + "." * (20 - int(done * 20))
        line = f"\r  {m.scope:<8} {m.layout_name:<24} [{bar}] {m.log.steps_run:>8} ops {elapsed:6.1f} s"
        if self.position is not None:
            i, n, run_start, deadline = self.position
            if deadline is not None:
                eta = max(0.0, deadline - now)
            else:  # the layouts so far, at their average pace
                eta = (now - run_start) / max(i - 1 + done, 0.1) * (n - i + 1 - done)
            line += f"  layout {i}/{n}, about {eta:.0f} s left"
        return line

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.stream.write(self._line())
            self.stream.flush()

    def end(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        self.stream.write("\r" + " " * 80 + "\r")
        self.stream.flush()


# --- replaying ---------------------------------------------------------------------------------


@dataclass
class ReplayOutcome:
    """How a replay ended: ``diverged_at`` is the 1-based step where the
    target broke a rule, left the spec or stopped following the trace (None
    when it conformed over the whole trace)."""

    steps: int
    diverged_at: int | None
    message: str
    rules: list[str]
    trace: Trace  # this replay's own record: the operations this target saw

    @property
    def conforms(self) -> bool:
        return self.diverged_at is None


def replay(
    trace: Trace, target: str | Callable[..., Any], level: str, on_step: Callable[[int, Any], None] | None = None,
    seconds: float | None = None, release: releases.Release | str | None = None,
) -> ReplayOutcome:
    """Replay ``trace``'s decisions against ``target`` at ``level``, judged
    by the release the trace was recorded under -- where it records none,
    by ``release``, else the one a run of ``target`` judges by
    (:func:`default_release`).
    ``on_step(i, step)`` sees each step as this target ran it.  With
    ``seconds``, a target that has not finished by then is stopped where it
    is (SIGALRM, as for a budgeted search) and the replay ends there: the
    target hangs in the call it never returned from."""
    deadline = None if seconds is None else time.perf_counter() + seconds
    machine = None
    with _hard_stop_at(deadline, lambda: machine.log if machine is not None else None):
        try:
            make = machine_for(trace.scope, trace.layout, target, level, frozenset(trace.avoid),
                               against=trace.against or None,
                               release=trace.release or release or None)
            machine = make()
            return _replay(machine, trace, on_step)
        except BudgetSpent:
            pass
        finally:
            if machine is not None:
                machine.release()  # a failing replay is not torn down: the drop-in must not outlive it
    hung = machine.log.hung_in if machine is not None else None
    where = f"{hung} did not return" if hung else "the replay did not finish"
    message = f"{where} within {seconds:g} s ({HANGS})"
    done = machine.trace if machine is not None else Trace(trace.scope, trace.layout)
    ran = [s for s in done.steps if s.rule != "teardown"]
    return ReplayOutcome(len(trace.steps), max(1, len(ran)), message, [], done)


def _replay(machine: CheckingMachine, trace: Trace, on_step: Callable[[int, Any], None] | None) -> ReplayOutcome:
    steps = [s for s in trace.steps if s.rule != "teardown"]
    invariants = [getattr(f, INVARIANT_MARKER) for _, f in inspect.getmembers(type(machine))
                  if getattr(f, INVARIANT_MARKER, None) is not None]

    def check_invariants() -> None:
        for invariant in invariants:
            if all(p(machine) for p in invariant.preconditions):
                invariant.function(machine)

    failed_at = (trace.failure or {}).get("step")
    i = 0
    try:
        check_invariants()
        for i, step in enumerate(steps, 1):
            _replay_step(machine, i, step, failed_here=i == failed_at)
            check_invariants()
            if on_step:
                on_step(i, machine.trace.steps[-1])
        i = len(steps) + 1
        machine.teardown()
        if on_step and machine.trace.steps and machine.trace.steps[-1].rule == "teardown":
            on_step(i, machine.trace.steps[-1])
    except ConformanceError as error:
        rules = sorted({v.rule for v in error.violations})
        return ReplayOutcome(max(len(trace.steps), i), i, str(error), rules, machine.trace)
    except TraceMismatch as error:
        message = f"the target left the recorded path: {error}"
        return ReplayOutcome(max(len(trace.steps), i), i, message, [], machine.trace)
    except TraceEnd:
        if on_step:
            on_step(i, machine.trace.steps[-1])
        message = f"conforms up to the end of the trace (the recorded failure at step {i} did not happen)"
        return ReplayOutcome(len(trace.steps), None, message, [], machine.trace)
    except TraceError:
        raise
    except Exception as error:  # the target (or the machine) raised where no refusal was possible
        message = stopped_on(error)
        return ReplayOutcome(max(len(trace.steps), i), i, message, [], machine.trace)
    return ReplayOutcome(len(trace.steps), None, "conforms over the whole trace", [], machine.trace)


def _replay_step(machine: CheckingMachine, i: int, step: Any, *, failed_here: bool) -> None:
    method = getattr(machine, step.rule, None)
    rule = getattr(method, RULE_MARKER, None)
    if rule is None:
        raise TraceError(f"step {i}: the {machine.scope} machine has no rule {step.rule!r}")
    if not all(p(machine) for p in rule.preconditions):
        raise TraceMismatch(f"step {i}: rule {step.rule!r} cannot run in this state")
    data = ReplayData(step.draws, f"step {i} ({step.rule})", failed_here=failed_here)
    kwargs = dict(step.args)
    if "data" in rule.arguments:
        kwargs["data"] = data
    try:
        method(**kwargs)
    except (ConformanceError, TraceMismatch, TraceEnd, TraceError):
        raise
    except (IndexError, KeyError) as error:  # a recorded index that this target's state does not have
        mismatch = f"step {i} ({step.rule}): the recorded decisions do not fit this state ({error!r})"
        raise TraceMismatch(mismatch) from None
    data.finish()
