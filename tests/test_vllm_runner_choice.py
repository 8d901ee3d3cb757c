"""Which model runner vLLM picks for each model is vLLM's own decision
(``VllmConfig.use_v2_model_runner``), asked as on a CUDA GPU: kvspec only
states each checkpoint's architecture and expert counts.

Run under tools/install_vllm.sh's environment:
``PYTHONHASHSEED=0 .venv-vllm/bin/python -m pytest tests/test_vllm_runner_choice.py``.
"""

from dataclasses import replace

import pytest

pytest.importorskip("vllm")

from kvspec.models.architectures import ARCHITECTURES  # noqa: E402
from kvspec.models.vllm_runner_choice import V1, V2, architecture_of, vllm_runner_choice  # noqa: E402

# vLLM 0.25.1's answers: dense generate models run V2; hybrid and MoE models (none of these in its default
# list) V1.  Gemma-3's multimodal module imports torchvision: undecided where that is missing.
EXPECTED = {"llama-3-8b": V2, "mistral-7b": V2, "whisper": V2, "gpt-oss": V1, "llama-4-scout": V1,
            "nemotron-h-8b": V1, "deepseek-v3": V1, "gemma-3": (V2, None)}


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    vllm_runner_choice.cache_clear()
    yield
    vllm_runner_choice.cache_clear()


def _release_has_both_runners():
    import importlib.util

    from vllm.config import VllmConfig
    return hasattr(VllmConfig, "use_v2_model_runner") and \
        importlib.util.find_spec("vllm.v1.worker.gpu_model_runner") is not None


@pytest.mark.parametrize("name", ["llama-3-8b", "gpt-oss", "nemotron-h-8b", "deepseek-v3", "whisper",
                                  "llama-4-scout"])
def test_vllms_choice_for_each_model(name):
    choice = vllm_runner_choice(ARCHITECTURES[name])
    if not _release_has_both_runners():
        pytest.skip(f"this release has one runner: {choice.describe()}")
    assert choice.picked in (EXPECTED[name] if isinstance(EXPECTED[name], tuple) else (EXPECTED[name],)), \
        choice.describe()
    assert ARCHITECTURES[name].hf_architecture in choice.why


def test_the_choice_is_vllms_not_kvspecs(monkeypatch):
    """Change vLLM's own list of MoE models that default to V2, and gpt-oss moves to V2."""
    from vllm.config import vllm as config_module

    if not _release_has_both_runners():
        pytest.skip("this release has one runner")
    gpt_oss = ARCHITECTURES["gpt-oss"]
    assert vllm_runner_choice(gpt_oss).picked == V1
    vllm_runner_choice.cache_clear()
    monkeypatch.setattr(config_module, "DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES",
                        config_module.DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES | {gpt_oss.hf_architecture})
    assert vllm_runner_choice(gpt_oss).picked == V2
    # ... and a model vLLM lists there (DeepSeek-V2) is V2 though MoE, one it does not (DeepSeek-V3) V1.
    vllm_runner_choice.cache_clear()
    v2 = replace(ARCHITECTURES["deepseek-v3"], name="deepseek-v2", hf_architecture="DeepseekV2ForCausalLM")
    assert vllm_runner_choice(v2).picked == V2 and "MoE in DEFAULT" in vllm_runner_choice(v2).why


def test_vllms_override_is_honoured(monkeypatch):
    if not _release_has_both_runners():
        pytest.skip("this release has one runner")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    choice = vllm_runner_choice(ARCHITECTURES["llama-3-8b"])
    assert choice.picked == V1 and "VLLM_USE_V2_MODEL_RUNNER=0" in choice.why


def test_a_manager_layout_has_no_model():
    assert architecture_of("full+mamba-align") is None
    assert architecture_of("model:nemotron-h-8b@small") is ARCHITECTURES["nemotron-h-8b"]
    assert vllm_runner_choice(None).picked is None


def test_the_stage_reports_each_layouts_runner(tmp_path, capsys):
    from kvspec.cli import main
    from kvspec.models.vllm_worker import vllm_worker_available

    if vllm_worker_available() is not None:
        pytest.skip(vllm_worker_available())
    code = main(["kernels", "--target", "vllm", "--model", "llama-3-8b", "--examples", "1", "--seed", "1",
                 "--report-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    line = next(line for line in out.splitlines() if line.startswith("runner model:llama-3-8b:"))
    assert "vLLM picks Model Runner" in line and "driven: Model Runner" in line
    assert "Model runners" in (tmp_path / "report.md").read_text()
    assert '"runner": "vLLM picks' in (tmp_path / "report.json").read_text()


def test_a_release_without_model_runner_v1_runs_v2_for_every_model():
    """vLLM 0.34.0 removed Model Runner V1 (and ``use_v2_model_runner`` with it): its GPU worker builds V2
    for every model, and the stage drives V2 wherever kvspec can; a hybrid model is skipped with why."""
    import importlib.util

    from kvspec.conformance.kernel_stage import DRIVEN_V2, model_runners
    from kvspec.models.architectures import setup
    from kvspec.models.vllm_worker import vllm_worker_available

    if importlib.util.find_spec("vllm.v1.worker.gpu_model_runner") is not None:
        pytest.skip("this release still has Model Runner V1")
    for arch in ARCHITECTURES.values():
        choice = vllm_runner_choice(arch)
        assert choice.picked == V2 and "no Model Runner V1" in choice.why, choice.describe()
    if vllm_worker_available() is not None:
        pytest.skip(vllm_worker_available())
    runners = model_runners([setup(name, "tiny") for name in ARCHITECTURES])
    for name, (_, driven) in runners.items():
        if name == "model:nemotron-h-8b":
            assert driven.startswith("none: ") and "Mamba" in driven, driven
        else:
            assert driven == DRIVEN_V2, (name, driven)


def test_a_model_whose_runner_cannot_run_is_skipped_and_nothing_run_exits_2(capsys):
    """On 0.34.0 (V2 alone) kvspec does not drive V2's Mamba state: Nemotron-H is skipped with the reason,
    never a FAILED layout, and a run where nothing could run exits 2."""
    import importlib.util

    from kvspec.cli import main
    from kvspec.models.vllm_worker import vllm_worker_available

    if importlib.util.find_spec("vllm.v1.worker.gpu_model_runner") is not None:
        pytest.skip("this release still has Model Runner V1, which serves Nemotron-H")
    if vllm_worker_available() is not None:
        pytest.skip(vllm_worker_available())
    code = main(["kernels", "--target", "vllm", "--model", "nemotron-h-8b", "--examples", "1", "--seed", "1"])
    out = capsys.readouterr().out
    assert code == 2, out
    assert "skipped (runner Model Runner V2 cannot run here" in out and "FAILED" not in out, out
    assert "no layout could run" in out
