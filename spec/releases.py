"""Releases: which vLLM release the spec describes, and what each later one changed.

The chapters before this one describe vLLM **0.25.1**, the *base*.  vLLM
ships a release a month; a release that changes what its block manager
does, or what it answers, is written here as a :class:`Delta` on the one
before -- the way a protocol's forks are written as deltas on its base --
so that a reader targeting release R reads the base chapters and then the
deltas up to R, oldest first (:func:`deltas_until`), and nothing else.

Each delta says:

- the **release** that made the change and a **key** that names it;
- what changed, in prose (the **change**);
- the **rules** whose reading changes with it (none: the rules stand and
  only what a target answers, or which inputs exist, changed);
- the **vectors** that judge it (none yet: said so);
- its **status**: ``modelled`` (the spec follows the release: a switch on
  :class:`Release` that the rules or the machines read), ``outside`` (the
  change is outside what the spec judges -- an answer the neutral
  interface leaves out, a feature the release removed -- and the delta
  says exactly what is not judged), or ``not-modelled`` (the release does
  something the spec does not describe yet: a target on that release may
  break a rule there for no fault of its own; the delta names the layouts
  where it shows).

A release is judged by the rules of the newest release the spec knows at
or before it (:func:`judged`): a release newer than every known one is
judged by the newest known one's rules, and says so.  Rules that no delta
names are release-independent: ref-conservation holds in every release.

Nothing here imports vLLM; releases are version strings.  Run as a script,
the module prints the base release (``tools/install_vllm.sh`` reads it so,
before kvspec is installed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

BASE = "0.25.1"
"""The release the chapters before this one describe."""

MODELLED, OUTSIDE, NOT_MODELLED = "modelled", "outside", "not-modelled"

FIXED_ROOT_SEED = "vllm-none-hash"
"""The seed of an unseeded process's root hash from 0.29 (delta fixed-root-hash)."""


def version_key(version: str) -> tuple[int, ...]:
    """``"0.31.0rc1"`` -> ``(0, 31, 0)``: a release's numbers, for ordering
    releases (a pre-release orders with its release).  A string that is no
    version is a ``ValueError`` naming it."""
    match = re.match(r"v?(\d+(?:\.\d+)*)", str(version).strip())
    if not match:
        raise ValueError(f"{version!r} is not a vLLM release (expected a version such as {BASE!r})")
    return tuple(int(n) for n in match[1].split("."))


@dataclass(frozen=True)
class Delta:
    """One change a release made to the block manager, as the spec reads it."""

    release: str
    key: str
    change: str
    rules: tuple[str, ...] = ()
    vectors: tuple[str, ...] = ()
    status: str = MODELLED
    shows_on: tuple[str, ...] = ()
    """For a delta not modelled: the conformance layouts where a target on the release can break a rule."""


