"""The house by layer: which part of kvspec may import which.

Read bottom-up, each layer uses only the layers below it: ``LAYERS`` below is
the table, defined here only; docs/layers.md and the README show it, and the
last test checks their rows against it.

spec and impl share a rank and never import each other: impl is checked
against spec, so neither may lean on the other.  The drop-in is impl seen
from vLLM (it needs impl, vLLM, and the spec's release catalogue for
the deltas impl is built with); conformance uses it to drive impl
under vLLM's own scheduler.  Every import counts, those
inside functions too -- a lazy import is still a dependency, and a cycle
through one is still a cycle; only ``if TYPE_CHECKING:`` imports, which
never run, do not count.

Conformance is one layer seen from outside and a ladder of rooms inside
(its table is further down, at ``CONFORMANCE_RANKS``): each room imports
only the rooms below it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"kvspec": "kvspec", "kvspec.spec": "spec", "kvspec.impl": "impl", "kvspec.models": "models",
            "kvspec.proofs": "proofs"}
# The layers, bottom-up: (layer, rank, modules).  A module is in the row that names it or a package
# above it (``kvspec.spec`` holds every ``kvspec.spec.*``); ``kvspec`` names the package's root alone.
LAYERS = (
    ("vocabulary", 0, ("kvspec", "kvspec.errors", "kvspec.hashing", "kvspec.request", "kvspec.kv_cache_interface")),
    ("spec", 1, ("kvspec.spec",)),
    ("impl", 1, ("kvspec.impl",)),
    ("dropin", 2, ("kvspec.dropin", "kvspec.dropin_releases")),
    ("testing", 2, ("kvspec.testing",)),
    ("models", 3, ("kvspec.models",)),
    ("conformance", 4, ("kvspec.conformance",)),
    ("proofs", 5, ("kvspec.proofs",)),
    ("roof", 6, ("kvspec.cli", "kvspec.pytest_plugin", "kvspec.fuzz")),
)


def modules() -> dict[str, Path]:
    """Every kvspec module, by dotted name."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([package, *parts])
            if package == "kvspec" and parts[:1] in (["spec"], ["impl"], ["models"], ["proofs"]):
                continue
            found[name] = path
    return found


MODULES = modules()


def imports(name: str) -> set[str]:
    """The kvspec modules ``name`` imports, anywhere in its text."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names]
            if any(target not in MODULES for target in targets):  # a name from the package itself
                targets.append(base)
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name and target.startswith("kvspec"):
                out.add(target)
    return out


def _runtime_nodes(tree: ast.AST):
    """Every node that can run: ``if TYPE_CHECKING:`` bodies left out."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


GRAPH = {name: imports(name) for name in MODULES}


def layer(name: str) -> tuple[str, int]:
    for layer_name, rank, names in LAYERS:
        if any(name == n or (n != "kvspec" and name.startswith(n + ".")) for n in names):
            return layer_name, rank
    raise AssertionError(f"{name} belongs to no layer: add it to tests/test_layers.py's LAYERS")


def test_every_module_belongs_to_a_layer():
    for name in MODULES:
        layer(name)


