"""From per-layer KV-cache specs to KV-cache groups and a pool size, the way
vLLM 0.25.1 does it (``get_kv_cache_groups`` and
``get_kv_cache_config_from_groups`` in ``vllm/v1/core/kv_cache_utils.py``).

A model's layers each have a spec (full attention, sliding window, Mamba...).
The block manager does not see layers: it sees **groups**, each a set of
layers sharing one spec and one block table.  vLLM forms them so that every
group has the same number of layers and every layer's block occupies the
same number of bytes (one *page*), because all groups draw blocks from one
pool whose memory is shared:

1. **One spec for every layer** (Llama, DeepSeek's MLA, Mistral with its
   window on every layer): one group with all layers.
2. **Several specs**: first the page sizes are unified -- a spec with a
   smaller page gets a proportionally larger block size (if the larger page is
   a multiple; otherwise vLLM refuses) -- then the layers of each spec are
   split into groups of ``group_size`` layers, where ``group_size`` is the
   smallest per-spec layer count (or the largest, when the largest is under
   1.5 times the smallest: fewer padding layers).  The last group of a spec
   may be short ("padding" layers); layer ``i`` of a spec goes to group
   ``i mod num_groups`` (pipeline stages stay balanced).
3. **The pool**: ``group_size`` tensors, each shared by one layer of every
   group; a block costs ``page_size * group_size`` bytes, so
   ``num_blocks = memory // page_size // group_size``.

Groups appear in the order their spec first appears among the layers.
Hidden-state specs, DeepSeek-V4's packed layout and the disabled-hybrid
fallback are out of scope (kvspec's models do not use them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from kvspec.kv_cache_interface import (
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
    MambaSpec,
    cdiv,
)


def unify_page_sizes(specs: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """Every layer's page made as large as the largest: a spec whose page
    divides the largest gets ``ratio`` times its block size.  Raises
    ``ValueError`` naming the layer when a page does not divide the largest
    (vLLM would pad attention pages for some backends; kvspec does not)."""
    sizes = {spec.page_size_bytes for spec in specs.values()}
    if len(sizes) <= 1:
        return dict(specs)
    largest = max(sizes)
    unified = {}
    for name, spec in specs.items():
        page = spec.page_size_bytes
        if largest % page:
            raise ValueError(
                f"layer {name!r}: page of {page} bytes does not divide the largest page ({largest} bytes); "
                "the groups cannot share one pool"
            )
        unified[name] = spec if page == largest else replace(spec, block_size=spec.block_size * (largest // page))
    return unified


def group_size(layer_counts: list[int]) -> int:
    """How many layers each group holds: the smallest per-spec count, or
    the largest when that pads less (largest < 1.5 x smallest)."""
    smallest, largest = min(layer_counts), max(layer_counts)
    return largest if largest < smallest * 1.5 else smallest


def get_kv_cache_groups(specs: Mapping[str, KVCacheSpec]) -> list[KVCacheGroupSpec]:
    """The KV-cache groups of a model whose layer ``name`` has spec
    ``specs[name]`` (in layer order); no layers, no groups."""
    if not specs:
        return []
    if len(set(specs.values())) == 1:
        return [KVCacheGroupSpec(list(specs), next(iter(specs.values())))]
    unified = unify_page_sizes(specs)
    by_spec: dict[KVCacheSpec, list[str]] = {}
    for name, spec in unified.items():
        by_spec.setdefault(spec, []).append(name)
    size = group_size([len(layers) for layers in by_spec.values()])
    groups = []
    for spec, layers in by_spec.items():
        num_groups = cdiv(len(layers), size)
        groups += [KVCacheGroupSpec(layers[i::num_groups], spec) for i in range(num_groups)]
    return groups


def page_size_bytes(groups: list[KVCacheGroupSpec]) -> int:
    """The one page size every group's blocks share (ValueError if not)."""
    sizes = {g.kv_cache_spec.page_size_bytes for g in groups}
    if len(sizes) != 1:
        raise ValueError(f"groups have different page sizes {sorted(sizes)}; unify them first")
    return sizes.pop()


def kv_cache_config_from_groups(
    groups: list[KVCacheGroupSpec], *, memory_bytes: int | None = None, num_blocks: int | None = None
) -> KVCacheConfig:
    """The pool for ``groups``: ``num_blocks`` given, or as many as
    ``memory_bytes`` holds (each block costs one page in each of the
    ``group_size`` shared tensors).  No groups (an attention-free model):
    only the null block."""
    if (memory_bytes is None) == (num_blocks is None):
        raise ValueError("give exactly one of memory_bytes and num_blocks")
    if not groups:
        return KVCacheConfig(num_blocks=1, kv_cache_tensors=[], kv_cache_groups=[])
    tensors_per_layer_slot = max(len(g.layer_names) for g in groups)
    page = page_size_bytes(groups)
    if num_blocks is None:
        num_blocks = max(0, memory_bytes // page // tensors_per_layer_slot)
    tensors = [
        KVCacheTensor(size=page * num_blocks, shared_by=[g.layer_names[i] for g in groups if i < len(g.layer_names)])
        for i in range(tensors_per_layer_slot)
    ]
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=tensors, kv_cache_groups=groups)


def mamba_aligned_block_size(
    attention_page_per_token: int,
    mamba_page: int,
    *,
    block_size: int,
    kernel_alignment: int,
    mamba_cache_mode: str,
    mamba_chunk_size: int | None = None,
) -> int:
    """The attention block size of a hybrid attention + Mamba model: large
    enough that an attention page holds a Mamba state (vLLM's
    ``_align_hybrid_block_size``).  Without prefix caching ("none") and in
    "align" mode: the smallest multiple of the kernel's block alignment whose
    page covers the state; in "all" mode a multiple of
    ``lcm(mamba_chunk_size, kernel alignment)`` (the Mamba kernels cache at
    chunk boundaries).  Never below ``block_size``."""
    from math import lcm

    alignment = max(kernel_alignment, block_size)
    if mamba_cache_mode == "all":
        if mamba_chunk_size is None:
            raise ValueError("mamba_cache_mode 'all' needs the model's mamba_chunk_size")
        chunk = lcm(mamba_chunk_size, alignment)
        needed = chunk * cdiv(cdiv(mamba_page, attention_page_per_token), chunk)
    else:
        needed = alignment * cdiv(mamba_page, alignment * attention_page_per_token)
    return max(block_size, needed)


def pad_mamba_pages(specs: Mapping[str, KVCacheSpec], page: int) -> dict[str, KVCacheSpec]:
    """Mamba specs padded to ``page`` bytes (``page_size_padded``)."""
    return {
        name: replace(spec, page_size_padded=page) if isinstance(spec, MambaSpec) and spec.page_size_bytes < page
        else spec
        for name, spec in specs.items()
    }
