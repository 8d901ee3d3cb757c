"""The language-neutral conformance vectors: generated from the spec, read
back, replayed against targets -- and failing where a target is wrong."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from broken_pools import BROKEN, target
from kvspec.cli import main
from kvspec.conformance.findings import FINDINGS
from kvspec.conformance.runner import resolve_target
from kvspec.conformance.vectors.codec import (
    CHAPTERS,
    VectorError,
    check,
    from_json,
    read,
    to_json,
    vector_files,
)
from kvspec.conformance.vectors.corpus import generate, holds_finding
from kvspec.request import LoRARequest
from kvspec.spec import releases
from kvspec.spec.catalogue import RULES, TIER_RULES
from kvspec.spec.interface import Removed, Stored


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("vectors")
    return generate(root, "quick", measure_coverage=False)


def targets(name):
    return {scope: resolve_target(name, scope) for scope in ("pool", "manager", "offload")}


def test_the_corpus_exercises_every_rule_and_has_every_source(corpus):
    assert corpus.unexercised == []
    assert set(corpus.rules) == set(RULES) | set(TIER_RULES)
    kinds = {f["path"].split("/")[1] for f in corpus.files}
    assert kinds == {"cases", "configs", "walks", "findings"}
    assert {f["path"].split("/")[1] for f in corpus.files if f["scope"] == "offload"} == {"cases", "walks", "findings"}
    base_findings = {f.id for f in FINDINGS if holds_finding(f)}
    assert base_findings and {"F17", "F18"} <= base_findings  # the base release's corpus holds the offload tier's
    later = releases.judged("0.34.0")  # ... a later release's does not: chapter 11 models 0.25.1's tier alone
    assert not {f.id for f in FINDINGS if holds_finding(f, later) and f.scope == "offload"}
    assert {f["findings"][0] for f in corpus.files if "/findings/" in f["path"]} == base_findings
    index = json.loads((corpus.root / "index.json").read_text())
    assert len(index["files"]) == len(vector_files(corpus.root))


def test_every_chapter_of_the_spec_has_vectors(corpus, tmp_path):
    """Every chapter of spec/README.md that the base release reads is needed
    by some vector (issue 29) -- the committed edge cases alone included --
    and the releases' chapter by a corpus of a later release."""
    assert corpus.unread_chapters == ["9"]
    assert generate(tmp_path / "cases", "cases", measure_coverage=False).unread_chapters == ["9"]
    assert "9" in generate(tmp_path / "later", "cases", measure_coverage=False, release="0.30.0").chapters
    index = json.loads((corpus.root / "index.json").read_text())
    assert set(index["chapters"]) == set(CHAPTERS) - {"9"}
    assert "| 8. Cross attention | " in (corpus.root / "INDEX.md").read_text()


@pytest.mark.parametrize("name", ["spec", "impl"])
def test_spec_and_impl_replay_every_vector(corpus, name):
    report = check(corpus.root, targets(name))
    assert report.ok, {str(p): d[:2] for p, d in report.differences.items()} or report.unreadable
    assert len(report.files) == len(corpus.files) and not report.skipped and not report.known


def test_generation_is_deterministic(corpus, tmp_path):
    again = generate(tmp_path, "quick", measure_coverage=False)
    for f in again.files:
        assert (tmp_path / f["path"]).read_text() == (corpus.root / f["path"]).read_text(), f["path"]


@pytest.mark.parametrize("rule", sorted(BROKEN))
def test_a_broken_pool_fails_the_vectors(corpus, rule):
    report = check(corpus.root, {"pool": target(BROKEN[rule])})
    assert report.differences, f"no vector catches a pool that breaks {rule}"
    assert report.skipped  # the manager vectors, without a manager target


def test_a_tampered_expectation_is_a_difference(corpus, tmp_path):
    path = tmp_path / "v.json"
    doc = read(corpus.root / "pool/cases/exact-fit.json")
    doc["steps"][0]["result"] = [4, 3, 2, 1]
    path.write_text(json.dumps(doc))
    report = check(path, targets("spec"))
    assert list(report.differences) == [path]
    assert "returned [1, 2, 3, 4], expected [4, 3, 2, 1]" in report.differences[path][0]


def test_a_configuration_refused_with_the_wrong_error_is_a_difference(tmp_path):
    """A configuration vector names the error as well as the rule: a pool
    that refuses a size that is not an int with a ValueError (the spec's
    table says TypeError) differs; one that refuses it by ``assert``, read
    as a refusal by its adapter (vLLM's constructors), is not held to a kind."""
    from kvspec.impl.block_pool import BlockPool

    def value_error_pool(num_blocks, *args, **kwargs):
        if type(num_blocks) is not int:
            raise ValueError(f"num_blocks {num_blocks!r}")
        return resolve_target("spec", "pool")(num_blocks, *args, **kwargs)

    def asserting_pool(num_blocks, *args, **kwargs):
        try:
            assert type(num_blocks) is int
        except AssertionError as error:
            raise ValueError("the adapter's reading of an assert") from error
        return BlockPool(num_blocks, *args, **kwargs)

    path = Path(__file__).parent.parent / "vectors/pool/configs/two-groups/a-pool-size-not-an-int.json"
    assert read(path)["refused_with"] == "TypeError"
    differences = check(path, {"pool": value_error_pool}).differences[path]
    assert differences == ["construction: refused with ValueError (num_blocks 12.5), expected a TypeError "
                           "(null-exclusion)"]
    assert check(path, {"pool": asserting_pool}).ok and check(path, targets("spec")).ok


