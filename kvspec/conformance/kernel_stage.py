"""The kernel stage as a library: ``kvspec kernels``' options checked, its
model setups chosen, each searched by the kernel machine
(:mod:`kvspec.conformance.machines.kernel`).

:func:`plan_kernel_stage` checks :class:`KernelOptions` and returns a
:class:`KernelPlan`, whose ``run`` returns one
``(setup, StageResult)`` per model, telling ``on_result`` as each finishes.
A bad option, or a kernel or worker this environment cannot run, raises
:class:`~kvspec.errors.SetupError` before anything runs.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvspec.conformance.runner import quiet_loggers, resolve_target, shrinking_limited_to
from kvspec.errors import SetupError

SHRINK_SECONDS = 30.0
"""How long a failing model's example may shrink: each replay runs real
kernels (interpreted on a CPU), and Hypothesis's own five minutes made one
fault in vLLM's worker take 4.5 minutes to report (caught in the first
second).  The example kept is the smallest found by then."""

KERNELS = ("reference", "flex", "vllm")
WORKERS = ("kvspec", "vllm")
DTYPES = ("float32", "bfloat16", "float16")
SPLIT_MODEL = "nemotron-h-8b"  # run at its real block sizes too, last, when vLLM's worker runs every model


def default_kernels(target: str) -> list[str]:
    """The kernels a run uses when none are named: the reference and
    FlexAttention, and with the target vLLM also vLLM's own Triton kernels
    (``unified_attention``, the MLA decode kernel) -- the test of vLLM as it
    runs reads its tables with its kernels."""
    return ["reference", "flex", "vllm"] if target == "vllm" else ["reference", "flex"]


@dataclass
class KernelOptions:
    """One kernel-stage run; the fields are ``kvspec kernels``' options."""

    target: str = "impl"
    models: list[str] = field(default_factory=lambda: ["all"])  # architectures, "all" or manager layouts
    scale: str = "tiny"
    layers: int = 2  # per group: each with its own K/V or state behind the group's block table
    kernels: list[str] | None = None  # None: default_kernels(target)
    device: str = "cpu"
    dtype: str = "float32"
    profile: str = "ci"
    examples: int | None = None
    seed: int | None = None
    worker: str | None = None  # None: vllm for --target vllm, else kvspec
    budget: float | None = None  # seconds for the whole stage, shared by the models (instead of examples)
    report_dir: str | None = None  # report.json, report.md and junit.xml, as kvspec conform writes them
    known_findings: bool = False  # steer around the target's known findings, as kvspec conform does
    command: str = "kvspec kernels"  # recorded in the report

    def __post_init__(self) -> None:
        if self.kernels is None:
            self.kernels = default_kernels(self.target)

    def chosen_worker(self) -> str:
        return self.worker or ("vllm" if self.target == "vllm" else "kvspec")


