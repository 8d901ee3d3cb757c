"""One signature table: the target protocols of spec/interface.py.  The
spec, impl, the adapters (and, in the vLLM stage, vLLM itself) must take
every operation's arguments by the same names, in the same order, with the
same defaults -- so that a vector's or a trace's named arguments mean the
same thing to all of them."""

import inspect

import pytest

from kvspec.conformance.targets.manager import KVCacheManagerTarget
from kvspec.conformance.targets.pool import VllmApiPoolTarget
from kvspec.impl import BlockPool, KVCacheManager
from kvspec.spec.interface import ManagerTarget, PoolTarget
from kvspec.spec.manager import SpecKVCacheManager
from kvspec.spec.pool import SpecBlockPool


def operations(protocol):
    return sorted(n for n, f in inspect.getmembers(protocol, inspect.isfunction) if not n.startswith("_"))


def parameters(fn):
    """Names, kinds and defaults -- annotations may differ (ids vs blocks)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values() if p.name != "self"]


# impl's classes speak vLLM's API: blocks, not ids, but the same names.
BY_ID_ONLY = {"snapshot", "take_events"}  # observations the adapters add


@pytest.mark.parametrize("cls", [SpecBlockPool, VllmApiPoolTarget])
@pytest.mark.parametrize("op", operations(PoolTarget))
def test_pool_operations_match_the_protocol(cls, op):
    assert parameters(getattr(cls, op)) == parameters(getattr(PoolTarget, op)), f"{cls.__name__}.{op}"


@pytest.mark.parametrize("cls, op", [
    (cls, op) for cls in (SpecKVCacheManager, KVCacheManagerTarget, KVCacheManager) for op in operations(ManagerTarget)
    if not (cls is KVCacheManager and op in BY_ID_ONLY)  # vLLM's API has no id-level observations
], ids=lambda v: getattr(v, "__name__", v))
def test_manager_operations_match_the_protocol(cls, op):
    assert parameters(getattr(cls, op)) == parameters(getattr(ManagerTarget, op)), f"{cls.__name__}.{op}"


@pytest.mark.parametrize("op", [op for op in operations(PoolTarget) if op not in BY_ID_ONLY])
def test_impl_pool_has_every_operation(op):
    assert callable(getattr(BlockPool, op, None)), f"impl's BlockPool lacks {op}"


@pytest.mark.parametrize("op", [op for op in operations(ManagerTarget) if op not in BY_ID_ONLY])
def test_vllm_manager_matches_the_protocol(op):
    """In the vLLM stage: vLLM 0.25.1's own KVCacheManager is the table's source."""
    vllm_manager = pytest.importorskip("vllm.v1.core.kv_cache_manager")
    assert parameters(getattr(vllm_manager.KVCacheManager, op)) == parameters(getattr(ManagerTarget, op))
