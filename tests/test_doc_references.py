"""Every reference a document makes resolves: the README, docs/, spec/README.md
and the examples' READMEs name files, modules and symbols, and code moves
under them.  Checked, without importing anything (vLLM need not be here):

- every relative link ``[text](path)`` is a file or folder;
- every backticked path under a folder of the repository (``kvspec/...py``,
  ``tools/x.sh``, ``tests/test_x.py``; a glob or ``{a,b}`` matches something;
  in a fenced block, every such word) exists, and a bare ``x.py`` that is a
  document's subject exists beside the document;
- every backticked dotted ``kvspec.x.y`` is a module, or a module and a name
  it defines (``kvspec.errors.RuleError``), a class's member one level down;
- the names a document places in a file exist there, read with ``ast``:
  ``path::name``, ```path.py`'s `name```, ```name` in `path.py```, and a
  checklist item led by files -- ``1. `spec/layout.py` -- ... `GroupView```
  -- for the names before the item's next file;
- ``delta `key``` names a release delta of the spec's catalogue;
- the layout counts the documents state (``5 pool layouts``, ``25 manager
  layouts``) are the machines' own.
"""

from __future__ import annotations

import ast
import functools
import glob
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = sorted({ROOT / "README.md", ROOT / "spec" / "README.md", *(ROOT / "docs").glob("*.md"),
                    *(ROOT / "examples").rglob("README.md")})
# Folders of the repository a backticked path may start with; a path elsewhere (reports/, a venv, ~/.cache)
# is something a command writes, not a file of the tree.
TREE = {"kvspec", "spec", "impl", "models", "proofs", "tests", "tools", "benchmarks", "examples", "docs",
        "vectors", ".ci"}
PACKAGES = {"kvspec.spec": "spec", "kvspec.impl": "impl", "kvspec.models": "models", "kvspec.proofs": "proofs",
            "kvspec.finding_traces": "docs/findings", "kvspec": "kvspec"}
IDENTIFIER = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
SPAN = re.compile(r"`([^`\n]+)`")


def prose(text: str) -> str:
    """The document without its fenced blocks."""
    return FENCE.sub("", text)


def fenced_words(text: str) -> list[str]:
    return [word for block in FENCE.findall(text) for word in block.split()]


def relative(document: Path) -> str:
    return str(document.relative_to(ROOT))


# --- files --------------------------------------------------------------------------------------


def expand(path: str) -> list[str]:
    """``a.{b,c}.d`` as ``a.b.d`` and ``a.c.d``."""
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    return [p for part in match.group(1).split(",") for p in expand(path[:match.start()] + part + path[match.end():])]


def exists(path: str, base: Path = ROOT) -> bool:
    return all((any(glob.glob(str(base / p))) if "*" in p else (base / p).exists()) for p in expand(path))


def tree_path(word: str) -> str | None:
    """The repository path a word names, or None: a relative path whose first
    folder is one of the tree's, without a test id, line or trailing mark."""
    word = word.split()[0].strip("()[],;:.'\"").split("::")[0] if word.split() else ""
    if "/" not in word or word.startswith(("/", "~", "http")) or "<" in word or "..." in word or "$" in word:
        return None
    if word.split("/")[0] not in TREE:
        return None
    return word.rstrip("/") or None


def near(document: Path, name: str) -> Path | None:
    """A bare or relative ``name`` as the document means it: beside it, else
    from the repository's root."""
    for base in (document.parent, ROOT):
        if (base / name).exists():
            return base / name
    return None


# --- names --------------------------------------------------------------------------------------


@functools.cache
def defined(path: Path) -> frozenset[str]:
    """Every name a Python file (or a package's files) defines or imports:
    functions, classes, assigned names and attributes, anywhere in it."""
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    names = set()
    for file in files:
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[0])
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return frozenset(names)


