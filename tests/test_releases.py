"""The release axis (spec/releases/, chapter 9 of spec/README.md): each
delta, its chapter row and its rules in step; how a release is judged; and
that a delta is live -- the gate judges by the release asked for."""

import functools
import re
from pathlib import Path

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvspec import hashing
from kvspec.conformance.gate import GateOptions, run_gate
from kvspec.conformance.machines.layouts import LATER_LAYOUTS, MANAGER_LAYOUTS
from kvspec.conformance.machines.manager import manager_machine
from kvspec.conformance.runner import layout_names
from kvspec.conformance.targets.manager import ImplManagerTarget
from kvspec.conformance.targets.spec_manager import SpecManagerTarget
from kvspec.dropin_releases import impl_deltas
from kvspec.errors import SetupError
from kvspec.request import Request
from kvspec.spec import releases
from kvspec.spec.catalogue import RULES
from kvspec.spec.interface import ManagerSnapshot
from kvspec.spec.layout import Layout
from kvspec.spec.request_rules import ManagerStep, stats_records
from kvspec.testing import full

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = (ROOT / "spec" / "README.md").read_text().split("## 9. Releases", 1)[1].split("\n## ", 1)[0]
STATUS_WORDS = {releases.MODELLED: "modelled", releases.OUTSIDE: "outside", releases.NOT_MODELLED: "not modelled"}


def chapter_rows() -> dict[str, list[str]]:
    rows = {}
    for line in CHAPTER.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and (key := re.fullmatch(r"`([a-z-]+)`", cells[1])):
            rows[key[1]] = cells
    return rows


def test_every_delta_has_its_row_in_the_chapter_and_nothing_else_does():
    rows = chapter_rows()
    assert set(rows) == {d.key for d in releases.DELTAS}
    for delta in releases.DELTAS:
        release, _, status, rules, _ = rows[delta.key]
        assert release == delta.release, delta.key
        assert status == STATUS_WORDS[delta.status], delta.key
        assert [r.strip() for r in rules.split(",")] == (list(delta.rules) or ["--"]), delta.key
        for shown in delta.shows_on:
            assert f"`{shown}`" in rows[delta.key][4], f"{delta.key}: the chapter does not say it shows on {shown}"


def test_deltas_name_catalogue_rules_known_releases_and_real_layouts():
    keys = [d.key for d in releases.DELTAS]
    assert len(keys) == len(set(keys))
    order = [releases.version_key(d.release) for d in releases.DELTAS]
    assert order == sorted(order), "DELTAS are listed oldest release first"
    assert [releases.version_key(k) for k in releases.KNOWN] == sorted(releases.version_key(k) for k in releases.KNOWN)
    for delta in releases.DELTAS:
        assert delta.release in releases.KNOWN
        assert set(delta.rules) <= set(RULES), delta.key
        assert delta.status in STATUS_WORDS
        assert bool(delta.shows_on) == (delta.status == releases.NOT_MODELLED), delta.key
        for shown in delta.shows_on:
            scope, name = shown.split("/")
            # a layout may exist only from a later release on
            assert name in layout_names(scope, releases.judged(delta.release)), shown
    assert releases.KNOWN[0] == releases.BASE


def test_a_release_is_judged_by_the_newest_known_release_at_or_before_it():
    assert releases.judged("0.25.1").is_base and releases.judged("0.25.1").warning() is None
    assert releases.judged("0.27.1").known == "0.27.1"
    assert releases.judged("0.29.5").known == "0.29.0"
    assert releases.judged("0.31.0rc2").known == "0.31.0"
    newer = releases.judged("9.0.0")
    assert newer.known == releases.KNOWN[-1] and newer.beyond_known
    assert "newer than every release" in newer.warning() and releases.KNOWN[-1] in newer.warning()
    older = releases.judged("0.20.0")
    assert older.is_base and "older than" in older.warning()
    assert "not modelled yet: partial-hit-copy-on-write)" in \
        releases.judged("0.26.0").warning()
    assert [d.key for d in releases.deltas_until("0.27.0")] == [
        "partial-tail-entries", "partial-hit-copy-on-write", "zeroing-with-mamba-only", "dcp-on-hybrid-models",
        "pcp-outside-the-block", "processed-token-windows", "shared-prefix-boundary", "free-order-without-caching",
        "stats-at-admission"]


def test_bad_releases_and_delta_names_are_refused_by_name():
    with pytest.raises(ValueError, match="'latest' is not a vLLM release"):
        releases.judged("latest")
    with pytest.raises(ValueError, match="no release delta is named 'stats'"):
        releases.REFERENCE.has("stats")


def test_a_release_passed_to_the_hasher_chooses_its_hash_format():
    from types import SimpleNamespace

    salted = SimpleNamespace(cache_salt="s", lora_request=None, mm_features=[], prompt_embeds=None)
    later, earlier = releases.judged("0.31.0"), releases.judged("0.30.0")
    assert later.known == "0.31.0" and later.extra_key_format == "tagged"
    assert hashing.generate_block_hash_extra_keys(salted, 0, 16, 0, release=later)[0] == (("cache_salt", "s"),)
    assert hashing.generate_block_hash_extra_keys(salted, 0, 16, 0, release=earlier)[0] == ("s",)
    assert hashing.generate_block_hash_extra_keys(salted, 0, 16, 0)[0] == ("s",)  # no release: the reference's


def _step(op: str, **args) -> ManagerStep:
    empty = ManagerSnapshot(pool=None, tables={})
    return ManagerStep(op, args, empty, empty, result=args.pop("result", None), error=None)


def test_stats_count_lookups_in_the_base_and_admissions_from_0_27():
    from kvspec.request import Request

    layout = MANAGER_LAYOUTS["full"]
    request = Request("r1", list(range(40)))
    lookup = _step("get_computed_blocks", request=request, result=((), 16))
    admitted = _step("record_prefix_cache_stats", request=request, num_hits=16)
    base, later = releases.judged("0.25.1"), releases.judged("0.27.0")
    assert stats_records(lookup, layout, base) == [("lookup", 40, 16, False)]
    assert stats_records(admitted, layout, base) == []
    assert stats_records(lookup, layout, later) == []
    assert stats_records(admitted, layout, later) == [("lookup", 40, 16, False)]


