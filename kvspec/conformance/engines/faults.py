"""Faults planted in the engines' own code, to show each engine's gate
bites: a method of the engine's class is recompiled from its own source
with one change (the text replaced must be there, or the fault refuses to
apply: an engine release that rewrote the line is reported, not silently
skipped), and put back afterwards.

``FAULTS[engine]`` lists each fault: what it breaks, where, and the rules
a cache-scope run must report for it.  ``tests/test_engines.py`` runs the
gate on each; ``kvspec conform --target ENGINE --plant NAME`` is not
offered -- a planted fault is a test of kvspec, not a way to run it.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Edit:
    """One change to one method: the engine's own text, and what the fault puts there."""

    method: str
    old: str
    new: str


@dataclass(frozen=True)
class Fault:
    """A fault: changes to methods of one class of the engine's."""

    name: str
    what: str
    module: str
    owner: str  # the class
    edits: tuple[Edit, ...]
    rules: frozenset[str]  # a run must report at least one of these
    layout: str = "page-4"

    def _class(self) -> type:
        from kvspec.conformance import engines

        engines.require(self.module.split(".")[0])  # the engine's imports prepared as its target prepares them
        return getattr(importlib.import_module(self.module), self.owner)

    def mutated_source(self, method: str) -> str:
        """``method``'s source with every edit of it made."""
        source = textwrap.dedent(inspect.getsource(getattr(self._class(), method)))
        for edit in self.edits:
            if edit.method != method:
                continue
            if source.count(edit.old) != 1:
                raise LookupError(f"fault {self.name}: {self.owner}.{method} no longer reads {edit.old!r} "
                                  "exactly once (a release rewrote it)")
            source = source.replace(edit.old, edit.new)
        return source

    @contextlib.contextmanager
    def planted(self) -> Iterator[None]:
        """The fault in the engine's class for the duration (the originals put back after)."""
        owner = self._class()
        module = sys.modules[self.module]
        originals = {edit.method: owner.__dict__[edit.method] for edit in self.edits}
        compiled = {}
        for method, original in originals.items():  # every method compiles before any is put in
            code = self.mutated_source(method)
            wrapper = type(original) if isinstance(original, (staticmethod, classmethod)) else None
            if wrapper is not None:
                code = code.split("\n", 1)[1]  # the decorator line; the wrapper is put back below
            namespace: dict = {}
            exec(compile(code, f"<fault {self.name} in {inspect.getsourcefile(owner)}>", "exec"),  # noqa: S102
                 module.__dict__, namespace)
            fn = namespace[method]
            fn.__qualname__ = f"{self.owner}.{method}"
            compiled[method] = wrapper(fn) if wrapper is not None else fn
        for method, fn in compiled.items():
            setattr(owner, method, fn)
        try:
            yield
        finally:
            for method, original in originals.items():
                setattr(owner, method, original)


_TRIE = "lmdeploy.pytorch.paging.block_trie.trie"
_LIFE = "lmdeploy.pytorch.paging.block_trie.kv_lifecycle"
_BM = "lmdeploy.pytorch.paging.block_manager.default_block_manager"
_RC = "sglang.srt.mem_cache.radix_cache"
_REQ = "sglang.srt.managers.schedule_batch"
_CORE = "sglang.srt.mem_cache.unified_cache.unified_tree_core"  # UnifiedRadixCache's Python TreeCore
_SWA = "sglang.srt.mem_cache.unified_cache.components.swa"
_FULL = "sglang.srt.mem_cache.unified_cache.components.full"