DELTAS: tuple[Delta, ...] = (
    Delta(
        "0.26.0", "partial-tail-entries",
        "Where a full-attention group's blocks hold several hash blocks, caching a request's blocks also "
        "registers the prompt's last hash boundary, when it ends inside a block and is computed, as a partial "
        "entry of the block that holds it (chapter 1's cache_partial_block, with its Stored event).  Such an "
        "entry is found only by the partial hits of delta partial-hit-copy-on-write; elsewhere it is held, "
        "announced and evicted like any other key.",
        rules=("hash-map-consistency",)),
    Delta(
        "0.26.0", "partial-hit-copy-on-write",
        "Where a Mamba group in align mode has blocks bigger than the hash block (and no context parallelism), "
        "a hit may end inside a block: the lookup probes partial entries past the last full block, Mamba "
        "registers its own partial tail states, the shared tail block is copied on write into a block of the "
        "request's own, the hash moves to the copy, and the pending copy holds references to both blocks "
        "outside any block table until the step runs.",
        rules=("ref-conservation", "no-eviction-in-use", "content-soundness", "hit-soundness",
               "hash-map-consistency"), status=NOT_MODELLED,
        shows_on=("manager/full+mamba-align-drafts",)),
    Delta(
        "0.26.0", "zeroing-with-mamba-only",
        "The worker zeroes newly allocated attention blocks only for a model with Mamba layers (the KV-cache "
        "config's needs_kv_cache_zeroing): for any other model take_new_block_ids names no block.",
        rules=("content-soundness",)),
    Delta(
        "0.26.0", "dcp-on-hybrid-models",
        "Decode context parallelism is accepted on a hybrid model of full-attention and Mamba groups (no "
        "prefill ranks, no other kind of group): attention blocks are split over the ranks, so the manager "
        "counts block_size x dcp_world_size tokens in a full-attention block, and Mamba states are replicated "
        "on every rank, so a Mamba block keeps its block_size.  The base refuses context parallelism with more "
        "than one group.  The layout full+mamba-align-dcp2 exists from this release on.",
        rules=("block-size-coherence",)),
    Delta(
        "0.26.0", "pcp-outside-the-block",
        "Prefill context parallelism no longer widens a block: the manager counts block_size x dcp_world_size "
        "tokens a block, whatever pcp_world_size is (the engine hands the manager no prefill ranks), and the "
        "scheduler and hash block sizes follow.",
        rules=("block-size-coherence",)),
    Delta(
        "0.26.0", "processed-token-windows",
        "Blocks leave the attention window on the processed-token basis: the scheduler passes "
        "remove_skipped_blocks the tokens computed minus those in flight, and allocate_slots frees on that "
        "basis too: the request's computed tokens less its num_in_flight_tokens (the tokens of steps still in "
        "the forward pass, which async scheduling overlaps with the next schedule and which still read the "
        "blocks below).  So a Mamba group no longer holds back its num_speculative_blocks tokens (drafts that may "
        "still be rejected) before it frees the states behind the last one.",
        rules=("content-soundness",)),
    Delta(
        "0.26.0", "shared-prefix-boundary",
        "get_computed_blocks returns a third value after (blocks, num_hits): the block-aligned end of a "
        "shared prefix a sparse-retention group has not cached yet (0: none).  The scheduler stores it on the "
        "request, and under a retention interval a sliding-window or Mamba group keeps the tail before it as "
        "it keeps the prompt's replay boundary's (chapter 3's reachable_boundaries reads it; the machines' "
        "requests carry none).  The spec's answer is the pair; the third value is read and not judged.",
        status=OUTSIDE),
    Delta(
        "0.27.0", "free-order-without-caching",
        "A pool with prefix caching off returns every freed block to the tail of the free queue, in the order "
        "freed, instead of putting blocks without a hash at the head: the block freed longest ago is reused "
        "first.  With caching on nothing changes.",
        rules=("free-order",)),
    Delta(
        "0.27.0", "stats-at-admission",
        "The prefix-cache stats stop counting lookups: get_computed_blocks records nothing, and the scheduler "
        "records a request once it is admitted, with record_prefix_cache_stats(request, num_hits) -- one "
        "request, its num_tokens as queries, num_hits as hits (nothing with caching off or for a request that "
        "skips reading the cache).  A lookup whose request is not admitted is not counted.",
        rules=("allocation-accounting",)),
    Delta(
        "0.28.0", "free-order-restored",
        "Delta free-order-without-caching is undone: a pool with caching off again puts freed blocks at the "
        "head of the free queue, in the order freed, as the base does (no block has a hash there, so every one "
        "is reused before the blocks already free).",
        rules=("free-order",)),
    Delta(
        "0.28.0", "zeroing-every-attention-group",
        "Where the worker zeroes new blocks (a model with Mamba layers), it zeroes those of every attention "
        "group -- sliding-window and chunked-local ones too -- not only full attention's.",
        rules=("content-soundness",)),
    Delta(
        "0.29.0", "fixed-root-hash",
        "A process started without PYTHONHASHSEED roots every hash chain at a fixed seed, "
        f"{FIXED_ROOT_SEED!r}, hashed by the prefix-caching hash function, so that independent processes "
        "compute the same block hashes and can share a cache; the base roots such a process at random bytes.  "
        "vLLM's non-cryptographic hash functions (xxhash) keep a random seed.  The spec roots chains at a "
        "seed, as a process started with PYTHONHASHSEED does (chapter 2), so no rule reads it; "
        "kvspec.hashing.init_none_hash follows it for a release that has it.",
        status=OUTSIDE),
    Delta(
        "0.29.0", "retention-zero-anywhere",
        "A retention interval of 0 (keep only the prompt-replay boundary) is accepted on a model with no "
        "sliding-window or Mamba group, where it changes nothing; the base refuses any interval there.  (vLLM "
        "now reads the interval from the KV-cache config, not the environment.)",
        rules=("block-size-coherence",)),
    Delta(
        "0.29.0", "hybrid-one-spec-group",
        "A model of several groups whose specs are all equal builds with prefix caching on: the hybrid "
        "coordinator searches them as one spec group (it requires one cacheable group, no longer two).  The "
        "base refuses such a model (vLLM 0.28 asserted that a hybrid coordinator has two attention groups: "
        "the crash vllm-project/vllm#51888 reports, on a development build).  Measured in the releases' source: 0.28.0 "
        "asserts, 0.29.0 to 0.34.0 build it.",
        rules=("hit-soundness",), vectors=("manager/configs/constructor/two-groups-of-one-spec",)),
    Delta(
        "0.29.0", "partial-hits-under-dcp",
        "Delta partial-hit-copy-on-write also applies under decode context parallelism: there a Mamba align "
        "group whose block is at least the hash block turns hits inside a block on.  A full-attention block "
        "then spans block_size x dcp_world_size tokens, and where that is more than the hash block a hit may "
        "end inside it; where every group's block is the hash block (full+mamba-align-dcp2) every hash "
        "boundary is a block boundary and no hit changes (what caching changes there is delta "
        "unrounded-caching-under-dcp, modelled).",
        rules=("ref-conservation", "no-eviction-in-use", "content-soundness", "hit-soundness",
               "hash-map-consistency"), status=NOT_MODELLED,
        shows_on=("manager/full2+mamba-align-dcp2",)),
    Delta(
        "0.29.0", "unrounded-caching-under-dcp",
        "Where delta partial-hits-under-dcp turns hits inside a block on (decode context parallelism and a Mamba "
        "align group whose block is at least the hash block), a caching call covers every computed token: the "
        "count is no longer rounded down to the scheduler block.  Where every block is the hash block "
        "(full+mamba-align-dcp2) no hit changes, but a Mamba align group is then never asked to cache exactly "
        "the prompt's last reusable boundary once the request computes past it, so it does not key the state "
        "there again (deltas mamba-boundary-remarked, mamba-boundary-remark-fixed).",
        rules=("hit-optimality", "hash-map-consistency")),
    Delta(
        "0.30.0", "eagle-replay-boundaries",
        "In a model a drafter reads (use_eagle, or a group marked as the drafter's), the positions where a "
        "replay of a prompt of P tokens resumes -- which sparse retention keeps in every sliding-window and "
        "Mamba group -- are each one scheduler block A lower: max(R - A, 0) for a resend of the prompt "
        "(R = (P - 1) // A * A) and max(E - A, 0) for a longer sibling (E = P // A * A); the two differ on a "
        "block-aligned prompt.  The base keeps P - 1 alone.  Without a drafter, or without a retention "
        "interval, nothing changes.",
        rules=("hit-optimality",)),
    Delta(
        "0.30.0", "mamba-retire-across-gaps",
        "A Mamba group in align mode frees every state block before the window, tail first in one free call, "
        "past the null entries prefill leaves between states; the base stops at the first null entry, so a "
        "state below a gap stayed held until the request ended (or until the previous-state release reached "
        "it).",
        rules=("ref-conservation", "free-order")),
    Delta(
        "0.30.0", "session-id",
        "Requests carry a session_id, which the pool reads into the BlockStored events it emits.  The "
        "interface's requests have no session; a target on this release is driven with session_id unset "
        "and events are compared without it.",
        status=OUTSIDE),
    Delta(
        "0.31.0", "tagged-extra-keys",
        "A block hash's extra keys lead with their kind -- (\"lora\", name, path), (\"mm\", identifier, "
        "offset), (\"cache_salt\", salt), (\"prompt_embeds\", digest) -- so that keys of different kinds never "
        "collide, and a LoRA adapter's key carries its path.  Every block hash changes; KV events keep the "
        "base release's untagged keys.",
        rules=("hash-map-consistency", "tenant-isolation")),
    Delta(
        "0.31.0", "zero-token-hit-adoption",
        "allocate_slots with no new tokens and no external tokens is accepted when it adopts a local hit "
        "(num_new_computed_tokens > 0): the hit's blocks join the request, the window is released and the "
        "blocks the computed tokens need are allocated, as for any call -- a step that needs no slots of its "
        "own (vLLM's scheduler makes it for a chunk ending inside a hit's replayed range).  The base refuses "
        "every call without new or external tokens, and both still refuse one that adopts nothing.",
        rules=("allocation-accounting",)),
    Delta(
        "0.31.0", "mm-keys-on-resume",
        "The request block hasher, resuming inside a request (the blocks before already hashed), keys every "
        "multimodal input overlapping the next block, from the first that does; the base keys from the last "
        "input only, so a block holding two inputs and completed by generated tokens was keyed by the last "
        "alone -- and two requests differing only in the first input shared the block.  Only such blocks' "
        "hashes change.",
        rules=("content-soundness", "tenant-isolation")),
    Delta(
        "0.32.0", "eagle-lookahead-hashes",
        "In a hybrid model, an EAGLE group's search past the candidate hit may reach the end of the request's "
        "last full hash block, not only num_tokens - 1: on a block-aligned prompt the last block, whose hash "
        "the request has, proves the block before it, so the hit keeps one block more than the base's.",
        rules=("hit-soundness", "hit-optimality")),
    Delta(
        "0.32.0", "partial-tail-resend-boundary",
        "The partial tail entry's boundary is the last hash boundary within the prompt less its last token -- "
        "the longest hit a resend of the prompt can use -- except in an EAGLE group, whose search reads the "
        "whole prompt; a block-aligned prompt's tail may thus be registered one hash block earlier.",
        rules=("hash-map-consistency",)),
    Delta(
        "0.32.0", "partial-entries-at-boundaries",
        "BlockPool.cache_partial_block accepts any positive multiple of the hash block size, in a block whose "
        "size is a multiple of it: an entry at a block boundary, or in a block of one hash block, is keyed by the "
        "request's hash there as any entry is (nothing changes when the block already holds that key, as its own "
        "key or a further one).  The base refuses everything but a boundary strictly inside a block larger than "
        "the hash block.",
        rules=("hash-map-consistency",)),
    Delta(
        "0.32.0", "mamba-boundary-remarked",
        "A Mamba group in align mode, asked to cache a request's first n tokens where n is the prompt's last "
        "reusable state boundary -- (P - 1) // H * H, or with use_eagle P // H * H - H (at least 0), for a "
        "prompt of P tokens and hash blocks of H -- keys the block holding that state at n (a partial entry, "
        "delta partial-entries-at-boundaries; the key it already holds, in the layouts served) and counts it "
        "cached this step, whether or not it was cached before.  So while the request computes the tokens past "
        "that boundary, every step marks the state again, and a sibling whose hit ends on it is refused a slot "
        "in that step (chapter 5: a hit on a state cached this step waits).  vLLM's scheduler reaches it: with "
        "requests behind a shared prompt it admits the first and stops at the second.",
        rules=("hit-optimality",)),
    Delta(
        "0.33.0", "mamba-all-removed",
        "Mamba's `all` cache mode is gone: a Mamba group with prefix caching must use `align`, and a model "
        "configured with `all` is refused.  Layouts with an `all` Mamba group do not exist in this release.",
        status=OUTSIDE),
    Delta(
        "0.33.0", "lookahead-block-hashes",
        "With an EAGLE-style drafter, prefix caching on and no KV connector, vLLM hashes each block together "
        "with the L tokens after it (L = num_hash_lookahead_tokens: the drafter's KV at a block's last position "
        "read them).  The request block hasher emits a block's hash only once those tokens exist, and hashes "
        "(parent, block tokens, (E, *lookahead tokens)), E the extra keys of the block and its lookahead window "
        "(a multimodal input reaching past the block is keyed again by the next).  The manager takes L "
        "(num_hash_lookahead_tokens; the base has no such argument) and, whatever L, caches only the blocks the "
        "request has hashes for; a Stored event carries each block's lookahead tokens.  Because a hash proves "
        "the token past its block, the scheduler then turns the EAGLE block drop off (use_eagle False).",
        rules=("content-soundness", "hash-map-consistency")),
    Delta(
        "0.33.0", "eagle-drop-needs-use-eagle",
        "Groups marked as the drafter's (is_eagle_group) drop the last block of a hit only when the manager is "
        "built with use_eagle; the base drops it for marked groups whatever use_eagle says (and for every group "
        "when use_eagle is set and none is marked, as before).",
        rules=("hit-optimality",)),
    Delta(
        "0.33.0", "eagle-junction-peek",
        "Under a retention interval, an EAGLE group also keeps the tail before the block below a shared-prefix "
        "junction (the boundary of delta shared-prefix-boundary, less the group's block size): a sibling "
        "diverging right after the junction cannot peek at the block past it, so its hit ends a block lower.  "
        "The machines' requests carry no junction (delta shared-prefix-boundary); impl follows it for the "
        "drop-in.",
        status=OUTSIDE),
    Delta(
        "0.33.0", "mamba-boundary-remark-fixed",
        "Delta mamba-boundary-remarked is undone: the boundary's block is keyed and counted cached this step "
        "only where its own key does not name that boundary yet -- never while the key it was given stays, so "
        "a running request's state no longer stalls a sibling's hit; but again where evict_blocks took the key "
        "from a block the request still holds (vLLM's scheduler evicts the blocks a KV connector failed to "
        "load), and a sibling's hit on it then waits that step.",
        rules=("hit-optimality",)),
    Delta(
        "0.34.0", "prefix-cache-hit-limit",
        "A request carries a prefix-cache hit limit (prefix_cache_hit_limit) in place of skip_reading_prefix_cache: "
        "0 reads no cache (the old skip), a request asking for prompt logprobs reads only up to its first scored "
        "position (those positions' logits must be computed), None is unbounded; every lookup's hit is at most "
        "the least of num_tokens - 1, that limit and the caller's bound.  The interface's requests carry only the "
        "skip; the drop-in reads vLLM's request's limit.",
        status=OUTSIDE),
    Delta(
        "0.34.0", "common-prefix-blocks-removed",
        "KVCacheManager.get_num_common_prefix_blocks, cascade attention's question, is gone; the machines no "
        "longer ask it.",
        status=OUTSIDE),
)
"""Every delta, oldest release first."""

