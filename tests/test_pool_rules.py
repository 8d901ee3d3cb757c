"""Each pool rule catches a pool that breaks it.

Two angles: the machine (rules only, no spec comparison) finds the broken
pool and the violation it reports names the rule; and each predicate, given a
hand-made bad snapshot or step, reports the problem.
"""

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from broken_pools import BROKEN, FirstGroupForAll, SilentEviction, TableWithoutBlockHash, target
from kvspec.conformance.machines.pool import ConformanceError, PoolLayout, pool_machine
from kvspec.conformance.settings import PROFILES
from kvspec.spec import rules
from kvspec.spec.interface import PoolSnapshot

LAYOUT = PoolLayout(num_blocks=6, hash_block_size=1, group_block_sizes=(1, 2))


def violated_rules(pool_cls) -> set[str]:
    """The rules named by every distinct failure the machine finds."""
    machine = pool_machine(target(pool_cls), LAYOUT, lockstep=False)
    with pytest.raises((ConformanceError, BaseExceptionGroup)) as caught:
        # The ci profile's shape whatever HYPOTHESIS_PROFILE says: this checks
        # that the rule catches the bug, not how long a profile searches.
        run_state_machine_as_test(
            machine, settings=settings(PROFILES["ci"], max_examples=300, report_multiple_bugs=True)
        )
    errors = caught.value.exceptions if isinstance(caught.value, BaseExceptionGroup) else [caught.value]
    assert all(isinstance(e, ConformanceError) for e in errors), errors
    return {v.rule for e in errors for v in e.violations}


@pytest.mark.parametrize("rule", sorted(BROKEN))
def test_machine_catches_broken_pool(rule):
    assert rule in violated_rules(BROKEN[rule])


def test_events_must_mirror_the_table():
    assert "hash-map-consistency" in violated_rules(SilentEviction)


def test_table_and_block_hash_must_agree():
    assert "hash-map-consistency" in violated_rules(TableWithoutBlockHash)


def test_a_lookup_answers_from_the_table():
    assert "hash-map-consistency" in violated_rules(FirstGroupForAll)


def test_lookup_predicate():
    from kvspec.hashing import make_block_hash_with_group_id

    h = b"h" * 8
    k0, k1 = make_block_hash_with_group_id(h, 0), make_block_hash_with_group_id(h, 1)
    cached = snap([0, 0, 0], [1, 2], {1: k0, 2: k1}, {k0: (1,), k1: (2,)})
    assert not rules.check_step(step("get_cached_block", (h, [0, 1]), cached, cached, [1, 2]))
    wrong = rules.check_step(step("get_cached_block", (h, [0, 1]), cached, cached, [1, 1]))
    assert [v.rule for v in wrong] == ["hash-map-consistency"]
    assert "group 1 returned block 1" in wrong[0].message


def snap(ref, free, key_of=None, table=None):
    return PoolSnapshot(len(ref), tuple(ref), tuple(free), key_of or {}, table or {})


K = b"k" * 8


@pytest.mark.parametrize(
    "rule, bad",
    [
        ("ref-conservation", snap([0, -1, 0], [2])),
        ("free-queue-consistency", snap([0, 0, 0], [1])),
        ("free-queue-consistency", snap([0, 0, 1], [1, 1, 2])),
        ("null-exclusion", snap([0, 0, 0], [0, 1, 2])),
        ("null-exclusion", snap([0, 0], [1], {0: K}, {K: (0,)})),
        ("hash-map-consistency", snap([0, 0], [1], {1: K}, {})),
        ("hash-map-consistency", snap([0, 0], [1], {}, {K: (1,)})),
        ("hash-map-consistency", snap([0, 0], [1], {1: K}, {K: (1, 1)})),
    ],
)
def test_state_predicate_reports(rule, bad):
    assert rule in {v.rule for v in rules.check_state(bad)}
    good = snap([0, 0, 0], [1, 2])
    assert not rules.check_state(good)


def test_ref_conservation_uses_the_holders():
    s = snap([0, 1, 0], [2])
    assert not rules.check_state(s, {1: 1})
    assert {v.rule for v in rules.check_state(s, {1: 2})} == {"ref-conservation"}


def step(op, args, before, after, result=None, error=None):
    return rules.Step(op, args, before, after, result, error)


def test_free_order_predicate():
    before = snap([0, 1, 1, 0], [3], {2: K}, {K: (2,)})
    right = snap([0, 0, 0, 0], [1, 3, 2], {2: K}, {K: (2,)})
    wrong = snap([0, 0, 0, 0], [3, 1, 2], {2: K}, {K: (2,)})
    assert not rules.check_step(step("free_blocks", ([2, 1],), before, right))
    assert {v.rule for v in rules.check_step(step("free_blocks", ([2, 1],), before, wrong))} == {"free-order"}


def test_allocation_predicates():
    before = snap([0, 0, 0], [1, 2], {1: K}, {K: (1,)})
    stale = snap([0, 1, 0], [2], {1: K}, {K: (1,)})
    found = {v.rule for v in rules.check_step(step("get_new_blocks", (1,), before, stale, [1]))}
    assert "hash-map-consistency" in found
    wrong_head = snap([0, 0, 1], [1], {1: K}, {K: (1,)})
    found = {v.rule for v in rules.check_step(step("get_new_blocks", (1,), before, wrong_head, [2]))}
    assert {"allocation-accounting", "free-order"} <= found
    changed = snap([0, 1, 0], [2])
    found = {v.rule for v in rules.check_step(step("get_new_blocks", (5,), before, changed, None, ValueError()))}
    assert "allocation-accounting" in found


def test_reset_predicate():
    busy = snap([0, 1, 0], [2], {1: K}, {K: (1,)})
    cleared = snap([0, 1, 0], [2])
    assert "reset" in {v.rule for v in rules.check_step(step("reset_prefix_cache", (), busy, cleared, True))}
    idle = snap([0, 0, 0], [1, 2], {1: K}, {K: (1,)})
    assert "reset" in {v.rule for v in rules.check_step(step("reset_prefix_cache", (), idle, idle, False))}
    assert not rules.check_step(step("reset_prefix_cache", (), idle, snap([0, 0, 0], [1, 2]), True))


def test_null_never_handed_out_predicate():
    before = snap([0, 0], [0, 1])
    after = snap([1, 0], [1])
    assert "null-exclusion" in {v.rule for v in rules.check_step(step("get_new_blocks", (1,), before, after, [0]))}
