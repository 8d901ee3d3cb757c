"""Scheduler scope: vLLM's own ``Scheduler`` driven step by step on a CPU,
with a scripted KV connector, and the block manager underneath checked
after every step.

The manager-scope machine calls the block manager the way a scheduler
would; bugs that live in the scheduler's use of it -- which hit it takes,
what it tells a connector, what it believes is computed -- are out of its
reach.  Here the real scheduler makes every call.  The harness plays the
model runner and the connector's worker:

- each step, ``schedule()`` decides; the harness writes the KV of every
  scheduled token into the request's blocks (a *content shadow*: for each
  block, which token prefix each slot holds), completes connector loads,
  samples one token for each request whose prompt is done, and feeds the
  result back through ``update_from_output``;
- a connector load writes the remote store's KV into the blocks the
  scheduler allocated for it -- at once (a synchronous load), at the next
  step (asynchronous, reported as received), or not at all (a failed load,
  reported as invalid blocks).

After every step the harness checks every request-level state rule of
:mod:`kvspec.spec.request_rules` (and with them the pool's) on the block
manager underneath, with the requests and the shadow as context, and at
every forward pass:

``content-soundness`` for what is counted computed
    A scheduled request that counts ``n`` tokens as computed holds, in
    every group, what its step reads of them (:meth:`Shadow.backs
    <kvspec.spec.content.Shadow.backs>`): the KV of its own tokens in
    every slot the window still reads, the state after ``n`` tokens in a
    Mamba group -- whether those tokens were computed, hit in the prefix
    cache or loaded by the connector.  A request that reads a block this
    step's failing load was to fill is exempt for that step (the output
    reports the failure and vLLM discards what it computed); its next read
    holds the scheduler to having rolled it back.
``scheduled-tokens-have-slots``
    Every token ``schedule()`` hands the model has a slot in every group
    (attention: a block at the token's position; Mamba: the block that
    receives the step's final state).

On an EAGLE layout the harness drafts tokens each step and accepts a random
prefix of them: a rejected draft's slot holds junk until rewritten, so a
computed count that still includes it is caught at the next read.  Drafts
are not driven on Mamba layouts (speculative state blocks are not modelled
at this scope).

The same harness drives kvspec's implementation under vLLM's scheduler
through the drop-in (:mod:`kvspec.dropin`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import rule

from kvspec.conformance.machines.machinery import (
    CheckingMachine,
    MachineFactory,
    MachineSetup,
    SearchLog,
    harness_frame,
    one_of,
)
from kvspec.conformance.targets.manager import KVCacheManagerTarget
from kvspec.conformance.trace import recorded
from kvspec.errors import HarnessFault
from kvspec.kv_cache_interface import AttentionKind, MambaSpec, cdiv
from kvspec.spec.content import ATTENTION_KINDS, Shadow
from kvspec.spec.interface import NULL_BLOCK_ID
from kvspec.spec.layout import Layout
from kvspec.spec.request_rules import RequestContext, check_request_state, computed_content_sound
from kvspec.spec.rules import Violation
from kvspec.testing import full, mamba, swa

# "Every token it may write has a slot in every attention group": the catalogue states it for allocations;
# here the tokens are the ones schedule() hands the model.
SCHEDULED_TOKENS_HAVE_SLOTS = "allocation-accounting"

LOAD_MODES = ("none", "sync", "async", "sync-fail", "async-fail")

# Layouts at scheduler scope: 16-token hash blocks as a deployment has them,
# a pool small enough that requests preempt and evict each other's prefixes.
SCHEDULER_LAYOUTS: dict[str, Layout] = {
    "full": Layout((full(16),), num_blocks=12, max_model_len=256),
    "full+mamba-all": Layout((full(16), mamba(16, "all")), num_blocks=16, max_model_len=256),
    "full+mamba-align": Layout((full(16), mamba(16, "align")), num_blocks=16, max_model_len=256),
    # EAGLE: the machine drafts 2 tokens a step and accepts a random prefix of them.
    "full+swa-eagle": Layout((full(16), swa(16, window=32)), num_blocks=20, max_model_len=256,
                                    use_eagle=True),
}
DRAFTS_PER_STEP = 2  # on EAGLE layouts


@dataclass(frozen=True)
class Engine:
    """How the engine around the scheduler is configured: what a failed KV
    load does to its request (``failure_policy``: ``recompute``, or ``fail``
    -- vLLM's default) and whether the engine schedules asynchronously
    (vLLM's ``AsyncScheduler``, on by default where the executor supports
    it).  In either mode the engine drains the aborts that arrived while
    the model ran right before it hands the step's output to
    ``update_from_output()`` (``EngineCore.step`` and
    ``step_with_batch_queue``: ``_process_aborts_queue``), so an abort can
    land between a step's ``schedule()`` and its output (an *in-flight*
    abort) as well as between steps."""

    failure_policy: str = "recompute"
    async_scheduling: bool = False


ENGINES: dict[str, Engine] = {
    "full-fail": Engine(failure_policy="fail"),  # vLLM's default policy
    "full-async": Engine(failure_policy="fail", async_scheduling=True),  # vLLM's defaults, both
}
"""The scheduler layouts whose engine is not the default :class:`Engine`
(the recompute policy, synchronous scheduling).  The hybrid layouts keep
the default: a block-level load failure on them is S3 in every release.
Under ``AsyncScheduler`` (``full-async``) the search sends no failing load:
the harness does not model what an asynchronous worker feeds for an output
placeholder whose sample the scheduler discarded (a request rolled back by
a failed load), so a search there could blame vLLM for the harness's
guess.  Failing loads under ``AsyncScheduler`` are driven by the scheduler
findings' traces (:mod:`kvspec.conformance.vllm.scheduler_findings`: S2
and S2-fail under both schedulers)."""
for _name in ENGINES:
    SCHEDULER_LAYOUTS[_name] = SCHEDULER_LAYOUTS["full"]


def engine_of(name: str) -> Engine:
    """The engine configuration of scheduler layout ``name``."""
    return ENGINES.get(name, Engine())


def _runs(tokens: list[int]) -> str:
    """Tokens as runs (``[5]*3 + [7]``): a trace's prompts stay readable."""
    runs: list[list[int]] = []
    for t in tokens:
        if runs and runs[-1][0] == t:
            runs[-1][1] += 1
        else:
            runs.append([t, 1])
    parts: list[str] = []
    loose: list[int] = []
    for t, n in runs:
        if n > 2:
            parts += [str(loose)] if loose else []
            parts.append(f"[{t}]*{n}")
            loose = []
        else:
            loose += [t] * n
    return " + ".join(parts + ([str(loose)] if loose else []))