@dataclass
class KernelPlan:
    """A checked kernel-stage run, ready to search."""

    options: KernelOptions
    setups: list[Any]  # ModelSetup
    factory: Callable[..., Any]
    settings: Any
    seeded: Any  # a hypothesis.seed decorator, or None
    dtype: Any  # torch.dtype
    steered: tuple[Any, ...] = ()  # the known findings (Finding) steered around
    skipped: dict[str, str] = field(default_factory=dict)  # setup name -> why it is not searched
    runners: dict[str, Any] = field(default_factory=dict)  # setup name -> (vLLM's RunnerChoice, runner driven)

    def worker_for(self, name: str) -> str:
        """The engine's worker for a setup: with vLLM's worker, the model
        runner vLLM picks for its model (``vllm-v2`` for Model Runner V2)."""
        if name in self.runners and self.runners[name][1].startswith(DRIVEN_V2):
            return "vllm-v2"
        return self.options.chosen_worker()

    def runner_line(self, name: str) -> str:
        """Which model runner vLLM picks for a setup, and which the stage drove ("" without vLLM's worker)."""
        if name not in self.runners:
            return ""
        choice, driven = self.runners[name]
        picks = f"vLLM picks {choice.describe()}" if choice.picked else f"vLLM's choice unknown ({choice.why})"
        return f"{picks}; driven: {driven}"

    def searched(self) -> list[Any]:
        """The setups the run searches: all but those steered around."""
        return [s for s in self.setups if s.name not in self.skipped]

    def run(self, on_result: Callable[[Any, Any], None] | None = None) -> list[tuple[Any, Any]]:
        """Search each model setup's kernel machine; ``(setup, result)`` pairs.
        Under a budget each model gets an equal share of what is left, searched
        in batches of :data:`BUDGET_BATCH` examples (each batch its own seed)
        until its share is spent or a check fails."""
        import time

        o, results = self.options, []
        deadline = time.perf_counter() + o.budget if o.budget else None
        searched = self.searched()
        for i, s in enumerate(searched):
            if deadline is None:
                result = self._search(s, self.settings, self.seeded)
            else:
                share = (deadline - time.perf_counter()) / (len(searched) - i)
                result = self._search_for(s, share)
            results.append((s, result))
            if on_result:
                on_result(s, result)
        return results

    def _search(self, setup: Any, run_settings: Any, seeded: Any) -> Any:
        from kvspec.conformance.machines.kernel import run_stage

        o = self.options
        with shrinking_limited_to(SHRINK_SECONDS):
            return run_stage(setup, self.factory, run_settings, seeded=seeded, kernels=o.kernels, dtype=self.dtype,
                             device=o.device, worker=self.worker_for(setup.name))

    def _search_for(self, setup: Any, seconds: float) -> Any:
        """Batches of the kernel machine on ``setup`` for ``seconds``; one result, totals summed."""
        import time
        from collections import Counter

        from hypothesis import seed as hypothesis_seed
        from hypothesis import settings as hypothesis_settings

        from kvspec.conformance.machines.kernel import StageResult

        start, totals, batch = time.perf_counter(), Counter(), 0
        base = self.options.seed if self.options.seed is not None else 0
        batch_settings = hypothesis_settings(self.settings, max_examples=BUDGET_BATCH, derandomize=False)
        while True:
            result = self._search(setup, batch_settings, hypothesis_seed(base + batch))
            totals += result.totals
            batch += 1
            if not result.passed or time.perf_counter() - start >= seconds:
                return StageResult(result.name, totals, time.perf_counter() - start, result.failure, result.example)


BUDGET_BATCH = 1  # examples per batch of a budgeted kernel search: an example runs up to 20 forward steps,
# seconds each under Triton's interpreter, and a batch in flight is let finish


def stage_report(plan: KernelPlan, results: list[tuple[Any, Any]]) -> Any:
    """The stage's results as a :class:`~kvspec.conformance.report.RunReport`
    (scope ``kernels``, a row per model), so that report.md, report.json and
    junit.xml read as ``kvspec conform``'s do; a model that ran no step is
    not searched, never passed, and one steered around says which finding."""
    from kvspec.conformance.report import LayoutResult, RunReport, below_floor

    options = plan.options
    report = RunReport(options.target, "", options.profile, seed=options.seed, command=options.command,
                       command_name="kernels", steered_around=[f"{f.id}: {f.title}" for f in plan.steered],
                       checked={"kernels": sorted({k.removeprefix("check ") for _, r in results
                                                   for k in r.totals if k.startswith("check ")})},
                       versions={"worker": options.chosen_worker(), "kernels": ",".join(options.kernels),
                                 "device": options.device, "dtype": options.dtype, "scale": options.scale})
    for setup, r in results:
        steps = r.totals.get("steps", 0)
        failure = [f"{type(r.failure).__name__}: {r.failure}"] if r.failure is not None else []
        report.results.append(LayoutResult(
            "kernels", setup.name, steps, round(r.seconds, 3), r.passed, details=failure + r.example,
            skipped=below_floor("kernels", steps) if r.passed else None, runner=plan.runner_line(setup.name)))
    report.results += [LayoutResult("kernels", name, 0, 0.0, True, skipped=why, runner=plan.runner_line(name))
                       for name, why in plan.skipped.items()]
    return report


