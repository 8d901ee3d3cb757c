"""Incoherent configurations as gate input: every machine builds one variant
of its layout per run, and a target must refuse what the spec refuses."""

import pytest
from test_cli import target_module

from kvspec.conformance.gate import GateOptions, run_gate
from kvspec.conformance.machines.configurations import (
    NON_POSITIVE_SIZE,
    manager_variants,
    pool_variants,
    sendable,
    spec_refusal,
)
from kvspec.conformance.machines.layouts import MANAGER_LAYOUTS
from kvspec.conformance.machines.pool import LAYOUTS
from kvspec.conformance.runner import resolve_target
from kvspec.conformance.targets.spec_manager import SpecManagerTarget
from kvspec.conformance.vectors.codec import refusal_kind
from kvspec.spec.pool import SpecBlockPool

VARIANTS = [("manager", name, manager_variants(layout), SpecManagerTarget) for name, layout in MANAGER_LAYOUTS.items()]
VARIANTS += [("pool", name, pool_variants(layout), SpecBlockPool) for name, layout in LAYOUTS.items()]


@pytest.mark.parametrize("scope, name, variants, spec", VARIANTS, ids=[f"{s}/{n}" for s, n, *_ in VARIANTS])
def test_every_variant_is_refused_by_spec_and_impl_naming_a_rule(scope, name, variants, spec):
    impl = resolve_target("impl", scope)
    for variant in variants:
        refusal = spec_refusal(variant, spec)
        assert refusal.rule
        with pytest.raises((ValueError, TypeError)) as refused:
            variant.layout.make_target(impl)
        assert refusal_kind(refused.value) == refusal_kind(refusal), (variant.name, refused.value, refusal)
        assert refused.value.rule == refusal.rule, (variant.name, refused.value, refusal)


def test_the_avoid_name_leaves_out_exactly_the_non_positive_sizes():
    variants = manager_variants(MANAGER_LAYOUTS["full+swa+mamba-retention"])
    kept = sendable(variants, frozenset({NON_POSITIVE_SIZE}))
    assert set(kept) == {v.name for v in variants if not v.non_positive_size}
    assert "negative retention interval" in kept and "scheduler block size 0" not in kept


LENIENT = {
    "manager": (
        "from kvspec.conformance.machines.layouts import MANAGER_LAYOUTS\n"
        "from kvspec.conformance.targets.manager import ImplManagerTarget\n"
        "def make(*args, **options):\n"
        "    try:\n"
        "        return ImplManagerTarget(*args, **options)\n"
        "    except ValueError:  # a manager that shrugs off a bad configuration\n"
        "        return ImplManagerTarget(*MANAGER_LAYOUTS['full'].target_args())\n"),
    "pool": (
        "from kvspec.conformance.targets.pool import ImplPoolTarget\n"
        "def make(num_blocks, caching, hash_block_size, events):\n"
        "    return ImplPoolTarget(max(num_blocks, 1), caching, max(hash_block_size, 1), events)\n"),
}


@pytest.mark.parametrize("scope", ["manager", "pool"])
def test_a_target_that_accepts_an_incoherent_configuration_fails_the_gate(tmp_path, monkeypatch, scope):
    target = target_module(tmp_path, monkeypatch, f"lenient_{scope}", LENIENT[scope])
    layout = "full" if scope == "manager" else "two-groups"
    report = run_gate(GateOptions(target=target, scope=scope, layouts=[layout], examples=30, seed=1, level="L1"))
    (result,) = report.results
    assert not result.conforms
    assert set(result.rules) & {"block-size-coherence", "null-exclusion", "allocation-accounting"}, result
    assert "construct(" in "\n".join(op for step in result.trace.steps for op in step.operations)
