"""The specification's KV-cache manager as a :class:`~kvspec.spec.interface.ManagerTarget`.

:class:`kvspec.spec.manager.SpecKVCacheManager` already speaks the target
interface (block ids in, block ids and neutral events out), so the target is
the model itself.  Conformance machines build it with the layout's
constructor arguments::

    SpecManagerTarget(kv_cache_config, max_model_len, scheduler_block_size,
                      hash_block_size, enable_caching=True, use_eagle=False,
                      enable_kv_cache_events=False, watermark=0.0,
                      max_num_batched_tokens=None, retention_interval=None)

Notes for adapters of other managers (vLLM's ``KVCacheManager`` and drop-in
replacements), so that their observations compare with the spec's:

- ``new_computed_blocks``: a tuple of id lists, one per group; an all-empty
  tuple (or ``None``) means "no hit" -- pass vLLM's shared empty
  ``KVCacheBlocks`` for it, as its scheduler does;
- ``snapshot().tables`` lists the requests that hold a non-empty table in some
  group (vLLM also keeps empty tables for requests it has only looked at);
- ``get_num_common_prefix_blocks`` is only asked about requests holding blocks;
- a refused ``allocate_slots`` changes nothing, except that the request's
  blocks that left the attention window are released first (as
  ``remove_skipped_blocks(request_id, total_computed_tokens)`` would), whether
  or not the allocation then fits -- vLLM 0.25.1's own order, so its state
  after a refusal compares with the spec's as it is.
"""

from __future__ import annotations

from kvspec.spec.manager import SpecKVCacheManager


class SpecManagerTarget(SpecKVCacheManager):
    """The specification itself, as a manager target."""