def steer(plan: KernelPlan) -> None:
    """Under ``known_findings``, leave out each setup that would send one of
    the target's known findings' inputs, naming the finding.  The kernel
    machine sends no bad argument, no image, no per-group lookup, and no
    connector tokens or drafts to a model with Mamba, so only a finding that
    a whole manager layout reproduces (``layout:NAME``) can arise: that
    layout is not searched, as under ``kvspec conform --known-findings``."""
    from kvspec.conformance.findings import known_findings
    from kvspec.conformance.report import STEERED
    from kvspec.conformance.runner import findings_target

    if not plan.options.known_findings:
        return
    findings = known_findings(findings_target(plan.options.target, "manager"), ["manager"])
    steered: list[Any] = []
    for s in plan.setups:
        why = [f for f in findings if f.avoid == f"layout:{s.name}"]
        if why:
            plan.skipped[s.name] = STEERED + ", ".join(f.id for f in why)
            steered += [f for f in why if f not in steered]
    plan.steered = tuple(steered)


def plan_kernel_stage(options: KernelOptions) -> KernelPlan:
    """Check the options against this environment and choose the setups."""
    o, worker = options, options.chosen_worker()
    if ("vllm" in o.kernels or worker == "vllm") and o.device == "cpu" and "triton" not in sys.modules:
        # vLLM's Triton kernels on a CPU: Triton's interpreter, chosen before Triton is imported; an
        # empty CUDA_VISIBLE_DEVICES keeps vLLM's Triton probe from disabling Triton.
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    try:
        import torch

        import kvspec.conformance.machines.kernel  # noqa: F401  (torch, Hypothesis and the engine import here)
        from kvspec.models.architectures import ARCHITECTURES, SCALES, setup, setup_from_layout
    except ImportError as error:
        raise SetupError(f"the kernel stage needs torch ({error}); install kvspec[kernels]") from None
    from kvspec.conformance.machines.layouts import MANAGER_LAYOUTS
    from kvspec.conformance.settings import kernel_settings

    if o.examples is not None and o.examples <= 0:
        raise SetupError(f"--examples must be positive, got {o.examples}")
    if o.scale not in SCALES:
        raise SetupError(f"unknown scale {o.scale!r}; choose one of {SCALES}")
    if o.layers < 1:
        raise SetupError(f"--layers must be at least 1 (layers per group), got {o.layers}")
    if set(o.kernels) - set(KERNELS) or "reference" not in o.kernels:
        raise SetupError(f"--kernels takes reference (always), flex and vllm; got {','.join(o.kernels)!r}")
    if worker not in WORKERS:
        raise SetupError(f"--worker {worker!r}: choose one of {', '.join(WORKERS)}")
    if o.dtype not in DTYPES:
        raise SetupError(f"--dtype {o.dtype!r}: choose one of {', '.join(DTYPES)}")
    if o.budget is not None and o.budget <= 0:
        raise SetupError(f"--budget must be a positive number of seconds, got {o.budget:g}")
    if o.budget is not None and o.examples is not None:
        raise SetupError("--examples and --budget size the search two ways: give one")
    if o.report_dir is not None:
        from pathlib import Path

        from kvspec.conformance.report import unwritable

        if (problem := unwritable("--report-dir", Path(o.report_dir))) is not None:
            raise SetupError(problem)
    from kvspec.models.vllm_kernels import vllm_kernels_available

    problem = vllm_kernels_available() if "vllm" in o.kernels else None
    if problem is not None:
        raise SetupError(f"--kernels vllm (the default with --target vllm): {problem} (run kvspec from "
                         "tools/install_vllm.sh's environment)")
    if worker == "vllm":
        from kvspec.models.vllm_worker import vllm_worker_available

        problem = vllm_worker_available()
        if problem is not None:
            raise SetupError(f"--worker vllm: {problem} (run kvspec from tools/install_vllm.sh's "
                             "environment, or choose --worker kvspec)")
    if o.device == "cuda" and not torch.cuda.is_available():
        raise SetupError("--device cuda: torch sees no CUDA device")
    setups = []
    for name in o.models or ["all"]:
        if name == "all":
            setups += [setup(n, o.scale, layers=o.layers) for n in ARCHITECTURES]
        elif name.removeprefix("model:") in ARCHITECTURES:
            setups.append(setup(name.removeprefix("model:"), o.scale, layers=o.layers))
        elif name in MANAGER_LAYOUTS:
            if MANAGER_LAYOUTS[name].context_parallel_ranks > 1:
                raise SetupError(f"layout {name!r} is context-parallel: the kernel stage has one rank, which "
                                 "holds a slice of each block (not modelled); choose another layout")
            setups.append(setup_from_layout(name, MANAGER_LAYOUTS[name], layers=o.layers))
        else:
            raise SetupError(f"no model or layout named {name!r}: use one of {sorted(ARCHITECTURES)}, all, "
                             f"or a manager layout ({', '.join(MANAGER_LAYOUTS)})")
    if o.models == ["all"] and worker == "vllm" and o.scale == "tiny":
        # A hybrid at its real block sizes: 1152-token attention blocks that vLLM's model runner reads as
        # FlashInfer's 64-token kernel blocks -- the kernel-block split the tiny scale never reaches.  Last: it
        # took 371-413 s on 2 cores, and every tiny model's verdict waited behind it when it ran first.
        setups.append(setup(SPLIT_MODEL, "small", layers=o.layers))
    factory = resolve_target(o.target, "manager")
    quiet_loggers()
    warnings.filterwarnings("ignore", "invalid value encountered", RuntimeWarning)  # Triton's interpreter, masked lanes
    run_settings = kernel_settings(o.profile, examples=o.examples)
    seeded = None
    if o.seed is not None:
        from hypothesis import seed as hypothesis_seed
        from hypothesis import settings as hypothesis_settings

        run_settings, seeded = hypothesis_settings(run_settings, derandomize=False), hypothesis_seed(o.seed)
    plan = KernelPlan(o, setups, factory, run_settings, seeded, getattr(torch, o.dtype))
    if worker == "vllm":
        plan.runners = model_runners(setups)
        plan.skipped.update({name: f"runner {driven.removeprefix('none: ')}" for name, (_, driven)
                             in plan.runners.items() if driven.startswith("none: ")})
    steer(plan)
    return plan


