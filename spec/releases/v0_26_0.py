"""vLLM 0.26.0: what its block manager changed from 0.25.1 (chapter 9 of spec/README.md).

Its deltas (:data:`DELTAS`, in chapter 9's order), each with its prose
(``change``), the rules whose reading changes, its status and where it shows.
The switches that follow a modelled delta read ``Release.has(key)`` where
the rule is.
"""

from __future__ import annotations

from kvspec.spec.releases.base import NOT_MODELLED, OUTSIDE, Delta

RELEASE = "0.26.0"
PREVIOUS = "0.25.1"

DELTAS: tuple[Delta, ...] = (
    Delta(
        RELEASE, "partial-tail-entries",
        "Where a full-attention group's blocks hold several hash blocks, caching a request's blocks also "
        "registers the prompt's last hash boundary, when it ends inside a block and is computed, as a partial "
        "entry of the block that holds it (chapter 1's cache_partial_block, with its Stored event).  Such an "
        "entry is found only by the partial hits of delta partial-hit-copy-on-write; elsewhere it is held, "
        "announced and evicted like any other key.",
        rules=("hash-map-consistency",)),
    Delta(
        RELEASE, "partial-hit-copy-on-write",
        "Where a Mamba group in align mode has blocks bigger than the hash block (and no context parallelism), "
        "a hit may end inside a block: the lookup probes partial entries past the last full block, Mamba "
        "registers its own partial tail states, the shared tail block is copied on write into a block of the "
        "request's own, the hash moves to the copy, and the pending copy holds references to both blocks "
        "outside any block table until the step runs.",
        rules=("ref-conservation", "no-eviction-in-use", "content-soundness", "hit-soundness",
               "hash-map-consistency"), status=NOT_MODELLED,
        shows_on=("manager/full+mamba-align-drafts",)),
    Delta(
        RELEASE, "zeroing-with-mamba-only",
        "The worker zeroes newly allocated attention blocks only for a model with Mamba layers (the KV-cache "
        "config's needs_kv_cache_zeroing): for any other model take_new_block_ids names no block.",
        rules=("content-soundness",)),
    Delta(
        RELEASE, "dcp-on-hybrid-models",
        "Decode context parallelism is accepted on a hybrid model of full-attention and Mamba groups (no "
        "prefill ranks, no other kind of group): attention blocks are split over the ranks, so the manager "
        "counts block_size x dcp_world_size tokens in a full-attention block, and Mamba states are replicated "
        "on every rank, so a Mamba block keeps its block_size.  The base refuses context parallelism with more "
        "than one group.  The layout full+mamba-align-dcp2 exists from this release on.",
        rules=("block-size-coherence",)),
    Delta(
        RELEASE, "pcp-outside-the-block",
        "Prefill context parallelism no longer widens a block: the manager counts block_size x dcp_world_size "
        "tokens a block, whatever pcp_world_size is (the engine hands the manager no prefill ranks), and the "
        "scheduler and hash block sizes follow.",
        rules=("block-size-coherence",)),
    Delta(
        RELEASE, "processed-token-windows",
        "Blocks leave the attention window on the processed-token basis: the scheduler passes "
        "remove_skipped_blocks the tokens computed minus those in flight, and allocate_slots frees on that "
        "basis too: the request's computed tokens less its num_in_flight_tokens (the tokens of steps still in "
        "the forward pass, which async scheduling overlaps with the next schedule and which still read the "
        "blocks below).  So a Mamba group no longer holds back its num_speculative_blocks tokens (drafts that may "
        "still be rejected) before it frees the states behind the last one.",
        rules=("content-soundness",)),
    Delta(
        RELEASE, "shared-prefix-boundary",
        "get_computed_blocks returns a third value after (blocks, num_hits): the block-aligned end of a "
        "shared prefix a sparse-retention group has not cached yet (0: none).  The scheduler stores it on the "
        "request, and under a retention interval a sliding-window or Mamba group keeps the tail before it as "
        "it keeps the prompt's replay boundary's (chapter 3's reachable_boundaries reads it; the machines' "
        "requests carry none).  The spec's answer is the pair; the third value is read and not judged.",
        status=OUTSIDE),
)
"""What 0.26.0 changed, in the order chapter 9 lists it."""
