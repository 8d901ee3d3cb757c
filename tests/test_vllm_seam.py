"""The vLLM seam: kvspec's package imports vLLM only in the seam's three
rooms, each at the layer that uses it (tests/test_layers.py):
``kvspec/conformance/vllm/`` (the adapters, vLLM's scheduler, the
findings, ``compat``: every switch on the release), ``models/vllm_*.py``
(the kernel stage's side: vLLM's worker path and kernels) and
``kvspec/dropin.py`` (impl inside vLLM) -- so that they are where a
release's API is met (issue 26).  Scripts that stand outside the package --
the findings' standalone reproductions (vLLM alone, by design), benchmarks
and tools that put vLLM's classes side by side with kvspec's -- are not the
package and are not held to it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ("kvspec", "spec", "impl", "models", "proofs")
SEAM = ROOT / "kvspec" / "conformance" / "vllm"
ROOMS = (ROOT / "kvspec" / "dropin.py", *sorted((ROOT / "models").glob("vllm_*.py")))


def vllm_imports(path: Path) -> list[str]:
    """``line: statement`` for every import of a vllm module in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        if any(n == "vllm" or n.startswith("vllm.") for n in names):
            found.append(f"{node.lineno}: {', '.join(names)}")
    return found


def test_only_the_seam_imports_vllm():
    offenders = {}
    for top in PACKAGE:
        for path in sorted((ROOT / top).rglob("*.py")):
            if SEAM in path.parents or path in ROOMS:
                continue
            if hits := vllm_imports(path):
                offenders[str(path.relative_to(ROOT))] = hits
    assert not offenders, f"vLLM imported outside the seam: {offenders}"
    assert {p.name for p in ROOMS} == {"dropin.py", "vllm_kernels.py", "vllm_runner_choice.py", "vllm_specs.py",
                                       "vllm_worker.py", "vllm_worker_v2.py"}


def test_the_check_sees_an_import(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from vllm.v1.core import block_pool\n    import vllm\n")
    assert vllm_imports(planted) == ["2: vllm.v1.core", "3: vllm"]


def test_an_overlaid_source_is_named_in_the_reports_versions(tmp_path, monkeypatch):
    import json

    from kvspec.conformance.vllm import installed

    monkeypatch.setattr(installed, "package_dir", lambda: str(tmp_path) + "/")
    assert installed.overlay() is None  # a release as shipped
    (tmp_path / "KVSPEC_OVERLAY.json").write_text(json.dumps({"source": "/src/fork", "commit": "ab" * 20}))
    assert installed.overlay() == "/src/fork@abababababab"