def test_each_layer_imports_only_the_layers_below_it():
    wrong = []
    for name, targets in GRAPH.items():
        mine, rank = layer(name)
        for target in sorted(targets):
            theirs, their_rank = layer(target)
            if their_rank > rank or (their_rank == rank and theirs != mine):
                wrong.append(f"{name} ({mine}) imports {target} ({theirs})")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle():
    """Tarjan's strongly connected components over the import graph: any
    component of more than one module is a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_the_graph_sees_lazy_imports():
    """The check reads imports inside functions too (a cycle through a lazy
    import is still a cycle): the gate's lazy import of vLLM's targets shows."""
    assert "kvspec.conformance.vllm.targets" in GRAPH["kvspec.conformance.runner"]
    assert "kvspec.conformance.machines.kernel" in GRAPH["kvspec.conformance.kernel_stage"]


# --- conformance/ in rooms, and the documents' tables of the layers ----------------------------------

CONFORMANCE = ROOT / "kvspec" / "conformance"
ROOMS = sorted(p.parent.name for p in CONFORMANCE.glob("*/__init__.py"))


def test_conformance_keeps_at_most_ten_modules_at_its_root():
    root = sorted(p.name for p in CONFORMANCE.glob("*.py"))
    assert len(root) <= 10, root


def test_every_room_says_in_a_paragraph_what_lives_there():
    for room in ROOMS:
        doc = ast.get_docstring(ast.parse((CONFORMANCE / room / "__init__.py").read_text()))
        assert doc and len(doc.split()) >= 20, f"kvspec/conformance/{room}/__init__.py has no paragraph"
        for module in sorted((CONFORMANCE / room).glob("*.py")):
            if module.stem != "__init__":
                assert f"``{module.stem}``" in doc, f"{room}'s docstring does not say what {module.name} is"


def test_the_layer_table_names_every_conformance_module_and_room():
    row = next(line for line in (ROOT / "docs" / "layers.md").read_text().splitlines()
               if line.startswith("| conformance |"))
    missing = [p.name for p in CONFORMANCE.glob("*.py") if p.stem != "__init__" and f"`{p.name}`" not in row]
    missing += [f"{room}/" for room in ROOMS if f"`{room}/`" not in row]
    assert not missing, f"docs/layers.md's conformance row does not name {missing}"


def table_rows(path: Path) -> list[tuple[str, int, tuple[str, ...]]]:
    """A document's layer table: each row whose second cell is a rank, as
    (layer, rank, the modules its third cell names)."""
    rows = []
    for line in path.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) >= 3 and cells[1].isdigit():
            rows.append((cells[0], int(cells[1]), tuple(re.findall(r"`(kvspec[\w.]*)`", cells[2]))))
    return rows


@pytest.mark.parametrize("document", ["README.md", "docs/layers.md"])
def test_the_documents_layer_tables_are_layers(document):
    """The README's table and docs/layers.md's are LAYERS, row for row."""
    assert table_rows(ROOT / document) == list(LAYERS), f"{document}'s layer table differs from LAYERS"


# --- inside conformance: its rooms form a ladder -----------------------------------------------------
#
# A room is a folder of kvspec/conformance/ or a module at its root.  Read bottom-up, each room imports
# only rooms of a lower rank (and itself); rooms that share a rank never import each other, so there is
# no cycle among rooms.  The errors every room raises live below them all, in kvspec.errors.
#
# The vLLM seam (vllm/) is one folder, so that it is the one place vLLM is imported
# (tests/test_vllm_seam.py), but its modules sit at four heights: the seam's floor drives vLLM's own
# classes and imports nothing of conformance; its adapters build on targets/; its scheduler findings
# are traces for the scheduler machine; its version probe replays every finding, as the gate does.
#
# ====  ===============================================================================================
# rank  rooms
# ====  ===============================================================================================
#  0    trace, settings, spec_coverage, vllm (floor: compat, installed, scheduler, connector, offload)
#  1    targets, engines
#  2    vllm (adapters: targets, upstream)
#  3    machines
#  4    vllm (scheduler_findings)
#  5    findings
#  6    report
#  7    runner
#  8    show, kernel_stage, vectors, vllm (version_probe)
#  9    gate
# 10    mutation
# ====  ===============================================================================================

CONFORMANCE_RANKS = {
    "trace": 0, "settings": 0, "spec_coverage": 0, "vllm": 0,
    "targets": 1, "engines": 1,
    "vllm.adapters": 2,
    "machines": 3,
    "vllm.findings": 4,
    "findings": 5,
    "report": 6,
    "runner": 7,
    "show": 8, "kernel_stage": 8, "vectors": 8, "vllm.probe": 8,
    "gate": 9,
    "mutation": 10,
}
VLLM_HEIGHTS = {"targets": "vllm.adapters", "upstream": "vllm.adapters", "scheduler_findings": "vllm.findings",
                "version_probe": "vllm.probe"}


def room(name: str) -> str | None:
    """The conformance room of module ``name`` (vllm's modules by their height); None outside conformance."""
    parts = name.split(".")
    if parts[:2] != ["kvspec", "conformance"] or len(parts) < 3:
        return None
    if parts[2] == "vllm" and len(parts) > 3:
        return VLLM_HEIGHTS.get(parts[3], "vllm")
    return parts[2]


def test_every_conformance_room_has_a_rank():
    unranked = sorted({room(n) for n in MODULES if room(n) and room(n) not in CONFORMANCE_RANKS})
    assert not unranked, f"conformance rooms with no rank: add them to tests/test_layers.py's ladder: {unranked}"
    assert set(CONFORMANCE_RANKS) == {room(n) for n in MODULES if room(n)}, "a rank for a room that is gone"


def test_each_conformance_room_imports_only_rooms_below_it():
    wrong = []
    for name, targets in GRAPH.items():
        if (mine := room(name)) is None:
            continue
        for target in sorted(targets):
            theirs = room(target)
            if theirs is not None and theirs != mine and CONFORMANCE_RANKS[theirs] >= CONFORMANCE_RANKS[mine]:
                wrong.append(f"{name} ({mine}, rank {CONFORMANCE_RANKS[mine]}) imports "
                             f"{target} ({theirs}, rank {CONFORMANCE_RANKS[theirs]})")
    assert not wrong, "\n".join(wrong)


def test_no_cycle_among_conformance_rooms():
    """The ladder rules cycles out; this checks it outright, over the rooms' graph (vllm/ as one room too,
    but for its heights)."""
    edges: dict[str, set[str]] = {}
    for name, targets in GRAPH.items():
        if (mine := room(name)) is not None:
            edges.setdefault(mine, set()).update(t for t in map(room, targets) if t is not None and t != mine)
    order: list[str] = []
    state: dict[str, int] = {}

    def visit(v: str, path: list[str]) -> None:
        if state.get(v) == 1:
            raise AssertionError(f"a cycle among conformance's rooms: {' -> '.join(path[path.index(v):] + [v])}")
        if state.get(v) == 2:
            return
        state[v] = 1
        for w in sorted(edges.get(v, ())):
            visit(w, path + [v])
        state[v] = 2
        order.append(v)

    for v in sorted(edges):
        visit(v, [])


def test_the_ladder_sees_a_lazy_import():
    """findings imports the scheduler's findings inside a function: still an edge of the ladder."""
    assert "kvspec.conformance.vllm.scheduler_findings" in GRAPH["kvspec.conformance.findings"]
    assert room("kvspec.conformance.vllm.scheduler_findings") == "vllm.findings"
