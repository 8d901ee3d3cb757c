"""kvspec's searches generate the same examples whatever the process
imported before them (kvspec.conformance.settings.run_machine)."""

from __future__ import annotations

import importlib
import sys

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from kvspec.conformance.settings import run_machine


class Draws(RuleBasedStateMachine):
    """Records what Hypothesis draws, nothing else."""

    drawn: list[tuple[int, str]] = []

    @rule(number=st.integers(0, 2000), word=st.text(max_size=4))
    def draw(self, number, word):
        Draws.drawn.append((number, word))


DERANDOMIZED = settings(derandomize=True, database=None, max_examples=60, stateful_step_count=10, deadline=None)


def drawn_by(run) -> list[tuple[int, str]]:
    Draws.drawn = []
    run(Draws, DERANDOMIZED)
    return Draws.drawn


def plain(machine, run_settings):
    run_state_machine_as_test(machine, settings=run_settings)


def test_a_search_draws_the_same_examples_after_an_import(tmp_path, monkeypatch):
    """Hypothesis draws some integers and strings from the literals of the
    local modules loaded: importing one (a module of literals, as any of
    kvspec's own) changes a plain derandomized run's examples, not a
    search's."""
    before, plain_before = drawn_by(run_machine), drawn_by(plain)
    (tmp_path / "kvspec_literals_probe.py").write_text(
        "LITERALS = [" + ", ".join(str(n) for n in range(1000, 1900)) + ", 'kvspec-literal']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("kvspec_literals_probe")
    try:
        after, plain_after = drawn_by(run_machine), drawn_by(plain)
    finally:
        del sys.modules["kvspec_literals_probe"]
    if plain_after == plain_before:
        pytest.skip("this Hypothesis draws nothing from local modules' literals: nothing to pin")
    assert any(1000 <= n < 1900 for n, _ in plain_after), "the plain run drew the new module's literals"
    assert after == before


FOUND_BY_SEED = """
import json, sys
sys.path.insert(0, {tests!r})
from kvspec.conformance.gate import GateOptions, run_gate
from kvspec.conformance.trace import Trace


def found(traces):
    run_gate(GateOptions(target="broken_pools:StaleHash", scope="pool", layouts=["two-groups"], level="L1",
                         examples=200, seed=1, trace_dir=traces))
    return [s.to_json() for s in Trace.load(traces + "/pool-two-groups.unshrunk.json").steps]


first = found({traces!r} + "/first")
# another search in this process: other layouts, another target, another seed -- and what a long-lived
# process has imported by then (the vectors, the mutants, the models: literals Hypothesis could draw)
import kvspec.conformance.mutation.mutants, kvspec.conformance.vectors.corpus, kvspec.models.architectures
run_gate(GateOptions(target="impl", layouts=["full+swa", "two-groups"], examples=5, seed=7))
print(json.dumps([first, found({traces!r} + "/again")]))
"""


def test_a_seed_means_the_same_search_in_any_process_and_after_another_search(tmp_path):
    """The same seeded search finds its first failure by the same run, step
    for step -- operations, arguments and draws: run twice in one process
    with another search between, and once in another process (issue 52: a
    planted fault found in 296 examples in a fresh process, 378 after a
    kvspec conform)."""
    import json
    import os
    import subprocess
    from pathlib import Path

    runs = []
    for process in ("one", "another"):
        code = FOUND_BY_SEED.format(tests=str(Path(__file__).parent), traces=str(tmp_path / process))
        env = {**os.environ, "PYTHONHASHSEED": "0"}  # the hash chains' root, else random: hashes in the operations
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        runs += json.loads(done.stdout.splitlines()[-1])
    first = runs[0]
    assert first
    for run in runs[1:]:
        assert len(run) == len(first)
        for i, (a, b) in enumerate(zip(first, run, strict=True), 1):
            assert a == b, f"step {i}: {a} != {b}"
