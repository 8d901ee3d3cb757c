"""vLLM beside the installed one: the upstream a fork is judged against.

A fork of vLLM and its upstream release cannot share a process (both are
``import vllm``), so ``kvspec conform --target vllm --against vllm==0.25.1``
runs the upstream in a child process (:mod:`kvspec.conformance.targets.remote`)
and the machines run the two in lockstep: every difference is the fork's
change.  The upstream is named in one of two ways:

* ``vllm==X`` -- release X's Python tree, installed alone under
  ``~/.cache/kvspec/vllm-versions/X`` (``pip install --no-deps --target``,
  reused when present) and imported in front of this interpreter's packages:
  this environment supplies vLLM's import-time dependencies, as in the
  version matrix (``tools/version_matrix.py``);
* a path to another environment's interpreter (or the environment's
  directory) where vLLM and kvspec are installed.

This module is also the child's program: ``python -m
kvspec.conformance.vllm.upstream`` serves vLLM's own ``BlockPool`` and
``KVCacheManager`` through the same adapters as ``--target vllm``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from kvspec.conformance.targets import remote
from kvspec.errors import SetupError

CACHE = Path(os.environ.get("KVSPEC_CACHE", Path.home() / ".cache" / "kvspec")) / "vllm-versions"
LATER_IMPORTS = ("fastapi", "starlette", "opentelemetry-api", "partial_json_parser", "anyio", "annotated-doc", "einops")
"""What later releases import at start-up that 0.25.1 did not (installed
without their dependencies, like vLLM itself: an environment made by
``tools/install_vllm.sh`` already has pydantic, typing-extensions and the rest)."""


WHEEL_MB, INSTALLED_MB = 250, 600
"""What ``vllm==X`` costs the first time (measured on 0.25.1 and 0.34.0: a
250 MB wheel, 550-630 MB unpacked), said before the download starts."""


def install(version: str, python: str = sys.executable) -> Path:
    """vLLM ``version``'s Python tree alone in its own directory under
    :data:`CACHE` (reused when present), and the later releases' extra
    imports beside it."""
    target = CACHE / version
    if not (target / "vllm" / "__init__.py").exists():
        print(f"kvspec: --against vllm=={version}: downloading vLLM {version}'s wheel alone, without its dependencies "
              f"(about {WHEEL_MB} MB; about {INSTALLED_MB} MB installed in {target}, which later runs reuse) -- "
              "once, a minute or two", file=sys.stderr, flush=True)
        pip(python, "--target", str(target), f"vllm=={version}")
    extra = CACHE / "later-imports"
    if not (extra / "fastapi").exists():
        pip(python, "--target", str(extra), *LATER_IMPORTS)
    return target


def release_path(target: Path) -> tuple[str, str]:
    """What goes first on ``PYTHONPATH`` to import the release in ``target``."""
    return str(target), str(CACHE / "later-imports")


def pip(python: str, *args: str) -> None:
    run = subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                          *args], capture_output=True, text=True)
    if run.returncode != 0:
        last = (run.stderr or run.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise SetupError(f"pip install {' '.join(args[2:])} failed: {last[0]}")


def interpreter(against: str) -> remote.Interpreter:
    """Where the upstream named by ``--against`` runs (see the module's
    doc); a name that is neither form is a ``SetupError``."""
    seed = ("PYTHONHASHSEED", os.environ.get("PYTHONHASHSEED", "0"))  # both sides' hash chains from one root
    module = __name__
    if match := re.fullmatch(r"vllm==(\d+\.\d+\.\d+\S*)", against):
        version = match[1]
        return remote.Interpreter(sys.executable, module, release_path(install(version)),
                                  label=f"vLLM {version} (upstream)", env=(seed,))
    path = Path(against).expanduser()
    if path.is_dir():
        path = path / "bin" / "python"
    if path.is_file() and os.access(path, os.X_OK):
        return remote.Interpreter(str(path), module, label=f"vLLM at {against} (upstream)", env=(seed,))
    raise SetupError(f"--against {against!r}: name the upstream as vllm==X.Y.Z (a release from the package index) "
                     f"or as the interpreter (or environment directory) of an environment where vLLM is installed")


def start(against: str) -> remote.Child:
    """The upstream's child process, started and asked what it runs: one
    that does not start is a ``SetupError`` naming why."""
    child = remote.Child(interpreter(against))
    try:
        child.start()
    except BaseException as error:  # HarnessFault included: nothing has run yet, so it is a setup problem
        child.stop()
        raise SetupError(f"--against {against}: the upstream did not start: {error}") from None
    if problem := child.hello.get("problem"):
        child.stop()
        raise SetupError(f"--against {against}: vLLM does not import there ({problem})")
    wanted = against.removeprefix("vllm==") if against.startswith("vllm==") else None
    if wanted and child.hello["vllm"] != wanted:
        child.stop()
        raise SetupError(f"--against {against}: the child imported vLLM {child.hello['vllm']}, not {wanted} "
                         f"(is another vLLM first on PYTHONPATH?)")
    return child


# --- the child's program -----------------------------------------------------------------------


def hello() -> dict[str, Any]:
    """What this child runs: vLLM's release and source, or why vLLM does not import."""
    from kvspec.conformance.vllm import installed

    if (problem := installed.problem()) is not None:
        return {"problem": problem}
    return {"vllm": installed.version(), "source": installed.overlay(), "package": installed.package_dir()}


def build(scope: str, args: Any, kwargs: dict[str, Any]) -> Any:
    """vLLM's own pool or manager behind the adapters ``--target vllm`` uses."""
    from kvspec import hashing
    from kvspec.conformance.vllm.targets import VllmManagerTarget, VllmPoolTarget

    hashing.init_none_hash()
    return (VllmPoolTarget if scope == "pool" else VllmManagerTarget)(*args, **kwargs)


if __name__ == "__main__":
    remote.serve(build, hello)
