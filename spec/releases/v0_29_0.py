"""vLLM 0.29.0: what its block manager changed from 0.28.0 (chapter 9 of spec/README.md).

Its deltas (:data:`DELTAS`, in chapter 9's order), each with its prose
(``change``), the rules whose reading changes, its status and where it shows.
The switches that follow a modelled delta read ``Release.has(key)`` where
the rule is.
"""

from __future__ import annotations

from kvspec.spec.releases.base import NOT_MODELLED, OUTSIDE, Delta

RELEASE = "0.29.0"
PREVIOUS = "0.28.0"

FIXED_ROOT_SEED = "vllm-none-hash"
"""The seed of an unseeded process's root hash from 0.29 (delta fixed-root-hash)."""

DELTAS: tuple[Delta, ...] = (
    Delta(
        RELEASE, "fixed-root-hash",
        "A process started without PYTHONHASHSEED roots every hash chain at a fixed seed, "
        f"{FIXED_ROOT_SEED!r}, hashed by the prefix-caching hash function, so that independent processes "
        "compute the same block hashes and can share a cache; the base roots such a process at random bytes.  "
        "vLLM's non-cryptographic hash functions (xxhash) keep a random seed.  The spec roots chains at a "
        "seed, as a process started with PYTHONHASHSEED does (chapter 2), so no rule reads it; "
        "kvspec.hashing.init_none_hash follows it for a release that has it.",
        status=OUTSIDE),
    Delta(
        RELEASE, "retention-zero-anywhere",
        "A retention interval of 0 (keep only the prompt-replay boundary) is accepted on a model with no "
        "sliding-window or Mamba group, where it changes nothing; the base refuses any interval there.  (vLLM "
        "now reads the interval from the KV-cache config, not the environment.)",
        rules=("block-size-coherence",)),
    Delta(
        RELEASE, "hybrid-one-spec-group",
        "A model of several groups whose specs are all equal builds with prefix caching on: the hybrid "
        "coordinator searches them as one spec group (it requires one cacheable group, no longer two).  The "
        "base refuses such a model (vLLM 0.28 asserted that a hybrid coordinator has two attention groups: "
        "the crash vllm-project/vllm#51888 reports, on a development build).  Measured in the releases' source: 0.28.0 "
        "asserts, 0.29.0 to 0.34.0 build it.",
        rules=("hit-soundness",), vectors=("manager/configs/constructor/two-groups-of-one-spec",)),
    Delta(
        RELEASE, "partial-hits-under-dcp",
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
        RELEASE, "unrounded-caching-under-dcp",
        "Where delta partial-hits-under-dcp turns hits inside a block on (decode context parallelism and a Mamba "
        "align group whose block is at least the hash block), a caching call covers every computed token: the "
        "count is no longer rounded down to the scheduler block.  Where every block is the hash block "
        "(full+mamba-align-dcp2) no hit changes, but a Mamba align group is then never asked to cache exactly "
        "the prompt's last reusable boundary once the request computes past it, so it does not key the state "
        "there again (deltas mamba-boundary-remarked, mamba-boundary-remark-fixed).",
        rules=("hit-optimality", "hash-map-consistency")),
)
"""What 0.29.0 changed, in the order chapter 9 lists it."""
