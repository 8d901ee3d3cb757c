#!/usr/bin/env bash
# Install vLLM 0.25.1 -- the reference kvspec is checked against -- into its
# own virtual environment, CPU only, next to an editable install of kvspec.
#
# Usage:  tools/install_vllm.sh [VENV_DIR]
#         VENV_DIR defaults to .venv-vllm in the repository root.
#         PYTHON (env) chooses the interpreter that creates the venv
#         (default: python3; vLLM 0.25.1 needs Python >= 3.10).
#         VLLM_VERSION (env) installs another release (default: the reference).
#         VLLM_SOURCE (env) runs a vLLM source tree instead of the release's
#         own code: a fork's checkout (a directory holding vllm/), or a git
#         URL, optionally URL@REF.  Its Python files are put over the wheel of
#         VLLM_VERSION -- the release it is based on -- whose compiled parts
#         stay (tools/overlay_vllm.py): no CUDA build, no GPU.  The source's
#         commit is recorded in site-packages/vllm/KVSPEC_OVERLAY.json.
#
# Afterwards `VENV_DIR/bin/kvspec conform --target vllm` runs (with
# PYTHONHASHSEED set), and `VENV_DIR/bin/python` can import kvspec and
# vllm.v1.core.{block_pool,kv_cache_manager}, vllm.v1.request with no GPU and
# no environment variables (set PYTHONHASHSEED yourself when hashes must be
# reproducible).  Running the script again re-uses the venv and only installs
# what is missing, so it is safe to re-run.
#
# Why not just `pip install vllm==0.25.1`?  Its declared dependencies pin a
# CUDA build of torch and dozens of GPU kernel packages (many GB).  kvspec
# needs only vLLM's pure-Python KV-cache manager, so we install vLLM itself
# with --no-deps and then exactly the packages its import chain touches.
# The version bounds below are copied from vLLM 0.25.1's own metadata.

set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV_DIR="${1:-$REPO_ROOT/.venv-vllm}"
PYTHON="${PYTHON:-python3}"

# The reference release, from the one place kvspec keeps it (spec/releases/base.py, BASE);
# VLLM_VERSION=X in the environment installs another.
VLLM_VERSION="${VLLM_VERSION:-$("$PYTHON" "$REPO_ROOT/spec/releases/base.py")}"
LOG_TAG=install_vllm
# shellcheck source=tools/venv_lib.sh
source "$REPO_ROOT/tools/venv_lib.sh"  # TORCH_SPEC (the CPU build), log, venv_ready, pip_install

# Import-time dependencies of vllm.v1.core.*, vllm.v1.request and
# vllm.v1.worker.gpu_model_runner (the
# import chain goes through vllm.config, vllm.envs, the tokenizer and
# structured-output modules, the multimodal registry and the OpenAI-protocol
# types, hence the less obvious entries).
IMPORT_DEPS=(
    "numpy"
    "packaging"
    "regex"
    "psutil"
    "pyzmq>=25.0.0"
    "urllib3"
    "msgspec"
    "pydantic>=2.12.0"
    "cbor2"
    "transformers>=5.5.3"
    "aiohttp>=3.13.3"
    "requests>=2.26.0"
    "openai-harmony>=0.0.3"
    "openai>=2.0.0"
    "pillow"
    "pybase64"
    "cachetools"
    "cloudpickle"
    "uvloop"
    "py-cpuinfo"
    "prometheus_client>=0.18.0"
    "llguidance>=1.7.0,<1.8.0"
    "apache-tvm-ffi==0.1.9"
    # vllm.v1.worker.gpu_model_runner (the kernel stage drives its _update_states
    # and InputBatch) imports the attention layers, which import einops.
    "einops"
)
# xgrammar's own dependency list pulls triton (and with it a CUDA stack);
# vLLM only needs the package importable, so it goes in without its deps.
# vLLM allows xgrammar>=0.2.1,<1.0.0, but xgrammar >= 0.2.6 needs
# apache-tvm-ffi >= 0.1.10 (it fails at import with vLLM's pinned 0.1.9:
# "load_lib_module() got an unexpected keyword argument 'extra_lib_paths'").
# 0.2.5.post1 is the newest release that works with apache-tvm-ffi==0.1.9.
XGRAMMAR_SPEC="xgrammar==0.2.5.post1"
# The kernel stage runs vLLM's production Triton kernels (unified_attention,
# the MLA decode kernel, the block table's slot-mapping kernel); on a CPU
# they run under Triton's interpreter (TRITON_INTERPRET=1, set by the tests).
# Measured with vLLM 0.25.1 and torch 2.13 CPU.  --no-deps: torch is pinned above.
TRITON_SPEC="triton==3.9.0"

