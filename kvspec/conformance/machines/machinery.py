"""What the conformance machines share: how a failure is reported, how a
refusal travels, how a call is made without letting its error escape."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from hypothesis import strategies as st
from hypothesis import target
from hypothesis.control import _current_build_context as _build_context
from hypothesis.stateful import RuleBasedStateMachine
from hypothesis.strategies import SearchStrategy
from hypothesis.strategies._internal.lazy import unwrap_strategies

from kvspec.conformance.targets.pool import BrokenFreeList
from kvspec.conformance.trace import Trace, clip
from kvspec.errors import HarnessFault
from kvspec.request import Request
from kvspec.spec.interface import ManagerSnapshot, PoolSnapshot, comparable
from kvspec.spec.rules import Violation


def missing_dependency(error: BaseException, package: str) -> bool:
    """Whether ``error`` says that ``package`` itself, or a module outside
    it, is not installed: the environment's problem (an install step), not
    the code's -- where a module *of* ``package`` that is missing is."""
    if not isinstance(error, ModuleNotFoundError) or error.name is None:
        return False
    return error.name == package or not error.name.startswith(package + ".")


def harness_frame(error: BaseException, target_roots: tuple[str, ...], harness_roots: tuple[str, ...]) -> str | None:
    """Where ``error`` was raised, if that was kvspec's harness: of the
    traceback's frames in the target's code (files under ``target_roots``)
    or the harness's (under ``harness_roots``), the deepest decides.
    ``"file:line in function"`` for the harness, ``None`` for the target
    (or when neither is on the stack)."""
    verdict = None
    for frame in traceback.extract_tb(error.__traceback__):
        if frame.filename.startswith(target_roots):
            verdict = None
        elif frame.filename.startswith(harness_roots):
            verdict = f"{frame.filename}:{frame.lineno} in {frame.name}"
    return verdict


DIVERGENCE = {"spec": "divergence from the spec", "upstream": "difference from upstream"}
"""The label of a failure that names no rule -- the lockstep comparison's --
by the side the target ran with: the spec, or a fork's upstream (``--against``)."""


def unnamed_failure(text: str) -> str:
    """The label of a failure naming no rule, read from its text."""
    return DIVERGENCE["upstream"] if DIVERGENCE["upstream"] in text else DIVERGENCE["spec"]


class ConformanceError(AssertionError):  # noqa: N818 (it is an assertion failure)
    """The target broke a rule or diverged from the spec (or, run against
    its upstream, differed from it: ``partner``)."""

    def __init__(self, violations: list[Violation] | None = None, divergence: str | None = None,
                 partner: str = "spec"):
        self.violations = violations or []
        self.divergence = divergence
        lines = [str(v) for v in self.violations]
        if divergence:
            lines.append(f"{DIVERGENCE[partner]}: {divergence}")
        super().__init__("\n".join(lines))


MM_PLACEHOLDER = 9  # the token id every image's positions carry (its content is the image's identifier)


@functools.lru_cache(maxsize=512)
def one_of(values: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    """``st.sampled_from(values)``, built once per tuple of values.  Hypothesis
    caches most strategies by their arguments but not this one, and a new
    strategy is validated on its first draw: the machines draw from a few
    small choice lists thousands of times a second."""
    return st.sampled_from(values)


def stopped_on(error: BaseException) -> str:
    """How a run that the target (or the machine) ended with an exception,
    where no refusal was possible, is reported."""
    return f"the run stopped on {type(error).__name__}: {error}"


class BudgetSpent(KeyboardInterrupt):  # noqa: N818 (not an error: the time is up)
    """The run's time is up.  Raised as an interrupt is, so that Hypothesis
    neither takes it for a failure to shrink nor keeps the cut-off run in its
    cache: it ends the search at once, and only the runner catches it."""


def in_final_replay() -> bool:
    """Whether Hypothesis is replaying the failure it settled on, to report
    it: that run must repeat the failure exactly, so the time is not checked."""
    context = _build_context.value
    return context is not None and context.is_final


class Refused(Exception):  # noqa: N818 (a refusal is an outcome, not an error)
    """The target refused an operation (with ``ValueError``/``TypeError``)."""

    def __init__(self, error: BaseException):
        super().__init__(repr(error))
        self.error = error


def call(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any] | None = None
) -> tuple[Any, Exception | None]:
    """``(result, None)`` or ``(None, error)``: the caller judges the error
    (only a ``ValueError``/``TypeError`` refusal is acceptable)."""
    try:
        return fn(*args, **(kwargs or {})), None
    except Exception as error:
        return None, error