FAULTS: dict[str, list[Fault]] = {
    "lmdeploy": [
        Fault("lock-not-released", "a finished sequence keeps its reference on the blocks the trie shares",
              _BM, "DefaultBlockManager", (Edit(
                  "free", "self.allocator.free(msg.logical_blocks.get_real_blocks())",
                  "blocks = msg.logical_blocks.get_real_blocks()\n"
                  "    self.allocator.free(blocks[self.allocator.get_ref_count(blocks) == 1])"),),
              frozenset({"ref-conservation"})),
        Fault("evicted-while-locked", "eviction ignores the sequences' references: a leaf a running sequence "
              "holds is detached and its block returned to the free stack",
              _LIFE, "KVBlockLifecycle", (
                  Edit("evict", "evictable_indices = (ref_counts == 1).nonzero()[0]",
                       "evictable_indices = (ref_counts >= 1).nonzero()[0]"),
                  Edit("evict", "self.allocator.free(np.array(evicted_blocks))",
                       "for block in evicted_blocks:\n"
                       "        while self.allocator.get_ref_count(block) > 0:\n"
                       "            self.allocator.free(np.array([block]))"),
                  Edit("_try_evict_leaf", "if int(self.allocator.get_ref_count(leaf.block_id)) != 1:",
                       "if int(self.allocator.get_ref_count(leaf.block_id)) < 1:")),
              frozenset({"free-queue-consistency", "ref-conservation", "content-soundness",
                         "no-eviction-in-use"})),
        Fault("stale-page-served", "an evicted leaf stays attached: its freed block is still served",
              _LIFE, "KVBlockLifecycle", (Edit("_try_evict_leaf", "leaf.detach_leaf()", "pass"),),
              frozenset({"free-queue-consistency", "hash-map-consistency", "hit-soundness"})),
        Fault("adapter-root-shared", "every adapter shares the base model's root",
              _TRIE, "BlockTrie", (Edit(
                  "_get_or_create_root", '"""Return the adapter-partitioned root, creating it on first use."""',
                  '"""Return the adapter-partitioned root, creating it on first use."""\n'
                  "    adapter_name = None"),),
              frozenset({"tenant-isolation", "hit-soundness", "hash-map-consistency"}), layout="tenants"),
        Fault("insert-keeps-no-ref", "attaching blocks to the trie takes no reference for the trie "
              "(nor for a sequence handed the trie's copy)",
              _LIFE, "KVBlockLifecycle", (Edit("commit_path_extension", "if len(ref_blocks) > 0:", "if False:"),),
              frozenset({"ref-conservation", "free-queue-consistency"})),
        Fault("hit-not-referenced", "a match hands the sequence the trie's blocks without taking a reference",
              _TRIE, "BlockTrie", (Edit("_match_block_prefix", "self.allocator.add_ref_count(matched_block_ids, 1)",
                                        "pass"),),
              frozenset({"ref-conservation", "free-queue-consistency"})),
    ],
    "sglang": [
        Fault("lock-not-released", "unlocking a request's node leaves its lock count as it was",
              _RC, "RadixCache", (Edit("dec_lock_ref", "node.lock_ref -= 1", "node.lock_ref -= 0"),),
              frozenset({"ref-conservation"})),
        Fault("evicted-while-locked", "a locked leaf stays an eviction candidate: its pages are freed while a "
              "request reads them",
              _RC, "RadixCache", (Edit("_update_leaf_status", "if node.evicted or node.lock_ref > 0:",
                                       "if node.evicted:"),),
              frozenset({"free-queue-consistency", "ref-conservation", "content-soundness", "no-eviction-in-use"})),
        Fault("stale-page-served", "an evicted leaf's pages are freed but the leaf stays in the tree",
              _RC, "RadixCache", (Edit("evict", "self._delete_leaf(x)", "pass"),),
              frozenset({"free-queue-consistency", "hash-map-consistency", "hit-soundness"})),
        Fault("adapter-root-shared", "the tree's child keys and matches ignore the namespace (LoRA id)",
              _RC, "RadixKey", (
                  Edit("child_key_at", "return plain if self.extra_key is None else (self.extra_key, plain)",
                       "return plain"),
                  Edit("_check_compatible", "if self.extra_key != other.extra_key:", "if False:")),
              frozenset({"tenant-isolation", "hit-soundness", "hash-map-consistency"}), layout="tenants"),
        Fault("row-keeps-freed-pages", "a chunk's insertion frees the request's duplicate pages but leaves its "
              "row pointing at them", _RC, "RadixCache", (Edit(
                  "checkpoint", "self.req_to_token_pool.write(", "(lambda *_: None)("),),
              frozenset({"free-queue-consistency", "content-soundness", "ref-conservation", "no-aliasing"}),
              layout="page-1"),
        Fault("match-whole-prompt", "a match may cover the whole prompt, leaving no token to compute",
              _REQ, "Req", (Edit("_compute_max_prefix_len", "max_prefix_len = input_len - 1",
                                 "max_prefix_len = input_len"),),
              frozenset({"hit-soundness"}), layout="page-1"),
        Fault("window-frees-inside", "a decode step frees the request's slots up to half a window behind it, "
              "inside the window its next token reads",
              "sglang.srt.mem_cache.base_prefix_cache", "BasePrefixCache", (Edit(
                  "evict_sliding_windows", "sliding_window_size=self.swa_retain_window,",
                  "sliding_window_size=self.swa_retain_window // 2,"),),
              frozenset({"content-soundness"}), layout="window-1"),
        # UnifiedRadixCache (a hybrid full+SWA model), in its Python TreeCore and its components
        Fault("unified-swa-lock-not-released", "releasing a request's lock leaves the SWA lock counts of its "
              "window's nodes as they were", _SWA, "SWAComponent", (Edit(
                  "release_component_lock", "comp.lock_ref = ref - 1", "comp.lock_ref = ref"),),
              frozenset({"ref-conservation"}), layout="full+swa"),
        Fault("unified-full-lock-not-released", "releasing a request's lock leaves the full-attention lock counts "
              "of its path as they were", _FULL, "FullComponent", (Edit(
                  "release_component_lock", "cd.lock_ref -= 1", "cd.lock_ref -= 0"),),
              frozenset({"ref-conservation"}), layout="full+swa"),
        Fault("unified-swa-evicted-while-locked", "the SWA eviction walk does not skip locked nodes: a window a "
              "running request reads is tombstoned and its SWA pages freed",
              _CORE, "UnifiedLRUList", (Edit(
                  "get_prev_no_lock", "while x.component_data[ct].lock_ref > 0:",
                  "while x.component_data[ct].lock_ref > 0 and ct != ComponentType.SWA:"),),
              frozenset({"free-queue-consistency", "ref-conservation", "content-soundness", "no-eviction-in-use",
                         "hit-soundness"}), layout="full+swa"),
        Fault("unified-tombstone-not-set", "evicting a node's SWA frees its pages but leaves the node's SWA value: "
              "no tombstone, the freed pages still served", _SWA, "SWAComponent", (Edit(
                  "evict_component", "cd.value = None", "pass"),),
              frozenset({"free-queue-consistency", "hash-map-consistency", "hit-soundness"}), layout="full+swa"),
        Fault("unified-tombstone-matched", "a match walks through SWA tombstones as if their window were there: "
              "the hit's window reads SWA pages the tree no longer has", _SWA, "SWAComponent", (Edit(
                  "create_match_validator", "if cd.value is None and (match_device_only or cd.host_value is None):",
                  "if False:"),),
              frozenset({"hit-soundness", "content-soundness"}), layout="full+swa"),
        Fault("unified-window-frees-inside", "a hybrid model's decode step frees the request's SWA slots up to half "
              "a window behind it, inside the window its next token reads",
              "sglang.srt.mem_cache.base_prefix_cache", "BasePrefixCache", (Edit(
                  "evict_sliding_windows", "sliding_window_size=self.swa_retain_window,",
                  "sliding_window_size=self.swa_retain_window // 2,"),),
              frozenset({"content-soundness"}), layout="full+swa"),
    ],
}
"""The planted faults, by engine."""