# The modules whose import proves the install usable.
CHECK_MODULES="vllm.v1.core.block_pool, vllm.v1.core.kv_cache_manager, vllm.v1.request, vllm.v1.core.kv_cache_utils, vllm.lora.request, kvspec.hashing"

start_s=$SECONDS

# 1. The venv (re-used when it already exists).
venv_ready

# 2. A pip that understands current wheels and metadata.
pip_install --upgrade pip

# 3. torch first, so nothing below can drag in a different build.
log "installing $TORCH_SPEC"
pip_install "$TORCH_SPEC"

# 4. vLLM itself, without its GPU-oriented dependency list (afresh under a
#    source overlay, so that no file of an earlier overlay stays behind).
log "installing vllm==$VLLM_VERSION (--no-deps)"
if [[ -n "${VLLM_SOURCE:-}" ]]; then
    pip_install --no-deps --force-reinstall "vllm==$VLLM_VERSION"
else
    pip_install --no-deps "vllm==$VLLM_VERSION"
fi

# 5. What importing the KV-cache manager actually needs.  torch is passed
#    again as a constraint so that no dependency can replace it.
log "installing import-time dependencies"
pip_install "$TORCH_SPEC" "${IMPORT_DEPS[@]}"
pip_install --no-deps "$XGRAMMAR_SPEC"
log "installing $TRITON_SPEC (vLLM's kernels, interpreted on a CPU)"
pip_install --no-deps "$TRITON_SPEC"

# 5b. A source tree's Python code over the wheel: a fork, a pull request, vLLM main.
if [[ -n "${VLLM_SOURCE:-}" ]]; then
    site_vllm="$("$PY" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("vllm").origin))')"
    log "overlaying $VLLM_SOURCE on vllm==$VLLM_VERSION"
    "$PY" "$REPO_ROOT/tools/overlay_vllm.py" "$VLLM_SOURCE" "$site_vllm"
fi

# 6. kvspec itself with its kernel stage, editable, so both import in one
#    interpreter; pytest for the tests that need vLLM (tests/test_impl_vs_vllm.py,
#    tests/test_findings.py, tests/test_kernel_stage_vllm.py), on both cores.
#    kvspec must take the torch the engine's environment has: adding it to a
#    vLLM environment may never replace vLLM's torch (its compiled ops are
#    built against that one).  Checked, not assumed.
torch_version() { "$PY" -c "import torch; print(torch.__version__)"; }
torch_before="$(torch_version)"
log "installing kvspec[kernels] (editable) from $REPO_ROOT, and pytest"
pip_install -e "$REPO_ROOT[kernels]" pytest "pytest-xdist>=3.5"
torch_after="$(torch_version)"
if [[ "$torch_before" != "$torch_after" ]]; then
    log "installing kvspec replaced the environment's torch: $torch_before -> $torch_after"
    exit 1
fi
log "torch left as it was: $torch_after"

# 7. Check: the modules kvspec drives import with no GPU.
log "checking imports"
"$PY" - <<EOF
import importlib, sys
for name in "$CHECK_MODULES".split(", "):
    importlib.import_module(name)
import torch, vllm
print(f"ok: vllm {vllm.__version__}, torch {torch.__version__}, "
      f"python {sys.version.split()[0]}, cuda available: {torch.cuda.is_available()}")
EOF

log "done in $((SECONDS - start_s)) s; venv size $(du -sh "$VENV_DIR" | cut -f1)"
log "use: $PY"
