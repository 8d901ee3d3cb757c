"""The kernel stage as a search: Hypothesis plays a serving engine's
scheduler over a model layout, one engine step per rule, the :class:`~kvspec.models.runner.Engine`
runs every step through real kernels, and every check of
:data:`~kvspec.models.runner.CHECKS` runs after every step.

Each step, requests arrive (prompts over a two-token alphabet, some after a
shared system prompt, so prefixes are shared; some with a cache salt or a
LoRA adapter: other tenants; some prompts come as embeddings), wait, are admitted after a prefix-cache lookup
-- sometimes with tokens a KV connector holds, loaded at once or by the next
step --, prefill in chunks (ending on block boundaries where Mamba's align
mode needs it), decode with speculative drafts that the model may reject,
are preempted and resumed, finish; between steps blocks are evicted and the
prefix cache is reset.  A token budget per step keeps the batches small.
"""

from __future__ import annotations

import contextlib
import io
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from kvspec.conformance.settings import run_machine
from kvspec.models.architectures import ModelSetup
from kvspec.models.runner import Engine
from kvspec.request import Request
from kvspec.spec.interface import ManagerTarget
from kvspec.testing import embedding_rows

SYSTEM_PROMPTS = ([], [1, 1, 0, 1, 0, 0], [0, 1, 1, 1])
MAX_REQUESTS = 5
SHORT = 64  # up to this max_model_len, prompts are drawn token by token


