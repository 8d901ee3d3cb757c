"""CrossHair proofs of the fixed-size pool model, run in ordinary CI.

Four angles:

1. every obligation of :mod:`kvspec.proofs.pool_model` is *confirmed over
   all paths* -- not merely "no counterexample found";
2. every planted bug in :mod:`kvspec.proofs.pool_model_buggy` is caught by a
   counterexample on the rule it breaks (so the obligations have teeth);
3. the runner never counts a vacuous or unfinished check as a pass: an
   unsatisfiable precondition, a timeout, or a broken condition is a failure;
4. the model *is* the spec at this size: every reachable state of the model
   (counts up to 2) is run side by side with :class:`SpecBlockPool`, and the
   two agree on every count, hash flag and the free queue, and the model's
   ``pre:`` lines accept exactly the operations the spec accepts.

The whole CrossHair run (every module, one process per function, one
process per core; the planted bugs and mutations included) takes about
5 minutes on two cores.
"""

from __future__ import annotations

import copy
import inspect
import json
import os
import subprocess
import sys
import textwrap
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvspec.errors import RuleError, RuleTypeError
from kvspec.proofs import pool_model as M
from kvspec.proofs import run as R
from kvspec.spec.pool import SpecBlockPool

# One worker should run the whole module (the report is one CrossHair run,
# itself one process per core) -- but with pytest 9.2 pytest-xdist's loadgroup
# silently ignores the mark (pytest-dev/pytest-xdist#1386, open), and every
# worker that got a test of this module ran its own CrossHair at once: 22
# minutes of a 31-minute suite.  So the report is also shared between
# workers through a file (see ``report``), whatever the scheduler does.
pytestmark = pytest.mark.xdist_group("crosshair")

MODEL_CONTRACTS = R.find_contracts(R.module_path(R.MODEL_MODULE))
IMPL_CONTRACTS = {name: c for m in R.IMPL_MODULES for name, c in R.find_contracts(R.module_path(m)).items()}
IMPL_OBLIGATIONS = [o for c in IMPL_CONTRACTS.values() for o in c.obligations]
IMPL_FAULTS = R.impl_faults()
BUGGY_CONTRACTS = R.find_contracts(R.module_path(R.PLANTED_MODULE))
OBLIGATIONS = [o for c in MODEL_CONTRACTS.values() for o in c.obligations]
PLANTED = R.planted_bugs()
TRANSITIONS = [name for name in MODEL_CONTRACTS if name != "initial_pool"]


# --- 1 and 2: the proofs ------------------------------------------------------------


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> R.Report:
    """One run of every model obligation and every planted bug, once per
    test session: the first pytest-xdist worker to need it runs CrossHair
    (on every core) while holding a lock; the others wait and read its
    report.  ``KVSPEC_CROSSHAIR_DIR`` names another directory to share it
    through: CI starts the run there before the suite, so that it uses the
    cores its earlier steps leave idle (.ci/run)."""
    shared = os.environ.get("KVSPEC_CROSSHAIR_DIR") or tmp_path_factory.getbasetemp().parent
    rep, computed = R.shared_report(Path(shared))
    if computed:
        print(rep.render())
    return rep


def _verdict(report: R.Report, obligation: R.Obligation) -> R.Verdict:
    (result,) = [r for r in report.proofs if r.function == obligation.function]
    (verdict,) = [v for v in result.verdicts if v.obligation == obligation]
    return verdict


@pytest.mark.parametrize("obligation", OBLIGATIONS, ids=lambda o: f"{o.function}:{o.line}:{o.rule}")
def test_model_obligation_confirmed(report, obligation):
    verdict = _verdict(report, obligation)
    assert verdict.status is R.Status.CONFIRMED, (
        f"{obligation.function} line {obligation.line} [{obligation.rule}] "
        f"{obligation.condition}: {verdict.status.value}\n{verdict.detail}"
    )