def test_the_gate_judges_by_the_release_asked_for():
    """impl follows the release judged (its deltas, kvspec.impl.release):
    judged by 0.27's rules it conforms, and the report and trace say 0.27;
    judged by 0.33's, the Mamba `all` layouts are skipped, saying why."""
    report = run_gate(GateOptions(target="impl", scope="manager", level="L1", layouts=["full"], examples=30,
                                  seed=1, release="0.27.0"))
    (result,) = report.results
    assert result.conforms, result
    assert report.versions["release judged"] == "0.27.0"
    report = run_gate(GateOptions(target="impl", scope="manager", level="L1", layouts=["full+mamba-all"],
                                  examples=5, seed=1, release="0.33.0"))
    (result,) = report.results
    assert result.conforms and "no Mamba `all` cache mode" in result.skipped
    assert report.versions["release judged"] == "0.33.0"


@pytest.mark.parametrize("target", ["impl", "spec"])
def test_a_layout_where_a_not_modelled_delta_shows_is_skipped_naming_the_delta(target):
    """Judged by 0.34.0, the layout where delta partial-hits-under-dcp shows
    is skipped, the reason naming the delta and its release -- on purpose,
    not unsearched -- while 0.28.0, before the delta, searches it."""
    options = dict(target=target, scope="manager", level="L1", layouts=["full2+mamba-align-dcp2"], examples=3, seed=1)
    report = run_gate(GateOptions(**options, release="0.34.0"))
    (result,) = report.results
    assert result.skipped == "not modelled: release delta partial-hits-under-dcp (0.29.0)", result
    assert result.conforms and not result.unsearched and report.conforms and not report.unsearched
    (result,) = run_gate(GateOptions(**options, release="0.28.0")).results
    assert result.conforms and not result.skipped and result.operations > 0, result
    assert releases.judged("0.34.0").not_modelled("manager/full+swa") is None


def _impl_without(version: str, delta: str, layout: str, examples: int = 100) -> str | None:
    """The first failure of impl built for ``version`` less ``delta``, in
    lockstep with the spec judged by ``version`` (``None``: none found)."""
    release = releases.judged(version)
    deltas = impl_deltas(release) - {delta}
    factory = functools.wraps(ImplManagerTarget)(functools.partial(ImplManagerTarget, deltas=deltas))
    machine = manager_machine(factory, MANAGER_LAYOUTS[layout], release=release,
                              spec_factory=functools.partial(SpecManagerTarget, release=release))
    try:
        run_state_machine_as_test(machine, settings=settings(max_examples=examples, deadline=None,
                                                             database=None, phases=[Phase.generate]))
    except Exception as error:  # noqa: BLE001 (the failure is the answer)
        return str(error)
    return None


@pytest.mark.parametrize(("version", "delta", "layout", "says"), [
    ("0.26.0", "zeroing-with-mamba-only", "full", "is zeroed but was not taken fresh"),
    ("0.26.0", "processed-token-windows", "full+mamba-all-drafts", "content-soundness|divergence from the spec"),
    ("0.27.0", "stats-at-admission", "full", "record_prefix_cache_stats"),
    ("0.27.0", "free-order-without-caching", "caching-off", "free-order|divergence from the spec"),
    ("0.28.0", "free-order-restored", "caching-off", "free-order|divergence from the spec"),
    ("0.28.0", "zeroing-every-attention-group", "full+swa+mamba", "was taken fresh but is not zeroed"),
    ("0.30.0", "eagle-replay-boundaries", "full+swa-eagle-retention0", "divergence from the spec|hit-optimality"),
    ("0.33.0", "eagle-drop-needs-use-eagle", "full+swa-marked", "divergence from the spec|hit-optimality"),
])
def test_each_delta_impl_follows_is_live(version, delta, layout, says):
    """Built without one delta of the release judged, impl breaks a rule
    there: the delta is what makes it conform (and the rules read it).
    ``says``: a pattern of the failure (Hypothesis versions shrink to
    different first failures: the rule's, or the spec lockstep's)."""
    failure = _impl_without(version, delta, layout)
    assert failure is not None and re.search(says, failure), failure


@pytest.mark.parametrize("caching", [True, False])
def test_in_0_27_a_pool_without_caching_returns_freed_blocks_to_the_tail(caching):
    """Three blocks taken and freed (as a request frees, last first): in the
    base they go back to the head; in 0.27 a pool that caches nothing puts
    them at the tail, so the blocks never used are taken next; 0.28 puts
    them at the head again.  The spec's pool, impl's pool built with the
    release's deltas, and the free-order rule agree; the base order is a
    free-order violation on 0.27 only (measured on vLLM 0.26.0, 0.27.0 and
    0.28.0 themselves)."""
    from kvspec.conformance.targets.pool import ImplPoolTarget
    from kvspec.spec.pool import SpecBlockPool
    from kvspec.spec.rules import Step, check_step

    for version, expected in (("0.26.0", [3, 2, 1, 4, 5]), ("0.27.0", [3, 2, 1, 4, 5] if caching else [4, 5, 3, 2, 1]),
                              ("0.28.0", [3, 2, 1, 4, 5])):
        release = releases.judged(version)
        for pool in (SpecBlockPool(6, caching, 2, release=release), ImplPoolTarget(6, caching, 2, release=release)):
            taken = pool.get_new_blocks(3)
            ids = [getattr(b, "block_id", b) for b in taken][::-1]
            before = pool.snapshot()
            pool.free_blocks(ids)
            assert list(pool.snapshot().free) == expected, (version, type(pool).__name__)
            base_order = before.__class__(before.num_blocks, (0,) * 6, (3, 2, 1, 4, 5), before.key_of,
                                          before.table, before.partial_of)
            step = Step("free_blocks", (ids,), before, base_order, None, None, caching, release)
            said = [v.rule for v in check_step(step)]
            assert ("free-order" in said) == (expected != [3, 2, 1, 4, 5]), (version, said)


