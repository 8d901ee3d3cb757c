"""The drop-in: vLLM running on kvspec's block manager.

Under tools/install_vllm.sh's environment (vLLM 0.25.1):
``PYTHONHASHSEED=0 .venv-vllm/bin/python -m pytest tests/test_dropin.py``;
on another release the drop-in knows, that release first on the path
(``tools/dropin_release.sh 0.26.0`` runs this file there).
"""

import re

import pytest

vllm = pytest.importorskip("vllm")

from kvspec import dropin  # noqa: E402
from kvspec.conformance.vllm.scheduler import make_scheduler, serve  # noqa: E402
from kvspec.kv_cache_interface import MambaSpec  # noqa: E402
from kvspec.spec import releases  # noqa: E402
from kvspec.spec.layout import Layout  # noqa: E402
from kvspec.spec.releases import version_key  # noqa: E402
from kvspec.testing import full, mamba, swa  # noqa: E402


@pytest.fixture
def installed():
    dropin.install()
    try:
        yield
    finally:
        dropin.uninstall()


def test_install_replaces_vllms_block_manager_and_uninstall_restores_it():
    import vllm
    import vllm.v1.core.block_pool as vllm_pool
    import vllm.v1.core.kv_cache_manager as vllm_manager
    import vllm.v1.core.sched.scheduler as vllm_scheduler
    from vllm.distributed import kv_events as vllm_events

    from kvspec import impl
    from kvspec.dropin_releases import API
    from kvspec.impl import kv_events

    # impl's manager and pool, or their subclasses with the installed release's API
    shapes = API[dropin.check_release(vllm.__version__)]
    ours = shapes.get("vllm.v1.core.kv_cache_manager", {}).get("KVCacheManager", impl.KVCacheManager)
    our_pool = shapes.get("vllm.v1.core.block_pool", {}).get("BlockPool", impl.BlockPool)
    assert issubclass(ours, impl.KVCacheManager) and issubclass(our_pool, impl.BlockPool)
    ours, our_pool = dropin.under_scheduler(ours), dropin.under_scheduler(our_pool)  # they trust its word
    assert ours.trusts_scheduler and our_pool.trusts_scheduler and not impl.KVCacheManager.trusts_scheduler
    original = vllm_manager.KVCacheManager
    replaced = dropin.install()
    try:
        assert "vllm.v1.core.kv_cache_manager.KVCacheManager" in replaced
        assert vllm_manager.KVCacheManager is ours and vllm_pool.BlockPool is our_pool
        assert vllm_scheduler.KVCacheManager is ours  # imported by name before the install
        assert kv_events.EVENTS.stored is vllm_events.BlockStored
        assert dropin.install() == replaced  # twice changes nothing more
    finally:
        dropin.uninstall()
    assert vllm_manager.KVCacheManager is original and vllm_scheduler.KVCacheManager is original
    assert kv_events.EVENTS.stored is kv_events.BlockStored


def test_uninstall_leaves_nothing_of_the_drop_in_in_the_process():
    """A vLLM module first imported while the drop-in is in -- in a fresh
    pytest-xdist worker, vLLM's scheduler and engine -- takes kvspec's
    objects by name; uninstall gives it vLLM's back, and kvspec's root hash,
    which the drop-in keeps one with vLLM's, is again what it was.  Before,
    both stayed, and a later test in the worker (test_impl_vs_vllm's, or
    the lockstep's vLLM side) ran kvspec where it meant vLLM (issue 52)."""
    import sys
    import types

    import vllm.v1.core.kv_cache_manager as vllm_manager
    from vllm.v1.core import kv_cache_utils as vllm_utils

    from kvspec import hashing

    theirs = (vllm_manager.KVCacheManager, vllm_manager.KVCacheBlocks, vllm_utils.init_none_hash)
    roots = hashing.NONE_HASH, hashing.ROOT_SEED
    vllm_root = vars(vllm_utils).get("NONE_HASH")  # vLLM's own init_none_hash below moves it (or makes it)
    late = types.ModuleType("vllm.kvspec_test_imported_late")
    dropin.install()
    try:
        sys.modules[late.__name__] = late
        exec("from vllm.v1.core.kv_cache_manager import KVCacheManager, KVCacheBlocks\n"
             "from vllm.v1.core.kv_cache_utils import init_none_hash\n"
             "from vllm.utils.hashing import sha256\n"
             "init_none_hash(sha256)", vars(late))  # another root than the process's
        assert late.KVCacheManager is not theirs[0] and hashing.NONE_HASH != roots[0]
    finally:
        dropin.uninstall()
        del sys.modules[late.__name__]
        if vllm_root is None:
            del vllm_utils.NONE_HASH
        else:
            vllm_utils.NONE_HASH = vllm_root
    back = (late.KVCacheManager, late.KVCacheBlocks, late.init_none_hash)
    assert all(a is b for a, b in zip(back, theirs, strict=True))
    assert (hashing.NONE_HASH, hashing.ROOT_SEED) == roots


