"""The kernel stage against vLLM 0.25.1 itself: its KVCacheManager drives
the schedules, its production Triton kernels (``unified_attention``, the MLA
decode kernel) consume the tables -- on CPU under Triton's interpreter --,
its worker-side ``MultiGroupBlockTable`` must hold the same rows and compute
the same slot mappings, and its layer grouping must give the same groups.

Run under tools/install_vllm.sh's environment (vLLM + triton):
``PYTHONHASHSEED=0 .venv-vllm/bin/python -m pytest tests/test_kernel_stage_vllm.py``.
"""

import os
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")
pytest.importorskip("triton")

from hypothesis.stateful import run_state_machine_as_test  # noqa: E402

from kvspec.conformance.machines.kernel import kernel_machine  # noqa: E402
from kvspec.conformance.runner import require_vllm  # noqa: E402
from kvspec.conformance.settings import kernel_settings  # noqa: E402
from kvspec.conformance.vllm.targets import VllmManagerTarget as vllm_manager  # noqa: E402
from kvspec.models.architectures import ARCHITECTURES, architecture, kv_cache_config, layer_specs  # noqa: E402
from kvspec.models.architectures import setup as model_setup  # noqa: E402 (pytest 8.0 calls a module-level "setup")
from kvspec.models.runner import Engine  # noqa: E402
from kvspec.models.vllm_kernels import vllm_kernels_available  # noqa: E402
from kvspec.models.vllm_specs import to_vllm_spec  # noqa: E402

require_vllm()
pytestmark = pytest.mark.skipif(vllm_kernels_available() is not None,
                                reason=f"vLLM's Triton kernels cannot run here: {vllm_kernels_available()}")
VLLM_KERNELS = ("reference", "flex", "vllm")
EXAMPLES = {"ci": 3, "long": 200, "quick": 2}  # vLLM's kernels are interpreted: seconds per step


@pytest.mark.parametrize("name", ARCHITECTURES)
@pytest.mark.parametrize("prefix_caching", [False, True])
def test_grouping_matches_vllm(name, prefix_caching):
    from vllm.v1.core import kv_cache_utils

    if not hasattr(kv_cache_utils, "get_kv_cache_config_from_groups"):
        pytest.skip("this release plans KV-cache tensors in kv_cache_planning, by offsets and strides "
                    "(0.34.0): not compared here")

    config = SimpleNamespace(scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
                             cache_config=SimpleNamespace(num_gpu_blocks_override=None), kv_transfer_config=None)
    arch = architecture(name)
    specs = {k: to_vllm_spec(v) for k, v in layer_specs(arch, prefix_caching=prefix_caching).items()}
    theirs = kv_cache_utils.get_kv_cache_config_from_groups(
        config, kv_cache_utils.get_kv_cache_groups(config, specs), 40 << 30)
    ours = kv_cache_config(arch, memory_bytes=40 << 30, prefix_caching=prefix_caching)
    assert [g.layer_names for g in ours.kv_cache_groups] == [g.layer_names for g in theirs.kv_cache_groups]
    assert [g.kv_cache_spec.block_size for g in ours.kv_cache_groups] == [
        g.kv_cache_spec.block_size for g in theirs.kv_cache_groups]
    assert [g.kv_cache_spec.page_size_bytes for g in ours.kv_cache_groups] == [
        g.kv_cache_spec.page_size_bytes for g in theirs.kv_cache_groups]
    assert ours.num_blocks == theirs.num_blocks
    assert [t.shared_by for t in ours.kv_cache_tensors] == [t.shared_by for t in theirs.kv_cache_tensors]


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_vllm_manager_and_kernels(name):
    """vLLM's manager under random schedules; vLLM's kernels and block tables checked every step.  One layer
    per group: vLLM's interpreted kernels are the cost here; several layers, and vLLM's plan of their tensors,
    are tested by tests/test_vllm_worker_faults.py and the GPU stage's dry run.  Through Model Runner V1
    while the release has it; on 0.34.0 (V2 alone) through the runner the stage drives, or skipped with why."""
    from kvspec.models.vllm_worker import vllm_worker_v1_available

    worker = "vllm"
    if vllm_worker_v1_available() is not None:
        from kvspec.conformance.kernel_stage import DRIVEN_V2, model_runners

        (_, driven), = model_runners([model_setup(name, layers=1)]).values()
        if driven != DRIVEN_V2:
            pytest.skip(driven.removeprefix("none: "))
        worker = "vllm-v2"
    _vllm_kernels_checked_every_step(name, worker=worker)


