"""kvspec's block manager inside vLLM: the drop-in mode.

It goes into the releases whose block-manager API it presents
(:data:`kvspec.dropin_releases.API`: 0.25.1 to 0.34.0), each with impl
built as that release behaves, and refuses any other before replacing
anything.

:func:`install` puts ``kvspec.impl``'s classes and functions in place of
vLLM's in vLLM's own block-manager modules -- ``vllm.v1.core.block_pool``,
``kv_cache_utils``, ``single_type_kv_cache_manager``,
``kv_cache_coordinator``, ``kv_cache_manager`` -- and in every vLLM module
that imported them by name (the scheduler does), and makes kvspec's pool
emit vLLM's own KV-event classes (``vllm.distributed.kv_events``), so vLLM's
event consumers work unchanged.  Everything else stays vLLM's: the
scheduler, the workers, the engine's KV-cache sizing (``get_kv_cache_configs``
and friends in ``kv_cache_utils``), and vLLM's spec classes, which kvspec's
managers accept as they are (see ``kvspec.kv_cache_interface.spec_is``).

Two ways in:

- explicitly, before vLLM builds an engine or scheduler::

      import kvspec.dropin
      kvspec.dropin.install()

- as a vLLM plugin: kvspec registers ``kvspec.dropin:plugin`` under vLLM's
  ``vllm.general_plugins`` entry points, which vLLM loads in every process
  it starts; the plugin installs the drop-in only when ``KVSPEC_DROPIN=1``
  is set (installing kvspec next to vLLM changes nothing by itself)::

      KVSPEC_DROPIN=1 vllm serve ...

vLLM's scheduler caches only blocks a request holds and hands
``allocate_slots`` the hit it has just looked up, so the drop-in's pool and
manager take its word for what a block holds (``trusts_scheduler``), as
vLLM's do; kvspec's own targets keep refusing such input.

:func:`uninstall` puts vLLM's originals back.  Not replaced: vLLM's
``SinkFullAttentionManager`` class (a feature kvspec does not implement).
Under the drop-in, a ``SinkFullAttentionSpec`` -- full attention's subclass,
and matched as such by name along its MRO -- is served by impl's
full-attention manager, without sink blocks.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
from typing import Any

logger = logging.getLogger(__name__)

# vLLM module -> kvspec module, and the names kvspec provides for it.
REPLACED: dict[str, tuple[str, tuple[str, ...]]] = {
    "vllm.v1.core.kv_cache_utils": ("kvspec.impl.kv_cache_utils", (
        "KVCacheBlock", "FreeKVCacheBlockQueue", "BlockHashListWithBlockSize", "hash_block_tokens",
        "get_request_block_hasher", "generate_block_hash_extra_keys", "need_extra_keys",
        "make_block_hash_with_group_id", "get_block_hash", "get_group_id", "maybe_convert_block_hash",
    )),
    "vllm.v1.core.block_pool": ("kvspec.impl.block_pool", ("BlockPool", "BlockHashToBlockMap")),
    "vllm.v1.core.single_type_kv_cache_manager": ("kvspec.impl.single_type_kv_cache_manager", (
        "SingleTypeKVCacheManager", "FullAttentionManager", "RSWAManager", "SlidingWindowManager",
        "ChunkedLocalAttentionManager", "MambaManager", "CrossAttentionManager", "get_manager_for_kv_cache_spec",
    )),
    "vllm.v1.core.kv_cache_coordinator": ("kvspec.impl.kv_cache_coordinator", (
        "KVCacheCoordinator", "KVCacheCoordinatorNoPrefixCache", "UnitaryKVCacheCoordinator",
        "HybridKVCacheCoordinator", "get_kv_cache_coordinator",
    )),
    "vllm.v1.core.kv_cache_manager": ("kvspec.impl.kv_cache_manager", ("KVCacheManager", "KVCacheBlocks")),
}



class DropinError(RuntimeError):
    """The drop-in cannot go into this vLLM: nothing was replaced."""


def check_release(version: str) -> str:
    """The release whose block manager the drop-in puts in place for vLLM
    ``version``; a release it does not know is refused: its scheduler would
    call an API impl does not present (``kvspec.dropin_releases``), or rely
    on semantics impl does not follow -- wrong tokens, not an error.  A fork
    keeps its base wheel's version, so a fork of a known release passes."""
    from kvspec.dropin_releases import API

    release = version.split("+")[0]  # a local build's suffix (+cpu) is the same release
    if release not in API:
        known = list(API)
        raise DropinError(f"kvspec's drop-in implements vLLM {', '.join(known)}'s block manager; this is vLLM "
                          f"{version} (the newest it knows is {known[-1]}): nothing was replaced")
    return release