def test_the_drop_in_takes_the_schedulers_word_for_what_a_block_holds():
    """Under vLLM's scheduler the drop-in caches a block nobody holds and
    takes a free, uncached block as a hit, as vLLM does (vLLM's own unit
    tests build both by hand; its scheduler sends neither); impl's own
    classes refuse both (rule content-soundness, nothing changed)."""
    import vllm.v1.core.block_pool as vllm_pool

    from kvspec import impl
    from kvspec.errors import RuleError
    from kvspec.hashing import get_request_block_hasher
    from kvspec.request import Request

    request = Request("r", list(range(8)), block_hasher=get_request_block_hasher(4))
    with pytest.raises(RuleError, match="nobody holds"):
        impl.BlockPool(8, True, 4).cache_full_blocks(request, [impl.KVCacheBlock(1)], 0, 1, 4, 0)
    dropin.install()
    try:
        pool = vllm_pool.BlockPool(8, True, 4)
        pool.cache_full_blocks(request, [pool.blocks[1]], 0, 1, 4, 0)
        assert pool.blocks[1].block_hash is not None and pool.blocks[1].ref_cnt == 0
    finally:
        dropin.uninstall()


def test_the_peer_suites_listed_differences_are_the_drop_ins():
    """Every test of vLLM's own that tools/peer_suite_differences.json lists
    as failing on the drop-in names the paragraph of docs/rules.md that
    explains it, and none is one the drop-in now serves as vLLM does --
    caching a block nobody holds, or a hit that is no hit (the test
    above)."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    listed = json.loads((root / "tools" / "peer_suite_differences.json").read_text())
    rules = (root / "docs" / "rules.md").read_text()
    for release, differences in listed.items():
        for test, why in differences.items():
            named = re.findall(r"docs/rules\.md: [^']*'([^']+)'", why)
            assert named and all(n in rules for n in named), (release, test, why)
            assert "caches free-standing blocks" not in why and "A hit that is no hit" not in why, (release, test)


def test_a_release_impl_does_not_implement_is_refused_with_nothing_replaced(monkeypatch):
    """On a vLLM whose block manager kvspec.impl does not implement (issue
    28), the drop-in refuses in one line naming the newest it knows, before
    replacing anything -- by hand and through the plugin -- and the
    scheduler scope with --target impl is a usage error, exit 2."""
    import vllm
    import vllm.v1.core.kv_cache_manager as vllm_manager

    from kvspec.cli import main
    from kvspec.dropin_releases import API

    original = vllm_manager.KVCacheManager
    monkeypatch.setattr(vllm, "__version__", "0.99.0")
    known = list(API)
    with pytest.raises(dropin.DropinError, match=re.escape(
            f"implements vLLM {', '.join(known)}'s block manager; this is vLLM 0.99.0 (the newest it knows is "
            f"{known[-1]}): nothing was replaced")):
        dropin.install()
    monkeypatch.setenv("KVSPEC_DROPIN", "1")
    with pytest.raises(dropin.DropinError):
        dropin.plugin()
    assert not dropin.installed() and vllm_manager.KVCacheManager is original
    assert main(["conform", "--target", "impl", "--scope", "scheduler", "--layout", "full", "--examples", "2"]) == 2
    from kvspec.conformance.runner import scopes_for

    assert scopes_for("impl") == ["pool", "manager", "offload"]  # the README's main job still runs: no scheduler scope
    monkeypatch.setattr(vllm, "__version__", "0.25.1+cpu")  # a local build of the release: the same
    dropin.check_release(vllm.__version__)


@pytest.mark.parametrize("salt", [None, "tenant-7"])
def test_kvspecs_lookahead_hasher_hashes_as_vllms(salt):
    """From 0.33 an EAGLE drafter's block hashes cover the token past each
    block: kvspec's hasher (what the drop-in puts in vLLM's engine) gives
    vLLM's own hashes, block for block, as the request grows."""
    if version_key(vllm.__version__) < (0, 33):
        pytest.skip(f"vLLM {vllm.__version__} has no lookahead block hashes")
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.request import Request

    from kvspec import hashing

    kv_cache_utils.init_none_hash(sha256_cbor)
    hashing.NONE_HASH = kv_cache_utils.NONE_HASH

    def grown(hasher):
        request = Request("r", list(range(21)), SamplingParams(max_tokens=8), None, block_hasher=hasher,
                          cache_salt=salt)
        sizes = [len(request.block_hashes)]
        for token in range(100, 108):
            request.append_output_token_ids(token)
            sizes.append(len(request.block_hashes))
        return list(request.block_hashes), sizes

    theirs = grown(kv_cache_utils.get_request_block_hasher(4, sha256_cbor, 1))
    # the release's extra-key format, as the drop-in sets it
    ours = grown(hashing.get_request_block_hasher(4, sha256_cbor, 1, release=releases.judged(vllm.__version__)))
    assert ours == theirs and theirs[1][0] == 5  # 21 tokens: block 5's lookahead token is the 22nd


