"""Which model runner vLLM picks for a model: vLLM's own decision, asked as
a default deployment on a CUDA GPU would ask it.

vLLM 0.25.1 has two worker paths: **Model Runner V1**
(``vllm/v1/worker/gpu_model_runner.py``) and **Model Runner V2**
(``vllm/v1/worker/gpu/``).  ``VllmConfig.use_v2_model_runner``
(``vllm/config/vllm.py``) chooses: V2 for every generate model that is not
hybrid, not attention-free, and either not MoE or in
``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES`` -- when Triton is there and no
feature V2 lacks is on; ``VLLM_USE_V2_MODEL_RUNNER`` overrides it.  The
kernel stage must drive the runner vLLM actually picks, so the choice is
vLLM's, never kvspec's: :func:`vllm_runner_choice` evaluates vLLM's own
property.

What it is evaluated on (the smallest honest stand-ins, all named here):

- **the platform**: vLLM's decision asks one thing of the machine,
  ``vllm.config.vllm.HAS_TRITON`` (Triton installed with one active
  driver).  On a CUDA GPU with Triton that is true; on this CPU it depends
  on ``CUDA_VISIBLE_DEVICES``.  It is answered true, as on a CUDA GPU --
  nothing else of the platform is read;
- **every setting but the model**: vLLM's own defaults -- a ``VllmConfig``
  whose parallel, cache, compilation, scheduler, ... configs are vLLM's
  default objects, no speculative decoding, no EC transfer: ``vllm serve
  MODEL`` with no flags;
- **the model**: a ``ModelConfig`` needs the checkpoint's config.json (no
  downloads here), so the decision reads a stand-in whose answers come from
  vLLM's code: ``is_hybrid``, ``is_attention_free``, ``is_moe`` and
  ``is_diffusion`` are ``ModelConfig``'s own properties, over vLLM's model
  registry's ``inspect_model_cls`` for the architecture (its class's
  interfaces) and vLLM's ``ModelArchConfigConvertorBase.get_num_experts``
  over the expert counts the checkpoint's config.json states (kept with the
  architecture in :mod:`.architectures`, with its source); ``runner_type``
  is the registry's (``generate`` for a text-generation model); every other
  field is ``ModelConfig``'s default.

Where vLLM's registry cannot inspect an architecture here (Gemma-3's and
Llama-4's multimodal modules import torchvision, which the CPU environment
lacks), the decision is evaluated for every answer the registry could give;
when all agree (a MoE model not in the default list is V1 whatever the
class says) that is vLLM's choice, otherwise it is undecided here, with the
reason.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import itertools
import logging
import os
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any
from unittest import mock

from kvspec.models.architectures import ARCHITECTURES, Architecture

V1, V2 = "v1", "v2"
RUNNER_NAMES = {V1: "Model Runner V1", V2: "Model Runner V2"}


@dataclass(frozen=True)
class RunnerChoice:
    """vLLM's choice of model runner for a model: ``picked`` is ``"v1"``,
    ``"v2"`` or None (vLLM's decision could not be evaluated here);
    ``why`` says what decided it."""

    picked: str | None
    why: str

    def describe(self) -> str:
        name = RUNNER_NAMES.get(self.picked or "", "undecided")
        return f"{name} ({self.why})"


def architecture_of(setup_name: str) -> Architecture | None:
    """The architecture of a kernel-stage setup (``model:NAME[@scale]``),
    None for a manager layout (no model: vLLM decides runners for models)."""
    name = setup_name.removeprefix("model:").partition("@")[0]
    return ARCHITECTURES.get(name) if setup_name.startswith("model:") else None


def _defaults(config_class: type) -> list[tuple[str, Any]]:
    """A vLLM config class's fields at their defaults (pydantic ``Field`` s
    resolved, factories called).  Left out: fields with no default, and
    those whose default needs a platform (``DeviceConfig`` infers the
    device): the decision does not read them (if it did, AttributeError)."""
    out = []
    for f in dataclasses.fields(config_class):
        value = f.default
        try:
            if f.default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            if hasattr(value, "get_default"):  # pydantic's FieldInfo
                value = value.get_default(call_default_factory=True)
        except RuntimeError:
            continue
        if value is not dataclasses.MISSING and type(value).__name__ != "PydanticUndefinedType":
            out.append((f.name, value))
    return out


class _Model:
    """What ``VllmConfig.use_v2_model_runner`` reads of a ``ModelConfig``,
    its derived answers computed by ``ModelConfig``'s own properties."""

    def __init__(self, model_config_class: type, arch: Architecture, model_info: Any, runner_type: str,
                 num_experts: int):
        for name, value in _defaults(model_config_class):  # every setting at vLLM's default
            setattr(self, name, value)
        self.hf_config = SimpleNamespace(architectures=[arch.hf_architecture], **dict(arch.hf_experts))
        self.hf_text_config = self.hf_config
        self.model_arch_config = SimpleNamespace(architectures=[arch.hf_architecture], num_experts=num_experts)
        self._model_info = model_info
        self.runner_type = runner_type


def _model_class(model_config_class: type) -> type:
    """:class:`_Model` with ``ModelConfig``'s own derived properties."""
    names = ("architectures", "is_hybrid", "is_attention_free", "is_moe", "get_num_experts", "is_diffusion")
    return type("ModelConfigStandIn", (_Model,), {n: getattr(model_config_class, n) for n in names
                                                  if hasattr(model_config_class, n)})


