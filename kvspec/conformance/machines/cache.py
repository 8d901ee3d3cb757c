"""The cache-scope machine: any engine's prefix cache and allocator.

A Hypothesis state machine plays an engine's scheduler and model runner
over a :class:`~kvspec.spec.engines.CacheTarget` -- vLLM's manager seen
through kvspec's impl, SGLang's radix cache, LMDeploy's block trie, or a
``module:factory`` of your own: requests arrive with prompts from a tiny
alphabet (so prefixes are shared) and a tenant, grow by decode steps and
prefill chunks, insert their blocks into the index mid-flight, finish, are
preempted, and the engine is asked to evict.

The machine records what each block holds (:data:`~kvspec.spec.engines.Written`:
the key of the tokens a request wrote there) and, after every operation,
judges the engine's content view by chapter 10's rules
(:mod:`kvspec.spec.engines`).  Nothing runs in lockstep: engines differ in
policy (which block is reused, which leaf is evicted), and the rules hold
whatever the policy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from kvspec.conformance.machines.machinery import (
    CheckingMachine,
    MachineFactory,
    MachineSetup,
    SearchLog,
    Violation,
    call,
    describe_call,
    describe_outcome,
    one_of,
)
from kvspec.conformance.trace import recorded
from kvspec.spec import engines
from kvspec.spec.engines import CacheLayout, CacheTarget, CacheView, content_key

CACHE_LAYOUTS: dict[str, CacheLayout] = {
    layout.name: layout for layout in (
        CacheLayout("page-1", block_size=1, num_blocks=24,
                    description="a block (page) of one token: SGLang's default"),
        CacheLayout("page-4", block_size=4, num_blocks=12, description="blocks of 4 tokens"),
        CacheLayout("tenants", block_size=4, num_blocks=12, tenants=(None, "adapter-a", "adapter-b"),
                    description="three tenants (no adapter, two LoRA adapters) that must never share a block"),
        CacheLayout("window", block_size=4, num_blocks=12, window=8,
                    description="a sliding window of 8 tokens: blocks wholly before it are no longer read"),
        CacheLayout("window-1", block_size=1, num_blocks=24, window=8,
                    description="a sliding window of 8 tokens over blocks of one token: SGLang's all-SWA cache"),
        CacheLayout("full+swa", block_size=4, num_blocks=12, window=8, groups=("full", "swa"),
                    description="a hybrid model: full-attention layers and sliding-window layers of 8 tokens, "
                    "each token with a slot in both pools (SGLang's UnifiedRadixCache)"),
    )
}
"""The cache scope's layouts.  A target without a layout's feature says
so (its factory's ``unsupported(layout)``) and the layout is skipped."""

ALPHABET = (0, 1, 2)


@dataclass(frozen=True, kw_only=True)
class CacheSetup(MachineSetup):
    """What a :class:`CacheMachine` checks: the targets
    ``target_factory(layout)`` builds."""

    target_factory: Callable[..., CacheTarget]
    layout: CacheLayout


class CacheMachine(CheckingMachine):
    """The cache-scope machine (see the module's docstring), configured by
    a :class:`CacheSetup`, reporting to a :class:`SearchLog`."""

    scope = "cache"
    setup: CacheSetup

    def __init__(self, setup: CacheSetup, log: SearchLog | None = None) -> None:
        super().__init__(setup, log)
        self.layout, self.block_size = setup.layout, setup.layout.block_size  # the spec calls it B
        self.target = setup.target_factory(self.layout)
        self.requests: dict[str, tuple[Any, list[int]]] = {}  # running: tenant, tokens (all computed)
        self.written: engines.Written = {}
        self.next_id = 0
        self.last = self.view()

    def view(self) -> CacheView:
        with self.calling("view()"):
            return self.target.view()

    # --- one operation: call, write, judge -----------------------------------------

    def apply(self, op: str, *args: Any) -> tuple[Any, CacheView, CacheView]:
        before = self.last
        where = describe_call(op, args)
        with self.calling(where):
            result, error = call(getattr(self.target, op), args)
        self.record(where, describe_outcome(result, error))
        if error is not None:  # the machine sends only what a scheduler sends: no refusal is possible
            raise error
        after = self.view()
        self.last = after
        self.cover(op, result, after)
        return result, before, after

    def cover(self, op: str, result: Any, view: CacheView) -> None:  # type: ignore[override]
        free, cached = len(view.free), len(set(view.cached) - set(view.held()))
        fill = "empty" if free == 0 else "low" if free <= 2 else "high" if 2 * free >= len(view.blocks) else "mid"
        self.aim("blocks in use", len(view.blocks) - free)
        self.aim("cached blocks waiting", cached)
        self.log.reached.add((op, "none" if result is None or result is False else "ok", fill, min(cached, 3)))

    def write(self, request_id: str, start: int) -> None:
        """The model runner writes tokens ``start ..`` of the request into its blocks."""
        tenant, tokens = self.requests[request_id]
        size = self.block_size
        for _, group, _ in engines.groups_of(self.last):  # a hybrid model writes every group's slots
            table = group.tables.get(request_id, ())
            for i in range(start // size, -(-len(tokens) // size)):
                if i < len(table):
                    self.written[table[i]] = content_key(tenant, tokens, min((i + 1) * size, len(tokens)))

    def judge(self, problems: list[Violation]) -> None:  # type: ignore[override]
        if problems:
            self.fail(problems)

    def others_untouched(self, op: str, before: CacheView, after: CacheView, but: str | None) -> list[Violation]:
        return engines.unchanged_holders(before, after, op, [r for r in self.requests if r != but])

    def pick(self, data: st.DataObject) -> str:
        names = sorted(self.requests)
        return names[data.draw(st.integers(0, len(names) - 1), label="request")]

    def tokens(self, data: st.DataObject, most: int, label: str) -> list[int]:
        return data.draw(st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=most), label=label)

    # --- the scheduler's operations --------------------------------------------------

    @rule(data=st.data())
    @recorded
    def admit(self, data: st.DataObject) -> None:
        """A request arrives: its prefix is matched and locked, the rest allocated."""
        tenant = data.draw(one_of(self.layout.tenants), label="tenant")
        tokens = self.tokens(data, 3 * self.block_size + 3, "prompt")
        request_id = f"r{self.next_id}"
        self.next_id += 1
        hit, before, after = self.apply("admit", request_id, tokens, tenant)
        problems = engines.admission(before, after, request_id, tenant, tokens, hit, self.written, self.layout.max_hit,
                                     self.layout.window)
        problems += self.others_untouched("admit", before, after, request_id)
        if hit is not None and not problems:
            self.requests[request_id] = (tenant, list(tokens))
            self.write(request_id, hit)
        self.judge(problems)

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    @recorded
    def append(self, data: st.DataObject) -> None:
        """A running request grows: one decode token, or a prefill chunk."""
        request_id = self.pick(data)
        more = self.tokens(data, self.block_size + 2, "tokens")
        ok, before, after = self.apply("append", request_id, more)
        problems = self.others_untouched("append", before, after, request_id)
        if ok:
            tenant, tokens = self.requests[request_id]
            start = len(tokens)
            tokens.extend(more)
            slots = len(after.tables.get(request_id, ())) * self.block_size
            if slots < len(tokens):
                problems.append(Violation("allocation-accounting", f"{request_id} grew to {len(tokens)} "
                                          f"tokens with slots for {slots}"))
            else:
                self.write(request_id, start)
        else:  # preempted and given up
            del self.requests[request_id]
            if after.tables.get(request_id):
                problems.append(Violation("allocation-accounting", f"{request_id} could not grow, was given up, "
                                          f"and still holds {after.tables[request_id]}"))
        self.judge(problems)

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    @recorded
    def cache(self, data: st.DataObject) -> None:
        """A running request's full blocks go into the index (chunked insertion)."""
        request_id = self.pick(data)
        _, before, after = self.apply("cache", request_id)
        self.judge(self.others_untouched("cache", before, after, request_id))

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    @recorded
    def finish(self, data: st.DataObject) -> None:
        """A request ends; its full blocks stay cached."""
        self.leave(self.pick(data), "finish")

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    @recorded
    def preempt(self, data: st.DataObject) -> None:
        """A request is preempted (retracted) and holds nothing."""
        self.leave(self.pick(data), "preempt")

    def leave(self, request_id: str, op: str) -> None:
        del self.requests[request_id]
        _, before, after = self.apply(op, request_id)
        problems = self.others_untouched(op, before, after, request_id)
        if after.tables.get(request_id):
            problems.append(Violation("ref-conservation", f"{request_id} still holds {after.tables[request_id]} "
                                      f"after {op}"))
        self.judge(problems)

    @rule(n=st.integers(1, 4))
    @recorded
    def evict(self, n: int) -> None:
        """The engine is asked to evict: only what nobody holds may go."""
        _, before, after = self.apply("evict", n)
        self.judge(self.others_untouched("evict", before, after, None))

    @invariant()
    def rules_hold(self) -> None:
        """Every state rule of chapter 10 on the view after each operation."""
        with self.guarded():
            self.fail(engines.check_view(self.last, self.requests, self.written, self.layout.window))

    def teardown(self) -> None:
        if not self.teardown_begins():
            return
        with self.guarded():
            for request_id in sorted(self.requests):
                self.leave(request_id, "finish")
            _, _, after = self.apply("evict", len(self.last.blocks))
            self.fail(engines.check_view(after, {}, self.written, self.layout.window))
            if after.holds:  # nothing runs: nothing may be held (an evict may leave cached blocks: its policy)
                self.fail([Violation("ref-conservation", f"blocks {sorted(after.holds)[:8]} are still held "
                                     "once every request left")])



def cache_machine(target_factory: Callable[..., CacheTarget], layout: CacheLayout, *,
                  ignore_rules: frozenset[str] = frozenset(), avoid: frozenset[str] = frozenset(),
                  layout_name: str = "") -> MachineFactory:
    """A factory of :class:`CacheMachine` checking targets built by
    ``target_factory(layout)``, with a fresh :class:`SearchLog`."""
    setup = CacheSetup(target_factory=target_factory, layout=layout, ignore_rules=frozenset(ignore_rules),
                       avoid=frozenset(avoid), layout_name=layout_name)
    return MachineFactory(CacheMachine, setup, name=f"CacheMachine_{layout.name.replace('-', '_')}")
