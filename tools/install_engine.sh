#!/usr/bin/env bash
# Install an engine of another design -- SGLang or LMDeploy -- into its own
# virtual environment, CPU only, next to an editable install of kvspec, so
# that `VENV/bin/kvspec conform --target ENGINE` judges the engine's own
# prefix cache and allocator (spec chapter 10, the cache scope).
#
# Usage:  tools/install_engine.sh ENGINE [VENV_DIR]
#         ENGINE: lmdeploy or sglang.  VENV_DIR defaults to .venv-ENGINE.
#         PYTHON (env) chooses the interpreter (default python3).
#
# As for vLLM (tools/install_vllm.sh): the engine is installed with
# --no-deps -- its declared dependencies pin CUDA builds and GPU kernels,
# many GB -- and then exactly the packages its import chain touches on the
# way to the modules kvspec drives.  Nothing of the engine's is stubbed.
# Re-running re-uses the venv and installs only what is missing.

set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENGINE="${1:?usage: tools/install_engine.sh lmdeploy|sglang [VENV_DIR]}"
VENV_DIR="${2:-$REPO_ROOT/.venv-$ENGINE}"
PYTHON="${PYTHON:-python3}"
LOG_TAG=install_engine
# shellcheck source=tools/venv_lib.sh
source "$REPO_ROOT/tools/venv_lib.sh"  # TORCH_SPEC (the CPU build), log, venv_ready, pip_install
# Engines pin their own torch (SGLang: a CUDA 2.14.1): hold every install to the CPU build.
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "$TORCH_SPEC" > "$CONSTRAINTS"
export PIP_CONSTRAINT="${PIP_CONSTRAINT:+$PIP_CONSTRAINT }$CONSTRAINTS"

case "$ENGINE" in
    lmdeploy)
        ENGINE_SPEC="lmdeploy==0.18.0"
        # lmdeploy/__init__ imports its pipeline (tqdm, pydantic, transformers, mmengine's Registry -- the
        # -lite build, without matplotlib and opencv --, psutil, requests, pybase64, PIL); a real
        # SchedulerSequence needs its AR strategy, whose engine package imports zmq, xgrammar (guided
        # decoding only: installed --no-deps, without triton) and shortuuid.
        IMPORT_DEPS=("apache-tvm-ffi==0.1.11" "tqdm" "pydantic>=2" "transformers>=5" "mmengine-lite==0.10.7"
                     "psutil" "requests" "pybase64" "pillow" "pyzmq" "shortuuid" "numpy")
        NO_DEPS=("xgrammar==0.2.9")
        CHECK="lmdeploy.pytorch.paging.scheduler, lmdeploy.pytorch.paging.block_trie, lmdeploy.pytorch.strategies.ar.sequence"
        ;;
    sglang)
        ENGINE_SPEC="sglang==0.5.23"
        # sglang.srt.mem_cache and managers.schedule_batch import, through srt.utils, srt.configs and the
        # OpenAI-protocol types: these.  triton is imported (by torch's flop counter, through srt.utils)
        # but never run on a CPU.  torchvision is imported by the multimodal preprocessing configs only,
        # and PyPI has CUDA builds of it alone, which fail to load against CPU torch: kvspec's adapter
        # answers that one import with an empty module (kvspec/conformance/engines/sglang.py).
        IMPORT_DEPS=("numpy" "orjson" "psutil" "pybase64" "requests" "packaging" "pillow" "starlette" "msgspec"
                     "pydantic" "pyzmq" "tqdm" "IPython" "aiohttp" "dill" "triton" "gguf" "einops" "uvicorn"
                     "fastapi" "partial_json_parser" "setproctitle" "transformers==5.19.0" "tokenizers==0.23.2"
                     "apache-tvm-ffi==0.1.11" "sentencepiece==0.2.1" "compressed-tensors==0.18.0" "openai==2.8.0")
        NO_DEPS=()
        CHECK="kvspec.conformance.engines.sglang"
        ;;
    *)
        echo "install_engine: no engine '$ENGINE': use lmdeploy or sglang" >&2
        exit 2
        ;;
esac

start_s=$SECONDS
venv_ready

log "installing $TORCH_SPEC"
pip_install "$TORCH_SPEC"
log "installing $ENGINE_SPEC (--no-deps)"
pip_install --no-deps "$ENGINE_SPEC"
if (( ${#IMPORT_DEPS[@]} )); then
    log "installing import-time dependencies"
    pip_install "$TORCH_SPEC" "${IMPORT_DEPS[@]}"
fi
if (( ${#NO_DEPS[@]} )); then
    pip_install --no-deps "${NO_DEPS[@]}"
fi
log "installing kvspec[dev] (editable) from $REPO_ROOT"
pip_install "$TORCH_SPEC" -e "$REPO_ROOT[dev]"

log "checking imports"
"$PY" -c "
import importlib, torch
for name in '$CHECK'.split(', '):
    importlib.import_module(name)
from kvspec.conformance import engines
engines.require('$ENGINE')
import $ENGINE
print(f'ok: $ENGINE {$ENGINE.__version__}, torch {torch.__version__}')
"
log "done in $((SECONDS - start_s)) s: $VENV_DIR/bin/kvspec conform --target $ENGINE"