Outcome = tuple[Any, BaseException | None, PoolSnapshot | ManagerSnapshot, list[Any]]
"""What one operation did: its result, its refusal (or ``None``), the
snapshot after it and the events it emitted."""


def divergence(where: str, target: Outcome, spec: Outcome, partner: str = "spec") -> str | None:
    """How the target's outcome of one operation differs from the spec's
    (``None``: it does not), checked in this order: both accept or both
    refuse, with the same kind of error (``ValueError`` or ``TypeError``);
    equal results; equal block tables (managers); equal pools, the null
    block's count aside; equal events.  ``partner`` names the other side
    (``spec``, or ``upstream`` for a fork run against its upstream)."""
    result, error, after, events = target
    spec_result, spec_error, spec_after, spec_events = spec
    width = max(len("target"), len(partner))
    me, other = "target".ljust(width), partner.ljust(width)  # the two sides of a two-line difference, aligned
    if (error is None) != (spec_error is None):
        return (f"{where}: target {'refused: ' + repr(error) if error else 'accepted'}, "
                f"{partner} {'refused: ' + repr(spec_error) if spec_error else 'accepted'}")
    if error is not None and isinstance(error, TypeError) != isinstance(spec_error, TypeError):
        return f"{where}: target raised {error!r}, {partner} {spec_error!r}"
    if error is None and result != spec_result:
        return f"{where}: target returned {result!r}, {partner} {spec_result!r}"
    if isinstance(after, ManagerSnapshot):
        if after.tables != spec_after.tables:
            return f"{where}: block tables differ\n  {me} {after.tables}\n  {other} {spec_after.tables}"
        after, spec_after = after.pool, spec_after.pool
    mine, theirs = after.without_null_ref(), spec_after.without_null_ref()
    if mine != theirs:
        fields = [f.name for f in dataclasses.fields(mine) if getattr(mine, f.name) != getattr(theirs, f.name)]
        shown = "\n".join(f"  {name}:\n    {me} {describe(getattr(mine, name))}\n    {other} "
                          f"{describe(getattr(theirs, name))}" for name in fields)
        return f"{where}: pools differ in {', '.join(fields)}\n{shown}"
    if comparable(events) != comparable(spec_events):
        return f"{where}: events differ\n  {me} {events}\n  {other} {spec_events}"
    return None


def describe(value: Any) -> str:
    """A value as a report shows it: a request by its id, a block hash by
    its first four bytes (``#1a2b3c4d``), containers element by element."""
    if isinstance(value, Request):
        return value.request_id
    if isinstance(value, bytes):
        return "#" + value[:4].hex()
    if isinstance(value, list):
        return "[" + ", ".join(map(describe, value)) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(map(describe, value)) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{describe(k)}: {describe(v)}" for k, v in value.items()) + "}"
    return repr(value)