@functools.cache
def top_level(path: Path) -> dict[str, ast.AST]:
    """A module's top-level names (a package: its ``__init__.py``'s), each
    with its node (a class's, to look one level into it)."""
    file = path / "__init__.py" if path.is_dir() else path
    out: dict[str, ast.AST] = {}
    for node in ast.parse(file.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        out[name.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                out[(alias.asname or alias.name).split(".")[0]] = node
    return out


def module_path(dotted: str) -> Path | None:
    """The file or folder of a dotted kvspec module, or None."""
    for package, folder in sorted(PACKAGES.items(), key=lambda item: -len(item[0])):
        if dotted == package or dotted.startswith(package + "."):
            rest = dotted[len(package):].lstrip(".").split(".") if dotted != package else []
            base = ROOT / folder / Path(*rest) if rest else ROOT / folder
            if base.is_dir() and (base / "__init__.py").exists():
                return base
            if base.with_suffix(".py").exists():
                return base.with_suffix(".py")
            return None
    return None


def resolve_dotted(dotted: str) -> str | None:
    """Why ``kvspec.x.y[.Name[.member]]`` does not resolve, or None."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        path = module_path(".".join(parts[:cut]))
        if path is None:
            continue
        rest = parts[cut:]
        if not rest:
            return None
        names = top_level(path)
        if rest[0] not in names:
            return f"{'.'.join(parts[:cut])} defines no {rest[0]}"
        node = names[rest[0]]
        if len(rest) > 1 and isinstance(node, ast.ClassDef) and rest[1] not in defined_in_class(node):
            return f"{'.'.join(parts[:cut + 1])} has no {rest[1]}"
        return None
    return "no such module"


def defined_in_class(node: ast.ClassDef) -> set[str]:
    names = set()
    for child in ast.walk(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(child.name)
        elif isinstance(child, (ast.Name, ast.Attribute)) and isinstance(child.ctx, ast.Store):
            names.add(child.id if isinstance(child, ast.Name) else child.attr)
    return names


def name_of(span: str) -> str | None:
    """The Python name a backticked span is, or None: ``f(x)`` is ``f``."""
    match = IDENTIFIER.fullmatch(span.split("(")[0].split("[")[0].strip())
    return match.group(0) if match else None


def code_file(document: Path, span: str) -> Path | None:
    """The Python file or package a backticked path or module names."""
    if span.startswith("kvspec."):
        return module_path(span)
    if span.endswith(".py"):
        return near(document, span)
    return None


def missing_names(path: Path, names: list[str]) -> list[str]:
    have = defined(path)
    return [n for n in names if any(part not in have for part in n.split("."))]


# --- the checks ---------------------------------------------------------------------------------


def problems(document: Path) -> list[str]:
    text = document.read_text()
    body = prose(text)
    found = []
    for target in re.findall(r"\]\(([^)\s]+)\)", body):
        if target.startswith(("http:", "https:", "mailto:", "#")):
            continue
        if not (document.parent / target.split("#")[0]).exists():
            found.append(f"link ({target}) leads nowhere")
    for word in [*SPAN.findall(body), *fenced_words(text)]:
        path = tree_path(word)
        if path and not exists(path):
            found.append(f"`{path}` does not exist")
    for span in SPAN.findall(body):
        dotted = span.split("(")[0].split(":")[0].strip()
        if re.fullmatch(r"kvspec(\.\w+)+", dotted) and not dotted.startswith("kvspec.egg"):
            why = resolve_dotted(dotted)
            if why:
                found.append(f"`{dotted}`: {why}")
    for path, name in re.findall(r"`([\w./-]+\.py)::([\w\[\]*.-]+)`", body):
        file = near(document, path)
        if file and name.split("[")[0] not in defined(file):
            found.append(f"`{path}::{name}`: no {name.split('[')[0]} in {path}")
    owned = re.findall(r"`([\w./-]+\.py|kvspec\.[\w.]+)`'s `([^`]+)`", body)
    owned += [(path, name) for name, path in re.findall(r"`([^`]+)` in `([\w./-]+\.py)`", body)]
    for path, span in owned:
        file, name = code_file(document, path), name_of(span)
        if file is None:
            found.append(f"`{path}` does not exist")
        elif name and missing_names(file, [name]):
            found.append(f"`{path}`'s `{name}`: not there")
    for item in checklist_items(body):
        found += item_problems(document, item)
    for key in re.findall(r"\bdeltas? `([a-z0-9-]+)`", body):
        if key not in delta_keys():
            found.append(f"delta `{key}` is no delta of the spec's catalogue")
    return found


def checklist_items(body: str) -> list[str]:
    """The text of every list item (numbered or not), continuation lines
    joined."""
    items, current = [], None
    for line in body.splitlines():
        if re.match(r"\s*(\d+\.|-) ", line):
            if current is not None:
                items.append(current)
            current = re.sub(r"^\s*(\d+\.|-) ", "", line)
        elif current is not None and line.startswith("   ") and line.strip():
            current += " " + line.strip()
        elif current is not None:
            items.append(current)
            current = None
    if current is not None:
        items.append(current)
    return items


def item_problems(document: Path, item: str) -> list[str]:
    """A checklist item led by files (```a.py` -- ...``, ```a.py` or `b.py`
    (...) -- ...``): the names after the dash, up to the next file or module
    the item names, are the lead files' (one of them)."""
    lead = re.match(r"((?:`[^`]+\.py`(?:'s `[^`]+`)?(?: \([^)]*\))?(?:,| or| and)? ?)+) --", item)
    if not lead:
        return []
    files = [code_file(document, span) for span in re.findall(r"`([^`]+\.py)`", lead.group(1))]
    if not all(files):
        return []  # a missing lead file is reported as a path
    names = []
    for span in SPAN.findall(item[lead.end():]):
        if span.endswith((".py", ".md", ".sh", ".json")) or "/" in span or span.startswith("kvspec."):
            break
        name = name_of(span)
        if name and " " not in span and "=" not in span:
            names.append(name)
    wrong = [n for n in names if all(missing_names(f, [n]) for f in files)]
    return [f"`{n}` is named under {', '.join(str(f.relative_to(ROOT)) for f in files)}, which do not define it"
            for n in wrong]


@functools.cache
def delta_keys() -> frozenset[str]:
    """Every delta key the spec's release catalogue holds (the ``key=``
    of its ``Delta(release, key, ...)`` calls)."""
    keys = set()
    for path in (ROOT / "spec").rglob("*.py"):
        if "releases" not in str(path.relative_to(ROOT)):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Delta":
                for keyword in node.keywords:
                    if keyword.arg == "key" and isinstance(keyword.value, ast.Constant):
                        keys.add(keyword.value.value)
                if len(node.args) > 1 and isinstance(node.args[1], ast.Constant):  # Delta(release, key, ...)
                    keys.add(node.args[1].value)
    return frozenset(keys)


@pytest.mark.parametrize("document", DOCUMENTS, ids=relative)
def test_every_reference_a_document_makes_resolves(document):
    found = problems(document)
    assert not found, f"{relative(document)}:\n" + "\n".join(found)


def test_the_checks_catch_stale_pointers(tmp_path):
    """The three kinds of pointer issue 53 found stale: a name placed in a file
    that does not define it, a path that moved, a delta that is none."""
    page = tmp_path / "page.md"
    page.write_text(
        "1. `kvspec/conformance/vllm/compat.py` -- a switch (see `extra_key_format`, `hit_of`), in the seam.\n"
        "2. `kvspec/conformance/vllm/targets.py` -- `to_vllm_spec` for vLLM's class.\n"
        "\nSee `kvspec/conformance/gone.py`, `kvspec.conformance.runner.NOPE` and delta `no-such-delta`.\n")
    found = "\n".join(problems(page))
    for stale in ("`extra_key_format` is named", "`to_vllm_spec` is named", "gone.py` does not exist",
                  "defines no NOPE", "delta `no-such-delta`"):
        assert stale in found, found
    assert "hit_of" not in found


def test_the_documents_layout_counts_are_the_machines():
    """'5 pool layouts', '25 manager layouts': the numbers the documents
    state are the layout tables' sizes (read from their source, no import)."""
    pool = top_level(ROOT / "kvspec" / "conformance" / "machines" / "pool.py")["LAYOUTS"]
    manager = top_level(ROOT / "kvspec" / "conformance" / "machines" / "layouts.py")["MANAGER_LAYOUTS"]
    sizes = {"pool": len(pool.value.keys), "manager": len(manager.value.keys)}
    wrong = []
    for document in DOCUMENTS:
        for number, scope in re.findall(r"\b(\d+) (pool|manager) layouts\b", document.read_text()):
            if int(number) != sizes[scope]:
                wrong.append(f"{relative(document)}: {number} {scope} layouts (there are {sizes[scope]})")
    assert not wrong, wrong


COUNT = r"\d+|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve"
NOT_DELTAS_COUNTED = re.compile(rf"not deltas yet \((?:{COUNT})\b"
                                rf"|\b(?:{COUNT}) (?:changes )?(?:that are )?not deltas yet")


def test_no_document_counts_the_changes_that_are_not_deltas_yet():
    """docs/release-survey.md lists the changes that are not deltas yet; a
    count of them elsewhere goes stale with the next delta (chapter 9's
    'eight, among them 0.33's lookahead block hashes' did)."""
    stale = [f"{relative(d)}: {m.group(0)!r}" for d in DOCUMENTS if d.name != "release-survey.md"
             for m in NOT_DELTAS_COUNTED.finditer(" ".join(d.read_text().split()))]
    assert not stale, stale


def test_the_readme_stays_a_front_door():
    """The README is the two commands, what kvspec is, a tour and links (issue
    53): at most 200 lines; a manual grows in docs/, where the README links it."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move the detail to a page of docs/"
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)", "\n".join(lines)))
    unlinked = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name not in linked)
    assert not unlinked, f"README.md links no {unlinked}"
