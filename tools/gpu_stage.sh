#!/usr/bin/env bash
# The GPU stage, end to end, on one GPU: what a person with a GPU runs to
# check block tables against attention kernels at real shapes and to measure
# what fragmentation costs the decode kernel.
#
# Usage: tools/gpu_stage.sh [--device cuda|cpu] [--smoke] [--out DIR] [--python PY]
#
#   --device cuda   (default) the GPU stage proper: needs torch with CUDA;
#                   run it from the environment that runs vLLM on that GPU
#                   (docs/kernels.md, "The GPU stage": kvspec installs there without
#                   touching vLLM's torch)
#   --device cpu --smoke
#                   the dry run CI makes: the same steps at tiny shapes and a
#                   few examples, on the CPU (Triton's interpreter for vLLM's
#                   kernels): it checks the script and its outputs, it
#                   measures nothing
#   --out DIR       where everything is written (default gpu-results)
#   --python PY     the interpreter of the environment to test (default python)
#
# Steps, each logged to DIR/<step>.log and timed in DIR/timings.txt:
#   environment   torch, CUDA, the GPU, vLLM and Triton versions (environment.txt)
#   gpu-tests     tests/test_kernel_stage_gpu.py (-m gpu; the dry run only collects them)
#   kernels-impl  kvspec kernels --target impl, every architecture, real shapes in bf16
#   kernels-vllm  the same with --target vllm: vLLM's manager, its worker path and
#                 its Triton kernels (skipped, and said, when vLLM is not installed)
#   bandwidth     benchmarks/kernel_bandwidth.py: kernel-bandwidth.json (and .png)
#
# Expected time on one H200 (kvspec's estimate, not yet measured: no GPU has
# been lent to this project's sessions): 20-40 minutes, most of it the two
# kernel-stage runs at real shapes.  The dry run takes 2-4 minutes on 2 cores.
# Exit status: 0 every step passed, 1 a check failed (see its log), 2 the
# environment cannot run the stage (one line).
set -uo pipefail
device=cuda smoke=0 out=gpu-results py=python
while [[ $# -gt 0 ]]; do
    case "$1" in
        --device) device="$2"; shift 2 ;;
        --smoke) smoke=1; shift ;;
        --out) out="$2"; shift 2 ;;
        --python) py="$2"; shift 2 ;;
        *) echo "gpu_stage.sh: unknown option $1 (see the header of tools/gpu_stage.sh)" >&2; exit 2 ;;
    esac
done
if [[ "$device" != cuda && "$device" != cpu ]]; then
    echo "gpu_stage.sh: --device takes cuda or cpu, got $device" >&2; exit 2
fi
if [[ "$device" == cpu && $smoke == 0 ]]; then
    echo "gpu_stage.sh: on a CPU only the dry run makes sense: add --smoke" >&2; exit 2
fi
cd "$(dirname "$0")/.."
mkdir -p "$out"
: > "$out/timings.txt"
if ! "$py" -c "import torch, kvspec" 2>/dev/null; then
    echo "gpu_stage.sh: $py cannot import torch and kvspec: install kvspec[kernels] into that environment" >&2; exit 2
fi
if [[ "$device" == cuda ]] && ! "$py" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "gpu_stage.sh: torch sees no CUDA device (run with --device cpu --smoke for the dry run)" >&2; exit 2
fi
has_vllm=0
"$py" -c "import vllm" 2>/dev/null && has_vllm=1

failed=0
step() {  # step NAME COMMAND...: run, log, time; a failing step fails the stage but the others still run
    local name="$1" start status
    shift
    echo "== $name: $*"
    start=$(date +%s)
    "$@" > "$out/$name.log" 2>&1
    status=$?
    tail -n 4 "$out/$name.log"
    echo "$name $(( $(date +%s) - start )) s exit $status" | tee -a "$out/timings.txt"
    [[ $status -eq 0 ]] || failed=1
}

step environment "$py" -c "
import platform, torch
lines = [f'python {platform.python_version()}', f'torch {torch.__version__}', f'cuda {torch.version.cuda}',
         f'gpu {torch.cuda.get_device_name() if torch.cuda.is_available() else None}']
for name in ('vllm', 'triton', 'kvspec'):
    try:
        lines.append(f'{name} {__import__(name).__version__}')
    except ImportError:
        lines.append(f'{name} not installed')
open('$out/environment.txt', 'w').write('\n'.join(lines) + '\n')
print('\n'.join(lines))"

if [[ $smoke == 1 ]]; then
    step gpu-tests "$py" -m pytest -q -p no:cacheprovider --collect-only tests/test_kernel_stage_gpu.py
    shape=(--device cpu --dtype float32 --scale tiny --model llama-3-8b --model nemotron-h-8b --examples 2 --seed 1)
    bandwidth=(--smoke --repeats 1)
else
    step gpu-tests env KVSPEC_DEVICE=cuda "$py" -m pytest -q -p no:cacheprovider -m gpu tests/test_kernel_stage_gpu.py
    shape=(--device cuda --dtype bfloat16 --scale gpu)
    bandwidth=()
fi
if [[ $has_vllm == 1 ]]; then
    step kernels-impl "$py" -m kvspec.cli kernels --target impl --kernels reference,flex,vllm "${shape[@]}"
    step kernels-vllm env PYTHONHASHSEED=0 "$py" -m kvspec.cli kernels --target vllm --kernels reference,flex,vllm \
        "${shape[@]}"
else
    step kernels-impl "$py" -m kvspec.cli kernels --target impl --kernels reference,flex "${shape[@]}"
    echo "== kernels-vllm: skipped (vLLM is not installed in $py's environment)" | tee "$out/kernels-vllm.log"
fi
step bandwidth "$py" benchmarks/kernel_bandwidth.py --out "$out" "${bandwidth[@]}"

echo
echo "gpu_stage.sh: wrote $(cd "$out" && ls | tr '\n' ' ')"
cat "$out/timings.txt"
exit $failed
