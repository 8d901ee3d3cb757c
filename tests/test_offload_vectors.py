"""The offload tier's conformance vectors (spec chapter 11): recorded from
the spec's tier, they exercise every tier rule, impl and the spec replay
them, a tier with one fault planted fails them under the rule it breaks, and
the JavaScript tier written from chapter 11's prose replays them."""

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from kvspec.cli import main
from kvspec.conformance.machines.offload import key_of
from kvspec.conformance.runner import resolve_target
from kvspec.conformance.targets.offload import TierTarget
from kvspec.conformance.vectors.codec import check, read
from kvspec.conformance.vectors.corpus import offload_case_vector
from kvspec.conformance.vectors.offload import OFFLOAD_CASES
from kvspec.impl.offload import CPUOffloadingManager
from kvspec.spec.catalogue import TIER_RULES

ROOT = Path(__file__).resolve().parents[1]
OFFLOAD = ROOT / "vectors" / "offload"


def index_files():
    index = json.loads((ROOT / "vectors" / "index.json").read_text())
    return [f for f in index["files"] if f["scope"] == "offload"]


def test_the_hand_written_cases_exercise_every_tier_rule_under_each_policy():
    cases = [f for f in index_files() if "/cases/" in f["path"]]
    for rule in TIER_RULES:
        assert any(rule in f["rules"] for f in cases), f"no hand-written offload case exercises {rule}"
    configs = {f["path"]: read(ROOT / "vectors" / f["path"])["config"] for f in cases}
    policy_cases = [p for p, c in configs.items() if "tier-policy" in next(f["rules"] for f in cases if f["path"] == p)]
    assert {configs[p]["cache_policy"] for p in policy_cases} == {"lru", "arc"}
    assert any(c["store_threshold"] >= 2 for c in configs.values())
    assert {f["path"] for f in index_files() if "/findings/" in f["path"]} == {"offload/findings/F17.json",
                                                                               "offload/findings/F18.json"}
    assert [f["findings"] for f in cases if "arc-falls-back" in f["path"]] == [["F18"]]


def test_the_arc_fallback_vector_takes_the_fallback():
    """The F18 case reaches the spec's fallback: T1 under its target, nothing evictable in T2, and the store
    evicts T1's key rather than give up."""
    doc = read(OFFLOAD / "cases" / "arc-falls-back-to-t1.json")
    state = dict(doc["initial_state"])
    for step in doc["steps"]:
        if step["op"] == "prepare_store" and step["result"] and step["result"][2]:
            policy, evictable = state["policy"], set(state["evictable"])
            victim = step["result"][2][0]["bytes"]
            if len(policy["t1"]) < int(policy["target"]) and not evictable & set(policy["t2"]):
                assert victim in policy["t1"]
                return
        state.update(step.get("state", {}))
    pytest.fail("the arc-falls-back-to-t1 vector never evicts from T1 below its target with T2 busy")


def test_the_cases_are_recorded_from_the_spec():
    """Each committed case is what the spec's tier does now (no hand-edited expectation)."""
    for case in OFFLOAD_CASES:
        vector = offload_case_vector(case)
        assert json.loads((OFFLOAD / "cases" / f"{case.name}.json").read_text())["steps"] == \
            json.loads(json.dumps(vector.to_dict()["steps"])), case.name


@pytest.mark.parametrize("name", ["spec", "impl"])
def test_spec_and_impl_replay_the_offload_vectors(name):
    report = check(OFFLOAD, {"offload": resolve_target(name, "offload")})
    assert report.ok and not report.known and not report.skipped, report.differences
    assert len(report.files) == len(index_files())


# --- one fault planted each --------------------------------------------------------------------------


def lru_evicts_most_recent(**options):
    tier = CPUOffloadingManager(**options)
    if options["cache_policy"] == "lru":
        policy = tier._policy

        def victims(n, protected, blocks):
            chosen = [k for k in reversed(policy.order) if k not in protected][:n]
            return chosen if len(chosen) == n else None

        policy.victims = victims
    return TierTarget(tier)