DELTA_KEYS = frozenset(d.key for d in DELTAS)

KNOWN = (BASE, "0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")
"""Every release the spec knows: the base and each later one whose block
manager was read for deltas.  The catalogue is not complete yet: a survey of
every change from 0.26 to 0.34 (docs/release-survey.md) lists those not yet
written as deltas, and a release may differ from its spec where one shows."""


@dataclass(frozen=True)
class Release:
    """A vLLM release as the spec judges it.  ``version`` is the release
    asked about; ``known`` is the release whose rules judge it (the newest
    known one at or before it)."""

    version: str
    known: str

    def __reduce__(self) -> tuple:
        # Pickled by name (a manager's all-or-nothing copy pickles its pool, which holds its release): one
        # release of a process stays one object, its deltas computed once.
        return _interned, (self.version, self.known)

    @cached_property
    def deltas(self) -> tuple[Delta, ...]:
        """The deltas from the base to this release, oldest first."""
        return deltas_until(self.known)

    @cached_property
    def _keys(self) -> frozenset[str]:
        return frozenset(d.key for d in self.deltas)

    def has(self, key: str) -> bool:
        """Whether the delta ``key`` is in force in this release (the rules ask it at every operation)."""
        if key not in DELTA_KEYS:
            raise ValueError(f"no release delta is named {key!r} (known: {', '.join(d.key for d in DELTAS)})")
        return key in self._keys

    @property
    def is_base(self) -> bool:
        return self.known == BASE

    @property
    def beyond_known(self) -> bool:
        """Newer than every release the spec knows: judged by the newest known one's rules."""
        return version_key(self.version) > version_key(KNOWN[-1])

    @property
    def extra_key_format(self) -> str:
        """``bare`` (the base) or ``tagged`` (delta ``tagged-extra-keys``)."""
        return "tagged" if self.has("tagged-extra-keys") else "bare"

    @property
    def mm_resume_scan(self) -> str:
        """``last`` (the base) or ``overlapping`` (delta ``mm-keys-on-resume``):
        where a hasher resuming inside a request looks for multimodal inputs."""
        return "overlapping" if self.has("mm-keys-on-resume") else "last"

    @property
    def fixed_root_seed(self) -> str | None:
        """The seed an unseeded process roots its hash chains at (delta
        fixed-root-hash), or ``None``: random bytes, as in the base."""
        return FIXED_ROOT_SEED if self.has("fixed-root-hash") else None

    def unsupported(self, mamba_modes: set[str]) -> str | None:
        """Why a layout whose Mamba groups use ``mamba_modes`` (with prefix
        caching) does not exist in this release, or ``None``."""
        if "all" in mamba_modes and self.has("mamba-all-removed"):
            return f"vLLM {self.version} has no Mamba `all` cache mode (release delta mamba-all-removed, 0.33.0)"
        return None

    def not_modelled(self, layout: str) -> str | None:
        """Why the conformance layout ``layout`` (``scope/name``) is not
        judged on this release, or ``None``: a delta of the release that the
        spec does not model yet shows there (its ``shows_on``), so a target
        may break a rule there for no fault of its own.  The gate skips such
        a layout with this reason, naming the delta; a layout the delta does
        not name is judged as usual."""
        for delta in self.deltas:
            if delta.status == NOT_MODELLED and layout in delta.shows_on:
                return f"not modelled: release delta {delta.key} ({delta.release})"
        return None

    def warning(self) -> str | None:
        """What a run on this release says about how it is judged (``None``: it is the base)."""
        if version_key(self.version) < version_key(BASE):
            return (f"warning: vLLM {self.version} is older than {BASE}, the oldest release kvspec's spec "
                    f"describes; it is judged by {BASE}'s rules")
        if self.is_base:
            return None
        if self.beyond_known:
            return (f"warning: vLLM {self.version} is newer than every release kvspec's spec knows; it is judged by "
                    f"the rules of {self.known}, the newest known (spec/README.md, chapter Releases)")
        missing = [d.key for d in self.deltas if d.status == NOT_MODELLED]
        note = f"; not modelled yet: {', '.join(missing)}" if missing else ""
        count = f"{len(self.deltas)} delta{'s' if len(self.deltas) != 1 else ''}"
        return (f"note: judged by the rules of vLLM {self.version}: the spec of {self.known} "
                f"(base {BASE} + {count}{note})")


