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
