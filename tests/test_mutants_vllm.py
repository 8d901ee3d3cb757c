"""The mutant catalogue applied to vLLM's own classes (the vLLM stage): each
mutant patches vLLM 0.25.1 in memory and comes off cleanly, and runs found
against impl's mutants kill the same mutants of vLLM, by the same rules --
the gate for a vLLM fork's pull request is the gate measured here."""

from pathlib import Path

import pytest

pytest.importorskip("vllm")

from kvspec.conformance.mutation.mutants import MUTANTS_BY_NAME, Family, applied, for_family  # noqa: E402
from kvspec.conformance.runner import replay, require_vllm  # noqa: E402
from kvspec.conformance.trace import Trace  # noqa: E402

TRACES = Path(__file__).parent / "mutant_traces"


@pytest.fixture(scope="module", autouse=True)
def vllm_hashes():
    require_vllm()


def test_every_vllm_mutant_applies_and_comes_off():
    family = Family("vllm")
    names = ("BlockPool", "SingleTypeKVCacheManager", "FullAttentionManager", "SlidingWindowManager",
             "ChunkedLocalAttentionManager", "MambaManager", "CrossAttentionManager", "KVCacheCoordinator",
             "UnitaryKVCacheCoordinator", "HybridKVCacheCoordinator", "KVCacheManager", "Scheduler")
    pristine = {n: dict(vars(getattr(family, n))) for n in names}
    hasher = family.module("kv_cache_utils")
    utils = dict(vars(hasher))
    for mutant in for_family("vllm"):
        with applied(mutant, family):
            changed = {n for n in names if dict(vars(getattr(family, n))) != pristine[n]}
            assert changed or dict(vars(hasher)) != utils, f"{mutant.name} patched nothing"
        assert {n: dict(vars(getattr(family, n))) for n in names} == pristine, mutant.name
        assert dict(vars(hasher)) == utils, mutant.name
    assert len(for_family("vllm")) >= 30


@pytest.mark.parametrize("mutant, rules", [
    ("mamba-same-step-hit", {"content-soundness"}),
    ("external-before-touch", {"no-eviction-in-use", "no-aliasing"}),
])
def test_runs_found_against_impl_kill_the_same_vllm_mutants(mutant, rules):
    trace = Trace.load(TRACES / f"{mutant}.json")
    with applied(MUTANTS_BY_NAME[mutant], Family("vllm")):
        broken = replay(trace, "vllm", "L1")
    assert not broken.conforms and rules <= set(broken.rules), broken.message
    assert replay(trace, "vllm", "L1").conforms


def test_hash_mutants_reach_vllms_hasher():
    """vLLM's block hasher is vLLM's own: leaving the salt out gives a salted
    request the unsalted request's hashes."""
    from kvspec.conformance.runner import manager_layout
    from kvspec.conformance.vllm.targets import VllmManagerTarget
    from kvspec.request import Request

    target = VllmManagerTarget(*manager_layout("full").target_args())
    plain, salted = (target._request(Request(rid, [1, 2, 3, 4], cache_salt=salt))
                     for rid, salt in (("a", None), ("b", "tenant-b")))
    assert plain.block_hashes != salted.block_hashes
    with applied(MUTANTS_BY_NAME["hash-drops-salt"], Family("vllm")):
        mirrored = target._request(Request("c", [1, 2, 3, 4], cache_salt="tenant-b"))
    assert list(mirrored.block_hashes) == list(plain.block_hashes)


def test_the_multimodal_mutant_reaches_vllms_hasher():
    """An image straddling a block boundary keys both blocks in vLLM's own
    hasher; the mutant keys only the block where it starts: the first
    block's hash is unchanged, the second's is not (so it differs from the
    hash kvspec's content model names, which the rules compare)."""
    from kvspec.conformance.runner import manager_layout
    from kvspec.conformance.vllm.targets import VllmManagerTarget
    from kvspec.request import MultiModalFeatureSpec, PlaceholderRange, Request

    layout = manager_layout("full")
    target = layout.make_target(VllmManagerTarget)
    size = layout.hash_block_size
    tokens = [1] + [9] * (2 * size - 1)  # an image from position 1 to the end of the second block

    def hashes(rid):
        return list(target._request(Request(rid, tokens, mm_features=[
            MultiModalFeatureSpec("image-a", PlaceholderRange(1, 2 * size - 1))])).block_hashes)

    right = hashes("a")
    with applied(MUTANTS_BY_NAME["mm-key-where-it-starts"], Family("vllm")):
        bent = hashes("b")
    assert bent[0] == right[0] and bent[1] != right[1]
