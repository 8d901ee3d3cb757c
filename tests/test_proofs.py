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

The whole CrossHair run (both modules, one process per function, one
process per core) takes about 45 s on two cores.
"""

from __future__ import annotations

import copy
import inspect
import json
import subprocess
import sys
import textwrap
from collections import deque
from types import SimpleNamespace

import pytest

from kvspec.errors import RuleError, RuleTypeError
from kvspec.proofs import pool_model as M
from kvspec.proofs import run as R
from kvspec.spec.pool import SpecBlockPool

MODEL_CONTRACTS = R.find_contracts(R.module_path(R.MODEL_MODULE))
IMPL_CONTRACTS = R.find_contracts(R.module_path(R.IMPL_MODULE))
IMPL_OBLIGATIONS = [o for c in IMPL_CONTRACTS.values() for o in c.obligations]
BUGGY_CONTRACTS = R.find_contracts(R.module_path(R.PLANTED_MODULE))
OBLIGATIONS = [o for c in MODEL_CONTRACTS.values() for o in c.obligations]
PLANTED = R.planted_bugs()
TRANSITIONS = [name for name in MODEL_CONTRACTS if name != "initial_pool"]


# --- 1 and 2: the proofs ------------------------------------------------------------


@pytest.fixture(scope="module")
def report() -> R.Report:
    """One run of every model obligation and every planted bug."""
    rep = R.run(planted=True)
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


# Wrong production code, patched in before the obligations are imported: each must be refuted.
IMPL_FAULTS = {
    "swa_skip_inverse": "SlidingWindowManager.first_computed_skipping = lambda self, n: n + self.sliding_window",
    "chunked_skip_inverse": (
        "ChunkedLocalAttentionManager.first_computed_skipping = "
        "lambda self, n: n // self.attention_chunk_size * self.attention_chunk_size"
    ),
    "mamba_skip_inverse": "MambaManager.first_computed_skipping = lambda self, n: n + 2",
    "rswa_gap_is_between_prompt_and_window": (
        "RSWAManager.gap_blocks = lambda self, computed, prompt: "
        "range(prompt // self.block_size, max(prompt, computed - self.rswa_window) // self.block_size)"
    ),
    "aligned_hit_blocks": (
        "import kvspec.impl.single_type_kv_cache_manager as _managers\n"
        "_managers.aligned_block_count = lambda num_blocks, block_size, alignment: num_blocks"
    ),
    "group_key_roundtrip": (
        "import kvspec.hashing as _hashing\n"
        "_hashing.make_block_hash_with_group_id = lambda block_hash, group_id: "
        "block_hash + group_id.to_bytes(4, 'little')"
    ),
    "swa_skipped_agree": (
        "SlidingWindowManager.get_num_skipped_tokens = lambda self, n: max(0, n - self.sliding_window)"
    ),
    "chunked_skipped_agree": (
        "ChunkedLocalAttentionManager.get_num_skipped_tokens = lambda self, n: max(0, n - self.attention_chunk_size)"
    ),
    "mamba_skipped_agree": "MambaManager.get_num_skipped_tokens = lambda self, n: n",
    "rswa_gap_agrees": (
        "RSWAManager.gap_blocks = lambda self, computed, prompt: range(prompt // self.block_size + 1, "
        "max(prompt, computed - self.rswa_window) // self.block_size)"
    ),
    "rswa_next_release": (
        "_next_skip = RSWAManager._next_skip\n"
        "RSWAManager._next_skip = lambda self, computed, prompt=None: "
        "_next_skip(self, computed, prompt) + self.block_size"
    ),
}


@pytest.mark.parametrize("function", sorted(IMPL_FAULTS))
def test_a_wrong_impl_function_is_refuted(tmp_path, function):
    assert set(IMPL_FAULTS) == set(IMPL_CONTRACTS)
    source = R.module_path(R.IMPL_MODULE).read_text().replace("from __future__ import annotations\n", "")
    patch = (
        "from kvspec.impl.single_type_kv_cache_manager import (ChunkedLocalAttentionManager, MambaManager,\n"
        "    RSWAManager, SlidingWindowManager)\n" + IMPL_FAULTS[function] + "\n"
    )
    path = tmp_path / "planted_windows.py"
    path.write_text(patch + source)
    report = R.run([str(path)], only=[function])
    (result,) = report.proofs
    examples = result.counterexamples()
    assert examples, "\n".join(f"{v.status.value}: {v.detail}" for v in result.verdicts)
    assert f"when calling {function}(" in examples[0].detail


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
    assert {p["bug"] for p in data["planted"] if p["caught"]} == set(PLANTED)


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
    assert "unable to meet precondition" in cli.stdout
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
