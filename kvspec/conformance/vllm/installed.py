"""The installed vLLM, as the rest of kvspec asks about it: whether it
imports, which release it is, where its code lives.

Every question kvspec outside this package asks about vLLM goes through
here or through the other modules of the seam; nothing outside
:mod:`kvspec.conformance.vllm` imports vLLM (``tests/test_vllm_seam.py``
keeps it so).  vLLM is imported inside the functions, so that asking
costs nothing where it is absent.
"""

from __future__ import annotations

import importlib.util
import json
import os


def problem(module: str = "vllm.v1.core.block_pool") -> str | None:
    """Why ``module`` of vLLM does not import here (``"ImportError: ..."``,
    or whatever a broken install raises), or ``None`` when it does."""
    error = import_error(module)
    return None if error is None else f"{type(error).__name__}: {error}"


def import_error(module: str = "vllm.v1.core.block_pool") -> BaseException | None:
    """What importing ``module`` of vLLM raises here (``ModuleNotFoundError``
    where vLLM is not installed), or ``None`` when it imports."""
    if importlib.util.find_spec("vllm") is None:
        return ModuleNotFoundError("No module named 'vllm'", name="vllm")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout is kvspec's (runner.quiet_loggers)
    try:
        importlib.import_module(module)
    except Exception as error:  # ImportError, or a broken install's own error
        return error
    return None


def scheduler_importable() -> bool:
    """Whether vLLM's scheduler imports here (without importing vLLM when it is absent)."""
    return problem("vllm.v1.core.sched.scheduler") is None


def version() -> str:
    """The installed vLLM's ``__version__`` (vLLM must import)."""
    import vllm

    return vllm.__version__


def overlay() -> str | None:
    """The source tree put over the installed wheel (``tools/overlay_vllm.py``),
    as ``SOURCE@COMMIT``, or ``None`` for a release as shipped."""
    directory = package_dir()
    record = os.path.join(directory, "KVSPEC_OVERLAY.json") if directory else None
    if record is None or not os.path.isfile(record):
        return None
    with open(record) as f:
        found = json.load(f)
    return f"{found['source']}@{found['commit'][:12]}" if found.get("commit") else found["source"]


def package_dir() -> str | None:
    """The directory of the installed vLLM package (with a trailing separator), or ``None``."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return None
    return os.path.dirname(spec.origin) + os.sep