_INTERNED: dict[tuple[str, str], Release] = {}


def _interned(version: str, known: str) -> Release:
    """The one :class:`Release` of ``version`` judged by ``known``'s rules."""
    return _INTERNED.setdefault((version, known), Release(version, known))


def deltas_until(version: str) -> tuple[Delta, ...]:
    """The deltas of every release after the base up to ``version``, oldest first."""
    key = version_key(version)
    return tuple(d for d in DELTAS if version_key(d.release) <= key)


def judged(version: str) -> Release:
    """The release ``version`` as the spec judges it: by its own rules when
    the spec knows it, else by those of the newest known release before it
    (the base for anything older than the base)."""
    key = version_key(version)
    known = [k for k in KNOWN if version_key(k) <= key]
    return _interned(version, known[-1] if known else BASE)


REFERENCE = judged(BASE)
"""The base release, as a :class:`Release`: what the spec judges when it is
told no other.  There is no process-wide "current" release: whatever
depends on the release judged -- the spec's pool and managers, a
:class:`~kvspec.spec.layout.Layout`, impl, the conformance targets and
machines, the vectors, the findings -- is given it, as a value, where it is
built, and a constructor called without one builds for this release (so that
callers written before releases existed keep working)."""


def as_release(release: Release | str | None) -> Release:
    """``release`` as a :class:`Release`: one given as a version string is
    judged (:func:`judged`), ``None`` is the reference release
    (:data:`REFERENCE`)."""
    if release is None:
        return REFERENCE
    if isinstance(release, Release):
        return release
    return judged(release)


if __name__ == "__main__":
    print(BASE)