def test_impl_refuses_a_delta_it_does_not_implement():
    from kvspec.impl.release import require_deltas

    with pytest.raises(ValueError, match="does not implement release delta.*partial-hit-copy-on-write"):
        require_deltas({"partial-hit-copy-on-write"})
    with pytest.raises(TypeError, match="named by their keys"):
        require_deltas({1})
    layout = MANAGER_LAYOUTS["full"]
    with pytest.raises(ValueError, match="no-such-delta"):
        layout.make_target(ImplManagerTarget, deltas={"no-such-delta"})


def test_the_gate_refuses_a_release_that_is_no_version():
    with pytest.raises(SetupError, match="--release: 'next' is not a vLLM release"):
        run_gate(GateOptions(target="impl", scope="pool", layouts=["tiny-pool"], examples=1, release="next"))


def test_a_corpus_records_its_release_and_a_check_judges_by_it(tmp_path):
    import json

    from kvspec.conformance.targets.pool import ImplPoolTarget
    from kvspec.conformance.vectors.codec import check
    from kvspec.conformance.vectors.corpus import generate

    generate(tmp_path, "cases", release="0.31.0", measure_coverage=False)
    files = sorted(tmp_path.glob("*/cases/*.json"))
    assert files and all(json.loads(f.read_text())["config"]["release"] == "0.31.0" for f in files)
    pool_files = [f for f in files if f.parent.parent.name == "pool"]
    broken = json.loads(pool_files[0].read_text())
    broken["config"]["release"] = "next"
    pool_files[0].write_text(json.dumps(broken))
    report = check(tmp_path, {"pool": functools.partial(ImplPoolTarget, release=releases.REFERENCE)})
    assert not report.differences and list(report.unreadable) == [pool_files[0]]
    assert "'next' is not a vLLM release" in report.unreadable[pool_files[0]]


def test_from_0_26_prefill_ranks_no_longer_widen_a_block():
    """One process, two releases: mla-dcp2-pcp2's blocks hold 4 tokens under
    the base (2 decode x 2 prefill ranks) and 2 from 0.26 on."""
    layout = MANAGER_LAYOUTS["mla-dcp2-pcp2"]
    later = layout.for_release("0.26.0")
    assert (layout.scheduler_block_size, layout.hash_block_size, layout.views[0].block_size) == (4, 4, 4)
    assert (later.scheduler_block_size, later.hash_block_size, later.views[0].block_size) == (2, 2, 2)
    assert layout.scheduler_block_size == 4 and layout.release == releases.REFERENCE


def test_from_0_26_a_hybrid_of_full_attention_and_mamba_takes_decode_ranks():
    import dataclasses

    from kvspec.conformance.machines.layouts import LATER_LAYOUTS
    from kvspec.conformance.targets.spec_manager import SpecManagerTarget
    from kvspec.errors import RuleError

    dcp = LATER_LAYOUTS["full+mamba-align-dcp2"]
    swa = dataclasses.replace(MANAGER_LAYOUTS["full+swa"], dcp_world_size=2)
    prefill = dataclasses.replace(dcp, dcp_world_size=1, pcp_world_size=2)
    with pytest.raises(RuleError, match="needs a model of one KV-cache group"):
        dcp.make_target(SpecManagerTarget)
    release = releases.judged("0.26.0")
    spec = functools.partial(SpecManagerTarget, release=release)
    assert [v.block_size for v in dcp.for_release(release).views] == [2, 2]  # attention: 1 token a rank x 2
    dcp.for_release(release).make_target(spec)  # (Mamba: replicated)
    with pytest.raises(RuleError, match="full-attention and Mamba groups only, got SlidingWindowSpec"):
        swa.for_release(release).make_target(spec)
    with pytest.raises(RuleError, match="takes decode context parallelism only"):
        prefill.for_release(release).make_target(spec)


def test_a_later_release_s_layout_is_searched_there_and_skipped_with_its_reason_before():
    options = dict(target="spec", scope="manager", level="L1", layouts=["full+mamba-align-dcp2"], examples=5, seed=1)
    assert "full+mamba-align-dcp2" not in layout_names("manager")
    (result,) = run_gate(GateOptions(**options)).results
    assert result.conforms and "has no such configuration" in result.skipped, result
    (result,) = run_gate(GateOptions(**options, release="0.26.0")).results
    assert result.conforms and not result.skipped and result.operations > 0, result
    assert "full+mamba-align-dcp2" in layout_names("manager", releases.judged("0.26.0"))
    from kvspec.conformance.gate import make_plan

    assert ("manager", "full+mamba-align-dcp2") not in make_plan(GateOptions(target="impl", scope="manager"))
    # the default plan is made under the release judged, so a later release's layouts are in it
    assert ("manager", "full+mamba-align-dcp2") in make_plan(GateOptions(target="impl", scope="manager",
                                                                          release="0.26.0"))


def test_where_a_release_takes_decode_ranks_the_refused_variant_sends_prefill_ranks():
    from kvspec.conformance.machines.configurations import manager_variants

    def ranks(name, release=releases.REFERENCE):
        (variant,) = [v for v in manager_variants(MANAGER_LAYOUTS[name].for_release(release))
                      if v.name.startswith("context parallelism")]
        return variant.layout.dcp_world_size, variant.layout.pcp_world_size

    assert ranks("full+mamba-align") == ranks("full+swa") == (2, 1)
    later = releases.judged("0.26.0")
    assert ranks("full+mamba-align", later) == (1, 2) and ranks("full+swa", later) == (2, 1)


def test_a_fixed_finding_is_steered_around_only_on_the_releases_that_have_it():
    from kvspec.conformance.findings import inputs_to_avoid

    tag = "context-parallel:hybrid-per-group-lookup"  # F12: 0.26.0 up to 0.29.0
    assert tag not in inputs_to_avoid("vllm", release=releases.BASE)
    for version, steered in (("0.26.0", True), ("0.28.0", True), ("0.29.0", False)):
        assert (tag in inputs_to_avoid("vllm", release=version)) == steered, version


