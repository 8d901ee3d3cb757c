"""The cache scope (spec chapter 10): any engine's prefix cache through its
content view.  kvspec's own manager and the spec conform; planted faults of
any design are caught, by the rule they break; an engine that is not
installed is a usage error in one line."""

import importlib.util
import json

import pytest
from hypothesis import settings

from kvspec.cli import main
from kvspec.conformance.machines.cache import CACHE_LAYOUTS
from kvspec.conformance.runner import Search, layout_unsupported, machine_for, rules_checked, run_layout

QUICK = settings(max_examples=60, stateful_step_count=40, deadline=None, derandomize=True, database=None)


def search(target, layout, level="L1", examples=60):
    return run_layout(machine_for("cache", layout, target, level), Search(QUICK, examples=examples))


@pytest.mark.parametrize("layout", list(CACHE_LAYOUTS))
@pytest.mark.parametrize("target", ["impl", "spec"])
def test_kvspecs_manager_conforms_through_the_content_view(target, layout):
    if (why := layout_unsupported(target, "cache", layout)) is not None:
        pytest.skip(why)
    result = search(target, layout, level="L2")
    assert result.conforms, result.details


@pytest.mark.parametrize("fault, layout, rules", [
    ("broken_caches:keeps_lock", "page-4", {"ref-conservation"}),
    ("broken_caches:shares_tenants", "tenants", {"tenant-isolation", "hit-soundness"}),
    ("broken_caches:serves_freed", "page-4", {"hash-map-consistency", "free-queue-consistency"}),
])
def test_a_planted_fault_is_caught_by_its_rule(fault, layout, rules):
    result = search(fault, layout, examples=200)
    assert not result.conforms
    assert set(result.rules) & rules, result.details


def test_the_rules_judged_at_each_level():
    assert "hit-optimality" not in rules_checked("cache", "L1")
    assert "hit-optimality" in rules_checked("cache", "L2")
    assert "free-order" not in rules_checked("cache", "L3") and "null-exclusion" not in rules_checked("cache", "L3")


def test_the_cli_runs_the_cache_scope(capsys):
    assert main(["conform", "--target", "impl", "--scope", "cache", "--layout", "tenants", "--examples", "10",
                 "--level", "L1"]) == 0
    assert "cache    tenants" in capsys.readouterr().out


@pytest.mark.parametrize("engine", ["sglang", "lmdeploy"])
def test_an_engine_outside_the_cache_scope_is_a_usage_error(engine, capsys):
    assert main(["conform", "--target", engine, "--scope", "manager", "--examples", "1"]) == 2
    assert "cache scope only" in capsys.readouterr().err