def token_budget(max_model_len: int) -> int:
    """Tokens per step: a dozen for the tiny layouts, an eighth of the
    context for long ones."""
    return max(12, max_model_len // 8)


def long_prompt(length: int, pattern: list[int], system: list[int]) -> list[int]:
    """A long prompt: the system prompt scaled up, then a repeated pattern."""
    head = system * max(1, length // (4 * max(1, len(system)))) if system else []
    tail = (pattern * (length // len(pattern) + 1))[: max(1, length - len(head))]
    return head + tail


def kernel_machine(setup: ModelSetup, target_factory: Callable[..., ManagerTarget], *,
                   kernels: Sequence[str] = ("reference", "flex"), dtype: torch.dtype = torch.float32,
                   device: str = "cpu", worker: str = "kvspec",
                   engine_class: type[Engine] = Engine, **engine_options: Any) -> type[RuleBasedStateMachine]:
    """A state-machine class running ``setup``'s model on managers made by
    ``target_factory`` through ``kernels``, with ``worker``'s block tables
    and cache writes (:data:`~kvspec.models.runner.WORKERS`: kvspec's model,
    or vLLM's own); ``engine_class`` (and ``engine_options``, such as
    ``skip_checks``) let a test plant a fault in the model runner."""
    layout = setup.layout
    has_mamba = any(g.__class__.__name__ == "MambaSpec" for g in layout.groups)
    align = layout.has_mamba_align
    sbs = layout.scheduler_block_size
    connector = layout.enable_caching and not has_mamba

    class KernelMachine(RuleBasedStateMachine):
        totals: Counter[str] = Counter()  # over every run: steps, checks, what the schedules did

        def __init__(self) -> None:
            super().__init__()
            self.engine = engine_class.from_setup(setup, target_factory, kernels=kernels, dtype=dtype, device=device,
                                                  worker=worker, **engine_options)

        # --- one engine step -----------------------------------------------------------------------------

        @rule(data=st.data())
        def step(self, data: st.DataObject) -> None:
            """Arrivals, the running requests' next tokens, admissions, then the kernels."""
            e = self.engine
            self.maintain(data)
            e.begin_step()
            for _ in range(data.draw(st.integers(0, 2), label="arrivals")):
                if len(e.running) + len(e.waiting) < MAX_REQUESTS:
                    self.arrive(data)
            budget = token_budget(layout.max_model_len)
            for request in list(e.running):
                budget -= self.run(data, request, budget)
            for request in list(e.waiting):
                if budget > 0 and request.request_id not in e.loading and data.draw(st.booleans(), label="admit?"):
                    budget -= self.admit(data, request, budget)
            sampled = {r.request_id: data.draw(st.integers(0, 1), label="sampled") for r in e.running}
            accepted = {w.request.request_id: data.draw(st.integers(0, len(w.drafts)), label="accepted")
                        for w in e.work if w.drafts}
            e.execute(sampled, accepted)

        def arrive(self, data: st.DataObject) -> Request:
            e = self.engine
            earlier = [r for r in e.requests.values() if r.prompt_embeds is None]
            if earlier and data.draw(st.sampled_from([False] * 3 + [True]), label="a prompt seen before?"):
                # Served traffic repeats itself (the same system prompt and question, a retried request):
                # the prefix cache's hits, and its races with loads and frees, live here.
                twin = earlier[data.draw(st.integers(0, len(earlier) - 1), label="same prompt as")]
                return e.new_request(list(twin.prompt_token_ids), salt=twin.cache_salt,
                                     lora=twin.lora_request.lora_name if twin.lora_request else None)
            if data.draw(st.sampled_from([False] * 5 + [True]), label="as embeddings?"):
                length = data.draw(st.integers(1, layout.max_model_len // 2), label="embedded prompt length")
                source = data.draw(st.sampled_from(["source-a", "source-b"]), label="embeddings")
                return self.engine.new_request(None, prompt_embeds=embedding_rows(source, length))
            system = data.draw(st.sampled_from(SYSTEM_PROMPTS), label="system prompt")
            if layout.max_model_len <= SHORT:
                tokens = system + data.draw(st.lists(st.integers(0, 1), min_size=1,
                                                     max_size=layout.max_model_len // 2 - len(system)), label="prompt")
            else:  # thousands of tokens: a length and a pattern
                length = data.draw(st.integers(1, layout.max_model_len // 2), label="prompt length")
                pattern = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=4), label="pattern")
                tokens = long_prompt(length, pattern, system)
            salt = data.draw(st.sampled_from([None, None, "tenant-b"]), label="salt")
            lora = data.draw(st.sampled_from([None, None, "adapter-a"]), label="lora")
            return self.engine.new_request(tokens, salt=salt, lora=lora)

        def chunk(self, data: st.DataObject, start: int, end: int, budget: int) -> int:
            """Tokens of ``[start, end)`` to compute now: at most ``budget``;
            short of the end, on a block boundary where Mamba aligns."""
            num = data.draw(st.integers(1, max(1, min(end - start, budget))), label="chunk")
            if align and start + num < end:
                aligned = (start + num) // sbs * sbs
                num = aligned - start if aligned > start else 0
            return num

        def run(self, data: st.DataObject, request: Request, budget: int) -> int:
            e = self.engine
            action = data.draw(st.sampled_from(["run", "run", "run", "preempt", "finish", "wait"]), label="action")
            if action == "preempt":
                e.preempt(request)
                return 0
            if action == "finish" or request.num_tokens >= layout.max_model_len - 2:
                e.finish(request)
                return 0
            if action == "wait" or budget <= 0:
                return 0
            start = request.num_computed_tokens
            if start < request.num_tokens - 1:
                num = self.chunk(data, start, request.num_tokens, budget)
                if num and e.advance(request, num):
                    return num
                return 0
            drafts = [] if has_mamba else data.draw(st.lists(st.integers(0, 1), max_size=2), label="drafts")
            drafts = drafts[: max(0, min(budget - 1, layout.max_model_len - 3 - request.num_tokens))]
            return 1 + len(drafts) if e.advance(request, drafts=drafts) else 0

        def admit(self, data: st.DataObject, request: Request, budget: int) -> int:
            """The lookup, then connector tokens (perhaps) and a first chunk that fit what the hit left."""
            e = self.engine
            if request.num_computed_tokens:  # its connector load landed: compute the rest, no lookup
                num = self.chunk(data, request.num_computed_tokens, request.num_tokens, budget)
                return num if num and e.admit(request, num) else 0
            hit = e.lookup(request)
            start = hit[1]
            external, async_load = 0, False
            room = request.num_tokens - 1 - start
            if connector and room > sbs and data.draw(st.booleans(), label="external?"):
                external = data.draw(st.integers(1, (room - 1) // sbs), label="external blocks") * sbs
                async_load = data.draw(st.booleans(), label="async load?")
            if async_load:
                steps = data.draw(st.integers(1, 3), label="load steps")
                e.admit(request, 0, hit, external=external, async_load=True, load_steps=steps)
                return 0
            num = self.chunk(data, start + external, request.num_tokens, budget)
            return num if num and e.admit(request, num, hit, external=external) else 0

        # --- between steps ------------------------------------------------------------------------------------

        def maintain(self, data: st.DataObject) -> None:
            """Now and then, before a step: evictions by id, or a prefix-cache reset."""
            e = self.engine
            kind = data.draw(st.sampled_from(["none"] * 6 + ["evict", "evict", "reset"]), label="maintenance")
            if kind == "reset":
                e.reset()
            elif kind == "evict":
                e.evict(data.draw(st.sets(st.integers(1, layout.num_blocks - 1), max_size=3), label="evict"))

        def teardown(self) -> None:
            e = getattr(self, "engine", None)
            if e is None:
                return
            KernelMachine.totals["steps"] += e.steps
            KernelMachine.totals.update({f"check {k}": v for k, v in e.checks_run.items()})
            KernelMachine.totals.update(e.events)
            for request in e.running + e.waiting:
                e.finish(request)
            free = e.target.snapshot().pool.num_free
            assert free == layout.num_blocks - 1, f"{free} of {layout.num_blocks - 1} blocks free at the end"

    KernelMachine.__name__ = f"KernelMachine[{setup.name}]"
    return KernelMachine


@dataclass
class StageResult:
    """One layout's kernel-stage run: what it did, and its first failure."""

    name: str
    totals: Counter[str]
    seconds: float
    failure: BaseException | None = None
    example: list[str] = field(default_factory=list)  # Hypothesis's minimal failing run

    @property
    def passed(self) -> bool:
        return self.failure is None

    @property
    def checks(self) -> int:
        return sum(v for k, v in self.totals.items() if k.startswith("check "))


def run_stage(setup: ModelSetup, target_factory: Callable[..., ManagerTarget], run_settings: settings, *,
              seeded: Callable[[Any], Any] | None = None, **options: Any) -> StageResult:
    """Search ``setup`` under ``run_settings`` (``seeded``: Hypothesis's
    ``seed(n)`` decorator for a repeatable random search); a failing check
    (or a target raising where no refusal is possible) ends the search with
    Hypothesis's shrunk example."""
    machine = kernel_machine(setup, target_factory, **options)
    if seeded is not None:
        seeded(machine)
    printed = io.StringIO()
    start = time.perf_counter()
    failure = None
    try:
        with contextlib.redirect_stdout(printed):
            run_machine(machine, run_settings)
    except Exception as error:  # a check, or the target itself
        failure = error
    # Hypothesis attaches the minimal failing run to the exception (or prints it, in older releases).
    text = printed.getvalue() + "\n".join(getattr(failure, "__notes__", ()))
    lines = [line for line in text.splitlines() if line.strip()]
    return StageResult(setup.name, machine.totals, time.perf_counter() - start, failure, lines if failure else [])