_saved: dict[tuple[str, str], Any] = {}  # (module, name) -> vLLM's original
_saved_events: Any = None
_saved_deltas: frozenset[str] | None = None  # impl's default deltas before install
_saved_formats: tuple[str, str] | None = None  # the process's hash formats (vLLM's callers pass no release) before
_saved_root: tuple[Any, Any] | None = None  # kvspec's root hash and its seed before install
_put_in: dict[int, tuple[Any, Any]] = {}  # id(kvspec's object) -> (it, vLLM's original it stands in for)


def installed() -> bool:
    return bool(_saved)


def install() -> list[str]:
    """Replace vLLM's block manager by kvspec's; returns what was replaced
    (``module.name``).  Installing twice changes nothing more; on a release
    impl does not implement it raises :class:`DropinError`, having replaced
    nothing."""
    global _saved_events, _saved_deltas, _saved_formats, _saved_root
    if installed():
        return sorted(f"{m}.{n}" for m, n in _saved if m in REPLACED)
    import vllm

    release = check_release(vllm.__version__)  # before anything is replaced: never half-installed
    from vllm.distributed import kv_events as vllm_events
    from vllm.v1.core import kv_cache_utils as vllm_utils

    from kvspec import hashing
    from kvspec.dropin_releases import API
    from kvspec.impl import kv_events

    replacements = _replacements(API[release])  # every name checked before the first is replaced
    from kvspec.dropin_releases import impl_deltas
    from kvspec.impl import release as impl_release
    from kvspec.spec import releases

    deltas = impl_deltas(releases.judged(release))
    for (theirs, name), ours in replacements.items():
        _stand_in(ours, getattr(theirs, name))
        _replace(theirs, name, ours)
    # Whatever vLLM builds itself (a connector's coordinator, a pool, a manager) follows the release too.
    _saved_deltas = impl_release.use_default_deltas(deltas)
    # Block hashes as the release makes them (its extra-key format, its multimodal scan on resume): vLLM's
    # callers of the hashing functions pass no release, so the drop-in -- and only it -- sets the process's.
    _saved_formats = hashing.use_formats_of(releases.judged(release))
    # vLLM's root hash lives in its module: keep the two roots one.
    _saved_root = hashing.NONE_HASH, hashing.ROOT_SEED
    root = _init_none_hash(vllm_utils, hashing, release)
    _stand_in(root, vllm_utils.init_none_hash)
    _replace(vllm_utils, "init_none_hash", root)
    if getattr(vllm_utils, "NONE_HASH", None) is not None:
        hashing.NONE_HASH = vllm_utils.NONE_HASH
    # Modules that imported the names before: the scheduler, the engine, ...
    for module, name, ours in _importers({id(theirs): (theirs, ours) for ours, theirs in _put_in.values()}):
        _replace(module, name, ours)
    _saved_events = kv_events.use_event_classes(vllm_events.BlockStored, vllm_events.BlockRemoved,
                                                vllm_events.AllBlocksCleared)
    # Tensors hashed through vLLM's own helper, logs through vLLM's loggers.
    _replace(hashing, "TENSOR_BYTES", lambda tensor: vllm_utils.tensor_data(tensor))
    for vllm_name, (ours_name, _) in REPLACED.items():
        theirs, ours = sys.modules[vllm_name], sys.modules[ours_name]
        if hasattr(theirs, "logger") and hasattr(ours, "logger"):
            _replace(ours, "logger", theirs.logger)
    logger.info("kvspec drop-in: vLLM's block manager is kvspec.impl's (%d names)", len(_saved))
    return sorted(f"{m}.{n}" for m, n in _saved if m in REPLACED)