def test_from_0_26_a_mamba_group_frees_states_on_the_processed_token_basis():
    """With 2 speculative blocks, the base holds back 2 computed tokens
    before freeing Mamba states (the caller may count unverified drafts);
    from 0.26 the caller passes processed tokens and nothing is held back."""
    layout = MANAGER_LAYOUTS["full+mamba-all-drafts"]
    assert layout.views[1].window_hold_back == 2
    assert layout.for_release("0.26.0").views[1].window_hold_back == 0


def test_from_0_32_an_eagle_hit_in_a_hybrid_may_be_proved_by_the_prompt_s_last_block():
    """Full attention + sliding window with EAGLE, blocks of 2: a first
    request computes 4 tokens, which are cached.  A second request of the
    same 4 tokens: the base's EAGLE search stops at token 3 (num_tokens -
    1), finds one block and drops it: no hit.  0.32's search may read the
    second block, whose hash the request has, and keeps the first: 2."""
    from kvspec.hashing import get_request_block_hasher
    from kvspec.request import Request
    from kvspec.spec.manager import SpecKVCacheManager

    layout = MANAGER_LAYOUTS["full+swa-eagle"]

    def resend_hit(version):
        manager = SpecKVCacheManager(*layout.for_release(version).target_args(), release=version)
        hasher = get_request_block_hasher(layout.hash_block_size, release=releases.judged(version))
        first = Request("a", [1, 2, 3, 4, 5], block_hasher=hasher)
        assert manager.allocate_slots(first, 5) is not None
        first.num_computed_tokens = 4
        manager.cache_blocks(first, 4)
        manager.new_step_starts()
        _, hit = manager.get_computed_blocks(Request("b", [1, 2, 3, 4], block_hasher=hasher))
        return hit

    assert resend_hit(releases.BASE) == 0
    assert resend_hit("0.32.0") == 2


def test_from_0_26_a_full_attention_group_registers_the_prompt_s_partial_tail():
    """Full attention with blocks of 8 over hash blocks of 2 (and a window):
    a 13-token prompt computed to 16 tokens caches block 0 and block 1; from
    0.26 block 1 is also a partial entry for the prompt's first 12 tokens
    (from 0.32 the same: 12 is within the prompt less its last token), with a
    Stored event of one hash block; the base registers none."""
    from kvspec.hashing import get_request_block_hasher
    from kvspec.request import Request
    from kvspec.spec.interface import Stored
    from kvspec.spec.manager import SpecKVCacheManager

    layout = MANAGER_LAYOUTS["full8+swa2-sparse"]

    def partial_entries(version):
        release = releases.judged(version)
        manager = SpecKVCacheManager(*layout.for_release(release).target_args(), release=release)
        request = Request("a", list(range(13)), block_hasher=get_request_block_hasher(layout.hash_block_size,
                                                                                      release=release))
        assert manager.allocate_slots(request, 13) is not None
        request.num_computed_tokens = 13
        for token in (13, 14, 15):
            request.append_output_token_ids(token)
            assert manager.allocate_slots(request, 1) is not None
            request.num_computed_tokens += 1
        manager.cache_blocks(request, 16)
        events = [e for e in manager.take_events() if isinstance(e, Stored) and e.group == 0]
        pool = manager.snapshot().pool
        return {b: len(keys) for b, keys in pool.partial_of.items()}, [e.block_size for e in events]

    assert partial_entries(releases.BASE) == ({}, [8, 8])
    for version in ("0.26.0", "0.32.0"):
        partial, sizes = partial_entries(version)
        assert list(partial.values()) == [1] and sorted(sizes) == [2, 8, 8], version


def _manager(layout_name: str, release: releases.Release, manager_kind: str) -> object:
    """The spec's manager of ``release`` or impl's (built with ``release``'s
    deltas) on a conformance layout."""
    from kvspec.impl import KVCacheManager
    from kvspec.spec.manager import SpecKVCacheManager

    layout = MANAGER_LAYOUTS[layout_name].for_release(release)
    args = (layout.kv_cache_config(), layout.max_model_len, layout.scheduler_block_size, layout.hash_block_size)
    return KVCacheManager(*args, deltas=impl_deltas(release)) if manager_kind == "impl" \
        else SpecKVCacheManager(*args, release=release)


def _prefill_with_a_step_in_flight(version: str, manager_kind: str) -> list[int]:
    """A 16-token prompt prefilled 4 tokens a step on full attention + Mamba
    align (blocks of 2), as vLLM's engine runs it under async scheduling:
    each step is allocated while the one before is still in the forward
    pass (its tokens in flight).  Returns the Mamba table's held
    (non-null) positions after each allocation."""
    from kvspec.hashing import get_request_block_hasher
    from kvspec.request import Request

    layout = MANAGER_LAYOUTS["full+mamba-align"]
    release = releases.judged(version)
    manager = _manager("full+mamba-align", release, manager_kind)
    request = Request("r", list(range(16)), block_hasher=get_request_block_hasher(layout.hash_block_size,
                                                                                  release=release))
    request.num_in_flight_tokens = 0
    held = []
    for _ in range(4):
        assert manager.allocate_slots(request, 4) is not None
        request.num_computed_tokens += 4  # the scheduler counts the step as computed ...
        request.num_in_flight_tokens = 4  # ... and only the step before it has come back
        held.append([i for i, b in enumerate(manager.get_block_ids("r")[1]) if b != 0])
    return held


def test_mamba_states_leave_on_processed_tokens_and_past_null_gaps():
    """With a step in flight, the state two steps back cannot go yet
    (processed-token-windows: its window still holds it), and by the time it
    can, the next step's allocation has moved on: until 0.29 it stays held
    below a null gap; from 0.30 (mamba-retire-across-gaps) it goes.  The
    spec and impl agree on each release."""
    for version in ("0.29.0", "0.30.0"):
        held = _prefill_with_a_step_in_flight(version, "spec")
        assert held == _prefill_with_a_step_in_flight(version, "impl"), version
    # Until 0.29 each state below a gap stays: one more held block per step of a long prefill.
    assert _prefill_with_a_step_in_flight("0.29.0", "spec") == [[1], [1, 3], [1, 3, 5], [1, 3, 5, 7]]
    assert _prefill_with_a_step_in_flight("0.30.0", "spec")[-1] == [3, 5, 7]
    # The base counts every computed token as processed: the previous state goes a step earlier.
    assert _prefill_with_a_step_in_flight("0.25.1", "impl")[-1] == [5, 7]