@pytest.mark.parametrize("engine", ["sglang", "lmdeploy"])
def test_a_missing_engine_is_one_line(engine, capsys):
    if importlib.util.find_spec(engine) is not None:
        pytest.skip(f"{engine} is installed here")
    assert main(["conform", "--target", engine, "--examples", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"install_engine.sh {engine}" in err[0]


def test_the_content_view_cases_exercise_every_rule_of_chapter_10(tmp_path):
    from kvspec.conformance.vectors import content_view
    from kvspec.spec.engines import CACHE_RULES

    path = content_view.generate(tmp_path)
    cases = [json.loads(line) for line in path.read_text().splitlines()]
    assert {rule for case in cases for rule in case["expect"]} == set(CACHE_RULES)
    assert any(not case["expect"] for case in cases)  # and sound views, judged sound
    assert content_view.check(path) == []
    cases[0]["expect"] = ["ref-conservation"]  # a case the spec does not agree with is reported
    path.write_text("\n".join(json.dumps(c) for c in cases) + "\n")
    (problem,) = content_view.check(path)
    assert "sound" in problem and "ref-conservation" in problem


def test_each_reading_of_a_bad_hit_fails_a_committed_case(monkeypatch):
    """Chapter 10, "Which rules judge a bad hit" (issue 57): a hit that is not a whole-block length within
    the cap is judged by hit-soundness alone (not hit-optimality, not allocation-accounting); too few slots
    is allocation-accounting alone (not no-eviction-in-use); an unsound hit of whole blocks is still judged
    for hit-optimality.  Predicates that plant any other reading fail a committed case."""
    from pathlib import Path

    from kvspec.conformance.vectors import content_view
    from kvspec.spec import engines

    committed = Path(__file__).resolve().parents[1] / "vectors" / content_view.FILE
    assert content_view.check(committed) == []
    admission = engines.admission

    def unsound_exempt(before, after, request_id, tenant, tokens, hit, *args):
        found = admission(before, after, request_id, tenant, tokens, hit, *args)
        unsound = any(v.rule == "hit-soundness" for v in found)
        return [v for v in found if not (unsound and v.rule == "hit-optimality")]

    def unaligned_judged(before, after, request_id, tenant, tokens, hit, written, engine_cap=None, window=None):
        found = admission(before, after, request_id, tenant, tokens, hit, written, engine_cap, window)
        best = engines.servable(before, tenant, tokens, engines.hit_cap(len(tokens), before.block_size, engine_cap))
        if isinstance(hit, int) and hit < best and not any(v.rule == "hit-optimality" for v in found):
            found.append(engines.Violation("hit-optimality", f"hit {hit} < {best}"))
        return found

    def slots_judged_after_a_bad_length(before, after, request_id, tenant, tokens, hit, *args):
        found = admission(before, after, request_id, tenant, tokens, hit, *args)
        short = isinstance(hit, int) and len(after.tables.get(request_id, ())) * before.block_size < len(tokens)
        if short and not any(v.rule == "allocation-accounting" for v in found):
            found.append(engines.Violation("allocation-accounting", "too few slots"))
        return found

    def fresh_judged_with_few_slots(before, after, request_id, tenant, tokens, hit, *args):
        found = admission(before, after, request_id, tenant, tokens, hit, *args)
        held = before.held()
        if any(b in held for b in after.tables.get(request_id, ())[(hit or 0) // before.block_size:]) and \
                not any(v.rule == "no-eviction-in-use" for v in found):
            found.append(engines.Violation("no-eviction-in-use", "a fresh block in use"))
        return found

    for planted, fails in ((unsound_exempt, "hit-unsound-and-short"), (unaligned_judged, "hit-unaligned"),
                           (slots_judged_after_a_bad_length, "hit-unaligned-few-slots"),
                           (fresh_judged_with_few_slots, "few-slots-one-in-use")):
        monkeypatch.setattr(engines, "admission", planted)
        problems = content_view.check(committed)
        assert [p for p in problems if f"({fails})" in p], problems


def test_a_grouped_view_is_judged_group_by_group_and_its_hit_by_every_group_at_once():
    """Chapter 10, several groups per request: each group's rules with its
    window, the violation named by its group; a hit optimal against the
    longest length every group served at once -- which need not be the
    longest any one group served, nor grow with the length."""
    from kvspec.spec import engines
    from kvspec.spec.engines import CacheView, GroupedView, content_key

    tokens = [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0]  # 13 tokens: the cap is 12, three blocks of 4
    key = [content_key(None, tokens, n) for n in (4, 8, 12)]
    full = CacheView(blocks=frozenset({("full", b) for b in range(1, 5)}), block_size=4,
                     free=frozenset({("full", 4)}), tables={}, holds={},
                     cached={("full", 1): key[0], ("full", 2): key[1], ("full", 3): key[2]})
    # the window (8 tokens) of a 12-token hit reads blocks 1 and 2, of a 4- or 8-token hit block 0 too: block 0's
    # SWA is a tombstone, so every group serves 12 tokens, and not 4 or 8
    swa = CacheView(blocks=frozenset({("swa", b) for b in range(1, 5)}), block_size=4,
                    free=frozenset({("swa", 1), ("swa", 4)}), tables={}, holds={},
                    cached={("swa", 2): key[1], ("swa", 3): key[2]})
    view = GroupedView(groups={"full": full, "swa": swa}, windows={"full": None, "swa": 8})
    assert engines.servable_groups(view, None, tokens, 12) == 12
    assert engines.servable_groups(view, None, tokens, 8) == 0 and engines.servable(swa, None, tokens, 12) == 0
    written = {("full", 1): key[0], ("full", 2): key[1], ("full", 3): key[2], ("swa", 2): key[1], ("swa", 3): key[2]}
    assert engines.check_view(view, {}, written) == []
    lost = GroupedView(groups={"full": full, "swa": CacheView(swa.blocks, 4, frozenset({("swa", 4)}), {}, {},
                                                               swa.cached)}, windows=view.windows)
    (problem,) = engines.check_view(lost, {}, written)
    assert problem.rule == "free-queue-consistency" and problem.message.startswith("[swa] ")


def test_a_monotone_reading_of_what_every_group_serves_fails_the_tombstone_case(monkeypatch):
    """Chapter 10, "Several groups per request": what every group serves at
    once is not monotone in the length (a window's group may serve a long
    prefix and not a shorter one whose window falls on a tombstone).  A
    port that stops at the first length some group does not serve fails a
    committed case."""
    from pathlib import Path

    from kvspec.conformance.vectors import content_view
    from kvspec.spec import engines

    committed = Path(__file__).resolve().parents[1] / "vectors" / content_view.FILE
    assert content_view.check(committed) == []

    def monotone(view, tenant, tokens, cap):
        B = view.block_size  # noqa: N806
        keys = {name: set(group.cached.values()) for name, group in view.groups.items()}
        n = 0
        while n + B <= cap and all(engines.content_key(tenant, tokens, (i + 1) * B) in keys[name]
                                   for name, _, w in view.each()
                                   for i in range(engines.first_read(n + B, B, w), (n + B) // B)):
            n += B
        return n

    monkeypatch.setattr(engines, "servable_groups", monotone)
    problems = content_view.check(committed)
    assert [p for p in problems if "(grouped-hit-past-a-tombstone)" in p], problems
