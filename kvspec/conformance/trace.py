"""Traces: a machine's decisions, saved so that a run replays exactly.

A conformance machine decides everything through Hypothesis: which rule runs
next, with which arguments, and every value a rule draws inside (a prompt, an
index into the running requests, a chunk length).  Given the same decisions,
the machine sends the same operations to the target and checks the same
rules -- the machine has no other source of choice.  A :class:`Trace`
records those decisions step by step and, next to each step, the operations
the machine sent and what came back, for the reader.

Replaying (:func:`replay`) feeds a trace's decisions to a fresh machine for
any target.  Where the target behaves like the one recorded, every step asks
for the decision the trace holds; the first step where a rule breaks, the
target leaves the spec, or the machine asks for a decision the trace does not
hold (the target answered differently from the recorded one and the
scheduler took another path) is the step where it diverges.

The file format (JSON, ``"kvspec_trace": 1``)::

    {"kvspec_trace": 1, "scope": "manager", "layout": "full+swa",
     "target": "vllm", "level": "L1", "avoid": ["bad-input:negative"],
     "release": "0.27.0",
     "failure": {"step": 3, "rules": ["allocation-accounting"], "message": "..."},
     "steps": [{"rule": "schedule", "args": {},
                "draws": [["actions", 1], ["action", "arrive"], ...],
                "operations": ["new_step_starts() -> None", ...]}, ...]}

Values are JSON, with ``{"set": [...]}``, ``{"tuple": [...]}`` and
``{"lora": [name, id]}`` for the few that are not.  ``release`` (optional)
is the vLLM release whose rules judged the run (:mod:`kvspec.spec.releases`);
a replay judges by it.  ``against`` (optional) is the upstream the target
ran in lockstep with (``kvspec conform --against``); a replay runs with it.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvspec.request import LoRARequest

FORMAT_VERSION = 1


class TraceError(ValueError):
    """A trace file that cannot be read, or that does not fit the machine."""


class TraceMismatch(Exception):  # noqa: N818 (an outcome of replay, not a bug)
    """The replayed machine asked for a decision the trace does not hold."""


class TraceEnd(Exception):  # noqa: N818 (an outcome of replay, not a bug)
    """The replay went past the point where the recorded run failed: the
    trace holds nothing beyond it."""


def trace_file_name(scope: str, layout: str) -> str:
    """Where a failing layout's trace is saved, under the trace directory."""
    return f"{scope}-" + re.sub(r"[^A-Za-z0-9_.-]", "_", layout) + ".json"


# --- values ----------------------------------------------------------------------------------


def encode(value: Any) -> Any:
    """A drawn value as JSON."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, tuple):
        return {"tuple": [encode(v) for v in value]}
    if isinstance(value, (set, frozenset)):
        return {"set": sorted(encode(v) for v in value)}
    if isinstance(value, LoRARequest):
        return {"lora": [value.lora_name, value.lora_int_id]}
    raise TypeError(f"cannot save a drawn {type(value).__name__} in a trace: {value!r}")


def decode(value: Any) -> Any:
    """The inverse of :func:`encode`."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if isinstance(value, dict):
        if len(value) != 1:
            raise TraceError(f"unknown value {value!r}")
        (kind, inner), = value.items()
        if kind == "tuple":
            return tuple(decode(v) for v in inner)
        if kind == "set":
            return {decode(v) for v in inner}
        if kind == "lora":
            name, int_id = inner
            return LoRARequest(name, int_id)
        raise TraceError(f"unknown value kind {kind!r}")
    return value


# --- the record ---------------------------------------------------------------------------


@dataclass
class TraceStep:
    rule: str
    args: dict[str, Any] = field(default_factory=dict)
    draws: list[tuple[str | None, Any]] = field(default_factory=list)
    operations: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "args": {k: encode(v) for k, v in self.args.items()},
            "draws": [[label, encode(v)] for label, v in self.draws],
            "operations": self.operations,
        }

    @classmethod
    def from_json(cls, raw: Any) -> TraceStep:
        if not isinstance(raw, dict) or not isinstance(raw.get("rule"), str):
            raise TraceError(f"a step must be an object with a rule name, got {raw!r:.80}")
        args, draws = raw.get("args", {}), raw.get("draws", [])
        if not isinstance(args, dict) or not isinstance(draws, list):
            raise TraceError(f"step {raw['rule']!r}: args must be an object and draws a list")
        if not all(isinstance(d, list) and len(d) == 2 for d in draws):
            raise TraceError(f"step {raw['rule']!r}: each draw must be [label, value]")
        return cls(
            raw["rule"],
            {k: decode(v) for k, v in args.items()},
            [(label, decode(v)) for label, v in draws],
            [str(op) for op in raw.get("operations", [])],
        )