def _settings(vllm_config_class: type, model: Any) -> Any:
    """A ``VllmConfig`` at vLLM's defaults holding ``model``, built without
    ``__post_init__`` (which would resolve the model and the platform)."""
    settings = object.__new__(vllm_config_class)
    for name, value in _defaults(vllm_config_class):
        object.__setattr__(settings, name, value)
    object.__setattr__(settings, "model_config", model)
    return settings


def _why_not_inspected(registry: Any, name: str, error: Exception) -> str:
    """Why vLLM's registry cannot inspect ``name``: its module's import error
    (the registry only logs it)."""
    module = getattr(registry.models.get(name), "module_name", None)
    if module is not None:
        try:
            importlib.import_module(module)
        except Exception as cause:
            return f"{module}: {type(cause).__name__}: {cause}"
    return f"{type(error).__name__}: {error}"


@functools.cache
def vllm_runner_choice(arch: Architecture | None) -> RunnerChoice:
    """The model runner the installed vLLM picks for ``arch`` in a default
    deployment on a CUDA GPU with Triton (see the module docstring); asked
    once per process (vLLM's registry imports the model's module)."""
    if arch is None:
        return RunnerChoice(None, "a manager layout, not a model: vLLM picks runners for models")
    try:
        from vllm.config import vllm as config_module
    except Exception as error:
        return RunnerChoice(None, f"vLLM's config does not import ({type(error).__name__}: {error})")
    vllm_config_class = config_module.VllmConfig
    has_v1 = importlib.util.find_spec("vllm.v1.worker.gpu_model_runner") is not None
    if not has_v1:  # 0.34.0: V1 removed, and with it use_v2_model_runner; gpu_worker builds V2 for every model
        if importlib.util.find_spec("vllm.v1.worker.gpu.model_runner") is None:
            return RunnerChoice(None, "this vLLM release has neither Model Runner V1 nor V2")
        return RunnerChoice(V2, "this vLLM release has no Model Runner V1: its GPU worker builds V2 for every model")
    if not hasattr(vllm_config_class, "use_v2_model_runner"):
        return RunnerChoice(V1, "this vLLM release has no Model Runner V2")
    override = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    from vllm.config import ModelConfig
    from vllm.model_executor.models.registry import ModelRegistry
    from vllm.transformers_utils.model_arch_config_convertor import ModelArchConfigConvertorBase

    experts = SimpleNamespace(**dict(arch.hf_experts))
    num_experts = ModelArchConfigConvertorBase(experts, experts).get_num_experts()
    model_class = _model_class(ModelConfig)
    probe = model_class(ModelConfig, arch, None, "generate", num_experts)
    registry_log = logging.getLogger("vllm.model_executor.models.registry")
    registry_log.disabled = True  # an architecture it cannot inspect: a traceback of ~50 lines, said in a line below
    try:
        info, _ = ModelRegistry.inspect_model_cls([arch.hf_architecture], probe)
        infos, unknown = [info], None
    except Exception as error:  # the architecture's module does not import here
        unknown = _why_not_inspected(ModelRegistry, arch.hf_architecture, error)
        infos = [SimpleNamespace(is_hybrid=h, is_attention_free=a)
                 for h, a in itertools.product((False, True), repeat=2)]
    finally:
        registry_log.disabled = False
    answers = {}
    for info in infos:
        generate = unknown is not None or ModelRegistry.is_text_generation_model([arch.hf_architecture], probe)
        model = model_class(ModelConfig, arch, info, "generate" if generate else "pooling", num_experts)
        settings = _settings(vllm_config_class, model)
        with mock.patch.object(config_module, "HAS_TRITON", True):
            picked = V2 if vllm_config_class.use_v2_model_runner.fget(settings) else V1
        answers.setdefault(picked, (settings, model))  # first: the registry's answer, or "neither"
    if len(answers) > 1:
        return RunnerChoice(None, f"vLLM's registry cannot inspect {arch.hf_architecture} here ({unknown}), and "
                                  "vLLM's choice depends on what it would say")
    (picked, (settings, model)), = answers.items()
    why = _why(config_module, settings, model, override)
    if unknown is not None:
        why += f"; whatever vLLM's registry says of {arch.hf_architecture}, which it cannot inspect here ({unknown})"
    return RunnerChoice(picked, why)


def _why(config_module: Any, settings: Any, model: Any, override: str | None) -> str:
    """What decided vLLM's choice, in the terms of vLLM's decision."""
    if override is not None:
        return f"VLLM_USE_V2_MODEL_RUNNER={override}"
    arch = model.architectures[0]
    if model.runner_type != "generate":
        return f"{arch}: not a generate model"
    if model.is_hybrid:
        return f"{arch}: hybrid"
    if model.is_attention_free:
        return f"{arch}: attention-free"
    listed = arch in getattr(config_module, "DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES", ())
    if model.is_moe and not listed:
        return f"{arch}: MoE, not in DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES"
    unsupported = type(settings)._get_v2_model_runner_unsupported_features(settings)
    if unsupported:
        return f"{arch}: V2 lacks {', '.join(unsupported)}"
    return f"{arch}: " + ("MoE in DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES" if model.is_moe else "dense, generate")