def describe_call(op: str, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> str:
    """``op(arg, ...)`` for a report: keyword arguments only when set."""
    parts = [describe(a) for a in args]
    parts += [f"{k}={describe(v)}" for k, v in (kwargs or {}).items() if v]
    return f"{op}({', '.join(parts)})"


def describe_outcome(result: Any, error: BaseException | None, limit: int = 160) -> str:
    """What an operation returned, or how it was refused, cut to ``limit``."""
    return clip(f"refused {type(error).__name__}: {error}" if error is not None else describe(result), limit)


@dataclasses.dataclass
class SearchLog:
    """What one search tells its machines and what they report back: one
    log per search of one layout, handed to every machine (every example)
    the search makes -- never kept on a class.

    Told by the runner: under a budget, when the search must stop (before
    any failure) and when shrinking must stop; who is told at the first
    failing check (a red gate should not wait for the shrinker to say so);
    the optional inputs this batch of a swarm leaves out; whether the depths
    are handed to Hypothesis's targeting (budgeted searches).

    Reported by the machines: operations and examples run; the latest
    example's trace -- after a failed search, Hypothesis's final, shrunk
    reproduction; the smallest failure seen so far (what is reported if the
    time runs out while shrinking); the target operation the time ran out
    in (the target hangs there); when the first failure came and in which
    example (1-based); the distinct abstract states reached
    (:meth:`CheckingMachine.cover`) -- a budget moves to layouts whose
    search still finds new ones."""

    search_deadline: float | None = None
    shrink_deadline: float | None = None
    on_first_failure: Callable[[CheckingMachine, Exception], None] | None = None
    swarm_off: frozenset[str] = frozenset()
    steering: bool = False
    steps_run: int = 0
    examples_run: int = 0
    last_trace: Trace | None = None
    best_failure: tuple[Trace, Exception] | None = None
    hung_in: str | None = None
    calling_since: float | None = None  # when the target call in flight began (the budget's alarm asks)
    first_failure_at: float | None = None
    first_failure_example: int | None = None
    reached: set[tuple[Any, ...]] = dataclasses.field(default_factory=set)

    def states_reached(self) -> int:
        """How many distinct abstract states the search reached."""
        return len(self.reached)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MachineSetup:
    """What every machine is configured with, besides its scope's own
    (a subclass per scope: the target's factory, the layout, ...): the
    rules the run's conformance level does not ask for, the inputs the
    machine does not send, what the target runs in lockstep with (the spec,
    or a fork's upstream), and the layout's name for traces and reports."""

    ignore_rules: frozenset[str] = frozenset()
    avoid: frozenset[str] = frozenset()
    partner: str = "spec"
    layout_name: str = ""


class MachineFactory:
    """A machine class with its setup and its search's log: called, it
    makes one machine -- the factory ``run_state_machine_as_test`` takes --
    and it answers what a search asks of the machines it made (``scope``,
    ``layout_name``, ``steps_run``, :meth:`states_reached`, ...).

    Hypothesis digests a factory (a derandomized search's seed, the example
    database's key) by its source, its signature and its name.  A factory
    object has no source, and gets the name and signature that the classes
    built per target and layout had (their source was never found: they
    were renamed), so the searches draw what they drew before."""

    def __init__(self, machine: type[CheckingMachine], setup: MachineSetup, log: SearchLog | None = None,
                 name: str | None = None) -> None:
        self.machine, self.setup = machine, setup
        self.log = log if log is not None else SearchLog()
        self.__name__ = self.__qualname__ = name or machine.__name__
        self.__signature__ = inspect.Signature(return_annotation="None")

    def __call__(self) -> CheckingMachine:
        return self.machine(self.setup, self.log)

    def __repr__(self) -> str:
        return f"<{self.__name__} {self.setup.layout_name or '?'}>"

    @property
    def scope(self) -> str:
        return self.machine.scope

    @property
    def layout_name(self) -> str:
        return self.setup.layout_name

    @layout_name.setter
    def layout_name(self, name: str) -> None:
        self.setup = dataclasses.replace(self.setup, layout_name=name)

    @property
    def swarm_options(self) -> tuple[str, ...]:
        return self.machine.swarm_options

    @property
    def TestCase(self) -> Any:  # noqa: N802 (Hypothesis's name: the settings a run without its own reads)
        return self.machine.TestCase

    @property
    def steps_run(self) -> int:
        return self.log.steps_run

    @property
    def examples_run(self) -> int:
        return self.log.examples_run

    def states_reached(self) -> int:
        return self.log.states_reached()


Machines = MachineFactory | type["CheckingMachine"]
"""What a search runs: a :class:`MachineFactory` (every scope's), or a
machine class configured by its class attributes (a third party's, made
the way the machines once were) -- either is called to make a machine,
and has a ``log``."""


class PerMachine(SearchStrategy):  # type: ignore[type-arg]
    """A rule's argument strategy that depends on the machine's setup (a
    block id below the layout's pool size): ``build(machine)`` gives it,
    for the machine that runs.  Drawn exactly as the strategy it builds
    would be, span for span -- the same choices under the same label
    (``like``'s: a strategy of the same shape, whose label the built ones
    share, as Hypothesis's labels name shapes, not bounds) -- so that one
    module-level machine searches as the classes made per layout did."""

    def __init__(self, build: Callable[[Any], SearchStrategy], like: SearchStrategy) -> None:  # type: ignore[type-arg]
        super().__init__()
        self.build, self.like = build, like  # unwrapped when first drawn: a lazy strategy is not built on import

    def calc_label(self) -> int:
        return unwrap_strategies(self.like).label

    def do_draw(self, data: Any) -> Any:
        built = unwrap_strategies(self.build(data.hypothesis_runner))
        assert built.label == self.label, f"{built!r} is drawn under another label than {self.like!r}"
        return built.do_draw(data)

    def __repr__(self) -> str:
        return f"per_machine({self.like!r})"


class CheckingMachine(RuleBasedStateMachine):
    """A state machine that reports rule violations and divergences.

    A machine is made with its setup (a :class:`MachineSetup`: the target,
    the layout, the rules ignored, the inputs avoided) and the
    :class:`SearchLog` of the search it is an example of, where it reports
    (its ``log``): each run (one Hypothesis example) records its decisions
    in ``trace``, and the log keeps the latest; operations and runs are
    counted there.  Once a failure is raised, ``failed`` keeps teardown
    from masking it.

    A machine made without a setup -- a subclass configured by its class
    attributes, as the machines once were built per target and layout --
    reports to the log its class is given (``log``).
    """

    ignore_rules: frozenset[str] = frozenset()
    avoid: frozenset[str] = frozenset()  # inputs this machine does not send
    partner = "spec"  # what the target runs in lockstep with: the spec, or a fork's upstream
    spec: Any = None  # the spec model in lockstep, or None
    scope = ""
    layout_name = ""
    swarm_options: tuple[str, ...] = ()  # the inputs a swarm may switch off (see kvspec.conformance.runner)
    log: SearchLog = SearchLog()  # a class's own (each subclass gets one): for the machines made without one

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.log = SearchLog()

    def __init__(self, setup: MachineSetup | None = None, log: SearchLog | None = None) -> None:
        if setup is not None:
            self.setup = setup
            self.ignore_rules, self.avoid = setup.ignore_rules, setup.avoid
            self.partner, self.layout_name = setup.partner, setup.layout_name
        self.log = log if log is not None else SearchLog() if setup is not None else type(self).log
        self.check_time()
        super().__init__()
        self.failed = False
        self.interrupted = False  # a step was cut short (see guarded): the teardown judges nothing
        self.aims: dict[str, float] = {}
        left_out = self.avoid | {f"swarm:{name}" for name in self.log.swarm_off}  # a replay leaves them out too
        self.trace = Trace(self.scope, self.layout_name, avoid=sorted(left_out))
        self.log.last_trace = self.trace
        self.log.examples_run += 1

    def fail(self, violations: list[Violation] | None = None, divergence: str | None = None,
             partner: str = "spec") -> None:
        violations = [v for v in violations or [] if v.rule not in self.ignore_rules]
        if not violations and divergence is None:
            return
        error = ConformanceError(violations, divergence, partner)
        self.found(error, sorted({v.rule for v in violations}))
        raise error

    def found(self, error: Exception, rules: list[str]) -> None:
        """Note a failure of this run: in its trace, as the smallest failure
        so far if it is, and -- the first time -- as the moment the search
        turned red.  Every failure goes through here, a rule's verdict or an
        exception from the target, so that a budget that ends while
        Hypothesis shrinks it still reports it (never "conforms")."""
        self.failed = True
        self.trace.record_failure(rules, str(error) if isinstance(error, ConformanceError) else stopped_on(error))
        log = self.log
        best = log.best_failure
        if best is None or len(self.trace.steps) <= len(best[0].steps):
            log.best_failure = (self.trace, error)
        if log.first_failure_at is None:
            log.first_failure_at = time.perf_counter()
            log.first_failure_example = log.examples_run
            if log.on_first_failure is not None:
                log.on_first_failure(self, error)

    @contextlib.contextmanager
    def guarded(self) -> Iterator[None]:
        """Run a rule, an invariant or the teardown: an exception that is not
        the machine's own verdict, a refusal or the budget is the target's
        failure (it raised where no refusal is possible, or its state cannot
        be read) and is noted as one (:meth:`found`).  A free list that does
        not end is the free-queue rule's verdict.  Anything else that is not
        an ``Exception`` -- the budget's :class:`BudgetSpent`, or Hypothesis
        stopping an example whose draws ran past its size limit -- cuts the
        example short in the middle of a step: ``interrupted`` tells the
        teardown (which Hypothesis runs all the same) that the machine's
        model of the target is half-updated and nothing may be judged."""
        try:
            yield
        except (ConformanceError, Refused, HarnessFault):
            raise
        except BrokenFreeList as error:
            self.fail([Violation("free-queue-consistency", str(error))])
        except Exception as error:
            if not self.failed:
                self.found(error, [])
            raise
        except BaseException:  # the example was cut short mid-step: the budget, or Hypothesis ending it
            self.interrupted = True
            raise

    @contextlib.contextmanager
    def calling(self, where: str) -> Iterator[None]:
        """Mark a call into the target: if the time runs out inside it, the
        target hung there (see :func:`kvspec.conformance.runner.run_layout`;
        the alarm waits for a call younger than ``HANG_AFTER`` there)."""
        self.log.calling_since = time.perf_counter()
        try:
            yield
        except BudgetSpent:  # stopped inside the target (the alarm): mark where, for the runner
            if self.log.hung_in is None:
                self.log.hung_in = where
                self.trace.operation(f"{where} -> did not return")
            raise
        finally:
            self.log.calling_since = None

    def release(self) -> None:
        """Give back what the machine holds outside itself (a scheduler
        harness's drop-in): Hypothesis tears every run down, a replay that
        fails does not, and calls this instead.  Nothing by default."""

    def teardown_begins(self) -> bool:
        """Start judging the end of a run: the depths handed to targeting,
        the teardown recorded in the trace.  ``False`` when the run already
        failed or was cut short -- then nothing is judged."""
        self.steer()
        if self.failed or self.interrupted:
            return False
        self.trace.begin("teardown", {})
        return True

    def off(self, name: str) -> bool:
        """Whether optional input ``name`` is left out of this run: by the
        swarm's choice for this batch, or -- replaying a swarm run's trace --
        because the trace says it was (``swarm:NAME`` among its ``avoid``)."""
        return name in self.log.swarm_off or f"swarm:{name}" in self.avoid

    def cover(self, op: str, result: Any, error: BaseException | None, pool: PoolSnapshot, *extra: Any) -> None:
        """Count the abstract state an operation left: what it was and how it
        ended, how full the pool is, how many cached blocks wait in the free
        queue (where eviction and stale-hash bugs live), and ``extra``."""
        if error is not None:
            outcome = "refused " + type(error).__name__
        else:
            outcome = "none" if result is None else "empty" if result == [] or result == () else "ok"
        free = len(pool.free)
        cached_free = sum(1 for b in pool.free if b in pool.key_of)
        fill = "empty" if free == 0 else "low" if free <= 2 else "high" if free * 2 >= pool.num_blocks else "mid"
        self.aim("blocks in use", pool.num_blocks - free)
        self.aim("cached blocks waiting", cached_free)
        self.log.reached.add((op, outcome, fill, min(cached_free, 3), *extra))

    @classmethod
    def states_reached(cls) -> int:
        """How many distinct abstract states the search of this class's
        log reached (a class made per target and layout)."""
        return cls.log.states_reached()

    def aim(self, label: str, value: float) -> None:
        """Note how deep this example went by ``label`` (its maximum is
        handed to Hypothesis's targeting at the end: :meth:`steer`)."""
        if value > self.aims.get(label, 0):
            self.aims[label] = value

    def steer(self) -> None:
        """Hand this example's depths to ``hypothesis.target`` (one call per
        label and example, as it requires), so that the search leans toward
        examples that reach deeper.  Nothing outside a Hypothesis run."""
        if not self.log.steering or _build_context.value is None:
            return
        for label, value in self.aims.items():
            target(float(value), label=label)

    def check_time(self) -> None:
        """Stop the run (:class:`BudgetSpent`) once its time is up: the
        search's share before a failure, the shrinking deadline after one."""
        log = self.log
        deadline = log.shrink_deadline if log.best_failure is not None else log.search_deadline
        if deadline is not None and time.perf_counter() > deadline and not in_final_replay():
            raise BudgetSpent

    def in_lockstep(self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> Outcome | None:
        """The spec's outcome of the same operation (``None`` without
        lockstep).  Called right after the target's, before the caller
        changes anything the operation's arguments refer to."""
        if self.spec is None:
            return None
        if (whole := getattr(self.spec, "outcome", None)) is not None:  # in one call (a target in another process)
            return whole(op, args, kwargs)
        result, error = call(getattr(self.spec, op), args, kwargs)
        return result, error, self.spec.snapshot(), self.spec.take_events()

    def accepted_what_must_be_refused(self, where: str, spec_outcome: Outcome | None, rule: str) -> None:
        """The verdict on an input the machine sends only to see it refused
        (see ``must_refuse`` of the machines' ``apply``), when the target
        accepted it: that acceptance is the failure, named by the rule the
        spec refuses it by (``rule`` without a spec).  What the target did
        next is not judged: the machine, which expected a refusal, has no
        model of it (it played no model runner, knows no such request)."""
        spec_error = spec_outcome[1] if spec_outcome is not None else None
        why = f": the spec refuses it ({spec_error})" if spec_error is not None else ""
        self.fail([Violation(getattr(spec_error, "rule", rule), f"{where} was accepted; it must be refused{why}")])

    def judge(self, where: str, problems: list[Violation], outcome: Outcome, spec_outcome: Outcome | None) -> None:
        """One verdict per operation, in one order: the rules first, then
        the comparison with the spec."""
        if problems:
            self.fail(problems)
        if spec_outcome is not None and (found := divergence(where, outcome, spec_outcome, self.partner)):
            self.fail(divergence=found, partner=self.partner)

    def record(self, description: str, outcome: str) -> None:
        """One operation sent to the target, for the trace's reader."""
        self.check_time()
        self.log.steps_run += 1
        self.trace.operation(f"{description} -> {outcome}")