def test_an_unreadable_file_fails_the_check(corpus, tmp_path, capsys):
    root = tmp_path / "corpus"
    shutil.copytree(corpus.root / "pool/cases", root)
    (root / "notes.json").write_text("{not json")
    (root / "other.json").write_text(json.dumps({"kvspec_vectors": 99}))
    report = check(root, targets("spec"))
    assert set(report.unreadable) == {root / "notes.json", root / "other.json"} and not report.ok
    assert main(["vectors", "check", str(root), "--target", "spec"]) == 1
    out = capsys.readouterr().out
    assert "2 unreadable" in out and "UNREADABLE" in out


def test_cli_generates_and_checks(tmp_path, capsys):
    assert main(["vectors", "generate", "--out", str(tmp_path), "--size", "quick"]) == 0
    out = capsys.readouterr().out
    assert f"rules exercised: {len(RULES) + len(TIER_RULES)} of {len(RULES) + len(TIER_RULES)}" in out  # 14 + 5
    assert main(["vectors", "check", str(tmp_path), "--target", "impl"]) == 0
    assert "0 differ" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["vectors", "check", "/no/such/dir"], "no such vectors directory"),
    (["vectors", "check", ".", "--target", "tests.broken_pools:target"], "serves one scope"),
    (["vectors", "check", ".", "--target", "nonesuch"], "unknown target"),
])
def test_cli_usage_errors_are_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_values_round_trip():
    values = [b"\x00\xff", {1, 2}, 2**64 - 1, LoRARequest("a", 1, "/p"), [True, None, "s", 1.5],
              Stored(0, (2**63, 5), None, (1, 2), 2, None, None, ((b"\x01",), None)), Removed(1, 7)]
    for value in values:
        back = from_json(json.loads(json.dumps(to_json(value))))
        assert back == (list(value) if isinstance(value, list) else value)
    with pytest.raises(VectorError, match="never describes"):
        from_json({"request": "r9"}, {})
    with pytest.raises(VectorError, match="cannot be written"):
        to_json(object())


@pytest.mark.skipif(shutil.which("node") is None, reason="the JavaScript replayer needs Node.js")
def test_the_javascript_replayer_agrees(corpus, tmp_path):
    result = subprocess.run(["node", "examples/vectors-js/replay.mjs", str(corpus.root)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 differ" in result.stdout
    # and it is not a replayer that cannot fail: a tampered vector differs
    doc = read(corpus.root / "pool/cases/lru-eviction.json")
    doc["steps"][-1]["result"] = [1]
    (tmp_path / "lru.json").write_text(json.dumps(doc))
    result = subprocess.run(["node", "examples/vectors-js/replay.mjs", str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "1 differ" in result.stdout, result.stdout + result.stderr
    # a later release's corpus: the JavaScript manager applies chapter 9's deltas the vectors show
    later = generate(tmp_path / "later", "quick", measure_coverage=False, release="0.34.0")
    result = subprocess.run(["node", "examples/vectors-js/replay.mjs", str(later.root)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and " 0 differ" in result.stdout, result.stdout[-3000:] + result.stderr


def test_the_committed_corpus_is_what_the_spec_generates(tmp_path):
    """vectors/ (the edge cases and findings) must be regenerated when the
    spec's behaviour changes: `kvspec vectors generate --out vectors --size cases`."""
    generate(tmp_path, "cases", measure_coverage=False)
    committed = Path(__file__).resolve().parents[1] / "vectors"
    names = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(committed) for p in committed.rglob("*")
                           if p.is_file() and p.name != "coverage.json")
    for name in names:
        assert (committed / name).read_text() == (tmp_path / name).read_text(), f"vectors/{name} is stale"


COMMITTED = Path(__file__).resolve().parents[1] / "vectors"


def test_freeing_in_one_call_over_every_group_fails_its_vector(monkeypatch):
    """Chapter 4: free(request) makes one free_blocks call per group, in group-id order, tail first.  A
    manager that frees every group's blocks in one call (issue 57's other reading) -- planted here in the
    spec's coordinator -- fails manager/cases/free-group-by-group at the free, and so does one freeing the
    groups in the other order."""
    from kvspec.spec import coordinator

    vector = COMMITTED / "manager/cases/free-group-by-group.json"
    assert check(vector, targets("spec")).ok

    def one_call(self, rid, order=1):
        blocks = [b for group in self.groups[::order] for b in reversed(group.tables.get(rid, []))]
        for group in self.groups:
            group.tables.pop(rid, None)
            group.num_cached.pop(rid, None)
        self.pool.free_blocks(blocks)

    def groups_backwards(self, rid):
        for group in reversed(self.groups):
            group.free(rid)

    for planted in (one_call, lambda self, rid: one_call(self, rid, -1), groups_backwards):
        monkeypatch.setattr(coordinator.Coordinator, "free", planted)
        report = check(vector, targets("spec"))
        assert list(report.differences) == [vector], report.differences
        assert "free" in report.differences[vector][0]