DRIVEN_V1 = "Model Runner V1 (its _update_states, InputBatch and MultiGroupBlockTable)"
DRIVEN_V2 = "Model Runner V2 (its request states, BlockTables and prepare_inputs)"


def model_runners(setups: list[Any]) -> dict[str, Any]:
    """For each setup, vLLM's own choice of model runner for its model on a
    CUDA GPU (:func:`~kvspec.models.vllm_runner_choice.vllm_runner_choice`)
    and the runner the stage drives: the one vLLM picks; where vLLM's
    choice is unknown (a manager layout), V1 while the release has it, else
    V2 (0.34.0 removed V1).  A setup whose runner cannot run here is
    driven by none (``"none: why"``): it is skipped with the reason."""
    from kvspec.models.vllm_runner_choice import V2, architecture_of, vllm_runner_choice
    from kvspec.models.vllm_worker import vllm_worker_v1_available
    from kvspec.models.vllm_worker_v2 import vllm_worker_v2_serves

    runners = {}
    for s in setups:
        choice = vllm_runner_choice(architecture_of(s.name))
        if choice.picked == V2 or (choice.picked is None and vllm_worker_v1_available() is not None):
            problem = vllm_worker_v2_serves(s.layout)
            driven = DRIVEN_V2 if problem is None else f"none: Model Runner V2 cannot run here ({problem})"
        else:
            problem = vllm_worker_v1_available()
            driven = DRIVEN_V1 if problem is None else f"none: Model Runner V1 cannot run here ({problem})"
        runners[s.name] = (choice, driven)
    return runners
