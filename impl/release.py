"""Which later vLLM releases' block-manager changes a manager follows.

impl implements vLLM 0.25.1, the base release of kvspec's spec.  A later
release that changed what the block manager does is written in the spec as
a *delta* with a key (``spec/README.md``, chapter Releases): from 0.26.0,
``processed-token-windows``, ``pcp-outside-the-block``, and so on.  A
manager is built with the deltas in force (``KVCacheManager(...,
deltas=...)``), reads them once, at construction, and behaves as the
release that has them does; whoever builds it for a release (the drop-in,
a conformance target) asks the spec which deltas that release has.

impl refuses a delta it does not implement rather than ignore it, so a
manager never claims a release it does not follow.
"""

from __future__ import annotations

from collections.abc import Iterable

IMPLEMENTED: frozenset[str] = frozenset({
    "pcp-outside-the-block",  # 0.26: a block holds block_size x dcp tokens, whatever pcp is
    "dcp-on-hybrid-models",  # 0.26: full attention + Mamba take decode ranks; Mamba states are replicated
    "processed-token-windows",  # 0.26: Mamba holds back no speculative blocks' tokens before freeing states
    "partial-tail-entries",  # 0.26: full attention registers the prompt's last hash boundary inside a block
    "zeroing-with-mamba-only",  # 0.26: new blocks are zeroed only for a model with Mamba groups
    "free-order-without-caching",  # 0.27: with caching off, freed blocks go to the tail in order
    "stats-at-admission",  # 0.27: lookups are not counted; record_prefix_cache_stats counts an admission
    "free-order-restored",  # 0.28: undoes free-order-without-caching
    "zeroing-every-attention-group",  # 0.28: where blocks are zeroed, every attention group's are
    "retention-zero-anywhere",  # 0.29: a retention interval of 0 is accepted on any model
    "hybrid-one-spec-group",  # 0.29: several groups of one spec build, searched as one spec group
    "unrounded-caching-under-dcp",  # 0.29: DCP + Mamba align block >= hash block: caching is not rounded to A
    "eagle-replay-boundaries",  # 0.30: with a drafter, a prompt's replay resumes a scheduler block lower
    "mamba-retire-across-gaps",  # 0.30: Mamba align frees every state before the window, past null gaps
    "mamba-boundary-remarked",  # 0.32: Mamba align counts the prompt's boundary state cached this step, again
    "mamba-boundary-remark-fixed",  # 0.33: undoes mamba-boundary-remarked
    "partial-entries-at-boundaries",  # 0.32: the pool keys a partial entry at a block boundary too
    "partial-tail-resend-boundary",  # 0.32: the partial tail ends before the prompt's last token (not EAGLE)
    "eagle-lookahead-hashes",  # 0.32: a hybrid's EAGLE group peeks up to the request's last full hash block
    "zero-token-hit-adoption",  # 0.31: allocate_slots with no new or external tokens may adopt a local hit
    "mm-keys-on-resume",  # 0.31: a resuming hasher keys every image of the block (in kvspec.hashing, as tagged keys)
    "tagged-extra-keys",  # 0.31: extra keys lead with their kind (in the requests' hashes: impl hashes nothing)
    "lookahead-block-hashes",  # 0.33: hashes cover L tokens past their block; only hashed blocks are cached
    "eagle-drop-needs-use-eagle",  # 0.33: a group marked as the drafter's drops its last hit block only with use_eagle
    "eagle-junction-peek",  # 0.33: an EAGLE group keeps the tail a block below a shared-prefix junction (retention)
})
"""The deltas impl follows (each key is one of ``spec/releases/``'s)."""


_default: frozenset[str] = frozenset()


def use_default_deltas(deltas: Iterable[str]) -> frozenset[str]:
    """Build every manager, coordinator and pool that is not told its
    deltas with ``deltas`` from now on, in this process (the drop-in sets
    the installed release's, so that whatever vLLM builds itself -- a
    connector's own coordinator, a pool or a single-type manager --
    follows that release too); returns the previous default.  Refused, and
    nothing changed, as :func:`require_deltas` refuses."""
    global _default
    previous, _default = _default, require_deltas(deltas)
    return previous


def require_deltas(deltas: Iterable[str] | None) -> frozenset[str]:
    """``deltas`` as a set of keys impl implements (``None``: the default,
    :func:`use_default_deltas`; the base release's, none, unless set); a key
    that is no string is a ``TypeError``, one impl does not implement a
    ``ValueError`` naming it (and what impl does implement)."""
    if deltas is None:
        return _default
    keys = frozenset(deltas)
    if bad := [k for k in keys if not isinstance(k, str)]:
        raise TypeError(f"release deltas are named by their keys (str), got {bad!r}")
    if missing := sorted(keys - IMPLEMENTED):
        raise ValueError(f"impl does not implement release delta(s) {', '.join(missing)} "
                         f"(it implements {', '.join(sorted(IMPLEMENTED))})")
    return keys


def require_lookahead(num_hash_lookahead_tokens: object, deltas: frozenset[str]) -> int:
    """``num_hash_lookahead_tokens`` as a count a manager built with
    ``deltas`` accepts: 0, or any count under release delta
    ``lookahead-block-hashes`` (vLLM 0.33's); anything else is refused by
    name (a ``TypeError`` for no int, a ``ValueError`` otherwise)."""
    if not isinstance(num_hash_lookahead_tokens, int):  # a bool counts 0 or 1, as vLLM's callers pass it
        raise TypeError(f"num_hash_lookahead_tokens must be an int, got {num_hash_lookahead_tokens!r}")
    num_hash_lookahead_tokens = int(num_hash_lookahead_tokens)
    if num_hash_lookahead_tokens < 0:
        raise ValueError(f"num_hash_lookahead_tokens must be >= 0, got {num_hash_lookahead_tokens}")
    if num_hash_lookahead_tokens and "lookahead-block-hashes" not in deltas:
        raise ValueError(f"num_hash_lookahead_tokens={num_hash_lookahead_tokens}: hashes that cover tokens past "
                         "their block are release delta lookahead-block-hashes (vLLM 0.33), not in this manager's "
                         "deltas")
    return num_hash_lookahead_tokens
