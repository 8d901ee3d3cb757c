"""Known findings: where an implementation under test breaks a rule.

Each finding has a saved, minimal trace under ``docs/findings/`` (replay it
with ``kvspec replay``), the rules it breaks, the verdict -- which side is
wrong and why -- in ``docs/findings.md``, and the input it needs, which a
machine can be told to *avoid*.

Why avoid: a search stops at its first failure, so one known finding (say,
vLLM accepting a negative block count) would hide everything behind it on
every layout.  ``kvspec conform --known-findings`` steers the machines away
from the inputs of the target's known findings and searches the rest; the
report names what it steered around.  That a finding still reproduces is
checked separately, by replaying its trace (``tests/test_findings.py``).
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from kvspec.conformance.machines.configurations import ANY_BAD_CONFIG, ENGINE_CHECKED, NON_POSITIVE_SIZE
from kvspec.conformance.machines.layouts import LATER_LAYOUTS, MANAGER_LAYOUTS
from kvspec.conformance.machines.scheduler import AVOIDABLE as SCHEDULER_AVOIDABLE
from kvspec.spec import releases
from kvspec.spec.releases import BASE, version_key


def _findings_dir() -> Path:
    """Where the findings' traces are: ``docs/findings/`` of a checkout, or
    the same files installed from a wheel (package ``kvspec.finding_traces``)."""
    checkout = Path(__file__).resolve().parents[2] / "docs" / "findings"
    if checkout.is_dir():
        return checkout
    installed = importlib.util.find_spec("kvspec.finding_traces")
    return Path(next(iter(installed.submodule_search_locations))) if installed else checkout


FINDINGS_DIR = _findings_dir()

AVOIDABLE: dict[str, str] = {
    "bad-input:too_many": "pool: get_new_blocks for more blocks than are free",
    "bad-input:negative": "pool: get_new_blocks(-k); manager: allocate_slots with num_new_tokens=-1",
    "bad-input:bool_count": "pool: get_new_blocks(True)",
    "bad-input:bad_free": "pool: free_blocks of a block nobody holds (after up to two held ones)",
    "bad-input:bad_evict": "pool: evict_blocks of an id the pool does not have",
    "bad-input:bad_hash": "pool: get_cached_block with a str for a hash",
    "bad-input:no_tokens": "manager: allocate_slots with no tokens at all",
    "bad-input:bad_cache": "pool: cache_full_blocks with a negative num_cached_blocks, one block twice, or more "
                           "blocks than the request has hashes",
    "bad-input:bad_group": "pool: get_cached_block with a group id that is no 4-byte unsigned int (2**32, a str, -1)",
    "bad-input:trusted_args": "manager: allocate_slots with a count past max_model_len, a flag that is not a bool, "
                              "hits for a running request, or hit blocks no longer cached (any, with caching off)",
    "partial-entry:earlier-image": "pool: a partial entry whose last hash block overlaps an image that is not the "
                                   "request's last; manager: a multimodal prompt whose partial tail (from 0.26) "
                                   "would be such an entry",
    "mamba-align-external": "manager: external (connector) tokens where a Mamba group caches in align mode",
    "context-parallel:save-past-computed": "manager: on a context-parallel layout, asking which blocks a KV "
                                           "connector saves while the request's table reaches past its computed "
                                           "tokens (lookahead, rejected drafts)",
    "context-parallel:hybrid-per-group-lookup": "manager: on a hybrid model with decode context parallelism, "
                                                "asking each group's own longest hit (what a KV connector of a "
                                                "Mamba hybrid is given)",
    ANY_BAD_CONFIG: "pool and manager: any incoherent configuration (a target that leaves its checks to its "
                    "caller)",
    NON_POSITIVE_SIZE: "pool and manager: built with a block size, hash block size, max_model_len or "
                       "dcp_world_size of 0 or less, or a pool of 0 blocks; a pool whose size or hash block size "
                       "is not an int",
    ENGINE_CHECKED: "manager: built with a configuration vLLM's engine checks or never builds (cross attention "
                    "with caching, chunked-local attention under EAGLE or a larger scheduler block, decode ranks "
                    "on a window, a negative max_num_batched_tokens, a max_model_len or use_eagle of the wrong "
                    "type)",
    **SCHEDULER_AVOIDABLE,
    "layout:NAME": "the layout NAME altogether (a finding the layout's configuration itself triggers)",
}
"""The inputs a machine can be told not to send (``--avoid``), and what each is."""


def in_releases(version: str, releases: tuple[str, str | None]) -> bool:
    """Whether ``version`` is in ``releases``: from the first, before the
    second (``None``: not fixed yet)."""
    first, fixed = releases
    return version_key(first) <= version_key(version) and (fixed is None or version_key(version) < version_key(fixed))


COMPONENTS: dict[str, str] = {
    "vllm-block-manager": "vLLM's block manager",
    "vllm-scheduler": "vLLM's scheduler",
    "vllm-offload-tier": "vLLM's CPU offload tier",
}
"""The components a finding can live in, and how a report names each.  A
target replaces some of them with its own code and runs on the others:
``impl`` replaces vLLM's block manager and, at scheduler scope, runs under
vLLM's scheduler -- whose findings are then not impl's (:func:`inherited_findings`)."""


@dataclass(frozen=True)
class Finding:
    id: str
    target: str  # the implementation it was found in
    title: str
    rules: tuple[str, ...]  # the rules broken ("" entries: a divergence from the spec)
    avoid: str  # the machine input it needs (a knob of the machines), or "" if it cannot be steered around
    trace: str  # file name under docs/findings/
    also: tuple[str, ...] = ()  # further scopes whose machines send its input (steered there too)
    releases: tuple[str, str | None] = (BASE, None)  # the first release it is in, the first it is fixed in
    component: str = "vllm-block-manager"  # where it lives (COMPONENTS)

    def affects(self, version: str) -> bool:
        """Whether vLLM ``version`` has it (as far as the releases measured say)."""
        return in_releases(version, self.releases)

    @property
    def scope(self) -> str:
        """The machine the trace runs on (its file name says: ``F1-pool-...``, ``F17-offload-...``)."""
        word = self.trace.split("-")[1]
        return word if word in ("pool", "offload") else "manager"

    @property
    def trace_path(self) -> Path:
        return FINDINGS_DIR / self.trace

    def shows_on(self, scope: str, layout: str) -> bool:
        """Whether a run at ``scope`` on ``layout`` can show this finding at
        all: its scopes, and for an input that needs a kind of model (a
        Mamba group in align mode, context parallelism) or one layout, that
        model or that layout.  A bad input shows on any layout of its scopes."""
        if scope not in (self.scope, *self.also):
            return False
        if self.avoid.startswith("layout:"):
            return self.avoid == f"layout:{layout}"
        if self.avoid == "mamba-align-external":
            return "align" in _layout_of(layout, lambda found: found.mamba_cache_modes, ())
        if self.avoid.startswith("context-parallel:"):
            return _layout_of(layout, lambda found: found.context_parallel_ranks, 1) > 1
        return True


FINDINGS: tuple[Finding, ...] = (
    Finding(
        "F1", "vllm", "BlockPool.get_new_blocks accepts a negative count (the free count grows)",
        ("allocation-accounting",), "bad-input:negative", "F1-pool-negative-count.json",
    ),
    Finding(
        "F2", "vllm", "BlockPool.free_blocks accepts a block nobody holds (its ref count goes negative)",
        ("ref-conservation", "free-queue-consistency"), "bad-input:bad_free", "F2-pool-free-unheld.json",
    ),
    Finding(
        "F3", "vllm", "BlockPool.get_new_blocks takes True for a count of one",
        ("allocation-accounting",), "bad-input:bool_count", "F3-pool-bool-count.json",
    ),
    Finding(
        "F4", "vllm", "KVCacheManager.allocate_slots accepts a negative num_new_tokens",
        ("allocation-accounting",), "bad-input:negative", "F4-manager-negative-tokens.json",
    ),
    Finding(
        "F5", "vllm", "Mamba align mode with external tokens: the block estimate misses a block and "
        "allocate_slots fails half-way",
        ("allocation-accounting",), "mamba-align-external", "F5-mamba-align-external.json",
    ),
    Finding(
        "F6", "vllm", "Two full-attention specs: the second keeps the blocks of its longer first search "
        "when another group shortens the hit (with external tokens: get_new_blocks(-1))",
        ("hit-soundness",), "layout:two-full-specs", "F6-two-full-specs-uncut.json",
        releases=(BASE, "0.29.0"),  # its trace holds from 0.29.0, where the layout conforms unsteered (0.28.0 fails)
    ),
    Finding(
        "F7", "vllm", "EAGLE with a Mamba group: Mamba is searched as an EAGLE group without the drop, "
        "so the hit outruns full attention",
        ("hit-soundness",), "layout:full+mamba-eagle", "F7-mamba-as-eagle-group.json",
        releases=(BASE, "0.26.0"),  # its trace holds from 0.26.0, where the layout conforms unsteered
    ),
    Finding(
        "F8", "vllm", "Mamba align mode with drafts: once rejected drafts left the state table long, the block "
        "estimate goes negative and offsets the other groups' needs",
        ("allocation-accounting",), "layout:full+mamba-align-drafts", "F8-mamba-align-negative-estimate.json",
    ),
    Finding(
        "F9", "vllm", "KVCacheManager and BlockPool take sizes of 0 or less (scheduler block size, max_model_len, "
        "the pool's hash block size) or divide by zero on them (the manager's hash block size); the pool takes a "
        "hash block size that is not an int",
        ("block-size-coherence",), NON_POSITIVE_SIZE, "F9-non-positive-sizes-accepted.json", also=("pool",),
    ),
    Finding(
        "F10", "vllm", "Context parallelism: get_block_ids_for_computed_tokens counts a block as one rank's "
        "tokens, so a KV connector is handed blocks past the computed tokens (lookahead, rejected drafts)",
        ("content-soundness",), "context-parallel:save-past-computed", "F10-cp-connector-saves-uncomputed.json",
    ),
    Finding(
        "F11", "vllm", "BlockPool.cache_partial_block: the BlockStored event looks for images from the request's "
        "last one on, so an earlier image its hash block overlaps is missing from its extra keys",
        ("hash-map-consistency",), "partial-entry:earlier-image", "F11-pool-partial-event-drops-images.json",
        also=("manager",),  # from 0.26 the full-attention manager registers partial tails (partial-tail-entries)
    ),
    Finding(
        "F12", "vllm", "Decode context parallelism on a full-attention + Mamba model: the per-group lookup a KV "
        "connector is given (find_longest_cache_hit_per_group) reads full attention's hashes at the per-rank "
        "block size and raises AssertionError on the first request",
        (), "context-parallel:hybrid-per-group-lookup", "F12-dcp-hybrid-per-group-lookup.json",
        releases=("0.26.0", "0.29.0"),
    ),
    Finding(
        "F13", "vllm", "BlockPool.cache_full_blocks trusts its range: a negative num_cached_blocks keys blocks "
        "counted from the list's end, one block twice is cached once, a request with too few hashes fails an assert; "
        "and a pool with prefix caching off keys blocks all the same",
        ("allocation-accounting",), "bad-input:bad_cache", "F13-pool-cache-trusts-its-range.json",
    ),
    Finding(
        "F14", "vllm", "BlockPool takes any group id: one that does not fit the key's 4 bytes raises OverflowError, "
        "one that is no int AttributeError, instead of a refusal",
        (), "bad-input:bad_group", "F14-pool-group-id-unchecked.json",
    ),
    Finding(
        "F15", "vllm", "KVCacheManager.allocate_slots trusts its arguments: a count past max_model_len is capped, "
        "a flag that is not a bool is read as true or false, hits for a running request fail an assert, hit blocks "
        "no longer cached are taken, hits with caching off fail an assert, from 0.32 a float count is taken, a hit "
        "list past the groups is ignored; get_block_ids_for_computed_tokens answers a negative count; "
        "cache_blocks of blocks the request does not hold does nothing (with KV events, an IndexError)",
        ("allocation-accounting",), "bad-input:trusted_args", "F15-manager-allocation-trusts-its-arguments.json",
    ),
    Finding(
        "F16", "vllm", "KVCacheManager builds a manager from configurations its engine screens: cross attention "
        "with caching, a chunked-local EAGLE group or smaller block, decode ranks on a window (asserts at the "
        "first hit search), a negative max_num_batched_tokens, a float max_model_len, use_eagle=1",
        ("hash-map-consistency",), ENGINE_CHECKED,  # the trace's (cross attention); the other six break others
        "F16-manager-constructor-trusts-its-configuration.json",
    ),
    Finding(
        "F17", "vllm", "CPUOffloadingManager with store_threshold >= 2: a store evicts a key it is asked to store "
        "(only the keys past the threshold are protected; a held key whose count the tracker forgot is not)",
        ("tier-eviction", "tier-policy"), "layout:threshold-small-tracker",
        "F17-offload-threshold-evicts-a-named-key.json", releases=(BASE, "0.34.0"), component="vllm-offload-tier",
    ),
    Finding(
        "F18", "vllm", "CPUOffloadingManager under ARC refuses a store with a block to evict: below T1's target "
        "it looks in T2 alone and gives up when T2 has no evictable key (vllm#55461 adds the fallback to T1)",
        ("tier-eviction",), "layout:tiny-tier-arc",
        "F18-offload-arc-gives-up-with-a-block-to-evict.json", releases=(BASE, "0.34.0"), component="vllm-offload-tier",
    ),
)


def _layout_of(name: str, read, default):
    """``read(layout)`` for the manager layout ``name`` (built-in or a
    model's), or ``default`` where ``name`` names none (a pool layout)."""
    layout = MANAGER_LAYOUTS.get(name) or LATER_LAYOUTS.get(name)
    if layout is None and name.startswith("model:"):
        from kvspec.models.architectures import setup

        layout = setup(name.removeprefix("model:")).layout
    return default if layout is None else read(layout)


def is_avoidable(name: str, layouts: list[str]) -> bool:
    """Whether ``name`` is an input the machines can avoid."""
    if name.startswith("layout:"):
        return name.removeprefix("layout:") in layouts
    return name in AVOIDABLE and name != "layout:NAME"


def known_findings(target: str, scopes: list[str] | tuple[str, ...] = ("pool", "manager"),
                   release: releases.Release | str | None = None) -> tuple[Finding, ...]:
    """``target``'s own known findings at ``scopes``: vLLM's block manager's,
    and at scheduler scope its scheduler's
    (kvspec.conformance.vllm.scheduler_findings) -- a block manager of
    another's under that scheduler inherits those instead
    (:func:`inherited_findings`).  Only those of the release judged
    (``release``; by default the installed vLLM's for the vllm target, else
    the reference release): a finding fixed before it (or not yet in it) is
    not steered around, so that its return is seen."""
    version = _judged(target, release).version
    found = tuple(f for f in FINDINGS if f.target == target and ({f.scope, *f.also} & set(scopes))
                  and f.affects(version))
    if target == "vllm" and "scheduler" in scopes:
        from kvspec.conformance.vllm.scheduler_findings import SCHEDULER_FINDINGS

        found += tuple(SCHEDULER_FINDINGS.values())
    return found


def _judged(target: str, release: releases.Release | str | None) -> releases.Release:
    """``release``, or where none is given the one a run of ``target`` judges by."""
    if release is not None or target != "vllm":
        return releases.as_release(release)
    from kvspec.conformance.vllm import installed

    return releases.judged(installed.version()) if installed.import_error() is None else releases.REFERENCE


def inherited_findings(target: str, scopes: list[str] | tuple[str, ...]) -> tuple:
    """The known findings of components ``target`` runs on but does not
    replace: vLLM's scheduler's, for a block manager other than vLLM's
    judged under it (scheduler scope).  They are not the target's: a run
    steers around their inputs and reports them as the component's
    (``--strict`` sends them, and counts what they break)."""
    if target == "vllm" or "scheduler" not in scopes:
        return ()
    from kvspec.conformance.vllm.scheduler_findings import SCHEDULER_FINDINGS

    return tuple(SCHEDULER_FINDINGS.values())


def inputs_to_avoid(target: str, scopes: list[str] | tuple[str, ...] = ("pool", "manager"),
                    release: releases.Release | str | None = None) -> frozenset[str]:
    """The machine knobs that steer around ``target``'s known findings (on ``release``: :func:`known_findings`)."""
    return frozenset(f.avoid for f in known_findings(target, scopes, release) if f.avoid)


def matching_finding(target: str, scope: str, layout: str, trace: object) -> Finding | None:
    """The known finding that a failing run is, where it fits the finding
    in all three ways: the component (one of ``target``'s own findings, or
    one of a component it runs on, :func:`inherited_findings`), the layout
    (:meth:`Finding.shows_on`) and the rules -- it breaks only rules the
    finding breaks (a fork's leak met on a finding's input is the fork's)
    and its failing step sends the finding's input.  A divergence from an
    upstream run in lockstep (``--against``) is never a finding: the upstream
    has every finding the target inherited from it.  A label for reports,
    not a verdict: the run is still a failure."""
    if trace is None or not getattr(trace, "steps", None):
        return None
    broken = set((trace.failure or {}).get("rules") or ())
    if getattr(trace, "against", "") and not broken:
        return None
    if scope == "scheduler":
        return _matching_scheduler_finding(layout, trace)
    step = (trace.failure or {}).get("step") or len(trace.steps)
    failing = trace.steps[min(step, len(trace.steps)) - 1]
    values = set(map(str, failing.args.values())) | {str(v) for _, v in failing.draws}
    labels = {label for label, _ in failing.draws}
    for finding in known_findings(target, (scope,)):
        if not broken <= set(finding.rules) or not finding.shows_on(scope, layout):
            continue
        if finding.avoid.startswith("layout:"):
            return finding
        if finding.avoid.startswith("bad-input:") and finding.scope == scope and finding.avoid.split(":")[1] in values:
            return finding
        if finding.avoid == "mamba-align-external" and "external blocks" in labels:
            return finding
        if finding.avoid == "context-parallel:hybrid-per-group-lookup" and layout in LATER_LAYOUTS and \
                any("find_longest_cache_hit_per_group" in op for op in failing.operations):
            return finding
        if finding.avoid == "context-parallel:save-past-computed" and layout in MANAGER_LAYOUTS and \
                any("get_block_ids_for_computed_tokens" in op for op in failing.operations):
            return finding
    return None


def _matching_scheduler_finding(layout: str, trace: object) -> Finding | None:
    """The scheduler finding a failing scheduler-scope run looks like: a
    failing load anywhere in it (S3 where the layout has several groups,
    S2 where a request is aborted -- S2-fail under the fail policy), or a
    connector on a Mamba layout (S1)."""
    from kvspec.conformance.machines.scheduler import SCHEDULER_LAYOUTS, engine_of
    from kvspec.conformance.vllm.scheduler_findings import SCHEDULER_FINDINGS

    loads = {str(value) for step in trace.steps for label, value in step.draws if label == "load"}
    if loads & {"sync-fail", "async-fail"}:
        if layout in SCHEDULER_LAYOUTS and len(SCHEDULER_LAYOUTS[layout].groups) > 1:
            return SCHEDULER_FINDINGS["S3"]
        if any(step.rule == "abort" and step.draws for step in trace.steps) or _owner_preempted(trace):
            return SCHEDULER_FINDINGS["S2-fail" if engine_of(layout).failure_policy == "fail" else "S2"]
    if "mamba" in layout and "scheduler:mamba-connector" not in trace.avoid:
        return SCHEDULER_FINDINGS["S1-align" if "align" in layout else "S1"]
    return None


def _owner_preempted(trace: object) -> bool:
    """Whether a request whose load failed was preempted after the failing
    step -- S2's other way in: its blocks leave it still cached, before it
    recomputed them, and vLLM's scheduler decides the preemption (pool
    pressure), so no input of the machine can steer around it."""
    failing: set[str] = set()
    for step in trace.steps:
        for op in step.operations:
            failing |= set(re.findall(r"failing (r\d+) tokens", op))
            for listed in re.findall(r"preempted \[([^\]]*)\]", op):
                if failing & set(re.findall(r"r\d+", listed)):
                    return True
    return False