class ServesFailedStores(CPUOffloadingManager):
    def complete_store(self, keys, req_context=None, success=True):
        super().complete_store(keys, req_context, success=True)


class LoadsTakeNoReference(CPUOffloadingManager):
    def prepare_load(self, keys, req_context=None):
        spec = super().prepare_load(keys, req_context)
        self.complete_load(keys, req_context)
        return spec


class DropsRemovedEvents(CPUOffloadingManager):
    def take_events(self):
        return [e for e in super().take_events() if not e.removed]


def evicts_asked_keys(**options):
    tier = CPUOffloadingManager(**options)
    victims = tier._policy.victims
    tier._policy.victims = lambda n, protected, blocks: victims(n, set(), blocks)  # protects no key asked for
    return TierTarget(tier)


def built(cls):
    return lambda **options: TierTarget(cls(**options))


FAULTS = {
    "tier-policy": lru_evicts_most_recent,
    "tier-content-soundness": built(ServesFailedStores),
    "tier-ref-conservation": built(LoadsTakeNoReference),
    "tier-events": built(DropsRemovedEvents),
    "tier-eviction": evicts_asked_keys,
}


@pytest.mark.parametrize("rule", sorted(FAULTS))
def test_a_broken_tier_fails_the_vectors_under_the_rule_it_breaks(rule):
    assert set(FAULTS) == set(TIER_RULES)
    report = check(OFFLOAD, {"offload": FAULTS[rule]})
    assert report.differences, f"no offload vector catches a tier that breaks {rule}"
    lines = [line for lines in report.differences.values() for line in lines]
    assert any(f": {rule}: " in line for line in lines), lines[:6]


def test_the_cli_checks_the_offload_scope(capsys, tmp_path):
    assert main(["vectors", "check", str(OFFLOAD), "--target", "impl", "--scope", "offload"]) == 0
    assert f"{len(index_files())} vectors replayed against impl: 0 differ" in capsys.readouterr().out
    doc = read(OFFLOAD / "cases" / "lru-eviction.json")
    step = next(s for s in doc["steps"] if s["op"] == "prepare_store" and s["result"][2])
    step["result"][2] = [{"bytes": key_of(2).hex()}]  # tampered: the policy would evict another key
    (tmp_path / "v.json").write_text(json.dumps(doc))
    assert main(["vectors", "check", str(tmp_path), "--target", "spec", "--scope", "offload"]) == 1
    assert "tier-policy: prepare_store evicted" in capsys.readouterr().out


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed here")
def test_vllm_diverges_on_the_offload_vectors_exactly_as_f17_and_f18_record(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    factory = resolve_target("vllm", "offload")
    report = check(OFFLOAD, {"offload": factory})
    diverging = {p.relative_to(OFFLOAD).as_posix() for p in report.differences}
    assert diverging == {"cases/arc-falls-back-to-t1.json", "cases/threshold-tracker-forgets.json",
                         "findings/F17.json", "findings/F18.json"}
    assert check(OFFLOAD, {"offload": factory}, frozenset({"F17", "F18"})).ok


@pytest.mark.skipif(shutil.which("node") is None, reason="the JavaScript replayer needs Node.js")
def test_the_javascript_tier_replays_the_offload_vectors(tmp_path):
    result = subprocess.run(["node", "examples/vectors-js/replay.mjs", str(OFFLOAD)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and f"{len(index_files())} offload): 0 differ" in result.stdout, result.stdout
    doc = read(OFFLOAD / "cases" / "arc-ghosts-adapt.json")  # a tampered target: the JavaScript tier differs
    step = next(s for s in doc["steps"] if s.get("state", {}).get("policy", {}).get("target") == 2.0)
    step["state"]["policy"]["target"] = 1.0
    (tmp_path / "arc.json").write_text(json.dumps(doc))
    result = subprocess.run(["node", "examples/vectors-js/replay.mjs", str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "state policy.target" in result.stdout, result.stdout