def test_a_drafter_moves_the_replay_boundaries_a_scheduler_block_lower():
    from kvspec.spec.coordinator import replay_boundaries

    for version, aligned, unaligned in (("0.29.0", (15,), (14,)), ("0.30.0", (8, 12), (8,))):
        release = releases.judged(version)
        assert replay_boundaries(16, 4, with_drafter=True, release=release) == aligned
        assert replay_boundaries(15, 4, with_drafter=True, release=release) == unaligned
        assert replay_boundaries(16, 4, with_drafter=False, release=release) == (15,)
    assert replay_boundaries(3, 4, with_drafter=True, release=releases.judged("0.30.0")) == (0,)


def _adopt_a_hit_with_no_new_tokens(version: str, manager_kind: str) -> object:
    """A second request hits the first's two cached blocks and adopts them
    with no new tokens of its own: its block ids, or the refusal's rule."""
    from kvspec.errors import RuleError
    from kvspec.hashing import get_request_block_hasher
    from kvspec.request import Request

    layout = MANAGER_LAYOUTS["full"]
    release = releases.judged(version)
    manager = _manager("full", release, manager_kind)
    hasher = get_request_block_hasher(layout.hash_block_size, release=release)
    size = layout.hash_block_size
    first = Request("a", list(range(2 * size + 1)), block_hasher=hasher)
    assert manager.allocate_slots(first, first.num_tokens) is not None
    second = Request("b", list(range(2 * size + 1)), block_hasher=hasher)
    blocks, hit = manager.get_computed_blocks(second)[:2]
    assert hit == 2 * size
    try:
        out = manager.allocate_slots(second, 0, hit, blocks)
    except RuleError as error:
        return error.rule
    assert out is not None
    return manager.get_block_ids("b")


def test_from_0_31_a_call_with_no_new_tokens_may_adopt_a_hit():
    """Delta zero-token-hit-adoption: until 0.30 allocate_slots refuses a
    call with no new and no external tokens; from 0.31 it adopts a local hit
    (vLLM 0.31 itself accepts it: docs/release-survey/zero_new_tokens_with_a_hit.py).
    The spec and impl agree; a call that adopts nothing stays refused."""
    for version in ("0.30.0", "0.31.0"):
        assert _adopt_a_hit_with_no_new_tokens(version, "spec") == _adopt_a_hit_with_no_new_tokens(version, "impl")
    assert _adopt_a_hit_with_no_new_tokens("0.30.0", "impl") == "allocation-accounting"
    adopted = _adopt_a_hit_with_no_new_tokens("0.31.0", "impl")
    assert [len(ids) for ids in adopted] == [2]  # the two hit blocks, nothing allocated
    from kvspec.errors import RuleError
    from kvspec.impl import KVCacheManager
    from kvspec.request import Request

    layout = MANAGER_LAYOUTS["full"]
    manager = KVCacheManager(layout.kv_cache_config(), layout.max_model_len, layout.scheduler_block_size,
                             layout.hash_block_size, deltas=impl_deltas(releases.judged("0.31.0")))
    with pytest.raises(RuleError, match="no hit to adopt"):
        manager.allocate_slots(Request("c", [1, 2, 3]), 0)


def _two_images_then_a_generated_token(version: str, first_image: str) -> tuple[list, list]:
    """Block hashes of a 7-token prompt whose second hash block holds two
    images (tokens 4-5 and 6), completed by one generated token (the hasher
    resumes inside the request), and of a fresh 8-token request with the
    same tokens and images (vLLM 0.31's own
    test_request_block_hasher_incremental_append_with_multiple_mm_features)."""
    from kvspec.hashing import get_request_block_hasher
    from kvspec.request import MultiModalFeatureSpec, PlaceholderRange, Request

    features = [MultiModalFeatureSpec(first_image, PlaceholderRange(4, 2)),
                MultiModalFeatureSpec("B", PlaceholderRange(6, 1))]
    hasher = get_request_block_hasher(4, release=releases.judged(version))
    resumed = Request("r", list(range(7)), mm_features=features, block_hasher=hasher)
    resumed.append_output_token_ids(7)
    fresh = Request("f", list(range(8)), mm_features=features, block_hasher=hasher)
    return list(resumed.block_hashes), list(fresh.block_hashes)


def test_from_0_31_a_resumed_block_keys_every_image_it_holds():
    """Delta mm-keys-on-resume: until 0.30 a block completed by generated
    tokens is keyed by the request's last image only, so two requests
    differing only in the block's first image share the block's hash (and
    the second would hit KV computed for the first's image); from 0.31
    both images key it, as a fresh request's hash of the same tokens does."""
    before = _two_images_then_a_generated_token("0.30.0", "A")
    (old_a, fresh_a), (old_c, _) = before, _two_images_then_a_generated_token("0.30.0", "C")
    assert len(old_a) == 2 and old_a[1] == old_c[1]  # the collision: the first image is not in the key
    assert old_a[1] != fresh_a[1]  # and a resumed chain is not a fresh one
    (new_a, fresh_a), (new_c, _) = (_two_images_then_a_generated_token("0.31.0", image) for image in ("A", "C"))
    assert new_a[1] != new_c[1] and new_a == fresh_a
    assert _two_images_then_a_generated_token("0.30.0", "A") == before  # hashing for 0.31 changed nothing else


