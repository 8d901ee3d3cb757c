"""vLLM's releases as the adapters meet them: the reference release and
every switch in how a release is *driven and read*.

What a release changed in the block manager's behaviour is the spec's
business: :mod:`kvspec.spec.releases` holds those deltas (the hash format,
the stats, the third value of ``get_computed_blocks``, ...), and this
module reads the spec's releases rather than keeping its own.  What is
left here is how kvspec reaches into each release's code, named by the
release that changed it, so that adding a release means reading this file
and spec/releases/, not searching the tree:

- 0.34: the pool's hash table stores block ids,
  not blocks, with the keys several blocks cache kept apart
  (:func:`cached_table` reads every era);
- 0.34: ``ModelRunnerOutput`` lost ``req_id_to_index``
  (:func:`kvspec.conformance.vllm.scheduler.runner_output` reads its fields);
- 0.26: ``KVCacheManager``'s token budget ``max_num_batched_tokens`` is
  named ``max_in_flight_tokens`` (:func:`manager_options`);
- 0.29: the prefix-cache retention interval is a field of the
  ``KVCacheConfig`` (``prefix_cache_retention_interval``) instead of the
  environment variable ``VLLM_PREFIX_CACHE_RETENTION_INTERVAL``
  (:func:`manager_options`).

Nothing here imports vLLM: the switches take the release as a string, or
read what the installed release's classes offer.
"""

from __future__ import annotations

from typing import Any

from kvspec.spec import releases

REFERENCE_RELEASE = releases.BASE
"""The release the spec's base chapters describe, the drop-in replaces and
the vllm target is built for."""

def hit_of(computed: Any) -> tuple[Any, int]:
    """``(blocks, num_hits)`` of what a release's ``get_computed_blocks``
    returned: the pair in 0.25.1, the pair and the shared-prefix
    boundary from 0.26 (spec delta ``shared-prefix-boundary``: read, not judged)."""
    blocks, num_hits = tuple(computed)[:2]
    return blocks, num_hits


def manager_options(manager_class: Any, vllm_config: Any, options: dict[str, Any],
                    retention_interval: int | None) -> dict[str, Any]:
    """The keyword options for a release's ``KVCacheManager``, given those of
    the reference release's: the token budget under the name the release
    takes; the retention interval set on ``vllm_config`` where the release
    reads it from there (the caller sets the environment variable for the
    releases that read that)."""
    import inspect

    out = dict(options)
    takes = inspect.signature(manager_class).parameters
    if "max_num_batched_tokens" in out and "max_num_batched_tokens" not in takes and "max_in_flight_tokens" in takes:
        out["max_in_flight_tokens"] = out.pop("max_num_batched_tokens")
    if hasattr(vllm_config, "prefix_cache_retention_interval"):
        vllm_config.prefix_cache_retention_interval = retention_interval
    return out


def cached_table(table: Any) -> dict[Any, tuple[int, ...]]:
    """Every key of a vLLM ``BlockHashToBlockMap`` and the ids of the blocks
    cached under it, in insertion order.  The map has no public iteration,
    so its private dict is read the way each era stores it: through 0.33 a
    key maps to a block or to a dict of blocks by id; from 0.34 to one
    block id, with the ids of a key that
    several blocks cache in ``_dup_ids``."""
    dup_ids = getattr(table, "_dup_ids", None)
    out = {}
    for key, entry in table._cache.items():
        if dup_ids is not None:
            out[key] = tuple(dup_ids[key]) if key in dup_ids else (entry,)
        else:
            out[key] = (entry.block_id,) if hasattr(entry, "block_id") else tuple(entry)
    return out
