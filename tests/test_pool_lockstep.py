"""Spec and impl side by side: every observation equal, every rule kept.

As for the manager machine (test_manager_lockstep.py), the depth of this
search lives in ``kvspec conform --target impl`` (the README's main job, run
by CI before the suite, at 250 examples a layout); the ci profile runs a
quarter of it here, the long profile all of it."""

import os

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from kvspec.conformance.machines.pool import LAYOUTS, pool_machine
from kvspec.conformance.settings import load_profile
from kvspec.conformance.targets.pool import ImplPoolTarget, SpecPoolTarget
from kvspec.hashing import make_block_hash_with_group_id
from operations import record


@pytest.mark.parametrize("name", LAYOUTS)
def test_impl_matches_spec(name, request):
    machine = pool_machine(ImplPoolTarget, LAYOUTS[name])
    ci = os.environ.get("HYPOTHESIS_PROFILE") == "ci"
    full = load_profile()
    run_state_machine_as_test(machine, settings=settings(full, max_examples=full.max_examples // (4 if ci else 1)))
    record(request, f"pool {name}", machine.steps_run)
    if full.max_examples >= 250:  # the ci and long profiles: 20,000 operations over the layouts (ci: a quarter)
        wanted = 20_000 // len(LAYOUTS) // (4 if ci else 1)
        assert machine.steps_run >= wanted, f"{name}: only {machine.steps_run} operations"
    assert machine.steps_run > 0


def test_spec_keeps_its_own_rules():
    machine = pool_machine(SpecPoolTarget, LAYOUTS["two-groups"], lockstep=False)
    run_state_machine_as_test(machine, settings=settings(load_profile(), max_examples=50))




class CountingPartials(ImplPoolTarget):
    """impl, counting partial entries made and the lookups they answered."""

    made = 0
    hits = 0

    def cache_partial_block(self, request, block_id, num_tokens, group_id, block_size):
        key = super().cache_partial_block(request, block_id, num_tokens, group_id, block_size)
        CountingPartials.made += key is not None
        return key

    def get_cached_block(self, block_hash, group_ids):
        found = super().get_cached_block(block_hash, group_ids)
        sizes = LAYOUTS["wide-blocks"].group_block_sizes
        for g, b in zip(group_ids, found or (), strict=False):
            block = self.pool.blocks[b]
            own = block.block_hash == make_block_hash_with_group_id(block_hash, g)
            CountingPartials.hits += not own or block.block_hash_num_tokens % sizes[g] != 0
        return found


def test_the_machine_makes_and_hits_partial_entries():
    """Partial-block entries are gate input: the pool machine makes them (a
    block's own key and further entries beside it) and looks them up."""
    # Sized and derandomized so that no profile or Hypothesis release draws too little to meet a hit: blocks
    # of 4 over 1-token hashes, three places per block where an entry can end.
    machine = pool_machine(CountingPartials, LAYOUTS["wide-blocks"])
    run_state_machine_as_test(machine, settings=settings(load_profile(), max_examples=150, stateful_step_count=50,
                                                         derandomize=True))
    assert CountingPartials.made > 0 and CountingPartials.hits > 0, (CountingPartials.made, CountingPartials.hits)


class PredatesPartials(ImplPoolTarget):
    """A pool from before partial entries: the adapter says it has none."""

    def __init__(self, *args):
        super().__init__(*args)
        self.offers_partial_entries = False

    def cache_partial_block(self, *args):
        raise AssertionError("called on a pool that has no partial entries")


def test_a_pool_without_partial_entries_is_judged_without_them():
    run_state_machine_as_test(pool_machine(PredatesPartials, LAYOUTS["two-groups"]),
                              settings=settings(load_profile(), max_examples=20))
