# Shared by tools/install_vllm.sh and tools/install_engine.sh (sourced, not
# run): the CPU torch pin, the venv, and pip as both installers call it.
#
# The sourcing script sets VENV_DIR, PYTHON and LOG_TAG first; afterwards
# `venv_ready` creates (or re-uses) the venv and sets PY, and `pip_install`
# installs into it.

# A CPU build of torch.  Always pin it: a bare `torch` resolves to a
# multi-GB CUDA build.  (The engines declare their own CUDA builds -- vLLM
# 0.25.1 torch==2.11.0, SGLang 2.14.1 --; the modules kvspec drives never
# load their compiled ops, so the CPU build the rest of kvspec uses is fine.)
TORCH_SPEC="torch==2.13.0"

log() { printf '[%s] %s\n' "$LOG_TAG" "$*" >&2; }

# The venv, re-used when it already exists (re-running an installer only
# installs what is missing).
venv_ready() {
    if [[ -x "$VENV_DIR/bin/python" ]]; then
        log "re-using venv $VENV_DIR"
    else
        log "creating venv $VENV_DIR with $PYTHON ($("$PYTHON" --version 2>&1))"
        "$PYTHON" -m venv "$VENV_DIR"
    fi
    PY="$VENV_DIR/bin/python"
}

# --no-warn-conflicts: the engines are deliberately installed without most of
# their declared (GPU, serving) dependencies; pip would otherwise list every
# one of them as a "dependency conflict".  Each installer's import check at
# the end is what tells whether the environment works.
pip_install() {
    "$PY" -m pip install --disable-pip-version-check --no-warn-conflicts --quiet "$@"
}