def test_plugin_installs_only_when_asked(monkeypatch):
    monkeypatch.delenv("KVSPEC_DROPIN", raising=False)
    dropin.plugin()
    assert not dropin.installed()
    monkeypatch.setenv("KVSPEC_DROPIN", "1")
    try:
        dropin.plugin()
        assert dropin.installed()
    finally:
        dropin.uninstall()


def test_the_plugin_is_registered_with_vllm():
    from importlib.metadata import entry_points

    plugins = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert plugins.get("kvspec") == "kvspec.dropin:plugin"


# Pools small enough that running requests are preempted now and then; each layout with the scheduler's
# options (EAGLE drafts, a KV connector that loads nothing: the scheduler's connector path), and one
# without prefix caching, whose free order changed in 0.27 (release delta free-order-without-caching).
LAYOUTS = {
    "full attention": (Layout((full(16),), num_blocks=32, max_model_len=512), {}),
    "full + sliding window": (Layout((full(16), swa(16, window=64)), num_blocks=48, max_model_len=512), {}),
    "full + Mamba (all)": (Layout((full(16), mamba(16, "all")), num_blocks=48, max_model_len=512), {}),
    "full + Mamba (align)": (Layout((full(16), mamba(16, "align")), num_blocks=48, max_model_len=512), {}),
    "full attention, EAGLE": (Layout((full(16),), num_blocks=32, max_model_len=512, use_eagle=True),
                              {"num_draft_tokens": 2}),
    "full + sliding window, EAGLE": (Layout((full(16), swa(16, window=64)), num_blocks=48, max_model_len=512,
                                            use_eagle=True), {"num_draft_tokens": 2}),
    # vLLM's engine marks the drafter's layers' group (is_eagle_group); from 0.33 the mark alone drops nothing.
    "full attention, EAGLE, drafter's group marked": (
        Layout((full(16),), num_blocks=32, max_model_len=512, use_eagle=True, eagle_groups=(0,)),
        {"num_draft_tokens": 2}),
    # From 0.33 EAGLE's hashes cover its lookahead token and no hit drops a block; the legacy hashes and the
    # block drop stay one flag away (before 0.33 this layout is the one above).
    "full + sliding window, EAGLE, block drop": (Layout((full(16), swa(16, window=64)), num_blocks=48,
                                                        max_model_len=512, use_eagle=True),
                                                 {"num_draft_tokens": 2, "lookahead_hashes": False}),
    # vLLM's engine with async scheduling (its default where the executor supports it): the next step is
    # scheduled while the last is in the forward pass, so blocks leave windows on the processed tokens.
    "full + sliding window, async scheduling": (
        Layout((full(16), swa(16, window=32)), num_blocks=48, max_model_len=512), {"async_scheduling": True}),
    "full + Mamba (align), async scheduling": (
        Layout((full(16), mamba(16, "align")), num_blocks=48, max_model_len=512), {"async_scheduling": True}),
    "full + sliding window, KV connector": (Layout((full(16), swa(16, window=64)), num_blocks=48, max_model_len=512),
                                            {"connector": True}),
    "full + Mamba (align), KV connector": (Layout((full(16), mamba(16, "align")), num_blocks=48, max_model_len=512),
                                           {"connector": True}),
    "full + sliding window, caching off": (Layout((full(16), swa(16, window=64)), num_blocks=48, max_model_len=512,
                                                  enable_caching=False), {}),
}


