"""The layout catalogue (:mod:`kvspec.conformance.machines.catalogue`): one
index of every scope's layouts, from which their counts are read (issue 53)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from kvspec.conformance.machines import catalogue
from kvspec.conformance.runner import SCOPES, layout_names

MACHINES = Path(catalogue.__file__).parent


def _tables() -> dict[str, dict]:
    """Every module-level table of layouts in machines/: a name ``LAYOUTS``
    or ``*_LAYOUTS`` assigned at a module's top (read from the source, so
    that the kernel machine's torch is not imported for it)."""
    found = {}
    for path in sorted(MACHINES.glob("*.py")):
        names = [t.id for node in ast.parse(path.read_text()).body if isinstance(node, (ast.Assign, ast.AnnAssign))
                 for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                 if isinstance(t, ast.Name) and (t.id == "LAYOUTS" or t.id.endswith("_LAYOUTS"))]
        if names:
            module = importlib.import_module(f"kvspec.conformance.machines.{path.stem}")
            found.update({f"{path.stem}.{name}": getattr(module, name) for name in names})
    return found


def test_every_layout_table_is_in_the_catalogue():
    indexed = [*catalogue.CATALOGUE.values(), *catalogue.LATER.values()]
    tables = _tables()
    missing = [name for name, table in tables.items() if not any(table is t for t in indexed)]
    assert not missing, f"layout tables outside the catalogue: {missing}"
    assert set(catalogue.CATALOGUE) == set(SCOPES) and len(tables) == 6, sorted(tables)


def test_the_counts_are_the_tables():
    counts = catalogue.counts()
    assert counts["pool"] == len(layout_names("pool"))
    assert counts["cache"] == len(layout_names("cache"))
    assert counts["offload"] == len(layout_names("offload"))
    assert counts["scheduler"] + counts["scheduler (engine variants)"] == len(layout_names("scheduler"))
    assert counts["manager"] + counts["manager (later releases)"] == \
        len(catalogue.CATALOGUE["manager"]) + len(catalogue.LATER["manager"])
    assert counts["models"] == len(catalogue.MODELS) > 0


def test_the_command_line_lists_the_layouts_without_building_a_spec(monkeypatch):
    """--layout's help reads the catalogue: no spec manager is built (to ask
    a release whether it has a later layout) before an argument is read."""
    import kvspec.conformance.machines.configurations as configurations
    from kvspec.cli import build_parser

    def built(*args, **kwargs):
        raise AssertionError("a spec manager built to write the help")

    monkeypatch.setattr(configurations, "refusal", built)
    monkeypatch.setattr("kvspec.conformance.runner.refusal", built)
    text = build_parser().format_help() + next(a for a in build_parser()._subparsers._actions
                                               if a.choices).choices["conform"].format_help()
    assert "full+swa" in text and "tiny-pool" in text and "page-4" in text