@pytest.mark.parametrize("obligation", IMPL_OBLIGATIONS, ids=lambda o: f"{o.function}:{o.line}")
def test_impl_obligation_confirmed(report, obligation):
    """impl's own window arithmetic (the decode fast path's inverses, R-SWA's gap)."""
    verdict = _verdict(report, obligation)
    assert verdict.status is R.Status.CONFIRMED, f"{obligation.condition}: {verdict.status.value}\n{verdict.detail}"


@pytest.mark.parametrize("function", sorted(IMPL_CONTRACTS))
def test_a_mutated_impl_function_is_refuted(report, function):
    """Every obligation over impl refutes a mutation of the code it covers
    (:mod:`kvspec.proofs.impl_faults`), with a counterexample in the report."""
    (planted,) = [p for p in report.planted if p.imitates == function and not p.rule]
    assert planted.caught, "\n".join(f"{v.status.value}: {v.detail}" for v in planted.result.verdicts)
    assert f"when calling {function}(" in planted.result.counterexamples()[0].detail
    assert "planted bug" in report.render() and planted.why in report.render()


def test_every_impl_obligation_has_exactly_one_fault_and_covers_code():
    assert set(IMPL_FAULTS) == set(IMPL_CONTRACTS)
    for name, contract in IMPL_CONTRACTS.items():
        assert contract.covers, f"{name} names no production code (covers:)"
        assert all(o.rules for o in contract.obligations), f"{name}: every post: line names its rules"


@pytest.mark.parametrize("bug", PLANTED)
def test_planted_bug_caught(report, bug):
    (planted,) = [p for p in report.planted if p.bug == bug]
    assert planted.caught, "\n".join(f"{v.status.value}: {v.detail}" for v in planted.result.verdicts)
    example = planted.result.counterexamples(planted.rule)[0].detail
    assert f"when calling {bug}(" in example


def test_report_is_ok_and_serialisable(report):
    assert report.ok, report.render()
    data = json.loads(json.dumps(report.to_json()))
    assert data["ok"] is True
    assert sum(len(p["obligations"]) for p in data["proofs"]) == len(OBLIGATIONS) + len(IMPL_OBLIGATIONS)
    assert {p["bug"] for p in data["planted"] if p["caught"] and p["rule"]} == set(PLANTED)
    assert {p["imitates"] for p in data["planted"] if p["caught"] and not p["rule"]} == set(IMPL_CONTRACTS)
    table = report.table()
    for name in IMPL_CONTRACTS:
        assert f"| `{name}` |" in table


def test_planted_bugs_carry_the_model_contract_unchanged():
    for bug, (imitates, rule) in PLANTED.items():
        assert BUGGY_CONTRACTS[bug].contract_lines() == MODEL_CONTRACTS[imitates].contract_lines(), bug
        assert rule in {o.rule for o in MODEL_CONTRACTS[imitates].obligations}, (bug, rule)


@pytest.mark.parametrize("name", TRANSITIONS)
def test_every_transition_assumes_wf_and_restates_each_rule(name):
    contract = MODEL_CONTRACTS[name]
    assert contract.pre and contract.pre[0][1] == "wf(pool)"
    rules = {o.rule for o in contract.obligations}
    assert {
        "ref-conservation",
        "free-queue-consistency",
        "null-exclusion",
        "queue-representation",
        "free-order",
        "hash-map-consistency",
    } <= rules
    assert all(o.rule for o in contract.obligations), "every post: line names its rule"


# --- 3: the runner does not mistake a non-proof for a proof -------------------------

VACUOUS = '''
from kvspec.proofs.pool_model import NULL, Pool, ref, wf


def null_block_held(pool: Pool) -> int:
    """wf says the null block's count is 0: no input meets this.

    pre: wf(pool)
    pre: ref(pool, NULL) == 1
    post: __return__ == 1  # null-exclusion
    """
    return ref(pool, NULL)
'''

ENDLESS = '''
def triangle(n: int) -> int:
    """Unboundedly many paths: never confirmed.

    pre: n >= 0
    post: __return__ >= 0  # sum
    """
    total, i = 0, 0
    while i < n:
        total += i
        i += 1
    return total
'''

