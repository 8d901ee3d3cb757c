"""What a standalone reproduction script imports: a bug report's script
must run where kvspec is not installed, on the engine alone."""

import ast
from pathlib import Path


def imported_packages(script: Path) -> set[str]:
    """The top-level packages ``script`` imports."""
    imported = set()
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    return imported
