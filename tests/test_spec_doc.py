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


# --- one source per fact: the catalogue's prose is the rule's only wording -----------------------


def test_the_rule_index_states_each_rule_in_the_catalogues_words():
    for name, row in rows().items():
        statement = row.split(" | ")[1]
        assert statement == RULES[name], f"{name}: the rule index's statement differs from spec/catalogue.py"


def test_docs_rules_lists_the_catalogue_in_order():
    table = (ROOT / "docs" / "rules.md").read_text().split("## Below the block ids", 1)[0]
    names = [m.group(1) for m in re.finditer(r"^\| ([a-z-]+) \|", table, re.M) if m.group(1) != "rule"]
    assert names == list(RULES)


@pytest.mark.parametrize("rule", list(RULES))
def test_docs_rules_names_every_predicate_of_each_rule(rule):
    table = (ROOT / "docs" / "rules.md").read_text().split("## Below the block ids", 1)[0]
    row = next(line for line in table.splitlines() if line.startswith(f"| {rule} |"))
    stated = row.split(" | ")[1]
    missing = [p for p in sorted(registered()[rule]) if f"`{p}`" not in stated]
    assert not missing, f"docs/rules.md's {rule} row does not name {missing}"


def test_the_readme_names_every_rule_in_the_catalogues_order():
    readme = (ROOT / "README.md").read_text().split("## The rules", 1)[1].split("\n\n", 2)[1]
    named = [n for n in re.findall(r"[a-z]+(?:-[a-z]+)*", readme) if n in RULES]
    assert named == list(RULES)


COUNT_WORDS = "twelve|thirteen|fourteen|fifteen|sixteen|seventeen|eighteen|nineteen|twenty"


def test_no_document_hard_codes_how_many_rules_there_are():
    """The catalogue decides how many rules there are; prose that counts
    them goes stale with the next rule."""
    pattern = re.compile(rf"\b(\d+|{COUNT_WORDS}) (?:\w+ )?rules\b", re.I)
    documents = [ROOT / "README.md", ROOT / "spec" / "README.md", ROOT / "spec" / "catalogue.py",
                 *sorted((ROOT / "docs").glob("*.md"))]
    stale = [f"{path.relative_to(ROOT)}: {m.group(0)!r}" for path in documents
             for m in pattern.finditer(path.read_text()) if "rule" in m.group(0).lower()]
    assert not stale, stale


def test_the_hashing_examples_are_what_the_code_computes():
    """Chapter 1.1's worked example stays true: its root, its CBOR bytes and
    its hash are recomputed here (a document that runs)."""
    import cbor2

    from kvspec import hashing

    root = hashing.root_hash("0")
    first = hashing.hash_block_tokens(hashing.sha256_cbor, None, [1, 2], None, none_hash=root)
    encoded = cbor2.dumps((root, (1, 2), None), canonical=True).hex()
    assert f"`{root.hex()}`" in DOC and f"`{first.hex()}`" in DOC
    assert encoded.startswith("835820" + root.hex()[:4]) and encoded.endswith(root.hex()[-4:] + "820102f6")
    assert "`83 58 20 4e11…1c3e 82 01 02 f6`" in DOC
    assert str(int.from_bytes(first, "big") & (2**64 - 1)) in DOC
    extra, _ = hashing.generate_block_hash_extra_keys(_LoraSaltImage(), 0, 2, 0)
    assert extra == ("adapter-a", ("image-a", 1), "salt")
    assert '`extra = ["adapter-a",\n   ["image-a", 1], "salt"]`' in DOC


class _LoraSaltImage:
    """A request with a LoRA adapter, an image from offset 1 and a salt."""

    from kvspec.request import LoRARequest, MultiModalFeatureSpec, PlaceholderRange

    lora_request = LoRARequest("adapter-a", 1)
    mm_features = [MultiModalFeatureSpec("image-a", PlaceholderRange(offset=1, length=3))]
    cache_salt = "salt"
    prompt_embeds = None