def test_from_0_32_the_pool_keys_a_partial_entry_at_a_block_boundary():
    """Delta partial-entries-at-boundaries: until 0.31 cache_partial_block
    refuses an entry at a block boundary or in a block of one hash block
    (vLLM asserted: docs/release-survey/partial_entry_at_a_block_boundary.py);
    from 0.32 it keys it, and the spec's pool and impl's agree on the state.
    A boundary that is no whole hash block stays refused."""
    from kvspec.conformance.targets.pool import ImplPoolTarget
    from kvspec.errors import RuleError
    from kvspec.hashing import get_request_block_hasher
    from kvspec.request import Request
    from kvspec.spec.pool import SpecBlockPool

    for version, accepted in (("0.31.0", False), ("0.32.0", True)):
        release = releases.judged(version)
        states = []
        for pool in (SpecBlockPool(6, True, 2, release=release), ImplPoolTarget(6, True, 2, release=release)):
            request = Request("a", [0, 1, 0, 1], block_hasher=get_request_block_hasher(2, release=release))
            (block,) = pool.get_new_blocks(1)
            block = getattr(block, "block_id", block)
            for num_tokens, block_size in ((2, 2), (4, 4)):
                if accepted:
                    pool.cache_partial_block(request, block, num_tokens, 0, block_size)
                else:
                    with pytest.raises(RuleError):
                        pool.cache_partial_block(request, block, num_tokens, 0, block_size)
            with pytest.raises(RuleError, match="not a partial block boundary"):
                pool.cache_partial_block(request, block, 3, 0, 4)
            states.append(pool.snapshot())
        assert states[0] == states[1], version
        assert bool(states[0].table) == accepted


def test_from_0_32_a_connector_s_per_group_lookup_peeks_as_the_reconciled_one_does():
    """Delta eagle-lookahead-hashes reaches the per-group lookup a KV
    connector asks (vLLM 0.32's find_longest_cache_hit_per_group): on a
    block-aligned prompt an EAGLE full-attention group searches up to the
    last full hash block, so it keeps one block more than on 0.31."""
    from kvspec.hashing import get_request_block_hasher
    from kvspec.impl import KVCacheManager
    from kvspec.request import Request
    from kvspec.testing import config, full, mamba

    hits = {}
    for version in ("0.31.0", "0.32.0"):
        manager = KVCacheManager(config(full(4), mamba(4, "align"), num_blocks=32), 64, 4, 4, use_eagle=True,
                                 deltas=impl_deltas(releases.judged(version)))
        first = Request("a", list(range(16)), block_hasher=get_request_block_hasher(4))
        assert manager.allocate_slots(first, 16) is not None
        second = Request("b", list(range(16)), block_hasher=get_request_block_hasher(4))
        _, lengths = manager.coordinator.find_longest_cache_hit_per_group(second.block_hashes, 15)
        hits[version] = lengths[0]
    assert hits == {"0.31.0": 8, "0.32.0": 12}


def _sibling_in_the_step_the_owner_passes_its_boundary(version: str, manager_kind: str,
                                                       evicted: bool = False) -> bool:
    """A prompt of 5 tokens (blocks and hash blocks of 2: its last reusable
    state boundary is 4) computed as vLLM's scheduler splits it for Mamba
    align -- 4 tokens, then in the next step the fifth -- and, in that next
    step, a sibling with the same prompt hitting the state at 4: admitted?
    ``evicted``: the state's key is evicted (``evict_blocks``) between the
    steps, while the owner holds it.  (docs/release-survey/
    mamba_boundary_remarked.py and boundary_rekeyed_after_eviction.py show
    it on vLLM.)"""
    from kvspec.hashing import get_request_block_hasher
    from kvspec.request import Request

    layout = MANAGER_LAYOUTS["full+mamba-align"]
    release = releases.judged(version)
    manager = _manager("full+mamba-align", release, manager_kind)
    hasher = get_request_block_hasher(layout.hash_block_size, release=release)
    owner = Request("a", [1, 2, 3, 4, 5], block_hasher=hasher)
    assert manager.allocate_slots(owner, 4) is not None
    owner.num_computed_tokens = 4
    if evicted:
        manager.evict_blocks({manager.get_block_ids("a")[1][1]})  # Mamba's state at 4
    manager.new_step_starts()
    assert manager.allocate_slots(owner, 1) is not None
    sibling = Request("b", [1, 2, 3, 4, 5], block_hasher=hasher)
    blocks, hit = manager.get_computed_blocks(sibling)[:2]
    assert hit == 4
    return manager.allocate_slots(sibling, 1, hit, blocks) is not None


def test_in_0_32_only_a_sibling_waits_while_the_owner_passes_its_prompt_boundary():
    """Deltas mamba-boundary-remarked (0.32.0) and mamba-boundary-remark-fixed
    (0.33.0): on 0.32 Mamba align counts the state at the prompt's last
    reusable boundary cached again in the step the owner computes past it,
    so the sibling's hit on it waits a step; 0.31 and 0.33 admit it.  The
    spec and impl agree on each release (vLLM 0.31 admits, 0.32 refuses,
    0.34 admits: the standalone script)."""
    for version, admitted in (("0.31.0", True), ("0.32.0", False), ("0.33.0", True)):
        assert _sibling_in_the_step_the_owner_passes_its_boundary(version, "spec") is admitted, version
        assert _sibling_in_the_step_the_owner_passes_its_boundary(version, "impl") is admitted, version


@pytest.mark.parametrize("kind", ["spec", "impl"])
@pytest.mark.parametrize("version", ["0.32.0", "0.33.0", "0.34.0"])
def test_from_0_32_a_boundary_state_evicted_while_held_is_keyed_again_and_counted_this_step(kind, version):
    """Delta mamba-boundary-remark-fixed keys the prompt's boundary state
    only where its block does not hold that key: a key evict_blocks took
    from a block the owner still holds comes back at the owner's next
    caching call at that boundary, counted cached this step, so the
    sibling's hit on it waits (vLLM 0.34.0 does so:
    docs/release-survey/boundary_rekeyed_after_eviction.py; the gate found
    it at L3 on full+swa+mamba-retention)."""
    assert _sibling_in_the_step_the_owner_passes_its_boundary(version, kind, evicted=True) is False


