"""The gate as a library (:mod:`kvspec.conformance.gate`): what ``kvspec
conform``, ``kvspec mutate`` and the benchmarks call."""

import pytest
from test_cli import broken

from kvspec.conformance.gate import FirstFailure, GateOptions, Listener, make_plan, run_gate
from kvspec.conformance.runner import SetupError


class Recorder(Listener):
    def __init__(self):
        self.began, self.failures, self.done = 0, [], []

    def begin(self, options, steered, avoid):
        self.began += 1

    def first_failure(self, failure):
        self.failures.append(failure)

    def layout_done(self, result):
        self.done.append((result.scope, result.layout))


def test_the_gate_returns_its_report_and_prints_nothing(tmp_path, capsys):
    options = GateOptions(target="impl", layouts=["tiny-pool", "full"], examples=3, seed=1, report_dir=str(tmp_path))
    listener = Recorder()
    report = run_gate(options, listener)
    assert capsys.readouterr().out == ""
    assert [(r.scope, r.layout) for r in report.results] == [("pool", "tiny-pool"), ("manager", "full")]
    assert report.conforms and all(r.operations > 0 for r in report.results)
    assert listener.began == 1 and listener.done == [("pool", "tiny-pool"), ("manager", "full")]
    assert sorted(p.name for p in report.written) == ["junit.xml", "report.json", "report.md"]


def test_a_failure_is_told_before_it_shrinks_and_its_trace_saved(tmp_path, monkeypatch):
    target = broken(tmp_path, monkeypatch, "StaleHash")
    listener = Recorder()
    report = run_gate(GateOptions(target=target, scope="pool", layouts=["tiny-pool"], budget=20, seed=1,
                                  trace_dir=str(tmp_path / "traces")), listener)
    (result,) = report.results
    assert not result.conforms and result.trace_file and (tmp_path / "traces" / "pool-tiny-pool.json").exists()
    (first,) = listener.failures
    assert isinstance(first, FirstFailure) and first.path.exists() and first.seconds <= result.finished


@pytest.mark.parametrize("options, message", [
    (GateOptions(examples=0), "--examples must be positive"),
    (GateOptions(budget=-1), "--budget must be a positive"),
    (GateOptions(examples=5, budget=5), "give one"),
    (GateOptions(workers=0), "--workers must be at least 1"),
    (GateOptions(scope="pools"), "no scope 'pools'"),
    (GateOptions(profile="fast"), "no Hypothesis profile 'fast'"),
    (GateOptions(layouts=["no-such"]), "no layout named no-such"),
    (GateOptions(layouts=["full", "ful"]), "no layout named ful in scope all"),  # not dropped in silence
    (GateOptions(scope="pool", layouts=["full"]), "no layout named full in scope pool"),
    (GateOptions(shard="3/2"), "--shard takes I/N"),
    (GateOptions(avoid=["nothing:at-all"]), "not an input the machines know"),
    (GateOptions(target="nope"), "unknown target 'nope'"),
])
def test_bad_options_are_refused_before_any_search(options, message):
    with pytest.raises(SetupError, match=message):
        make_plan(options)


def test_shards_share_the_plan_round_robin():
    whole = make_plan(GateOptions())
    shares = [make_plan(GateOptions(shard=f"{i}/3")) for i in (1, 2, 3)]
    assert sorted(sum(shares, [])) == sorted(whole) and shares[0] == whole[0::3]


def test_mutate_runs_the_gate_as_a_library_not_the_cli():
    import ast
    from pathlib import Path

    import kvspec.conformance.mutation.mutate as mutate

    tree = ast.parse(Path(mutate.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "kvspec.conformance.gate" in imported and "kvspec" not in imported and "kvspec.cli" not in imported
