#!/usr/bin/env bash
# The drop-in on one vLLM release, by hand: that release's own block-manager tests (tools/peer_suite.py
# --release) and vLLM's Scheduler on vLLM's block manager and on kvspec's, in lockstep (tests/test_dropin.py),
# with the release installed alone under kvspec's cache and first on the path (about 750 MB a release);
# then the release's conformance vectors (generated for it) replayed on its own KVCacheManager and BlockPool.
#
#   bash tools/dropin_release.sh 0.26.0 [PYTHON]      # PYTHON: a vLLM environment (default .venv-vllm/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
release="${1:?usage: tools/dropin_release.sh RELEASE [PYTHON]}"
python="${2:-.venv-vllm/bin/python}"
[[ -x "$python" ]] || { echo "dropin_release: no Python at $python (run tools/install_vllm.sh first)" >&2; exit 2; }
path=$("$python" -c "
import sys
from kvspec.conformance.runner import SetupError
from kvspec.conformance.vllm import upstream
from kvspec.dropin_releases import API
if sys.argv[1] not in API:
    sys.exit(f'dropin_release: the drop-in does not know vLLM {sys.argv[1]} (it knows {\", \".join(API)})')
try:
    print(':'.join(upstream.release_path(upstream.install(sys.argv[1]))))
except SetupError as error:
    sys.exit(f'dropin_release: vLLM {sys.argv[1]} cannot be installed: {error}')
" "$release") || exit 2
export PYTHONHASHSEED=0
"$python" tools/peer_suite.py --release "$release"
PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}" "$python" -m pytest -q -p no:cacheprovider tests/test_dropin.py
vectors=$(mktemp -d)
trap 'rm -rf "$vectors"' EXIT
"$python" -m kvspec.cli vectors generate --out "$vectors" --release "$release" > /dev/null
PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}" "$python" -m kvspec.cli vectors check "$vectors" --target vllm --known-findings