BROKEN = '''
def broken(x: int) -> int:
    """
    pre: 0 <= x < 4
    post: __return__ >=  # oops
    """
    return x
'''


def _module(tmp_path, name, source):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return path


def test_unsatisfiable_precondition_is_a_failure(tmp_path):
    path = _module(tmp_path, "vacuous", VACUOUS)
    raw = subprocess.run(R.crosshair_command(f"{path}:5", 10, 2), capture_output=True, text=True)
    assert raw.returncode == 0, "CrossHair itself calls this a success -- the runner must not"
    assert "Unable to meet precondition" in raw.stdout

    report = R.run([str(path)])
    (verdict,) = report.proofs[0].verdicts
    assert verdict.status is R.Status.PRE_UNSAT
    assert not report.ok

    cli = subprocess.run(
        [sys.executable, "-m", "kvspec.proofs.run", "--target", str(path)],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 1, cli.stdout + cli.stderr
    assert "precondition unsatisfiable" in cli.stdout
    assert "FAILED" in cli.stdout


def test_timeout_is_a_failure(tmp_path):
    path = _module(tmp_path, "endless", ENDLESS)
    report = R.run([str(path)], per_condition_timeout=1, per_path_timeout=0.5)
    (verdict,) = report.proofs[0].verdicts
    assert verdict.status is R.Status.TIMED_OUT
    assert not report.ok


def test_broken_condition_is_a_failure(tmp_path):
    path = _module(tmp_path, "broken", BROKEN)
    report = R.run([f"{path}:broken"])
    (verdict,) = report.proofs[0].verdicts
    assert verdict.status is R.Status.ERROR
    assert not report.ok


SEARCH_ONLY = ENDLESS.replace(
    "Unboundedly many paths: never confirmed.\n",
    "Never confirmed: marked search-only.\n\n"
    "    search-only: the loop has a path per n; only a counterexample would count\n"
    "    budget: 1\n",
) + '''

def wrong(n: int) -> int:
    """search-only: a counterexample still fails
    budget: 2
    pre: 0 <= n < 4
    post: __return__ < 3  # sum
    """
    return n
'''


def test_search_only_accepts_an_unfinished_search_but_not_a_counterexample(tmp_path):
    path = _module(tmp_path, "search_only", SEARCH_ONLY)
    contracts = R.find_contracts(path)
    assert contracts["triangle"].budget == 1 and contracts["wrong"].budget == 2
    assert contracts["triangle"].search_only.startswith("the loop has a path per n")
    report = R.run([f"{path}:triangle"], per_path_timeout=0.5)
    (result,) = report.proofs
    assert result.verdicts[0].status is R.Status.TIMED_OUT
    assert result.passed and report.ok, report.render()
    assert "search-only (the loop has a path per n" in report.table()
    report = R.run([f"{path}:wrong"])
    assert not report.ok and report.proofs[0].result == "counterexample"


def test_a_budget_must_be_a_positive_number(tmp_path):
    path = _module(tmp_path, "bad_budget", SEARCH_ONLY.replace("budget: 2", "budget: soon"))
    with pytest.raises(ValueError, match="wrong: budget must be a number of seconds"):
        R.find_contracts(path)


def test_a_tag_may_name_several_rules():
    o = R.Obligation("f", 1, "pool-rules, spec-equivalence", "x")
    assert o.rules == ("pool-rules", "spec-equivalence")


def test_a_mutation_changes_only_this_process_and_keeps_super_working():
    """A mutant of a method that calls super() runs (the __class__ cell), and
    a mutation whose snippet is not in the source is refused by name."""
    code = (
        "from kvspec.proofs.impl_faults import IMPL_FAULTS\n"
        "from kvspec.impl.single_type_kv_cache_manager import MambaManager, aligned_block_count\n"
        "import kvspec.impl.single_type_kv_cache_manager as m\n"
        "assert aligned_block_count(3, 2, 4) == 2\n"
        "IMPL_FAULTS['aligned_hit_blocks'].apply()\n"
        "assert m.aligned_block_count(3, 2, 4) == 3\n"
        "IMPL_FAULTS['allocate_mamba_align'].apply()\n"
        "from kvspec.spec.layout import Layout\nfrom kvspec.testing import full, mamba\n"
        "from kvspec.conformance.targets.manager import ImplManagerTarget\n"
        "layout = Layout((full(2), mamba(2, mode='all')))\n"
        "manager = ImplManagerTarget(*layout.target_args()).manager.coordinator.single_type_managers[1]\n"
        "print(manager._num_new_blocks('r', 0, 4, 4))\n"  # mode 'all' goes through super()
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "2", out.stderr
    from kvspec.impl.single_type_kv_cache_manager import aligned_block_count

    assert aligned_block_count(3, 2, 4) == 2, "the mutation leaked into this process"
    wrong = R.impl_faults()["mamba_hit"].__class__("kvspec.impl.block_pool", "BlockPool.touch", "nowhere", "x", "-")
    with pytest.raises(ValueError, match="BlockPool.touch: 'nowhere' occurs 0 times"):
        wrong.apply()


def test_kvspec_prove_is_the_runner(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "kvspec.cli", "prove", "--only", "mamba_skipped_agree", "--markdown",
         str(tmp_path / "table.md")],
        capture_output=True, text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "| `mamba_skipped_agree` | spec-equivalence |" in out.stdout
    assert "1/1 obligations confirmed over all paths" in out.stdout
    assert "mamba_skipped_agree" in (tmp_path / "table.md").read_text()
    bad = subprocess.run([sys.executable, "-m", "kvspec.cli", "prove", "--jobs", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--jobs must be at least 1" in bad.stderr and "Traceback" not in bad.stderr


def test_the_harnesses_hold_on_plain_calls():
    """Outside CrossHair the harnesses are ordinary functions: a sample of
    inputs, each keeping every rule (a broken harness fails here first)."""
    from kvspec.proofs import impl_managers as HM
    from kvspec.proofs import impl_pool as HP

    for first in range(8):
        for second in range(8):
            assert HP.get_new_blocks_keeps_the_rules(first, second, 3) == ()
            assert HP.free_blocks_keeps_the_rules(first, second, 1, 2) == ()
            assert HP.reset_keeps_the_rules(first, second, 0) == ()
    assert HM.three_group_eagle_hit(7, 3, 5) == ()
    assert HM.allocate_mamba_align(4, 5, 1) == ()
    assert HM.rswa_release(12, 3) == ()


def test_parse_crosshair_output():
    contract = R.Contract(
        "f",
        1,
        20,
        1,
        pre=((3, "x >= 0"),),
        obligations=(
            R.Obligation("f", 4, "a", "p"),
            R.Obligation("f", 5, "b", "q"),
            R.Obligation("f", 6, "c", "r"),
            R.Obligation("f", 7, "d", "s"),
        ),
    )
    out = "\n".join(
        [
            "/m.py:4: info: Confirmed over all paths.",
            "/m.py:5: error: false when calling f(7) (which returns 7)",
            "/m.py:6: info: Not confirmed.",
            "/other.py:1: error: something elsewhere",
        ]
    )
    by_line, other = R.parse_crosshair_output(out, "/m.py", contract)
    assert by_line[4][0] is R.Status.CONFIRMED
    assert by_line[5] == (R.Status.COUNTEREXAMPLE, "false when calling f(7) (which returns 7)")
    assert by_line[6][0] is R.Status.TIMED_OUT
    assert other == ["/other.py:1: error: something elsewhere"]
    verdicts, _ = R._verdicts(contract, by_line, other, timed_out=False)
    assert [v.status for v in verdicts] == [
        R.Status.CONFIRMED,
        R.Status.COUNTEREXAMPLE,
        R.Status.TIMED_OUT,
        R.Status.ERROR,  # line 7: CrossHair said nothing -- never a pass
    ]
    # an exception in the body (reported on a body line) fails the silent lines
    by_line, other = R.parse_crosshair_output(
        "/m.py:12: error: IndexError: out of range when calling f(3)", "/m.py", contract
    )
    verdicts, _ = R._verdicts(contract, by_line, other, timed_out=False)
    assert {v.status for v in verdicts} == {R.Status.COUNTEREXAMPLE}


# --- 4: the model is the spec at this size ------------------------------------------


def _model_view(pool: M.Pool):
    return (
        tuple(M.ref(pool, b) for b in range(M.NUM_BLOCKS)),
        tuple(M.hashed(pool, b) for b in range(M.NUM_BLOCKS)),
        M.queue(pool),
    )


def _spec_view(spec: SpecBlockPool):
    s = spec.state
    return (tuple(s.ref), tuple(b in s.key_of for b in range(M.NUM_BLOCKS)), tuple(s.free))


_hash_ids = iter(range(1, 1 << 30))


def _spec_cache(spec: SpecBlockPool, b: int) -> None:
    request = SimpleNamespace(block_hashes=[next(_hash_ids).to_bytes(32, "big")])
    spec.cache_full_blocks(request, [b], 0, 1, 16, 0)


def _operations():
    """(model function, its arguments after ``pool``, the same operation on the spec)."""
    ids = range(M.NUM_BLOCKS)
    yield "allocate_block", (), lambda s: s.get_new_blocks(1)[0]
    for b in ids:
        yield "free_block", (b,), lambda s, b=b: s.free_blocks([b])
        yield "touch_block", (b,), lambda s, b=b: s.touch([b])
        yield "evict_block", (b,), lambda s, b=b: s.evict_blocks([b])
        yield "cache_block", (b,), lambda s, b=b: _spec_cache(s, b)
        for a in ids:
            if a != b:
                yield "free_pair", (a, b), lambda s, a=a, b=b: s.free_blocks([a, b])


def _pre_holds(name: str, pool: M.Pool, args: tuple) -> bool:
    """Evaluate the model's own ``pre:`` lines -- the contract CrossHair assumed."""
    contract = MODEL_CONTRACTS[name]
    params = inspect.signature(getattr(M, name)).parameters
    env = dict(zip(params, (pool, *args), strict=True))
    return all(eval(expr, vars(M), env) for _, expr in contract.pre)


def test_model_agrees_with_spec_on_every_reachable_state():
    """Breadth-first over every state reachable from a fresh pool with counts
    up to 2 (all 304 of them): each operation the model's preconditions allow,
    the spec performs with the same result; each they forbid, the spec
    refuses, unchanged."""
    start = (M.initial_pool(), SpecBlockPool(M.NUM_BLOCKS))
    assert _model_view(start[0]) == _spec_view(start[1])
    seen = {_model_view(start[0])}
    todo = deque([start])
    steps = refusals = 0
    while todo:
        model, spec = todo.popleft()
        assert M.wf(model)
        for name, args, on_spec in _operations():
            spec2 = copy.deepcopy(spec)
            if not _pre_holds(name, model, args):
                before = spec2.snapshot()
                with pytest.raises((RuleError, RuleTypeError)):
                    on_spec(spec2)
                assert spec2.snapshot() == before
                refusals += 1
                continue
            out = getattr(M, name)(model, *args)
            got = on_spec(spec2)
            if name == "allocate_block":
                assert out.block == got, (model, name)
                out = out.pool
            assert _model_view(out) == _spec_view(spec2), (model, name, args)
            steps += 1
            view = _model_view(out)
            if view not in seen and max(view[0]) <= 2:
                seen.add(view)
                todo.append((out, spec2))
    # Every state with counts <= 2 is reachable: for k free blocks, choose
    # them (C(3, k)), their hash flags (2^k) and order (k!), and each held
    # block's count and flag (4^(3-k)): 64 + 96 + 96 + 48 = 304.
    assert len(seen) == 304, len(seen)
    assert steps > 5_000 and refusals > 3_000, (steps, refusals)