def _boundary_state_keyed_again(layout_name: str, version: str, manager_kind: str) -> bool:
    """The owner of a 5-token prompt (blocks and hash blocks of 2: its last
    reusable boundary is 4) computes 4 tokens, its Mamba state at 4 loses
    its key (``evict_blocks``), and it computes the fifth token: is the
    state keyed again?"""
    from kvspec.hashing import get_request_block_hasher
    from kvspec.impl import KVCacheManager
    from kvspec.request import Request
    from kvspec.spec.manager import SpecKVCacheManager

    release = releases.judged(version)
    layout = (MANAGER_LAYOUTS[layout_name] if layout_name in MANAGER_LAYOUTS else LATER_LAYOUTS[layout_name]) \
        .for_release(release)
    args = (layout.kv_cache_config(), layout.max_model_len, layout.scheduler_block_size, layout.hash_block_size)
    manager = KVCacheManager(*args, **layout.target_options(), deltas=impl_deltas(release)) \
        if manager_kind == "impl" else SpecKVCacheManager(*args, **layout.target_options(), release=release)
    owner = Request("a", [1, 2, 3, 4, 5], block_hasher=get_request_block_hasher(layout.hash_block_size,
                                                                                release=release))
    assert manager.allocate_slots(owner, 4) is not None
    owner.num_computed_tokens = 4
    state = manager.get_block_ids("a")[1][1]
    manager.evict_blocks({state})
    manager.new_step_starts()
    assert manager.allocate_slots(owner, 1) is not None
    return state in (manager.pool.snapshot().key_of if manager_kind == "spec"
                     else {b.block_id for b in manager.block_pool.blocks if b.block_hash is not None})


@pytest.mark.parametrize("kind", ["spec", "impl"])
def test_from_0_29_caching_under_decode_ranks_is_not_rounded_so_the_boundary_state_stays_unkeyed(kind):
    """Delta unrounded-caching-under-dcp: under decode ranks with a Mamba
    align block at least the hash block, the owner's caching call after its
    prompt's boundary covers 5 tokens, not 4, so the state whose key was
    evicted is not keyed again (vLLM 0.34.0: the gate met it at L3 on
    full+mamba-align-dcp2, seed 3); without decode ranks it is (delta
    mamba-boundary-remark-fixed)."""
    assert _boundary_state_keyed_again("full+mamba-align", "0.34.0", kind)
    assert not _boundary_state_keyed_again("full+mamba-align-dcp2", "0.34.0", kind)


def _cached_under_lookahead(version: str, manager_kind: str) -> list[bool] | str:
    """Which of a 12-token request's six blocks (layout ``full``: blocks of
    2) a manager with EAGLE's lookahead token (L = 1) caches once all 12
    tokens are computed; the rule of a refusal where the release has no
    lookahead argument."""
    from kvspec.errors import RuleError
    from kvspec.hashing import get_request_block_hasher
    from kvspec.impl import KVCacheManager
    from kvspec.request import Request
    from kvspec.spec.manager import SpecKVCacheManager

    layout = MANAGER_LAYOUTS["full"]
    args = (layout.kv_cache_config(), layout.max_model_len, layout.scheduler_block_size, layout.hash_block_size)
    release = releases.judged(version)
    try:
        manager = KVCacheManager(*args, deltas=impl_deltas(release), num_hash_lookahead_tokens=1) \
            if manager_kind == "impl" else SpecKVCacheManager(*args, num_hash_lookahead_tokens=1, release=release)
    except (RuleError, ValueError) as error:
        return getattr(error, "rule", "ValueError")
    request = Request("r", list(range(12)), block_hasher=get_request_block_hasher(layout.hash_block_size,
                                                                                  hashing.sha256_cbor, 1,
                                                                                  release=release))
    assert manager.allocate_slots(request, 12) is not None
    request.num_computed_tokens = 12
    if manager_kind == "impl":
        return [b.block_hash is not None for b in manager.get_blocks("r").blocks[0]]
    keys = manager.pool.snapshot().key_of
    return [b in keys for b in manager.get_block_ids("r")[0]]


def test_from_0_33_hashes_cover_the_drafter_s_lookahead_and_only_hashed_blocks_are_cached():
    """Delta lookahead-block-hashes: with L = 1 the last block of 12 tokens
    (blocks of 2) has no hash yet -- its lookahead token is the 13th -- and
    neither the spec nor impl caches it; before 0.33 a manager refuses the
    argument."""
    for kind in ("spec", "impl"):
        assert _cached_under_lookahead("0.33.0", kind) == [True] * 5 + [False], kind
    assert _cached_under_lookahead("0.32.0", "spec") == "content-soundness"
    assert _cached_under_lookahead("0.32.0", "impl") == "ValueError"


@pytest.mark.parametrize(("version", "builds"), [("0.28.0", False), ("0.29.0", True), ("0.34.0", True)])
def test_several_groups_of_one_spec_build_from_0_29(version, builds):
    """Delta hybrid-one-spec-group: two full-attention groups of one spec
    are refused with caching on until 0.28 and built from 0.29, by the spec
    and by impl alike; built, the two groups are searched as one spec group
    (one hit, the same length in both)."""
    release = releases.judged(version)
    layout = Layout((full(2), full(2)), release=release)
    targets = [lambda: layout.make_target(functools.partial(SpecManagerTarget, release=release)),
               lambda: layout.make_target(functools.partial(ImplManagerTarget, release=release))]
    for make in targets:
        if not builds:
            with pytest.raises(ValueError, match="distinct"):
                make()
            continue
        manager = make()
        hasher = hashing.get_request_block_hasher(layout.hash_block_size, release=release)
        a = Request("a", [0, 1, 1, 0, 1], block_hasher=hasher)
        assert manager.allocate_slots(a, 5) is not None
        a.num_computed_tokens = 5
        manager.free(a)
        blocks, hit = manager.get_computed_blocks(Request("b", [0, 1, 1, 0, 1, 1], block_hasher=hasher))
        assert hit == 4 and [len(group) for group in blocks] == [2, 2]


