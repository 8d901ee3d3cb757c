"""vLLM 0.31.0: what its block manager changed from 0.30.0 (chapter 9 of spec/README.md).

Its deltas (:data:`DELTAS`, in chapter 9's order), each with its prose
(``change``), the rules whose reading changes, its status and where it shows.
The switches that follow a modelled delta read ``Release.has(key)`` where
the rule is.
"""

from __future__ import annotations

from kvspec.spec.releases.base import Delta

RELEASE = "0.31.0"
PREVIOUS = "0.30.0"

DELTAS: tuple[Delta, ...] = (
    Delta(
        RELEASE, "tagged-extra-keys",
        "A block hash's extra keys lead with their kind -- (\"lora\", name, path), (\"mm\", identifier, "
        "offset), (\"cache_salt\", salt), (\"prompt_embeds\", digest) -- so that keys of different kinds never "
        "collide, and a LoRA adapter's key carries its path.  Every block hash changes; KV events keep the "
        "base release's untagged keys.",
        rules=("hash-map-consistency", "tenant-isolation")),
    Delta(
        RELEASE, "zero-token-hit-adoption",
        "allocate_slots with no new tokens and no external tokens is accepted when it adopts a local hit "
        "(num_new_computed_tokens > 0): the hit's blocks join the request, the window is released and the "
        "blocks the computed tokens need are allocated, as for any call -- a step that needs no slots of its "
        "own (vLLM's scheduler makes it for a chunk ending inside a hit's replayed range).  The base refuses "
        "every call without new or external tokens, and both still refuse one that adopts nothing.",
        rules=("allocation-accounting",)),
    Delta(
        RELEASE, "mm-keys-on-resume",
        "The request block hasher, resuming inside a request (the blocks before already hashed), keys every "
        "multimodal input overlapping the next block, from the first that does; the base keys from the last "
        "input only, so a block holding two inputs and completed by generated tokens was keyed by the last "
        "alone -- and two requests differing only in the first input shared the block.  Only such blocks' "
        "hashes change.",
        rules=("content-soundness", "tenant-isolation")),
)
"""What 0.31.0 changed, in the order chapter 9 lists it."""
