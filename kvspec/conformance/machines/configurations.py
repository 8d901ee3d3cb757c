"""Incoherent configurations: what a pool or a manager must refuse when it is built.

A configuration is input too.  Block sizes that do not nest, a size of 0, a
retention interval that is no multiple of the scheduler block size: the spec
refuses each at construction (``RuleError`` naming the rule its sizes would
break), and so must a target -- with ``ValueError`` or ``TypeError``, before
it hands out a single block.  A manager that accepts them divides by zero
later, or converts tokens to blocks with sizes that do not nest: wrong
tables, no crash.

Each variant is the machine's own layout with one size broken; each machine
builds one variant per run (its ``configure`` rule), the spec first: the
spec's refusal names the rule, and the target must refuse too.  The vectors
carry every variant of a few layouts (``<scope>/configs/...``).
``bad-config:non-positive-size`` (an ``--avoid`` name) sends none of the
variants with a block size, hash block size, ``max_model_len`` or
``dcp_world_size`` of 0 or less: vLLM 0.25.1 takes several (finding F9).

The manager machine also sends the constructor's other refusals
(:func:`constructor_variants`: the rows of spec/README.md chapter 2's
table that no size of a layout reaches), each its own small model.
``bad-config:engine-checked`` sends none of those that vLLM's engine checks
before it builds a manager, or never produces, and that vLLM 0.25.1's
``KVCacheManager`` builds (finding F16).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

from kvspec.conformance.targets.spec_manager import SpecManagerTarget
from kvspec.errors import HarnessFault, RuleError, RuleTypeError
from kvspec.kv_cache_interface import AttentionKind
from kvspec.spec import releases
from kvspec.spec.layout import Layout
from kvspec.spec.rules import Violation
from kvspec.testing import chunked, cross, full, swa

NON_POSITIVE_SIZE = "bad-config:non-positive-size"  # the --avoid name of the variants with a size <= 0
ANY_BAD_CONFIG = "bad-config:any"  # the --avoid name of every variant (a target that checks no configuration)
ENGINE_CHECKED = "bad-config:engine-checked"  # the --avoid name of the constructor variants vLLM's engine screens


@dataclasses.dataclass(frozen=True)
class Variant:
    """One incoherent configuration: what it breaks, whether it sets a block
    size, hash block size, ``max_model_len`` or world size of 0 or less, and the layout
    (a manager's ``Layout`` or a ``PoolLayout``) that builds it
    (``make_target``)."""

    name: str
    non_positive_size: bool
    layout: Any
    engine_checked: bool = False  # a configuration vLLM's engine checks (or never builds) before a manager


def takes_keyword(factory: Callable[..., Any], keyword: str, named: bool = False) -> bool:
    """Whether ``factory`` can be called with ``keyword`` (a factory whose
    signature cannot be read, or that takes ``**kwargs``, is given the
    benefit of the doubt -- unless the keyword must be ``named``)."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return not named
    return any(p.name == keyword and p.kind is not p.POSITIONAL_ONLY or p.kind is p.VAR_KEYWORD and not named
               for p in parameters)


def manager_variants(layout: Layout, retention: bool = True, context_parallel: bool = True) -> tuple[Variant, ...]:
    """Incoherent variants of a manager layout: every size that must nest,
    broken one at a time; with ``retention`` (the target's factory takes
    the keyword), a retention interval the layout cannot have; with
    ``context_parallel`` (it takes ``dcp_world_size``), context parallelism
    the layout cannot have."""
    sbs, hbs = layout.scheduler_block_size, layout.hash_block_size

    def variant(name: str, non_positive: bool = False, **changed: Any) -> Variant:
        sizes = {"given_scheduler_block_size": sbs, "given_hash_block_size": hbs}
        return Variant(name, non_positive, dataclasses.replace(layout, **{**sizes, **changed}))

    largest = max(g.block_size for g in layout.managed_groups)
    found = [
        variant("scheduler block not a multiple of a group's block", given_scheduler_block_size=largest + 1,
                given_hash_block_size=1),
        variant("scheduler block size 0", True, given_scheduler_block_size=0),
        variant("hash block size 0", True, given_hash_block_size=0),
        variant("max_model_len 0", True, max_model_len=0),
    ]
    if layout.enable_caching:  # without caching no hash is read: blocks need not be made of hash blocks
        # 2 * sbs is larger than every group's block, so no block is made of such hash blocks
        found.append(variant("hash block larger than the blocks", given_scheduler_block_size=2 * sbs,
                             given_hash_block_size=2 * sbs))
    if context_parallel:
        found.append(variant("dcp_world_size 0", True, dcp_world_size=0))
        # vLLM's engine never builds it; its manager refuses it where prefix caching is on (its hybrid
        # coordinator) and takes it without (its NoPrefixCacheCoordinator), so only the former is sent.
        # From 0.26.0 a hybrid of full attention and Mamba takes decode ranks (dcp-on-hybrid-models) but
        # still no prefill ranks: those are sent there instead.
        if len(layout.groups) > 1 and layout.enable_caching:
            # (judged with the sizes the engine would derive for the ranks, so that only the ranks differ)
            decode = variant("context parallelism with more than one group", dcp_world_size=2)
            derived = dataclasses.replace(decode.layout, given_scheduler_block_size=None, given_hash_block_size=None)
            found.append(decode if refusal(derived, functools.partial(SpecManagerTarget, release=layout.release)) else
                         variant("context parallelism with more than one group", pcp_world_size=2))
    if not retention:
        return tuple(found)
    if any(g.kind in (AttentionKind.SLIDING_WINDOW, AttentionKind.MAMBA) for g in layout.views):
        found += [variant("retention interval not a multiple of the scheduler block", retention_interval=2 * sbs + 1),
                  variant("negative retention interval", retention_interval=-sbs)]
    else:
        found.append(variant("retention interval without a sliding-window or Mamba group", retention_interval=sbs))
    return tuple(found)


def constructor_variants(takes: Callable[[str], bool] = lambda keyword: True,
                         release: releases.Release = releases.REFERENCE) -> tuple[Variant, ...]:
    """The manager constructor's refusals that no size of a layout reaches
    (spec/README.md chapter 2), each on a small model of its own -- those
    whose options the target's factory ``takes`` -- under ``release``."""
    def variant(name: str, layout: Layout, engine_checked: bool = False) -> Variant:
        return Variant(name, False, layout.for_release(release), engine_checked)

    found = (
        variant("one group whose block is not the hash block",
                Layout((full(4),), given_scheduler_block_size=4, given_hash_block_size=2)),
        variant("a hybrid block not made of hash blocks",
                Layout((full(2), swa(3, window=4)), given_scheduler_block_size=6, given_hash_block_size=2)),
        *([] if release.has("hybrid-one-spec-group") else [  # built from 0.29
            variant("two groups of one spec", Layout((full(2), full(2))))]),
        variant("a negative watermark", Layout((full(2),), watermark=-0.5)),
        variant("cross attention with caching on", Layout((full(2), cross(2))), True),
        variant("a chunked-local EAGLE group", Layout((full(2), chunked(2, chunk=4)), use_eagle=True), True),
        variant("a chunked-local block smaller than the scheduler block", Layout((full(4), chunked(2, chunk=4))),
                True),
        variant("decode ranks on a sliding-window group", Layout((swa(2, window=4),), dcp_world_size=2), True),
        variant("a negative max_num_batched_tokens", Layout((full(2),), max_num_batched_tokens=-1), True),
        variant("max_model_len not an int", Layout((full(2),), max_model_len=2.5), True),
        variant("use_eagle not a bool", Layout((full(2),), use_eagle=1), True),
    )
    return tuple(v for v in found if all(takes(keyword) for keyword in v.layout.target_options()))


def manager_machine_variants(layout: Layout, factory: Callable[..., Any]) -> tuple[Variant, ...]:
    """Every configuration the manager machine may build for ``layout``
    with a target ``factory``: the layout's incoherent sizes and the
    constructor's other refusals, each only where the factory takes the
    keywords it needs."""
    def takes(keyword: str) -> bool:
        return takes_keyword(factory, keyword)

    return (manager_variants(layout, takes("retention_interval"), takes("dcp_world_size"))
            + constructor_variants(takes, layout.release))


def pool_variants(layout: Any) -> tuple[Variant, ...]:
    """Incoherent variants of a pool (a ``PoolLayout``): no room for the
    null block, a hash block size that is not positive, a size that is no
    int (the last two kinds F9's: ``non_positive_size`` says "not a positive
    int")."""
    replace = dataclasses.replace
    return (
        Variant("a pool of 0 blocks", True, replace(layout, num_blocks=0)),
        Variant("a pool of a negative size", False, replace(layout, num_blocks=-1)),
        Variant("hash block size 0", True, replace(layout, hash_block_size=0)),
        Variant("negative hash block size", True, replace(layout, hash_block_size=-layout.hash_block_size)),
        Variant("a pool size not an int", True, replace(layout, num_blocks=layout.num_blocks + 0.5)),
        Variant("a hash block size not an int", True, replace(layout, hash_block_size=layout.hash_block_size + 0.5)),
    )


def sendable(variants: tuple[Variant, ...], avoid: frozenset[str]) -> tuple[str, ...]:
    """The names of the variants a machine told to ``avoid`` inputs may send."""
    if ANY_BAD_CONFIG in avoid:
        return ()
    return tuple(v.name for v in variants if not (v.non_positive_size and NON_POSITIVE_SIZE in avoid)
                 and not (v.engine_checked and ENGINE_CHECKED in avoid))


def refusal(layout: Any, spec: Callable[..., Any]) -> RuleError | RuleTypeError | None:
    """The spec's refusal to build ``layout`` (``spec``: its target
    factory), under the release judged; ``None`` where it builds it."""
    try:
        layout.make_target(spec)
    except (RuleError, RuleTypeError) as refused:
        return refused
    return None


def spec_refusal(variant: Variant, spec: Callable[..., Any]) -> RuleError | RuleTypeError:
    """The spec's refusal of ``variant`` (every variant is one the spec refuses)."""
    if (refused := refusal(variant.layout, spec)) is not None:
        return refused
    # the variants are chosen so that the spec refuses every one: a fault of kvspec's, not the target's
    raise HarnessFault(f"the spec accepted the incoherent configuration {variant.name!r}")


def build_outcome(build: Callable[[], Any]) -> tuple[str, Any]:
    """Building a target that must be refused: ``("refused", error)`` for a
    ``ValueError``/``TypeError``, ``("crashed", error)`` for any other
    exception, ``("accepted", target)`` when it was built.  (The one judge of
    a construction, for the machines and for configuration vectors.)"""
    try:
        return "accepted", build()
    except (ValueError, TypeError) as error:
        return "refused", error
    except Exception as error:  # noqa: BLE001 (judged: anything but a refusal)
        return "crashed", error


def judge_construction(variant: Variant, spec: Callable[..., Any],
                       target: Callable[..., Any]) -> tuple[list[Violation], str | None, str]:
    """Build ``variant`` with the spec, then with the target.  Returns the
    violations (the target accepted what the spec refuses: the spec's rule),
    a divergence (the target raised something other than a refusal), and
    the outcome for the trace."""
    refusal = spec_refusal(variant, spec)
    outcome, got = build_outcome(lambda: variant.layout.make_target(target))
    if outcome == "refused":
        return [], None, f"refused {type(got).__name__}: {got}"
    if outcome == "crashed":
        return [], (f"building {variant.name} crashed with {got!r}; a refusal must raise ValueError or "
                    f"TypeError"), f"crashed {type(got).__name__}: {got}"
    return ([Violation(refusal.rule, f"{variant.name} was accepted (built a {type(got).__name__}); the spec "
                                     f"refuses it: {refusal}")], None, "accepted")


def construct_badly(machine: Any, variants: tuple[Variant, ...], name: str, spec: Callable[..., Any],
                    target: Callable[..., Any]) -> None:
    """A machine's step (a ``CheckingMachine``): build the variant ``name``
    with the spec and the target, record it, and fail the run where the
    target does not refuse it as the spec does."""
    variant = next(v for v in variants if v.name == name)
    where = f"construct({name})"
    with machine.calling(where):
        violations, divergence, outcome = judge_construction(variant, spec, target)
    machine.record(where, outcome)
    machine.fail(violations, divergence)
