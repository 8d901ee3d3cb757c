"""spec/README.md is the normative document: it must name every rule of the
catalogue, every predicate registered for it, and only vectors and files
that exist."""

import re
from pathlib import Path

import pytest

from kvspec.spec import request_rules, rules
from kvspec.spec.catalogue import RULES

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "spec" / "README.md").read_text()


def rows() -> dict[str, str]:
    """The rule index: rule name -> its table row."""
    index = DOC.split("## Rule index", 1)[1]
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| ([a-z-]+) \|.*$", index, re.M) if m.group(1) != "rule"}


def registered() -> dict[str, set[str]]:
    """Every predicate each rule has, as ``module.function``."""
    found: dict[str, set[str]] = {}
    for name, fn in rules.STATE_RULES.items():
        found.setdefault(name, set()).add(f"rules.{fn.__name__}")
    for module, table in ((rules, rules.STEP_RULES), (request_rules, request_rules.REQUEST_STATE_RULES),
                          (request_rules, request_rules.REQUEST_STEP_RULES)):
        for name, fns in table.items():
            found.setdefault(name, set()).update(f"{module.__name__.split('.')[-1]}.{fn.__name__}" for fn in fns)
    return found


def test_the_catalogue_is_the_set_of_rules_the_predicates_state():
    assert set(registered()) == set(RULES)


def test_the_rule_index_has_every_rule_once():
    assert list(rows()) == list(RULES)


@pytest.mark.parametrize("rule", list(RULES))
def test_every_predicate_of_a_rule_is_in_its_row(rule):
    row = rows()[rule]
    missing = [p for p in sorted(registered()[rule]) if f"`{p}`" not in row]
    assert not missing, f"spec/README.md's {rule} row does not name {missing}"


def test_every_vector_and_file_cited_exists():
    for path in set(re.findall(r"`((?:pool|manager)/(?:cases|findings)/[\w+.-]+)`", DOC)):
        assert (ROOT / "vectors" / f"{path}.json").is_file(), path
    for link in set(re.findall(r"\]\((\.\./[^)#]+)", DOC)):
        assert (ROOT / "spec" / link).resolve().exists(), link
    for name in set(re.findall(r"`(\w+\.py)`", DOC)):
        assert any((ROOT / d / name).exists() for d in ("spec", "kvspec", "kvspec/conformance")), name
