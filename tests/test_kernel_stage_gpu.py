"""The kernel stage natively on a GPU, at vLLM-like shapes: real KV heads and
head sizes (8 KV heads of 128 for Llama-3, 16 for Gemma-3, MLA's 576-wide
latent, Mamba-2's 128x64x128 state), bf16, real block sizes and windows
(128 to 4096, chunks of 8192), 32,768-block pools (2,048 for Mamba
hybrids).  flex_attention runs compiled; vLLM's kernels run compiled where
vLLM is installed (its Triton attention, its Mamba ``selective_state_update``).

Opt-in: ``KVSPEC_DEVICE=cuda python -m pytest -m gpu tests/test_kernel_stage_gpu.py``
(see docs/kernels.md for the whole GPU command and its runtime).
"""

import os

import pytest
import torch
from hypothesis.stateful import run_state_machine_as_test

from kvspec.conformance.machines.kernel import kernel_machine
from kvspec.conformance.settings import kernel_settings
from kvspec.conformance.targets.manager import ImplManagerTarget
from kvspec.models.architectures import ARCHITECTURES
from kvspec.models.architectures import setup as model_setup  # a module-level "setup" is pytest 8.0's xunit hook
from kvspec.models.runner import Engine
from kvspec.models.vllm_kernels import vllm_kernels_available

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(os.environ.get("KVSPEC_DEVICE") != "cuda" or not torch.cuda.is_available(),
                       reason="the GPU stage: KVSPEC_DEVICE=cuda on a machine with a CUDA device"),
]

KERNELS = ("reference", "flex") + (("vllm",) if vllm_kernels_available() is None else ())
GPU_EXAMPLES = 4  # each up to 20 steps of thousands of tokens


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_gpu_random_schedules(name):
    machine = kernel_machine(model_setup(name, "gpu"), ImplManagerTarget, kernels=KERNELS, dtype=torch.bfloat16,
                             device="cuda")
    run_state_machine_as_test(machine, settings=kernel_settings(examples=GPU_EXAMPLES))
    assert machine.totals["check exact-gather"] > 0 and machine.totals["check kernel-output"] > 0


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_gpu_real_shapes(name):
    from test_kernel_stage import REAL_SHAPES, long_request_scenario, sized_for

    length, chunk, shared = REAL_SHAPES[name]
    s = sized_for(name, "gpu", length)
    e = Engine.from_setup(s, ImplManagerTarget, kernels=KERNELS, dtype=torch.bfloat16, device="cuda")
    long_request_scenario(e, length, chunk, shared)
    assert e.checks_run["exact-gather"] > 0 and e.checks_run["kernel-output"] > 0