def _lockstep(layout: Layout, options: dict) -> tuple[list, list]:
    """Three hundred steps of vLLM's scheduler on vLLM's block manager, then
    on kvspec's: the two step records."""
    options = {**options, "engine_retention": True}  # the KV-cache config as vLLM's engine builds it
    overlap = options.get("async_scheduling", False)  # as vLLM's engine runs an async scheduler
    theirs = serve(make_scheduler(layout, **options), steps=300, seed=3, max_tokens=24, overlap=overlap)
    dropin.install()
    try:
        scheduler = make_scheduler(layout, **options)
        from kvspec import impl

        assert isinstance(scheduler.kv_cache_manager, impl.KVCacheManager)
        ours = serve(scheduler, steps=300, seed=3, max_tokens=24, overlap=overlap)
    finally:
        dropin.uninstall()
    return theirs, ours


@pytest.mark.parametrize("name", LAYOUTS)
def test_vllms_scheduler_runs_on_kvspecs_block_manager_as_on_its_own(name):
    """Three hundred steps of vLLM's scheduler -- arrivals behind a shared system prompt, chunked
    prefill, preemption under a small pool -- make the same decisions, block ids included, on
    kvspec's block manager as on vLLM's; the KV-cache config carries the retention interval vLLM's
    engine sets (from 0.29 sparse retention by default, the shared prefix's end kept)."""
    layout, options = LAYOUTS[name]
    if why := releases.judged(vllm.__version__).unsupported(layout.mamba_cache_modes):
        pytest.skip(why)
    theirs, ours = _lockstep(layout, options)
    assert ours == theirs
    assert sum(len(r.finished) for r in ours) > 20 and sum(len(r.preempted) for r in ours) > 0
    assert sum(n for r in ours for n in r.computed.values()) > 0 or not layout.enable_caching  # prefix hits
    if options.get("connector") and any(isinstance(g, MambaSpec) for g in layout.groups) \
            and version_key(vllm.__version__) >= (0, 29):
        assert sum(len(r.offers) for r in ours) > 0  # Mamba states offered to the connector, as vLLM offers them


@pytest.mark.parametrize(("fault", "since", "layout"), [
    ("in-flight", (0, 26), "full + sliding window, async scheduling"),
    ("in-flight", (0, 26), "full + Mamba (align), async scheduling"),
    ("mamba-retire-across-gaps", (0, 30), "full + Mamba (align), async scheduling"),
    ("eagle-replay-boundaries", (0, 30), "full + sliding window, EAGLE, block drop"),
    ("mamba-boundary-remarked", (0, 32), "full + Mamba (align), async scheduling"),
    ("lookahead-hasher", (0, 33), "full + sliding window, EAGLE"),
    ("eagle-drop-needs-use-eagle", (0, 33), "full attention, EAGLE, drafter's group marked"),
])
def test_the_lockstep_catches_a_release_change_the_drop_in_drops(monkeypatch, fault, since, layout):
    """Built without one thing the release changed -- windows counted on all
    computed tokens, not the processed ones (steps in flight under async
    scheduling read the blocks below); a release delta impl follows; block
    hashes blind to EAGLE's lookahead token -- the drop-in makes vLLM's
    scheduler decide otherwise on the layout that exercises it."""
    if version_key(vllm.__version__) < since:
        pytest.skip(f"vLLM {vllm.__version__} predates the change")
    if fault == "mamba-boundary-remarked" and version_key(vllm.__version__) >= (0, 33):
        pytest.skip("0.33 undid it (release delta mamba-boundary-remark-fixed)")
    from kvspec import dropin_releases
    from kvspec.impl.kv_cache_manager import KVCacheManager

    if fault == "in-flight":
        monkeypatch.setattr(KVCacheManager, "_processed_tokens", lambda self, request, total: total)
    elif fault == "lookahead-hasher":  # the hasher the drop-in installs ignoring the drafter's lookahead tokens
        from kvspec import hashing
        from kvspec.impl import kv_cache_utils

        monkeypatch.setattr(kv_cache_utils, "get_request_block_hasher",
                            lambda size, hash_fn, lookahead=0: hashing.get_request_block_hasher(size, hash_fn))
    else:
        deltas = dropin_releases.impl_deltas
        monkeypatch.setattr(dropin_releases, "impl_deltas", lambda release: deltas(release) - {fault})
    theirs, ours = _lockstep(*LAYOUTS[layout])
    assert ours != theirs