@dataclass
class Trace:
    """One run of a machine: where it ran and the decisions it made."""

    scope: str
    layout: str
    target: str = ""
    level: str = "L3"
    steps: list[TraceStep] = field(default_factory=list)
    failure: dict[str, Any] | None = None
    avoid: list[str] = field(default_factory=list)  # inputs the machine did not send
    release: str = ""  # the vLLM release whose rules judged (spec/releases/); "": the base, or not recorded
    against: str = ""  # the upstream run in lockstep with (--against); "": the spec's lockstep, if any

    # -- recording
    def begin(self, rule: str, args: dict[str, Any]) -> None:
        self.steps.append(TraceStep(rule, dict(args)))

    def operation(self, text: str) -> None:
        if not self.steps:
            self.begin("init", {})
        self.steps[-1].operations.append(text)

    def record_failure(self, rules: list[str], message: str) -> None:
        self.failure = {"step": len(self.steps), "rules": rules, "message": message}

    # -- reading
    def readable(self, limit: int = 200) -> list[str]:
        """The steps as lines a person reads: the rule, then its operations."""
        lines = []
        for i, step in enumerate(self.steps, 1):
            args = ", ".join(f"{k}={v!r}" for k, v in step.args.items())
            draws = " ".join(f"{label or 'value'}={clip(repr(v), 60)}" for label, v in step.draws)
            lines.append(f"step {i}: {step.rule}({args})" + (f"  [{draws}]" if draws else ""))
            lines += [f"    {op}" for op in step.operations]
        if len(lines) > limit:
            lines = lines[: limit // 2] + [f"    ... {len(lines) - limit} lines ..."] + lines[-limit // 2 :]
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "kvspec_trace": FORMAT_VERSION,
            "scope": self.scope,
            "layout": self.layout,
            "target": self.target,
            "level": self.level,
            "avoid": self.avoid,
            **({"release": self.release} if self.release else {}),
            **({"against": self.against} if self.against else {}),
            "failure": self.failure,
            "steps": [s.to_json() for s in self.steps],
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """Read a trace file; anything malformed raises :class:`TraceError`
        naming the file and the problem."""
        try:
            raw = json.loads(Path(path).read_text())
        except OSError as error:
            raise TraceError(f"cannot read trace {path}: {error.strerror or error}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise TraceError(f"trace {path} is not JSON: {error}") from None
        try:
            return cls.from_json(raw)
        except TraceError as error:
            raise TraceError(f"malformed trace {path}: {error}") from None

    @classmethod
    def from_json(cls, raw: Any) -> Trace:
        if not isinstance(raw, dict) or raw.get("kvspec_trace") != FORMAT_VERSION:
            raise TraceError(f'not a kvspec trace (expected "kvspec_trace": {FORMAT_VERSION})')
        for key in ("scope", "layout"):
            if not isinstance(raw.get(key), str):
                raise TraceError(f"missing {key!r}")
        if not isinstance(raw.get("steps"), list):
            raise TraceError("missing the list of steps")
        avoid = raw.get("avoid", [])
        if not isinstance(avoid, list) or not all(isinstance(a, str) for a in avoid):
            raise TraceError("'avoid' must be a list of input names")
        return cls(
            raw["scope"], raw["layout"], str(raw.get("target", "")), str(raw.get("level", "L3")),
            [TraceStep.from_json(s) for s in raw["steps"]], raw.get("failure"), avoid, str(raw.get("release", "")),
            str(raw.get("against", "")),
        )


# --- recording and replaying draws --------------------------------------------------------


class RecordingData:
    """Hypothesis's ``data`` object, with every draw written to the trace."""

    def __init__(self, inner: Any, step: TraceStep):
        self.inner, self.step = inner, step

    def draw(self, strategy: Any, label: str | None = None) -> Any:
        value = self.inner.draw(strategy, label=label)
        self.step.draws.append((label, value))
        return value


class ReplayData:
    """Stands in for Hypothesis's ``data``: hands out a step's recorded draws."""

    def __init__(self, draws: list[tuple[str | None, Any]], where: str, *, failed_here: bool = False):
        self.draws, self.where, self.used = list(draws), where, 0
        self.failed_here = failed_here  # the recorded run stopped inside this step

    def draw(self, strategy: Any, label: str | None = None) -> Any:
        if self.used == len(self.draws):
            if self.failed_here:
                raise TraceEnd(f"{self.where}: past the point where the recorded run failed")
            raise TraceMismatch(f"{self.where}: the machine asked for another value ({label}); the trace has none")
        recorded_label, value = self.draws[self.used]
        if recorded_label != label:
            raise TraceMismatch(
                f"{self.where}: the machine asked for {label!r}, the trace holds {recorded_label!r} "
                "-- the target answered differently from the recorded run"
            )
        self.used += 1
        return value

    def finish(self) -> None:
        if self.used != len(self.draws) and not self.failed_here:
            raise TraceMismatch(f"{self.where}: {len(self.draws) - self.used} recorded values were not asked for")


def recorded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Put under ``@rule``: the rule's name, arguments and draws go to the
    machine's trace, and the body runs guarded (``CheckingMachine.guarded``:
    an exception the target raises is noted as the run's failure)."""

    takes_data = "data" in inspect.signature(fn).parameters  # rules with internal draws

    @functools.wraps(fn)
    def rule_body(self: Any, **kwargs: Any) -> Any:
        self.trace.begin(fn.__name__, {k: v for k, v in kwargs.items() if k != "data"})
        if takes_data:
            kwargs["data"] = RecordingData(kwargs["data"], self.trace.steps[-1])
        with self.guarded():
            return fn(self, **kwargs)

    return rule_body


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, for lines a person reads."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