def test_the_version_matrix_judges_the_reference_and_the_newest_at_l3(tmp_path):
    """``tools/version_matrix.py --conform`` runs L3 on the two releases the
    project is judged on -- a matrix of quick L1 runs read "none failing"
    for 0.34.0 while its L3 gate was red (issue 52) -- and reads failures
    from the report, not from the terminal's lines."""
    import importlib.util
    import json
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("version_matrix", Path(__file__).parents[1] / "tools" /
                                                  "version_matrix.py")
    matrix = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(matrix)
    for version in (releases.BASE, releases.KNOWN[-1]):
        options = matrix.conform_options(version)
        assert options[options.index("--level") + 1] == "L3" and "quick" not in options
    between = next(v for v in releases.KNOWN if v not in (releases.BASE, releases.KNOWN[-1]))
    assert "L1" in matrix.conform_options(between)
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"results": [
        {"scope": "manager", "layout": "full", "conforms": True, "rules": [], "details": []},
        {"scope": "manager", "layout": "full+swa", "conforms": False, "rules": ["free-order"], "details": ["x"]},
        {"scope": "manager", "layout": "rswa", "conforms": False, "rules": [],
         "details": ["divergence from the spec: free(r1): block tables differ"]},
        {"scope": "scheduler", "layout": "full", "conforms": False, "rules": ["content-soundness"], "details": [],
         "owner": "vllm-scheduler"}]}))
    assert matrix.failed_layouts(report) == ["manager/full+swa (free-order)", "manager/rswa (divergence from the spec)"]
    assert matrix.failed_layouts(tmp_path / "none.json") == []


def test_two_releases_specs_run_side_by_side_in_one_process():
    """The release is a value passed in, never process-wide state (issue 53):
    the spec of 0.25.1 and that of 0.34.0 are built in one process and
    driven in turns, each by its own rules -- a call with no new tokens
    adopting a hit (delta zero-token-hit-adoption, 0.31) is refused by the
    first and taken by the second, a salted block hashes as each release
    hashes it (tagged-extra-keys), and the conformance machines of both
    releases run on one layout, one after the other, neither leaking into
    the other."""
    from types import SimpleNamespace

    from kvspec.errors import RuleError
    from kvspec.spec.manager import SpecKVCacheManager

    assert not any(hasattr(releases, name) for name in ("use", "current", "judging", "_current"))
    base, newest = releases.judged("0.25.1"), releases.judged("0.34.0")
    layout = MANAGER_LAYOUTS["full"]
    managers = {r: SpecKVCacheManager(*layout.for_release(r).target_args(), release=r) for r in (base, newest)}
    hashers = {r: hashing.get_request_block_hasher(layout.hash_block_size, release=r) for r in (base, newest)}
    size = layout.hash_block_size
    firsts = {r: Request("a", list(range(2 * size + 1)), block_hasher=hashers[r]) for r in managers}
    for r, manager in managers.items():  # both live at once, driven in turns
        assert manager.allocate_slots(firsts[r], firsts[r].num_tokens) is not None
    adopted = {}
    for r, manager in managers.items():
        second = Request("b", list(range(2 * size + 1)), block_hasher=hashers[r])
        blocks, hit = manager.get_computed_blocks(second)[:2]
        assert hit == 2 * size
        try:
            adopted[r] = manager.allocate_slots(second, 0, hit, blocks) is not None
        except RuleError as error:
            adopted[r] = error.rule
    assert adopted == {base: "allocation-accounting", newest: True}
    assert managers[base].release is base and managers[newest].pool.release is newest

    salted = SimpleNamespace(cache_salt="s", lora_request=None, mm_features=[], prompt_embeds=None)
    assert [hashing.generate_block_hash_extra_keys(salted, 0, 2, 0, release=r)[0] for r in (base, newest)] == \
        [("s",), (("cache_salt", "s"),)]

    for r in (base, newest, base):
        machine = manager_machine(functools.partial(SpecManagerTarget, release=r), layout, release=r,
                                  spec_factory=functools.partial(SpecManagerTarget, release=r))
        run_state_machine_as_test(machine, settings=settings(max_examples=5, deadline=None, database=None,
                                                             phases=[Phase.generate]))


def test_each_release_is_one_module_of_its_own_deltas():
    """spec/releases/ holds the base (base.py) and one module per later
    release, oldest first, each chained to the one before (PREVIOUS) and
    holding only its own release's deltas; no module is left unregistered."""
    modules = releases.RELEASE_MODULES
    assert [m.PREVIOUS for m in modules] == list(releases.KNOWN[:-1])
    assert [m.RELEASE for m in modules] == list(releases.KNOWN[1:])
    for module in modules:
        assert module.__name__.rsplit(".", 1)[1] == "v" + module.RELEASE.replace(".", "_")
        assert all(d.release == module.RELEASE for d in module.DELTAS), module.__name__
    files = {p.stem for p in (ROOT / "spec" / "releases").glob("*.py")}
    assert files == {"__init__", "base", *(m.__name__.rsplit(".", 1)[1] for m in modules)}


def test_chapter_9_lists_the_deltas_release_by_release_as_the_modules_do():
    """Chapter 9's table is checked against the modules: a row per delta
    (test_every_delta_has_its_row_in_the_chapter_and_nothing_else_does),
    in the modules' order."""
    assert list(chapter_rows()) == [d.key for d in releases.DELTAS]


def test_the_add_a_release_checklist_holds_for_every_known_release():
    """docs/CONTRIBUTING.md's "Add a vLLM release" names each place a
    release lives, and each is there for every release the spec knows: its
    module (above), its deltas' rows in chapter 9, impl following its
    modelled deltas, the drop-in's API shape, and -- for the newest -- its
    vectors, generated and replayed by .ci/run."""
    from kvspec.dropin_releases import API

    section = (ROOT / "docs" / "CONTRIBUTING.md").read_text().split("## Add a vLLM release", 1)[1].split("\n## ")[0]
    for named in ("spec/releases/", "RELEASE_MODULES", "spec/README.md", "impl/release.py",
                  "kvspec/dropin_releases.py", "kvspec vectors generate --release", ".ci/run",
                  "test_the_add_a_release_checklist_holds_for_every_known_release"):
        assert named in section, named
    rows = chapter_rows()
    for module in releases.RELEASE_MODULES:
        version = module.RELEASE
        assert all(d.key in rows for d in module.DELTAS), version
        impl_deltas(releases.judged(version))  # impl follows every modelled delta (else a ValueError names it)
        assert version in API, f"the drop-in has no API shape for vLLM {version} (kvspec/dropin_releases.py)"
    newest = releases.KNOWN[-1]
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(rf"kvspec vectors generate --out (\S+) --release {re.escape(newest)}\b", ci), newest
