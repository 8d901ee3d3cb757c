"""The request-level conformance machine: a scheduler in miniature.

Hypothesis plays vLLM's scheduler against a KV-cache manager: requests arrive
(tokens from a two-letter alphabet, so prefixes are shared; sometimes a cache
salt or a LoRA; some prompts come as embeddings), are admitted after a prefix-cache lookup with chunked
prefill (chunks end on block boundaries where Mamba's align mode needs it),
sometimes with tokens a KV connector already holds (external tokens), then
decode -- with speculative draft tokens that may be rejected where the layout
uses EAGLE -- and are preempted, resumed, finished or aborted.  Meanwhile
steps start (``new_step_starts``), blocks are evicted by id, the cache is
reset, and bad input is thrown at the manager.

Each operation goes to the target and, in lockstep mode, to the spec model;
results, block tables, the pool and the events must be equal, and every rule
must hold after every operation.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from kvspec.conformance.machines.configurations import (
    construct_badly,
    manager_machine_variants,
    sendable,
    takes_keyword,
)
from kvspec.conformance.machines.machinery import (
    MM_PLACEHOLDER,
    CheckingMachine,
    MachineFactory,
    MachineSetup,
    Refused,
    SearchLog,
    describe_call,
    describe_outcome,
    one_of,
)
from kvspec.conformance.machines.observe import MetricsLog, observe
from kvspec.conformance.targets.spec_manager import SpecManagerTarget
from kvspec.conformance.trace import recorded
from kvspec.hashing import (
    block_hashes_for_size,
    get_block_hash,
    get_request_block_hasher,
    make_block_hash_with_group_id,
)
from kvspec.kv_cache_interface import AttentionKind
from kvspec.request import LoRARequest, MultiModalFeatureSpec, PlaceholderRange, Request, RequestStatus
from kvspec.spec import releases
from kvspec.spec.content import Shadow, window_start
from kvspec.spec.interface import ManagerTarget
from kvspec.spec.layout import Layout
from kvspec.spec.request_rules import (
    RequestContext,
    check_request_state,
    check_request_step,
    fresh_blocks,
    stats_records,
)
from kvspec.spec.rules import EventMirror, Violation, check_events
from kvspec.testing import embedding_rows

ENCODER_TOKENS = 6


BALLAST_TOKEN = 1000  # + the request's number: a ballast prompt shares no prefix with any other
SWARM_INPUTS = {"arrive_embedded": "embedded", "arrive_multimodal": "multimodal", "arrive_ballast": "ballast",
                "arrive_followup": "followup", "preempt": "preempt", "finish": "finish"}
"""Scheduler actions a swarm batch may leave out, by the name of the input."""

SWARM_OPTIONS = ("embedded", "multimodal", "ballast", "followup", "preempt", "finish", "evict", "drop", "reset",
                 "bad", "connector", "tenants")
"""The optional inputs of the manager machine that swarm testing switches
off, a random subset per batch of examples (Groce et al., "Swarm testing",
ISSTA 2012): leaving some out lets the others go deeper -- no preemption and
no finishing fill the pool; no tenants make more prefixes shared.  A
conversation resumed under pressure (``resume_under_pressure``) is never
left out, and brings its connector tokens even in a batch without the
connector: it is one input whose parts must meet (vLLM #33775's setting),
which independent switches would leave together in one batch of eight."""


def ballast_length(layout: Layout, blocks: int) -> int:
    """The longest prompt (below ``max_model_len``) whose first allocation
    takes about ``blocks`` blocks: a block per ``block_size`` tokens in every
    group, a Mamba group its state block and speculative blocks (0: none fits)."""
    def need(tokens: int) -> int:
        return sum(1 + g.num_speculative_blocks if g.kind == AttentionKind.MAMBA else -(-tokens // g.block_size)
                   for g in layout.views)

    return max((t for t in range(1, layout.max_model_len) if need(t) <= blocks), default=0)


@dataclass(frozen=True, kw_only=True)
class ManagerSetup(MachineSetup):
    """What a :class:`ManagerMachine` checks, and how.

    ``target_factory`` is called with ``layout.target_args()``; every rule
    of :mod:`kvspec.spec.rules` and :mod:`kvspec.spec.request_rules`
    judges it -- and, when ``spec_factory`` is given, its targets in
    lockstep: the spec model, or a fork's upstream (named ``partner`` in
    reports).  ``avoid`` names inputs the machine does not send (see
    :mod:`kvspec.conformance.findings`): ``"bad-input:negative"``,
    ``"bad-input:no_tokens"``, ``"mamba-align-external"``,
    ``"context-parallel:save-past-computed"``.  The layout's release
    (:attr:`~kvspec.spec.layout.Layout.release`) judges: the requests'
    hashes, the rules and the spec's refusals follow it.

    Made once per setup from those: the scheduler block size (``sbs``),
    the tokens a step computes at most (``budget``, a scheduler's), whether
    a group is R-SWA, the layout's incoherent configurations
    (``variants``), whether the target takes a metrics collector
    (``collects``: observing is optional) and the oracle of what
    configuration is refused, at every level (``spec_builder``: the
    spec's -- an upstream in lockstep is no oracle of rules: its refusals
    are compared, not trusted)."""

    target_factory: Callable[..., ManagerTarget]
    layout: Layout
    spec_factory: Callable[..., ManagerTarget] | None = None
    sbs: int = field(init=False, repr=False, compare=False)
    budget: int = field(init=False, repr=False, compare=False)
    has_rswa: bool = field(init=False, repr=False, compare=False)
    variants: tuple[Any, ...] = field(init=False, repr=False, compare=False)
    collects: bool = field(init=False, repr=False, compare=False)
    spec_builder: Callable[..., ManagerTarget] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        layout, derived = self.layout, {}
        derived["sbs"] = layout.scheduler_block_size
        derived["budget"] = layout.max_num_batched_tokens or layout.max_model_len
        derived["has_rswa"] = any(group.kind == AttentionKind.RSWA for group in layout.views)
        derived["variants"] = manager_machine_variants(layout, self.target_factory)
        derived["collects"] = takes_keyword(self.target_factory, "metrics_collector", named=True)
        derived["spec_builder"] = (self.spec_factory if self.partner == "spec" else None) or \
            functools.partial(SpecManagerTarget, release=layout.release)
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    @property
    def release(self) -> releases.Release:
        return self.layout.release


class ManagerMachine(CheckingMachine):
    """The manager machine (see the module's docstring), configured by a
    :class:`ManagerSetup`, reporting to a :class:`SearchLog`."""

    scope = "manager"
    swarm_options = SWARM_OPTIONS
    setup: ManagerSetup

    def __init__(self, setup: ManagerSetup, log: SearchLog | None = None) -> None:
        super().__init__(setup, log)
        self.layout, self.sbs, self.budget, self.has_rswa = setup.layout, setup.sbs, setup.budget, setup.has_rswa
        # A collector where the target takes one (rule allocation-accounting: what it hears).
        self.metrics = MetricsLog() if self.setup.collects else None
        observed = {"metrics_collector": self.metrics} if self.setup.collects else {}
        self.target = self.layout.make_target(self.setup.target_factory, **observed)
        self.spec = self.layout.make_target(self.setup.spec_factory) if self.setup.spec_factory else None
        self.hasher = get_request_block_hasher(self.layout.hash_block_size, release=self.setup.release)
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.next_id = 0
        self.configured = False  # whether this run built its incoherent configuration (configure)
        self.earlier: list[Request] = []  # plain-token requests a follow-up turn may continue
        self.mirror = EventMirror()
        self.requests: dict[str, Request] = {}
        self.shadow = Shadow(self.layout)
        self.ctx = RequestContext(layout=self.layout, requests=self.requests, shadow=self.shadow,
                                  release=self.setup.release)

    # --- one operation: apply, compare, check -----------------------------------

    def apply(self, op: str, *args: Any, on_success: Callable[[Any], None] | None = None, lockstep: bool = True,
              must_refuse: str | None = None, **kwargs: Any) -> Any:
        """Apply ``op`` to the target (and, with ``lockstep``, the spec); on
        success let the caller play the model runner (``on_success(result)``
        writes the shadow and advances the request); then check every rule.
        ``must_refuse``: the call is one the target must refuse, by that
        rule unless the spec names another."""
        where = describe_call(op, args, kwargs)
        try:
            with self.calling(where):
                step = observe(self.target, op, *args, **kwargs)
        except Exception as error:  # anything but a clean refusal
            self.record(where, f"crashed {type(error).__name__}: {error}")
            self.fail(divergence=f"{where} crashed with {error!r}; a refusal must raise ValueError or TypeError")
        self.record(where, describe_outcome(step.result, step.error))
        if must_refuse and step.error is None:
            self.accepted_what_must_be_refused(where, self.in_lockstep(op, args, kwargs) if lockstep else None,
                                               must_refuse)
        if op == "new_step_starts":
            self.shadow.new_step()
        self.cover(op, step.result, step.error, step.after.pool, *self.depth(op, step.result, kwargs))
        events = self.target.take_events()
        self.mirror.apply(events)
        step = replace(step, events=tuple(events), residency=self.metrics.take() if self.metrics else None)
        # before the model runner moves the request on
        spec_outcome = self.in_lockstep(op, args, kwargs) if lockstep else None
        if step.error is None and on_success is not None and step.result is not None:
            on_success(step.result)
        problems = check_request_step(step, ctx=self.ctx)
        problems += check_request_state(step.after, ctx=self.ctx) + check_events(step.after.pool, self.mirror)
        self.judge(where, problems, (step.result, step.error, step.after, events), spec_outcome)
        if op == "take_new_block_ids":
            self.ctx.fresh.clear()
        self.ctx.fresh += fresh_blocks(step, self.layout, self.ctx.release)
        if op == "make_prefix_cache_stats":
            self.ctx.since_stats.clear()
        self.ctx.since_stats += stats_records(step, self.layout, self.ctx.release)
        if step.error is not None:
            raise Refused(step.error)
        return step.result

    def depth(self, op: str, result: Any, kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """What makes an operation's state deep, for the coverage count and
        Hypothesis's targeting: hits in several groups, connector tokens."""
        if op == "get_computed_blocks" and result is not None:
            groups_hit = sum(any(b != 0 for b in blocks) for blocks in result[0])
            self.aim("groups hit at once", groups_hit)
            return (groups_hit,)
        if op == "allocate_slots":
            external = kwargs.get("num_external_computed_tokens", 0)
            self.aim("connector tokens", external)
            return (bool(external), len(self.running))
        return ()

    def each(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """Apply an operation that both sides must accept."""
        try:
            return self.apply(op, *args, **kwargs)
        except Refused as refused:
            self.fail(divergence=f"{op} refused: {refused.error!r}")

    # --- requests ------------------------------------------------------------------------

    @rule(data=st.data())
    @recorded
    def schedule(self, data: st.DataObject) -> None:
        """One scheduler step: the step starts, then a few requests arrive,
        are admitted, compute, are preempted or finish."""
        self.each("new_step_starts")
        if self.running and not self.ctx.release.has("common-prefix-blocks-removed"):
            # Cascade attention's question, as vLLM's scheduler asks it every step: for its first running
            # request.  Judged by its rule at every level, not compared with the spec: vLLM also counts
            # requests whose tables are empty (a documented departure, spec/manager.py), so equal answers
            # are not the contract -- sound ones are.  (No draw: saved traces replay unchanged.)
            self.apply("get_num_common_prefix_blocks", self.running[0].request_id, lockstep=False)
        if hasattr(self.target, "get_usage"):  # the fill the scheduler logs and exports (optional in a target)
            self.apply("get_usage", lockstep=False)
        for _ in range(data.draw(st.integers(1, 3), label="actions")):
            arrivals = ["arrive", "arrive_embedded", "arrive_multimodal", "arrive_ballast"]
            arrivals += ["arrive_followup"] * bool(self.earlier) + ["resume_under_pressure"] * bool(self.ended())
            actions = arrivals if len(self.waiting) + len(self.running) < 6 else []
            actions += ["admit"] * bool(self.waiting) + ["step", "step", "preempt"] * bool(self.running)
            actions += ["finish"] * bool(self.waiting or self.running)
            actions = [a for a in actions if not self.off(SWARM_INPUTS.get(a, a))] or ["step"] * bool(self.running)
            if not actions:
                return
            getattr(self, data.draw(one_of(tuple(actions)), label="action"))(data)
        self.zero_new_blocks()

    def zero_new_blocks(self) -> None:
        """The scheduler's last questions of a step: which blocks the worker
        must zero before the step runs, and the prefix-cache stats for the
        metrics (each optional in a target; no draw)."""
        if hasattr(self.target, "take_new_block_ids"):
            self.apply("take_new_block_ids", lockstep=False)
        if hasattr(self.target, "make_prefix_cache_stats"):
            self.apply("make_prefix_cache_stats", lockstep=False)

    @rule(data=st.data())
    @recorded
    def maintain(self, data: st.DataObject) -> None:
        """Outside the step loop: evictions by id, a cache reset, dropping
        out-of-window blocks, bad input."""
        kinds = [k for k in ("evict", "evict", "drop", "reset", "bad") if not self.off(k)]
        if not kinds:
            return
        kind = data.draw(one_of(tuple(kinds)), label="maintenance")
        if kind == "evict":
            self.each("evict_blocks", data.draw(st.sets(st.integers(1, self.layout.num_blocks - 1), max_size=3)))
        elif kind == "reset":
            self.each("reset_prefix_cache")
        elif kind == "drop" and self.running:
            self.drop_out_of_window(data)
        elif kind == "bad":
            kinds = [k for k in ("no_tokens", "negative", "trusted_args") if f"bad-input:{k}" not in self.avoid]
            if kinds:
                kind = data.draw(one_of(tuple(kinds)), label="bad input")
                if kind == "trusted_args":
                    kind = data.draw(one_of(("past_max_len", "flag_type", "running_hits", "stale_hits",
                                             "save_count")), label="argument")
                if kind == "save_count":
                    self.bad_save()
                else:
                    self.bad_allocation(kind)

    @precondition(lambda self: not self.configured)
    @rule(data=st.data())
    @recorded
    def configure(self, data: st.DataObject) -> None:
        """Once per run: a manager built with one incoherent variant of
        this layout's sizes is refused, as the spec refuses it."""
        self.configured = True
        names = sendable(self.setup.variants, self.avoid)
        if names and not self.off("bad"):
            name = data.draw(one_of(names), label="configuration")
            construct_badly(self, self.setup.variants, name, self.setup.spec_builder, self.setup.target_factory)

    def arrive(self, data: st.DataObject) -> None:
        """A request arrives with a short prompt."""
        prompt = st.lists(st.integers(0, 1), min_size=1, max_size=self.layout.max_model_len // 2)
        tokens = data.draw(prompt, label="prompt")
        salt, lora = None, None
        if not self.off("tenants"):
            salt = data.draw(one_of((None, None, None, "tenant-b")), label="salt")
            lora = data.draw(one_of((None, None, None, LoRARequest("adapter-a", 1))), label="lora")
        self.next_id += 1
        request = Request(f"r{self.next_id}", tokens, cache_salt=salt, lora_request=lora, block_hasher=self.hasher)
        self.requests[request.request_id] = request
        self.earlier.append(request)
        self.waiting.append(request)
        self.admit(data, request)

    def arrive_embedded(self, data: st.DataObject) -> None:
        """A request arrives whose prompt comes as embeddings: placeholder
        token ids, and one embedding row per token from one of two
        sources -- same placeholders, other embeddings, other content."""
        length = data.draw(st.integers(1, self.layout.max_model_len // 2), label="embedded prompt length")
        source = data.draw(one_of(("source-a", "source-b")), label="embeddings")
        self.next_id += 1
        request = Request(f"r{self.next_id}", None, prompt_embeds=embedding_rows(source, length),
                          block_hasher=self.hasher)
        self.requests[request.request_id] = request
        self.waiting.append(request)
        self.admit(data, request)

    def arrive_multimodal(self, data: st.DataObject) -> None:
        """A request arrives with images in its prompt: one to three
        items, each a run of the same placeholder token named by one of
        two identifiers -- starting anywhere, so items straddle block
        boundaries, end on them, or share a block.  Requests with the same
        placeholders and other images hold other content."""
        length = data.draw(st.integers(2, self.layout.max_model_len // 2), label="multimodal prompt length")
        tokens = data.draw(st.lists(st.integers(0, 1), min_size=length, max_size=length), label="prompt")
        features, at = [], 0
        for _ in range(data.draw(st.integers(1, 3), label="items")):
            if at >= length:
                break
            start = at + data.draw(st.integers(0, min(2 * self.layout.hash_block_size, length - at - 1)),
                                   label="gap")
            size = data.draw(st.integers(1, min(3 * self.layout.hash_block_size, length - start)), label="item size")
            image = data.draw(one_of(("image-a", "image-b")), label="image")
            tokens[start:start + size] = [MM_PLACEHOLDER] * size
            features.append(MultiModalFeatureSpec(image, PlaceholderRange(start, size)))
            at = start + size
        if "partial-entry:earlier-image" in self.avoid:
            features = self.without_earlier_image_in_tail(tokens, features)
        self.next_id += 1
        request = Request(f"r{self.next_id}", tokens, mm_features=features, block_hasher=self.hasher)
        self.requests[request.request_id] = request
        self.waiting.append(request)
        self.admit(data, request)

    def without_earlier_image_in_tail(self, tokens: list[int], features: list) -> list:
        """Avoids finding F11 (``partial-entry:earlier-image``): the
        items up to the first that overlaps the last hash block before
        a partial tail boundary the prompt may get (which then is the
        last), the later ones' placeholders turned back into text."""
        hbs = self.layout.hash_block_size
        tail = {b for b in (len(tokens) // hbs * hbs, (len(tokens) - 1) // hbs * hbs) if b > 0}
        for k, f in enumerate(features):
            start, end = f.mm_position.offset, f.mm_position.offset + f.mm_position.length
            if any(start < b and end > b - hbs for b in tail):
                for later in features[k + 1:]:
                    offset = later.mm_position.offset
                    tokens[offset:offset + later.mm_position.length] = [0] * later.mm_position.length
                return features[:k + 1]
        return features

    def ended(self) -> list[Request]:
        """The earlier requests that hold nothing now (finished or preempted)."""
        return [r for r in self.earlier if r not in self.running and r not in self.waiting]

    def resume_under_pressure(self, data: st.DataObject) -> None:
        """A conversation that ended resumes under memory pressure: a
        ballast takes every free block queued before the conversation's
        cached ones, then its next turn arrives -- the conversation's own
        blocks are now the first an allocation evicts (vLLM #33775's
        setting: a group's connector blocks evicting a later group's hit)."""
        pool = self.target.snapshot().pool
        cached = {get_block_hash(pool.key_of[b]): i for i, b in reversed(list(enumerate(pool.free)))
                  if b in pool.key_of}
        ahead = {r: min((cached[h] for h in r.block_hashes if h in cached), default=None) for r in self.ended()}
        candidates = [r for r, at in ahead.items() if at is not None]  # those with blocks still cached
        if not candidates:
            return
        earlier = candidates[data.draw(st.integers(0, len(candidates) - 1), label="earlier request")]
        self.arrive_ballast(data, ahead[earlier])
        self.arrive_followup(data, [earlier], resumed=True)

    def arrive_followup(self, data: st.DataObject, candidates: list[Request] | None = None,
                        resumed: bool = False) -> None:
        """The next turn of a conversation: a request whose prompt is an
        earlier request's tokens so far (prompt and output, all of them
        or cut anywhere) plus a few new ones, from the same tenant -- the
        traffic prefix caching exists for.  ``resumed``: all of them, and
        new tokens enough for a connector to hold some."""
        candidates = candidates or self.earlier
        earlier = candidates[data.draw(st.integers(0, len(candidates) - 1), label="earlier request")]
        history = list(earlier.all_token_ids)
        whole = resumed or data.draw(st.booleans(), label="whole history?")
        kept = len(history) if whole else data.draw(st.integers(1, len(history)), label="kept")
        fresh = 2 * self.sbs + 1 if resumed else 0
        room = max(fresh, self.layout.max_model_len // 2 + self.sbs - kept)
        new = st.lists(st.integers(0, 1), min_size=fresh, max_size=min(fresh + 4, room))
        tokens = history[:kept] + data.draw(new, label="new tokens")
        self.next_id += 1
        request = Request(f"r{self.next_id}", tokens[:self.layout.max_model_len - 1], cache_salt=earlier.cache_salt,
                          lora_request=earlier.lora_request, block_hasher=self.hasher)
        self.requests[request.request_id] = request
        self.earlier.append(request)
        self.waiting.append(request)
        self.admit(data, request, resumed=resumed)

    def arrive_ballast(self, data: st.DataObject, blocks: int | None = None) -> None:
        """A request that fills the pool: a prompt no other request shares,
        about as long as ``blocks`` blocks hold (by default the pool's free
        blocks without a key), is admitted whole -- so the allocations
        after it evict cached blocks, least recently used first, where
        eviction bugs live.  (Sized from the target's snapshot.)"""
        if blocks is None:
            pool = self.target.snapshot().pool
            blocks = sum(1 for b in pool.free if b not in pool.key_of)
        length = ballast_length(self.layout, blocks)
        if not length:
            return
        self.next_id += 1
        request = Request(f"r{self.next_id}", [BALLAST_TOKEN + self.next_id] * length, block_hasher=self.hasher)
        self.requests[request.request_id] = request
        self.waiting.append(request)
        self.admit(data, request, whole=True)

    def admit(self, data: st.DataObject, request: Request | None = None, whole: bool = False,
              resumed: bool = False) -> None:
        """The scheduler looks up the longest cached prefix, maybe adds
        connector-held tokens, and allocates the first chunk (``whole``:
        the whole prompt at once -- up to the step's token budget --, no connector; ``resumed``: a connector
        even where the swarm left it out)."""
        if request is None:
            request = self.waiting[data.draw(st.integers(0, len(self.waiting) - 1), label="waiting")]
        blocks, hit = self.each("get_computed_blocks", request)
        if len(self.layout.views) > 1 and hasattr(self.target, "find_longest_cache_hit_per_group") and \
                not (self.layout.dcp_world_size > 1 and "context-parallel:hybrid-per-group-lookup" in self.avoid):
            # What a hybrid model's KV connector is given: each group's own hit (optional; no draw).
            self.apply("find_longest_cache_hit_per_group", request)
        room = request.num_tokens - hit
        external = 0
        connector = (resumed or not self.off("connector")) and \
            not (self.layout.has_mamba_align and "mamba-align-external" in self.avoid)
        if connector and not whole and room > self.sbs and (resumed or data.draw(st.booleans(), label="external?")):
            # resumed: one block right past the hit, so that the later groups' hits stay in their windows
            most = 1 if resumed else (room - 1) // self.sbs
            external = data.draw(st.integers(1, most), label="external blocks") * self.sbs
        if whole:
            num_new = min(request.num_tokens - hit, self.budget)
        elif resumed and external:  # the smallest first chunk (the pool is as full as it gets) ...
            start = hit + external  # ... ending on a scheduler block where Mamba's align mode needs it
            num_new = min((start // self.sbs + 1) * self.sbs, request.num_tokens) - start \
                if self.layout.has_mamba_align else 1
        else:
            num_new = self.chunk(data, hit + external, request.num_tokens)
        lookahead = data.draw(st.integers(0, 2), label="lookahead") if self.layout.use_eagle else 0
        delay = external > 0 and data.draw(st.booleans(), label="delay caching?")
        if external and len(self.layout.views) > 1:
            self.aim_at_untouched_hits(blocks, hit + external)

        def run_first_chunk(tables: Any) -> None:
            start = hit
            tables = self.target.get_block_ids(request.request_id)
            self.shadow.write(request, tables, start, start + external)  # the connector loads these
            self.shadow.write(request, tables, start + external, start + external + num_new)
            request.num_computed_tokens = start + external + num_new
            request.status = RequestStatus.RUNNING

        try:
            new = self.apply(
                "allocate_slots", request, num_new, hit, blocks,
                num_lookahead_tokens=lookahead, num_external_computed_tokens=external,
                delay_cache_blocks=delay,
                num_encoder_tokens=ENCODER_TOKENS if self.layout.has_cross_attention else 0,
                full_sequence_must_fit=not resumed and data.draw(st.booleans(), label="must fit?"),
                on_success=run_first_chunk,
            )
        except Refused:
            return
        if new is None:
            return  # not enough blocks: stays waiting, nothing changed
        self.waiting.remove(request)
        self.running.append(request)
        if self.ctx.release.has("stats-at-admission") and hasattr(self.target, "record_prefix_cache_stats"):
            self.apply("record_prefix_cache_stats", request, hit, lockstep=False)  # as the scheduler does
        if delay:
            self.each("cache_blocks", request, hit + external)
        self.maybe_sample(request, data)

    def aim_at_untouched_hits(self, hits: tuple[list[int], ...], computed: int) -> None:
        """Steer toward admissions whose connector blocks could evict a
        later group's hit before it is taken (vLLM #33775's class): the
        nearer such a free hit block -- one still in its group's window
        once ``computed`` tokens are -- sits to the free queue's head, the
        deeper the example.  (Reads the target's snapshot; no draw.)"""
        first = set(hits[0])  # the first group's hits leave the queue before any connector block is taken
        free = [b for b in self.target.snapshot().pool.free if b not in first]
        at_risk = {b for view, group in zip(self.layout.views[1:], hits[1:], strict=True)
                   for b in group[window_start(view, computed):] if b != 0}
        positions = [i for i, b in enumerate(free) if b in at_risk]
        if positions:
            self.aim("later groups' free hits near the queue's head", self.layout.num_blocks - positions[0])

    def chunk(self, data: st.DataObject, start: int, end: int) -> int:
        """How many tokens of ``[start, end)`` this step computes.  Chunks
        that stop before the end stop on a scheduler-block boundary when a
        Mamba group caches in align mode (vLLM's scheduler splits so)."""
        num = data.draw(st.integers(1, min(end - start, self.budget)), label="chunk")
        if self.layout.has_mamba_align and start + num < end:
            aligned = (start + num) // self.sbs * self.sbs
            num = aligned - start if aligned > start else end - start
        return num

    def maybe_sample(self, request: Request, data: st.DataObject) -> None:
        """When the prompt is fully computed the model emits a token (and
        the drafter proposes a few, where the layout speculates)."""
        if request.num_computed_tokens >= request.num_tokens:
            request.append_output_token_ids(data.draw(st.integers(0, 1), label="sampled"))
            if request.num_tokens >= self.layout.max_model_len:
                # vLLM's stop check ends a request at max_model_len tokens: it is never
                # scheduled again (a preempted one would be re-admitted past the limit).
                self.end(request, RequestStatus.FINISHED_LENGTH_CAPPED)
                return
            room = self.layout.max_model_len - request.num_tokens - 1  # vLLM's scheduler drafts no further
            if self.layout.use_eagle and room > 0:
                request.spec_token_ids = data.draw(st.lists(st.integers(0, 1), max_size=min(2, room)),
                                                   label="drafts")
            elif self.layout.use_eagle:
                request.spec_token_ids = []

    def step(self, data: st.DataObject) -> None:
        """A running request computes its next chunk, or decodes one token
        plus its drafts; rejected drafts are rolled back."""
        request = self.running[data.draw(st.integers(0, len(self.running) - 1), label="running")]
        drafts = len(request.spec_token_ids)
        if request.num_computed_tokens < request.num_tokens - 1:
            num_new = self.chunk(data, request.num_computed_tokens, request.num_tokens)
            drafts = 0
        else:
            num_new = request.num_tokens - request.num_computed_tokens + drafts
        lookahead = data.draw(st.integers(0, 2), label="lookahead") if self.layout.use_eagle else 0
        start = request.num_computed_tokens

        def run_step(tables: Any) -> None:
            tables = self.target.get_block_ids(request.request_id)
            if not drafts:
                self.shadow.write(request, tables, start, start + num_new)
                request.num_computed_tokens = start + num_new
                return
            accepted = data.draw(st.integers(0, drafts), label="accepted")
            request.append_output_token_ids(request.spec_token_ids[:accepted])
            request.spec_token_ids = []
            self.shadow.write(request, tables, start, start + 1 + accepted)
            self.shadow.scribble(request, tables, start + 1 + accepted, start + num_new)
            request.num_computed_tokens = start + 1 + accepted

        try:
            new = self.apply(
                "allocate_slots", request, num_new, num_lookahead_tokens=lookahead, on_success=run_step
            )
        except Refused:
            return
        if new is None:
            self.preempt_request(request)
            return
        self.maybe_sample(request, data)

    def preempt_request(self, request: Request) -> None:
        self.each("free", request)
        self.running.remove(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.spec_token_ids = []
        self.waiting.append(request)

    def preempt(self, data: st.DataObject) -> None:
        """The scheduler runs short and preempts a request (recompute later)."""
        self.preempt_request(self.running[data.draw(st.integers(0, len(self.running) - 1), label="victim")])

    def finish(self, data: st.DataObject) -> None:
        """A request finishes (or is aborted, perhaps before it ran)."""
        everyone = self.running + self.waiting
        self.end(everyone[data.draw(st.integers(0, len(everyone) - 1), label="finishing")],
                 RequestStatus.FINISHED_STOPPED)

    def end(self, request: Request, status: RequestStatus) -> None:
        if status == RequestStatus.FINISHED_STOPPED and request in self.running and \
                hasattr(self.target, "get_block_ids_for_computed_tokens") and not self.saves_past_computed(request):
            # What a KV connector saves of a finished request (optional in a target; no draw).
            self.apply("get_block_ids_for_computed_tokens", request.request_id, request.num_computed_tokens)
        self.each("free", request)
        (self.running if request in self.running else self.waiting).remove(request)
        request.status = status

    def saves_past_computed(self, request: Request) -> bool:
        """Whether a connector's save of ``request`` is a query this run
        avoids: on a context-parallel layout, while its table reaches past
        its computed tokens (lookahead, rejected drafts) -- vLLM 0.25.1
        counts those blocks per rank there (finding F10)."""
        if "context-parallel:save-past-computed" not in self.avoid or self.layout.context_parallel_ranks == 1:
            return False
        held = len(self.target.get_block_ids(request.request_id)[0])
        return held > -(-request.num_computed_tokens // self.layout.views[0].block_size)

    def drop_out_of_window(self, data: st.DataObject) -> None:
        """Blocks that left every window are returned to the pool."""
        request = self.running[data.draw(st.integers(0, len(self.running) - 1), label="request")]
        args = [request.request_id, request.num_computed_tokens]
        if self.has_rswa and data.draw(st.booleans(), label="with the prompt length"):  # R-SWA's gap needs it
            args.append(request.num_prompt_tokens)
        self.each("remove_skipped_blocks", *args)

    def bad_allocation(self, kind: str) -> None:
        """Impossible requests are refused and change nothing (see
        :meth:`bad_allocation_call`)."""
        call = self.bad_allocation_call(kind)
        if call is None:
            return
        args, kwargs = call
        # the kinds added after F4's trace was recorded: their acceptance is the verdict
        checked = {"no_tokens": None, "negative": None, "running_hits": "hit-soundness",
                   "stale_hits": "content-soundness" if self.layout.enable_caching else "hit-soundness"}.get(
            kind, "allocation-accounting")
        try:
            self.apply("allocate_slots", *args, must_refuse=checked, **kwargs)
        except Refused:
            return
        self.fail(divergence=f"{describe_call('allocate_slots', args, kwargs)} was accepted; it must be refused")

    def bad_save(self) -> None:
        """A KV connector's save asked for a negative count of computed
        tokens (a scheduler never sends one): refused, changing nothing
        (optional in a target)."""
        if not hasattr(self.target, "get_block_ids_for_computed_tokens"):
            return
        rid = self.running[0].request_id if self.running else "bad"
        with contextlib.suppress(Refused):
            self.apply("get_block_ids_for_computed_tokens", rid, -1, must_refuse="allocation-accounting")

    def bad_allocation_call(self, kind: str) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """The arguments of an impossible ``allocate_slots``: no tokens, a
        negative count, and -- arguments a scheduler never sends -- a count
        past ``max_model_len``, a flag that is not a bool, hits for a
        request already running (none running: nothing to send), and hits
        for a new request that are no hits: a block not cached under the
        request's hash (with caching off, any block)."""
        request = Request("bad", [0, 1], block_hasher=self.hasher)
        if kind == "stale_hits":
            stale = self.stale_block(request)
            hits = tuple([stale] if g == 0 else [] for g in range(len(self.layout.managed_groups)))
            return (request, 1, self.layout.managed_groups[0].block_size, hits), {}
        if kind == "running_hits":
            if not self.running:
                return None
            request = self.running[0]
            hits = tuple(list(table[:1]) for table in self.target.snapshot().tables[request.request_id])
            return ((request, 1, self.sbs, hits), {}) if any(hits) else None
        counts = {"no_tokens": 0, "negative": -1, "past_max_len": self.layout.max_model_len + 1, "flag_type": 2}
        return (request, counts[kind]), {"delay_cache_blocks": 1} if kind == "flag_type" else {}

    def stale_block(self, request: Request) -> int:
        """A block (never the null block) that is no hit for ``request``'s
        first block in group 0: one not keyed by that block's hash."""
        snap = self.target.snapshot().pool
        hashes = block_hashes_for_size(request.block_hashes, self.layout.hash_block_size,
                                      self.layout.managed_groups[0].block_size)
        if not hashes:  # no whole block to name: no block is a hit
            return 1
        hit = make_block_hash_with_group_id(hashes[0], 0)
        return next(b for b in range(1, self.layout.num_blocks) if snap.key_of.get(b) != hit)

    def teardown(self) -> None:
        if not self.teardown_begins():
            return
        with self.guarded():
            for request in self.running + self.waiting:
                self.each("free", request)
            free = self.target.snapshot().pool.num_free
            if free != self.layout.num_blocks - 1:
                self.fail([Violation("ref-conservation",
                                     f"{free} of {self.layout.num_blocks - 1} blocks free at the end")])



def manager_machine(
    target_factory: Callable[..., ManagerTarget],
    layout: Layout,
    *,
    spec_factory: Callable[..., ManagerTarget] | None = None,
    ignore_rules: frozenset[str] = frozenset(),
    avoid: frozenset[str] = frozenset(),
    partner: str = "spec",
    release: releases.Release | str | None = None,
    layout_name: str = "",
) -> MachineFactory:
    """A factory of :class:`ManagerMachine` checking managers made by
    ``target_factory`` (the arguments: :class:`ManagerSetup`'s), with a
    fresh :class:`SearchLog`: what ``run_state_machine_as_test`` and
    :func:`kvspec.conformance.runner.run_layout` take.  ``release``: the
    vLLM release whose rules judge (default: the layout's own)."""
    if release is not None:
        layout = layout.for_release(release)
    setup = ManagerSetup(target_factory=target_factory, layout=layout, spec_factory=spec_factory,
                         ignore_rules=frozenset(ignore_rules), avoid=frozenset(avoid), partner=partner,
                         layout_name=layout_name)
    return MachineFactory(ManagerMachine, setup)