@pytest.mark.parametrize("name", ["llama-3-8b", "mistral-7b", "whisper"])
def test_vllm_model_runner_v2(name):
    """The models vLLM 0.25.1 serves with Model Runner V2, through V2's request states, block tables and input
    preparation; vLLM's kernels read V2's gathered tables."""
    from kvspec.models.vllm_worker_v2 import vllm_worker_v2_available

    if (missing := vllm_worker_v2_available()) is not None:
        pytest.skip(missing)
    _vllm_kernels_checked_every_step(name, worker="vllm-v2")


@pytest.mark.parametrize("name", ["gpt-oss", "nemotron-h-8b", "deepseek-v3"])
def test_vllm_kernels_at_real_shapes(name):
    """vLLM's manager and kernels at real block sizes and windows (Nemotron-H: 1152-token blocks read
    as 16-token kernel blocks)."""
    from test_kernel_stage import REAL_SHAPES, long_request_scenario, sized_for

    from kvspec.models.vllm_worker import vllm_worker_v1_available

    if (missing := vllm_worker_v1_available()) is not None:  # these models at real shapes run V1's path here
        pytest.skip(missing)

    # Nemotron-H: one 1152-token block shared, one more computed (interpreted kernels are slow).
    length, chunk, shared = (1400, 1152, 1152) if name == "nemotron-h-8b" else REAL_SHAPES[name]
    e = Engine.from_setup(sized_for(name, "small", length), vllm_manager, kernels=VLLM_KERNELS, worker="vllm")
    long_request_scenario(e, length, chunk, shared)
    assert e.events["kernel vllm"] > 0 and e.checks_run["vllm-block-table"] > 0


def test_decode_batches_take_unified_attentions_3d_path_and_a_fault_there_is_caught(monkeypatch):
    """vLLM's Triton backend hands unified_attention its segmented-softmax
    buffers, so small decode batches run the 3D (parallel segments) path;
    the stage does the same.  A reduction of the segments that loses the
    first one's softmax mass is a kernel-output failure."""
    from unittest import mock

    import vllm.v1.attention.ops.triton_unified_attention as ops

    from kvspec.conformance.machines.kernel import run_stage

    calls, original = [], ops.reduce_segments

    class Counting:
        def __getitem__(self, grid):
            calls.append(grid)
            return original[grid]

    factory = vllm_manager
    with mock.patch.object(ops, "reduce_segments", Counting()):
        result = run_stage(model_setup("llama-3-8b"), factory, kernel_settings("quick", examples=3),
                           kernels=VLLM_KERNELS)
    assert result.passed and calls, "no decode batch took the 3D path"

    class DropsFirstSegment:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                kwargs["segm_expsum_ptr"][..., 0] = 0  # the first segment's softmax mass is lost
                return original[grid](*args, **kwargs)
            return launch

    with mock.patch.object(ops, "reduce_segments", DropsFirstSegment()):
        broken = run_stage(model_setup("llama-3-8b"), factory, kernel_settings("quick", examples=6),
                           kernels=VLLM_KERNELS)
    assert not broken.passed and "kernel-output" in str(broken.failure)


def _vllm_kernels_checked_every_step(name: str, worker: str) -> None:
    """One layer a group of model ``name`` under vLLM's manager, through ``worker``'s tables, vLLM's kernels
    and block tables checked every step."""
    examples = EXAMPLES[os.environ.get("HYPOTHESIS_PROFILE", "ci")]
    machine = kernel_machine(model_setup(name, layers=1), vllm_manager, kernels=VLLM_KERNELS, worker=worker)
    run_state_machine_as_test(machine, settings=kernel_settings(examples=examples))
    totals = machine.totals
    assert totals["kernel vllm"] > 0 and totals["check vllm-block-table"] > 0
    assert totals["check exact-gather"] > 0


def test_kvspecs_command_line_imports_neither_vllm_nor_triton():
    """`kvspec kernels` chooses Triton's interpreter before Triton is imported, so importing the command line
    must import neither: a module-level known-findings lookup that asked the installed vLLM's release did, and
    `kvspec kernels --target vllm` stopped with "TRITON_INTERPRET=1 was not set before Triton was imported"."""
    import subprocess
    import sys

    probe = "import sys, kvspec.cli; print(sorted(m for m in ('vllm', 'triton') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