@dataclass
class StepReport:
    """What one scheduler step did, as a line of the trace."""

    scheduled: dict[str, tuple[int, int]]  # request -> (computed before the step, tokens scheduled)
    loads: list[str]
    preempted: list[str]

    def __str__(self) -> str:
        parts = [", ".join(f"{r}: {c}+{n}" for r, (c, n) in self.scheduled.items()) or "nothing scheduled"]
        parts += [f"loads {'; '.join(self.loads)}"] if self.loads else []
        parts += [f"preempted {self.preempted}"] if self.preempted else []
        return " | ".join(parts)


class SchedulerHarness:
    """vLLM's ``Scheduler`` over ``layout`` with the scripted connector,
    the model runner and the connector's worker played by the harness."""

    def __init__(self, layout: Layout, *, connector: bool = True, max_num_seqs: int = 4,
                 max_num_batched_tokens: int = 64, seed: int = 0, num_draft_tokens: int = 0,
                 engine: Engine = Engine()):
        from kvspec.conformance.vllm.scheduler import make_scheduler, request_factory

        if num_draft_tokens and any(isinstance(g, MambaSpec) for g in layout.groups):
            raise ValueError("drafts are driven on attention-only layouts (Mamba's speculative states "
                             "are not modelled at scheduler scope)")
        self.layout = layout
        self.engine = engine
        self.num_draft_tokens = num_draft_tokens
        self.scheduler = make_scheduler(layout, max_num_seqs=max_num_seqs,
                                        max_num_batched_tokens=max_num_batched_tokens, connector=connector,
                                        num_draft_tokens=num_draft_tokens, failure_policy=engine.failure_policy,
                                        async_scheduling=engine.async_scheduling)
        self.in_flight_aborts: list[str] = []  # aborts the engine handles before this step's output
        self.new_request = request_factory(layout.hash_block_size)
        self.manager = KVCacheManagerTarget(self.scheduler.kv_cache_manager)
        self.connector = self.scheduler.connector
        self.rules_layout = layout
        self.shadow = Shadow(self.rules_layout)
        self.requests: dict[str, Any] = {}  # every request that arrived, finished or not
        self.pending: list[Any] = []  # asynchronous loads under way: they complete at the next step
        self.failed_blocks: set[int] = set()  # every block a load was to fill and did not
        self.trace: list[str] = []
        self.rng = random.Random(seed)
        self.steps = 0

    # --- the operations -----------------------------------------------------------

    def arrive(self, prompt: list[int], *, max_tokens: int = 4, remote_tokens: int = 0, load: str = "none") -> str:
        """A request arrives; the connector's store holds ``remote_tokens``
        of its prompt, loaded as ``load`` says (one of :data:`LOAD_MODES`)."""
        if load not in LOAD_MODES:
            raise ValueError(f"load must be one of {LOAD_MODES}, not {load!r}")
        if load != "none" and self.connector is None:
            raise ValueError(f"load {load!r} needs a connector; this harness was built without one")
        request_id = f"r{len(self.requests)}"
        if load != "none":
            script = self.connector.script
            script.remote_tokens[request_id] = remote_tokens
            if load.startswith("async"):
                script.async_load.add(request_id)
            if load.endswith("fail"):
                script.failing_load.add(request_id)
        request = self.new_request(request_id, list(prompt), max_tokens)
        self.requests[request_id] = request
        self.scheduler.add_request(request)
        self.trace.append(f"arrive {request_id}: {len(prompt)} tokens {_runs(prompt)}, max_tokens={max_tokens}"
                          + (f", store holds {remote_tokens} ({load})" if load != "none" else ""))
        return request_id

    def abort(self, request_id: str, *, in_flight: bool = False) -> None:
        """The client aborts ``request_id``: between steps, or (``in_flight``)
        while the next step runs -- after its ``schedule()``, before its
        output is processed, where the engine drains such aborts."""
        from kvspec.conformance.vllm.scheduler import abort

        if in_flight:
            self.in_flight_aborts.append(request_id)
            self.trace.append(f"abort {request_id} in flight (after the next schedule(), before its output)")
            return
        abort(self.scheduler, request_id)
        self.trace.append(f"abort {request_id}")

    def step(self) -> list[Violation]:
        """One engine step; every rule's violations, in order."""
        from kvspec.conformance.vllm.scheduler import abort, connector_output, runner_output

        self.steps += 1
        self.shadow.new_step()
        out = self.scheduler.schedule()
        scheduled = {rid: (self.scheduler.requests[rid].num_computed_tokens - n, n)
                     for rid, n in out.num_scheduled_tokens.items()}
        tables = {rid: self.manager.get_block_ids(rid) for rid in scheduled}  # as the model runner gets them
        loads = self.connector.take_loads() if self.connector is not None else []
        invalid: set[int] = set()
        for load in loads:
            if not load.is_async:
                invalid |= self._load(load)
        # A request that reads a block this step's failing load was to fill is told so in the
        # step's output, and vLLM discards what it computed: its read is not the one that counts.
        discarded = {rid for rid in scheduled if invalid & {b for table in tables[rid] for b in table}}
        self.trace.append(f"step {self.steps}: " + str(StepReport(
            scheduled, [self._describe(load) for load in loads],
            sorted(getattr(out, "preempted_req_ids", None) or []))))

        # The forward pass, layer by layer: every scheduled token's KV is written before attention
        # reads (so a block another request of the same batch fills counts as written), while a
        # Mamba state is read at the start of the step and written at its end.  A request's last
        # scheduled tokens may be drafts (positions past its tokens): their KV is written too, and
        # becomes its own once the drafts are accepted (below).
        drafts = {rid: list(getattr(out, "scheduled_spec_decode_tokens", {}).get(rid, ())) for rid in scheduled}
        problems = []
        for rid, (computed, count) in scheduled.items():
            problems += self._forward(rid, tables[rid], computed, count - len(drafts[rid]), ATTENTION_KINDS)
        problems += self._read("forward pass", {rid: c for rid, (c, _) in scheduled.items() if rid not in discarded})
        sampled = []
        for rid, (computed, count) in scheduled.items():
            self._forward(rid, tables[rid], computed, count - len(drafts[rid]), ("mamba",))
            request = self.scheduler.requests[rid]
            if computed + count - len(drafts[rid]) < request.num_tokens:
                sampled.append([])  # a prefill chunk: nothing sampled
            else:
                accepted = self.rng.randint(0, len(drafts[rid]))
                sampled.append(drafts[rid][:accepted] + [self.rng.randrange(1000)])
        num_tokens = {rid: self.scheduler.requests[rid].num_tokens for rid in scheduled}

        received = {load.request_id for load in self.pending}  # last step's asynchronous loads are done
        for load in self.pending:
            invalid |= self._load(load)
        self.pending = [load for load in loads if load.is_async]
        ids = list(out.num_scheduled_tokens)
        if self.in_flight_aborts:  # the engine handles the client's aborts while the step runs
            abort(self.scheduler, self.in_flight_aborts)
            self.trace.append(f"  aborted in flight: {self.in_flight_aborts}")
            self.in_flight_aborts = []
        loaded = connector_output(received, invalid) if received or invalid else None
        outputs = self.scheduler.update_from_output(out, runner_output(ids, sampled, loaded))
        for (rid, draft), tokens in zip(drafts.items(), sampled, strict=True):
            if draft and tokens:  # the accepted drafts' KV is the request's own; the rejected ones' is junk
                accepted = len(tokens) - 1
                request = self.requests[rid]
                self.shadow.write(request, tables[rid], num_tokens[rid], num_tokens[rid] + accepted, ATTENTION_KINDS)
                self.shadow.scribble(request, tables[rid], num_tokens[rid] + accepted, num_tokens[rid] + len(draft))
        done = sorted(o.request_id for batch in outputs.values() for o in batch.outputs if o.finished)
        if done:
            self.trace.append(f"  finished {done}")
        if self.num_draft_tokens:
            self._propose_drafts()
        return problems + self._check("after update_from_output()")

    def close(self) -> None:
        """Done with this harness (nothing to undo for vLLM's own manager)."""

    def _propose_drafts(self) -> None:
        """The drafter's proposals for the next step: ``k`` tokens for every
        running request (vLLM ignores them for prefill chunks)."""
        from kvspec.conformance.vllm.scheduler import propose_drafts

        running = sorted(self.scheduler.requests)
        proposals = [[self.rng.randrange(1000) for _ in range(self.num_draft_tokens)] for _ in running]
        propose_drafts(self.scheduler, running, proposals)

    # --- the model runner's and the worker's part ------------------------------------------

    def _forward(self, request_id: str, tables: tuple[list[int], ...], start: int, count: int,
                 kinds: tuple[str, ...]) -> list[Violation]:
        """The forward pass computes tokens ``[start, start + count)`` into
        the request's ``tables``, in groups of ``kinds``, every one of which
        must have a slot."""
        request = self.scheduler.requests[request_id]
        problems = []
        for g, (group, table) in enumerate(zip(self.rules_layout.views, tables, strict=True)):
            if group.kind not in kinds:
                continue
            p = (cdiv(start + count, group.block_size) if group.kind == AttentionKind.MAMBA
                 else (start + count - 1) // group.block_size + 1) - 1
            if p >= len(table) or table[p] == NULL_BLOCK_ID:
                problems.append(Violation(SCHEDULED_TOKENS_HAVE_SLOTS, (
                    f"step {self.steps}: {request_id} computes tokens {start}..{start + count} but group {g} "
                    f"has no block at position {p} ({list(table)})")))
        self.shadow.write(request, tables, start, start + count, kinds)
        return problems

    def _load(self, load: Any) -> set[int]:
        """The worker's load: the store's KV for the tokens into the blocks
        the scheduler allocated -- or, for a failing load, nothing, and the
        blocks it was to fill are reported invalid."""
        tables = self.manager.get_block_ids(load.request_id)
        if not load.fails:
            self.shadow.write(self.scheduler.requests[load.request_id], tables, load.start, load.start + load.count)
            return set()
        blocks = set()
        for group, table in zip(self.rules_layout.views, tables, strict=True):
            first, last = load.start // group.block_size, (load.start + load.count - 1) // group.block_size
            blocks |= {b for b in table[first: last + 1] if b != NULL_BLOCK_ID}
        self.failed_blocks |= blocks
        return blocks

    def _describe(self, load: Any) -> str:
        kind = ("async " if load.is_async else "") + ("failing " if load.fails else "")
        return f"{kind}{load.request_id} tokens {load.start}..{load.start + load.count}"

    def _context(self, computed: dict[str, int]) -> RequestContext:
        # Only the recompute policy keeps a failed load's blocks cached for their owner to recompute.
        unfilled = frozenset(self.failed_blocks) if self.engine.failure_policy == "recompute" else frozenset()
        return RequestContext(layout=self.rules_layout, requests=self.requests, shadow=self.shadow,
                              computed=computed, unfilled=unfilled)

    def _read(self, where: str, computed: dict[str, int]) -> list[Violation]:
        """What the step reads: each request's computed tokens are backed."""
        problems = computed_content_sound(self.manager.snapshot(), self._context(computed))
        return [Violation("content-soundness", f"step {self.steps}, {where}: {p}") for p in problems]

    def _check(self, where: str) -> list[Violation]:
        """Every request-level state rule on the manager.  Blocks a load
        failed to fill stay cached and shared under the recompute policy, by
        design (the first request holding them recomputes them, the others
        wait for it; vLLM PR #26813): they are exempt from the rules on what
        cached and shared blocks hold, never from the rule on reads.  Under
        the fail policy nothing is exempt: the blocks must leave the cache."""
        problems = check_request_state(self.manager.snapshot(), ctx=self._context({}))
        return [Violation(v.rule, f"step {self.steps}, {where}: {v.message}") for v in problems]


class DropinHarness(SchedulerHarness):
    """vLLM's scheduler over kvspec's implementation: the drop-in
    (:mod:`kvspec.dropin`) is installed while the harness lives -- the
    scheduler builds its ``KVCacheManager`` by name and asks at run time
    whether the coordinator is a ``HybridKVCacheCoordinator`` -- and
    :meth:`close` takes it out again (unless it was there before)."""

    def __init__(self, layout: Layout, **options: Any):
        from kvspec import dropin

        self._installed_here = not dropin.installed()
        dropin.install()
        try:
            super().__init__(layout, **options)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        from kvspec import dropin

        if self._installed_here:
            dropin.uninstall()
            self._installed_here = False


HARNESSES: dict[str, type[SchedulerHarness]] = {"vllm": SchedulerHarness, "impl": DropinHarness}
"""The targets at scheduler scope: vLLM's scheduler over vLLM's block
manager, or over kvspec's (the drop-in).  A block manager is only ever
judged here under vLLM's own scheduler."""


# --- the machine ------------------------------------------------------------------------------

FAILING_LOADS = ("sync-fail", "async-fail")
AVOIDABLE = {
    "scheduler:mamba-connector": "scheduler: no KV connector where a layout has a Mamba group",
    "scheduler:hybrid-failing-loads": "scheduler: no connector load fails where a layout has several groups",
    "scheduler:abort-failed-load": "scheduler: a request whose connector load fails is never aborted, and runs "
                                   "alone -- it arrives to an empty scheduler, nothing arrives while it lives -- "
                                   "so no other request can preempt it before it recomputes",
}
"""The inputs the scheduler machine can be told not to send (see
:mod:`kvspec.conformance.findings`)."""
SWARM_OPTIONS = ("loads", "failing-loads", "abort", "families")
"""The optional inputs a swarm batch may leave out: connector loads, failing
ones, aborts, shared system prompts (without them, no prefix is shared but
by chance)."""


def _code_roots() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the target's code, kvspec's harness code) as path prefixes: vLLM's
    package and kvspec's implementation are the target; the rest of kvspec
    -- the machines, the connector, the spec it checks with -- is the harness."""
    import os

    import kvspec
    from kvspec import impl, spec
    from kvspec.conformance.vllm import installed

    target = (os.path.dirname(impl.__file__) + os.sep,)
    if installed.package_dir() is not None:
        target += (installed.package_dir(),)
    harness = tuple(os.path.dirname(m.__file__) + os.sep for m in (kvspec, spec))
    return target, harness


@dataclass(frozen=True, kw_only=True)
class SchedulerSetup(MachineSetup):
    """What a :class:`SchedulerMachine` runs (the arguments of
    :func:`~kvspec.conformance.machines.scheduler.scheduler_machine`), and
    what follows from them once per setup: the system prompts of the
    ``families``, whether a connector loads (not on a Mamba layout that
    avoids it), the load modes left (no failing load under asynchronous
    scheduling, or on a hybrid layout that avoids them), the harness's
    class and the code roots that tell the target's exceptions from the
    harness's."""

    layout: Layout
    target: str = "vllm"
    load_modes: tuple[str, ...] = LOAD_MODES
    engine: Engine = field(default_factory=Engine)
    families: int = 3
    max_num_seqs: int = 4
    max_num_batched_tokens: int = 64
    system: list[list[int]] = field(init=False, repr=False, compare=False)
    connector: bool = field(init=False, repr=False, compare=False)
    harness_class: type[SchedulerHarness] = field(init=False, repr=False, compare=False)
    roots: tuple[tuple[str, ...], tuple[str, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        layout, load_modes = self.layout, self.load_modes
        system = [[rng.randrange(1000) for _ in range(48)] for rng in map(random.Random, range(self.families))]
        has_mamba = any(isinstance(g, MambaSpec) for g in layout.groups)
        connector = load_modes != ("none",) and not (has_mamba and "scheduler:mamba-connector" in self.avoid)
        if not connector:
            load_modes = ("none",)
        if self.engine.async_scheduling or ("scheduler:hybrid-failing-loads" in self.avoid and len(layout.groups) > 1):
            load_modes = tuple(m for m in load_modes if m not in FAILING_LOADS)  # async: see ENGINES
        derived = {"system": system, "connector": connector, "load_modes": load_modes,
                   "harness_class": HARNESSES[self.target], "roots": _code_roots()}
        for name, value in derived.items():
            object.__setattr__(self, name, value)


class SchedulerMachine(CheckingMachine):
    """The scheduler-scope machine (see :func:`scheduler_machine`),
    configured by a :class:`SchedulerSetup`, reporting to a :class:`SearchLog`."""

    scope = "scheduler"
    swarm_options = SWARM_OPTIONS
    setup: SchedulerSetup

    def __init__(self, setup: SchedulerSetup, log: SearchLog | None = None) -> None:
        super().__init__(setup, log)
        self.harness: SchedulerHarness | None = None
        self.shown = 0  # harness trace lines already in this run's trace
        self.harness = self.run("build the scheduler", lambda: setup.harness_class(
            setup.layout, connector=setup.connector, max_num_seqs=setup.max_num_seqs,
            max_num_batched_tokens=setup.max_num_batched_tokens,
            num_draft_tokens=DRAFTS_PER_STEP if setup.layout.use_eagle else 0, engine=setup.engine))

    def run(self, where: str, action: Any) -> Any:
        """One call into the scheduler: timed, marked for a hang, an
        exception judged (the target's, or kvspec's harness's), what it
        did added to the trace."""
        self.check_time()
        try:
            with self.calling(where):
                result = action()
        except Exception as error:
            frame = harness_frame(error, *self.setup.roots)
            if frame is not None:
                raise HarnessFault(f"kvspec's scheduler harness raised {type(error).__name__}: {error} "
                                   f"(at {frame}, during {where}) -- a fault in kvspec, not in the target") \
                    from error
            raise
        finally:
            if self.harness is not None:
                for line in self.harness.trace[self.shown:]:
                    self.log.steps_run += 1
                    self.trace.operation(line)
                self.shown = len(self.harness.trace)
        return result

    def modes(self) -> tuple[str, ...]:
        modes = ("none",) if self.off("loads") else self.setup.load_modes
        if self.off("failing-loads") or (self.failing_alone() and self.harness.scheduler.requests):
            modes = tuple(m for m in modes if m not in FAILING_LOADS)
        return modes or ("none",)

    def failing_alone(self) -> bool:
        """Whether failing loads run alone (``scheduler:abort-failed-load``):
        S2's owner preempted before it recomputes is vLLM's scheduler's
        decision under pool pressure, so the steer takes the pressure away."""
        return "scheduler:abort-failed-load" in self.avoid and self.harness.connector is not None

    def failing_owner_live(self) -> bool:
        return any(r in self.harness.scheduler.requests for r in self.harness.connector.script.failing_load)

    @rule(data=st.data())
    @recorded
    def arrive(self, data: Any) -> None:
        """A request arrives: a system prompt (or none) and its own
        tokens; the connector's store holds part of the prompt."""
        if self.failing_alone() and self.failing_owner_live():
            return
        family = -1 if self.off("families") else data.draw(st.integers(-1, self.setup.families - 1), label="family")
        own = data.draw(st.lists(st.integers(0, 999), min_size=1, max_size=40), label="own tokens")
        max_tokens = data.draw(st.integers(1, 6), label="max_tokens")
        load = data.draw(one_of(self.modes()), label="load")
        stored = data.draw(st.integers(0, 100), label="stored %") if load != "none" else 0
        prompt = (self.setup.system[family] if family >= 0 else []) + own
        self.run("add_request", lambda: self.harness.arrive(
            prompt, max_tokens=max_tokens, remote_tokens=stored * len(prompt) // 100, load=load))

    @rule()
    @recorded
    def step(self) -> None:
        """One engine step: schedule, the forward pass, the connector's
        loads, update_from_output; then every rule."""
        problems = self.run("schedule/update_from_output", self.harness.step)
        snapshot = self.harness.manager.snapshot()
        running = len(self.harness.scheduler.running)
        self.aim("requests running", running)
        self.cover("step", None, None, snapshot.pool, running, bool(self.harness.pending))
        self.fail(problems)

    @rule(data=st.data())
    @recorded
    def abort(self, data: Any) -> None:
        """A live request is aborted (a client went away)."""
        live = sorted(self.harness.scheduler.requests)
        if self.failing_alone():
            live = [r for r in live if r not in self.harness.connector.script.failing_load]
        if live and not self.off("abort"):
            request_id = data.draw(one_of(tuple(live)), label="request")
            in_flight = data.draw(st.booleans(), label="in flight?")
            self.run("finish_requests", lambda: self.harness.abort(request_id, in_flight=in_flight))

    def teardown(self) -> None:
        self.steer()
        self.release()

    def release(self) -> None:
        if self.harness is not None:
            self.harness.close()


def scheduler_machine(layout: Layout, *, target: str = "vllm", load_modes: tuple[str, ...] = LOAD_MODES,
                      engine: Engine = Engine(),
                      ignore_rules: frozenset[str] = frozenset(), avoid: frozenset[str] = frozenset(),
                      families: int = 3, max_num_seqs: int = 4, max_num_batched_tokens: int = 64,
                      layout_name: str = "") -> MachineFactory:
    """A conformance machine over vLLM's scheduler on ``layout``, the block
    manager underneath being ``target``'s (:data:`HARNESSES`): requests
    arrive (a shared system prompt of one of ``families``, or none, plus
    their own tokens; the connector's store holding part of the prompt,
    loaded in one of ``load_modes``), steps run (on an EAGLE layout with
    :data:`DRAFTS_PER_STEP` drafts a step, a random prefix of them
    accepted), requests are aborted; every rule is checked after every
    step -- those in ``ignore_rules`` aside -- and an exception out of the
    scheduler or the manager is the target's failure.  An exception out of
    kvspec's own harness stops the run as a :class:`HarnessError`.
    ``avoid`` names inputs not to send (:data:`AVOIDABLE`).

    A :class:`~kvspec.conformance.machines.machinery.MachineFactory` of
    :class:`SchedulerMachine` with its :class:`SchedulerSetup` and a fresh log."""
    setup = SchedulerSetup(layout=layout, target=target, load_modes=load_modes, engine=engine, families=families,
                           max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                           ignore_rules=frozenset(ignore_rules), avoid=frozenset(avoid), layout_name=layout_name)
    return MachineFactory(SchedulerMachine, setup, name="SchedulerMachine")


def search(layout: Layout, load_modes: tuple[str, ...], examples: int, *, target: str = "vllm",
           engine: Engine = Engine(), avoid: frozenset[str] = frozenset()) -> str | None:
    """Run :func:`scheduler_machine` on ``layout`` for ``examples``
    derandomized examples, not sending the inputs in ``avoid``: ``None``
    when nothing breaks, else the failure (the broken rules, or the
    exception out of the scheduler, and the minimal run)."""
    from hypothesis import HealthCheck, settings

    from kvspec.conformance.settings import run_machine

    machine = scheduler_machine(layout, target=target, load_modes=load_modes, engine=engine, avoid=avoid)
    try:
        run_machine(machine, settings(
            max_examples=examples, stateful_step_count=40, deadline=None, derandomize=True, database=None,
            suppress_health_check=list(HealthCheck), report_multiple_bugs=False))
    except Exception as failure:
        head = str(failure) if isinstance(failure, AssertionError) else f"vLLM's scheduler raised {failure!r}"
        return head + "\ntrace:\n  " + "\n  ".join(machine.log.last_trace.readable())
    return None