def uninstall() -> None:
    """Put vLLM's originals back -- also in the vLLM modules imported while
    the drop-in was in, which took kvspec's objects by name (the scheduler,
    the engine) -- and kvspec's own root hash: nothing of the drop-in stays
    in the process."""
    global _saved_events, _saved_deltas, _saved_formats, _saved_root
    for (module_name, name), original in _saved.items():
        setattr(sys.modules[module_name], name, original)
    _saved.clear()
    for module, name, theirs in _importers(_put_in):
        setattr(module, name, theirs)
    _put_in.clear()
    if _saved_root is not None:
        from kvspec import hashing

        hashing.NONE_HASH, hashing.ROOT_SEED = _saved_root
        _saved_root = None
    if _saved_deltas is not None:
        from kvspec.impl import release as impl_release

        impl_release.use_default_deltas(_saved_deltas)
        _saved_deltas = None
    if _saved_formats is not None:
        from kvspec import hashing

        hashing.use_extra_key_format(_saved_formats[0])
        hashing.use_mm_resume_scan(_saved_formats[1])
        _saved_formats = None
    if _saved_events is not None:
        from kvspec.impl import kv_events

        kv_events.use_event_classes(_saved_events.stored, _saved_events.removed, _saved_events.cleared)
        _saved_events = None


def plugin() -> None:
    """vLLM's ``vllm.general_plugins`` hook: install when ``KVSPEC_DROPIN=1``."""
    if os.environ.get("KVSPEC_DROPIN", "0") == "1":
        install()


def _replacements(shapes: dict[str, dict[str, Any]]) -> dict[tuple[Any, str], Any]:
    """(vLLM module, name) -> kvspec's object, for a release whose API
    differs from impl's in ``shapes``; a name the release's module lacks is
    a :class:`DropinError` (a build of vLLM the drop-in does not know),
    unless the release removed it (``GONE``)."""
    from kvspec.dropin_releases import GONE

    out = {}
    for vllm_name, (ours_name, names) in REPLACED.items():
        theirs, ours = importlib.import_module(vllm_name), importlib.import_module(ours_name)
        shaped = shapes.get(vllm_name, {})
        for name in names:
            if shaped.get(name) is GONE:
                continue
            if not hasattr(theirs, name):
                raise DropinError(f"{vllm_name} has no {name}: this vLLM build is not the release it names "
                                  "(nothing was replaced)")
            out[theirs, name] = under_scheduler(shaped.get(name, getattr(ours, name)))
    return out


@functools.cache
def under_scheduler(value: Any) -> Any:
    """``value`` as the drop-in puts it under vLLM's scheduler: impl's pool
    and manager classes (or a release's shape of them) as subclasses that
    take the scheduler's word for what a block holds
    (:attr:`kvspec.impl.block_pool.BlockPool.trusts_scheduler`); anything
    else as it is.  One subclass per class, so that installing twice
    replaces nothing more."""
    from kvspec.impl.block_pool import BlockPool
    from kvspec.impl.kv_cache_manager import KVCacheManager

    if not (isinstance(value, type) and issubclass(value, (BlockPool, KVCacheManager))):
        return value
    return type(value.__name__, (value,), {"trusts_scheduler": True, "__module__": value.__module__,
                                           "__qualname__": value.__qualname__, "__doc__": value.__doc__})


def _stand_in(ours: Any, theirs: Any) -> None:
    """Record that kvspec's ``ours`` stands in for vLLM's ``theirs``."""
    _put_in[id(ours)] = (ours, theirs)


def _importers(objects: dict[int, tuple[Any, Any]]) -> list[tuple[Any, str, Any]]:
    """(module, name, counterpart) for every name by which a vLLM module
    outside :data:`REPLACED` holds one of ``objects`` (``id(object) ->
    (object, counterpart)``): the modules that imported it by name."""
    found = []
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("vllm.") or module_name in REPLACED or module is None:
            continue
        for name, value in list(vars(module).items()):
            entry = objects.get(id(value))
            if entry is not None and entry[0] is value:
                found.append((module, name, entry[1]))
    return found


def _replace(module: Any, name: str, value: Any) -> None:
    _saved.setdefault((module.__name__, name), getattr(module, name))
    setattr(module, name, value)


def _init_none_hash(vllm_utils: Any, hashing: Any, release: str) -> Any:
    from kvspec.spec import releases

    fixed_seed = releases.judged(release).fixed_root_seed

    def init_none_hash(hash_fn: Any) -> None:
        """kvspec's root as ``release`` derives it, mirrored into vLLM's
        module (its code and tests read ``kv_cache_utils.NONE_HASH``, and
        from 0.29 the seed, which a cache shared between processes
        advertises)."""
        vllm_utils.NONE_HASH = hashing.init_none_hash(hash_fn, fixed_seed)
        if hasattr(vllm_utils, "_NONE_HASH_SEED"):
            vllm_utils._NONE_HASH_SEED = hashing.ROOT_SEED

    return init_none_hash
