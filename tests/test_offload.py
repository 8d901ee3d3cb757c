"""Spec chapter 11, tiers: the spec's offloading manager, its rules, impl's
tier in lockstep with it, and ``kvspec conform --scope offload`` on the
spec, impl and a ``module:factory`` (vLLM's own tier:
tests/test_offload_vllm_faults.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvspec.cli import main
from kvspec.errors import RuleError
from kvspec.impl.offload import CPUOffloadingManager
from kvspec.spec import tiers
from kvspec.spec.catalogue import TIER_LEVELS, TIER_RULES
from kvspec.spec.tiers import LookupResult, SpecOffloadingManager

ROOT = Path(__file__).resolve().parents[1]
A, B, C, D = (bytes([i]) * 4 + bytes(4) for i in (1, 2, 3, 4))


def stored(tier, *keys):
    out = tier.prepare_store(list(keys))
    tier.complete_store(out.keys_to_store)
    return out


# --- the model ------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [SpecOffloadingManager, CPUOffloadingManager])
def test_a_store_is_served_only_once_it_completed(make):
    tier = make(4)
    tier.prepare_store([A, B])
    assert tier.lookup(A) == tier.lookup(A).HIT_PENDING
    tier.complete_store([A], success=True)
    tier.complete_store([B], success=False)
    assert (tier.lookup(A).name, tier.lookup(B).name) == ("HIT", "MISS")


@pytest.mark.parametrize("make", [SpecOffloadingManager, CPUOffloadingManager])
def test_lru_evicts_the_least_recently_used_and_never_a_key_asked_for(make):
    tier = make(2)
    stored(tier, A)
    stored(tier, B)
    tier.touch([A])  # B is now the least recently used
    out = tier.prepare_store([C])
    assert out.evicted_keys == [B]
    tier.complete_store([C])
    assert tier.prepare_store([A, C, D]) is None  # A and C are asked for: protected, so D finds no block
    assert (tier.lookup(A).name, tier.lookup(C).name) == ("HIT", "HIT")


@pytest.mark.parametrize("make", [SpecOffloadingManager, CPUOffloadingManager])
def test_a_block_being_loaded_is_not_evicted(make):
    tier = make(1)
    stored(tier, A)
    tier.prepare_load([A])
    assert tier.prepare_store([B]) is None
    tier.complete_load([A])
    assert tier.prepare_store([B]).evicted_keys == [A]


def test_arc_promotes_a_touched_ready_key_and_evicts_from_t1_first():
    tier = SpecOffloadingManager(2, cache_policy="arc")
    stored(tier, A)
    stored(tier, B)
    tier.touch([A])
    assert tier.policy.state()[:2] == ((B,), (A,))
    assert tier.prepare_store([C]).evicted_keys == [B]
    assert tier.policy.state()[2] == (B,)  # B's ghost


def test_refusals_name_the_rule_and_change_nothing():
    tier = SpecOffloadingManager(2)
    tier.prepare_store([A])
    before = tier.snapshot()
    with pytest.raises(RuleError, match="tier-content-soundness") as refused:
        tier.prepare_load([A])
    assert repr(A) in str(refused.value)
    with pytest.raises(RuleError, match="tier-ref-conservation"):
        tier.complete_load([A])
    with pytest.raises(RuleError, match="tier-content-soundness"):
        tier.prepare_store([B, B])
    assert tier.snapshot() == before


def test_the_store_threshold_counts_lookups():
    tier = SpecOffloadingManager(2, store_threshold=2)
    tier.lookup(A)
    assert tier.prepare_store([A]).keys_to_store == []
    tier.lookup(A)
    assert tier.prepare_store([A]).keys_to_store == [A]


# --- the rules ------------------------------------------------------------------------------------


def test_a_pending_store_served_breaks_content_soundness():
    ledger = tiers.Ledger(pending={A: 0})
    snap = SpecOffloadingManager(2).snapshot()
    step = tiers.TierStep("lookup", (A,), ledger, snap, snap, "HIT")
    assert [rule for rule, _ in tiers.check_tier_step(step)] == ["tier-content-soundness"]


def test_a_ref_count_off_by_one_breaks_ref_conservation():
    ledger = tiers.Ledger(stored={A: 0})
    snap = tiers.TierSnapshot(2, {A: (0, 1)}, frozenset(), 0)
    assert {rule for rule, _ in tiers.check_tier_state(snap, ledger)} == {"tier-ref-conservation", "tier-eviction"}


def test_an_eviction_of_a_key_asked_for_breaks_tier_eviction():
    before = tiers.TierSnapshot(1, {A: (0, 0)}, frozenset({A}), 1)
    after = tiers.TierSnapshot(1, {B: (0, -1)}, frozenset(), 0)
    step = tiers.TierStep("prepare_store", ([A, B],), tiers.Ledger(stored={A: 0}), before, after, ([B], [0], [A]))
    assert "tier-eviction" in {rule for rule, _ in tiers.check_tier_step(step)}


def test_an_event_missing_breaks_tier_events():
    snap = SpecOffloadingManager(1).snapshot()
    step = tiers.TierStep("take_events", (), tiers.Ledger(owed=[(True, (A,))]), snap, snap, [])
    assert [rule for rule, _ in tiers.check_tier_step(step)] == ["tier-events"]


def test_the_tier_catalogue_is_the_rules_the_predicates_state_and_chapter_11_lists():
    named = set(tiers.TIER_STATE_RULES) | set(tiers.TIER_STEP_RULES)
    assert named == set(TIER_RULES) and set(TIER_LEVELS) == {"L1", "L2", "L3"}
    chapter = (ROOT / "spec" / "README.md").read_text().split("## 11. Tiers", 1)[1].split("\n## ", 1)[0]
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| (tier-[a-z-]+) \|.*$", chapter, re.M)}
    assert list(rows) == list(TIER_RULES)
    for name, row in rows.items():
        assert row.split(" | ")[1] == TIER_RULES[name], name
        fns = [*tiers.TIER_STATE_RULES.get(name, ()), *tiers.TIER_STEP_RULES.get(name, ())]
        assert all(f"`tiers.{fn.__name__}`" in row for fn in fns), name


# --- the machine ---------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["impl", "spec"])
def test_conform_offload_reaches_a_verdict(target, capsys):
    assert main(["conform", "--target", target, "--scope", "offload", "--examples", "8"]) == 0
    out = capsys.readouterr().out
    assert "offload  tiny-tier-arc" in out and "all layouts conform" in out


class ServesFailedStores(CPUOffloadingManager):
    """impl's tier, but a failed store is completed as a successful one."""

    def complete_store(self, keys, req_context=None, success=True):
        super().complete_store(keys, req_context, success=True)


def serves_failed_stores(**options):
    return ServesFailedStores(**options)


def test_a_module_factory_tier_is_judged_and_its_failure_named(capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    code = main(["conform", "--target", "test_offload:serves_failed_stores", "--scope", "offload",
                 "--layout", "lru", "--level", "L1", "--examples", "20"])
    out = capsys.readouterr().out
    assert code != 0 and "tier-content-soundness" in out, out


def test_lookup_result_names_are_vllms():
    assert [r.name for r in LookupResult] == ["MISS", "HIT", "HIT_PENDING", "RETRY"]
