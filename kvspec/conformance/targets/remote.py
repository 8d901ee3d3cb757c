"""A target that runs in another Python process: the other side of a lockstep.

Two releases of one package cannot share a process -- a fork of vLLM and
the upstream release it forked from both answer to ``import vllm``.  So the
second one runs in a child process of its own interpreter and environment,
and this module makes it look local: :class:`RemoteFactory` is a target
factory like any other (the machines call it with a layout's arguments),
and what it returns, a :class:`RemoteTarget`, forwards every operation to
the child and gives back the child's result or refusal.

The protocol is pickled messages on the child's stdin and stdout, one
request and one answer at a time: ``build`` (a scope, the factory's
arguments: a handle back), ``call`` (a handle, an operation, its
arguments: the result, or the exception raised), and ``hello`` (what the
child runs).  The child's own prints and logs go to its stderr, so nothing
but answers travel on stdout.

Requests are the one argument with an identity: a manager adapter mirrors
each request object it is given once, and the scheduler's machine moves that
object on (tokens appended, tokens computed) between calls.  A request is
therefore shipped as its fields under a token; the child keeps one object
per token and updates its fields in place.  Handles and tokens whose parent
objects are gone are dropped with the next message.

A child that dies, or answers nonsense, is kvspec's harness failing, never
the target's: it raises :class:`HarnessFault` (the run stops with exit 2 and
one line).  A call interrupted half-way (the budget ran out while the child
worked) leaves the stream out of step, so the child is stopped and the next
build starts a fresh one.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from kvspec.errors import HarnessFault
from kvspec.request import Request

_LENGTH = struct.Struct("!Q")
REFUSALS = (TypeError, ValueError, AssertionError, KeyError, IndexError, RuntimeError)
"""Exception kinds a child's error is rebuilt as when it cannot be pickled
(the first the error is an instance of; lockstep compares kinds)."""


@dataclass(frozen=True)
class Interpreter:
    """Where the child runs: an interpreter, directories put first on its
    ``PYTHONPATH`` and the module it runs (``python -m module``), which
    serves :func:`serve`; ``label`` names it in reports."""

    python: str
    module: str
    path: tuple[str, ...] = ()
    label: str = ""
    env: tuple[tuple[str, str], ...] = field(default=())

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.env)
        if self.path:
            env["PYTHONPATH"] = os.pathsep.join([*self.path, *filter(None, [os.environ.get("PYTHONPATH")])])
        return env


def _write(stream: BinaryIO, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def _read(stream: BinaryIO) -> Any:
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError("the other side closed the stream")
    size = _LENGTH.unpack(head)[0]
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the other side closed the stream mid-message")
    return pickle.loads(data)


# --- the parent's side -------------------------------------------------------------------------


class Child:
    """One child process serving targets; started on first use, in this
    process (a forked worker starts its own: a pipe is never shared)."""

    def __init__(self, interpreter: Interpreter):
        self.interpreter = interpreter
        self._process: subprocess.Popen | None = None
        self._pid = 0  # the process that started the child
        self._lock = threading.Lock()
        self._stderr: list[bytes] = []
        self.dropped: list[tuple[str, int]] = []  # handles and tokens whose parent objects are gone
        self.tokens: weakref.WeakKeyDictionary[Request, int] = weakref.WeakKeyDictionary()
        self._next = 0
        self.hello: dict[str, Any] = {}
        self.generation = 0  # how many child processes this one has started: a handle lives in one
        self.last_fault = ""  # why the last child was stopped (a later call on its targets says so)

    def start(self) -> subprocess.Popen:
        """The child process, started here if this process has none running."""
        if self.running():
            return self._process
        interpreter = self.interpreter
        try:
            process = subprocess.Popen([interpreter.python, "-m", interpreter.module], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       env=interpreter.environment())
        except OSError as error:
            raise HarnessFault(f"cannot start {interpreter.label or interpreter.python}: {error}") from None
        self._process, self._pid, self._stderr = process, os.getpid(), []
        self.generation += 1
        self.tokens = weakref.WeakKeyDictionary()
        self.dropped = []
        threading.Thread(target=self._drain, args=(process,), daemon=True).start()
        self.hello = self.request(("hello",))
        return process

    def _drain(self, process: subprocess.Popen) -> None:
        """Keep the child's stderr (its logs) from filling the pipe; the
        last of it explains a child that died."""
        for line in process.stderr:
            self._stderr.append(line)
            del self._stderr[:-40]

    def running(self) -> bool:
        """Whether this process's child is up."""
        return self._process is not None and self._pid == os.getpid() and self._process.poll() is None

    def drop(self, kind: str, key: int) -> None:
        """Forget a handle or token (its parent object is gone), with the next message."""
        self.dropped.append((kind, key))

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and self._pid == os.getpid():
            process.kill()
            process.wait()

    def request(self, message: tuple[Any, ...]) -> Any:
        """Send one message and return the child's answer (``("ok", value)``)
        or raise what it raised (``("raised", error)``)."""
        process = self.start() if message[0] != "hello" else self._process
        with self._lock:
            dropped, self.dropped = self.dropped, []
            done = False
            try:
                _write(process.stdin, (dropped, message))
                kind, value = _read(process.stdout)
                done = True
            except (OSError, EOFError, pickle.UnpicklingError) as error:
                self.stop()
                tail = b"".join(self._stderr).decode(errors="replace").strip().splitlines()[-3:]
                self.last_fault = (f"{self.interpreter.label or 'the other target'} stopped answering "
                                   f"({type(error).__name__}: {error})" + (f": {' / '.join(tail)}" if tail else ""))
                raise HarnessFault(self.last_fault) from None
            finally:
                if not done:  # interrupted mid-call: the stream is out of step
                    self.last_fault = self.last_fault or "a call to the other side was interrupted"
                    self.stop()
        if kind == "raised":
            raise value
        if kind == "broken":  # the child's own harness failed
            raise HarnessFault(f"{self.interpreter.label or 'the other target'}: {value}")
        return value

    def ship(self, value: Any) -> Any:
        """An argument as it travels: a request as its token and fields."""
        if not isinstance(value, Request):
            return value
        token = self.tokens.get(value)
        if token is None:
            token = self.tokens[value] = self._next = self._next + 1
            weakref.finalize(value, self.drop, "request", token)
        fields = dict(value.__dict__)
        fields["_block_hasher"] = None  # the parent's hasher; the child's adapter hashes for itself
        return _Shipped(token, fields)


@dataclass(frozen=True)
class _Shipped:
    token: int
    fields: dict[str, Any]


class RemoteTarget:
    """A target living in a :class:`Child`: every attribute is an operation
    forwarded to it."""

    def __init__(self, child: Child, handle: int):
        self._child, self._handle, self._generation = child, handle, child.generation
        weakref.finalize(self, child.drop, "target", handle)

    def __getattr__(self, op: str) -> Callable[..., Any]:
        if op.startswith("_"):
            raise AttributeError(op)

        def forward(*args: Any, **kwargs: Any) -> Any:
            return self._send("call", op, args, kwargs)

        forward.__name__ = op
        return forward

    def outcome(self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> tuple[Any, ...]:
        """``op``'s whole outcome in one round trip, as lockstep reads it:
        the result (or ``None``), the refusal (or ``None``), the snapshot
        after it and the events it emitted."""
        return self._send("outcome", op, args, kwargs or {})

    def _send(self, kind: str, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        child = self._child
        if self._generation != child.generation or not child.running():  # its process is gone: never a new one's
            raise HarnessFault(child.last_fault or "the other side's process is gone")
        return child.request((kind, self._handle, op, tuple(map(child.ship, args)),
                              {k: child.ship(v) for k, v in kwargs.items()}))


class RemoteFactory:
    """A target factory whose targets run in a child process: called with a
    layout's arguments, it has the child build ``scope``'s target."""

    def __init__(self, child: Child, scope: str):
        self.child, self.scope = child, scope

    def __call__(self, *args: Any, **kwargs: Any) -> RemoteTarget:
        return RemoteTarget(self.child, self.child.request(("build", self.scope, args, kwargs)))


# --- the child's side --------------------------------------------------------------------------


def serve(build: Callable[[str, Sequence[Any], dict[str, Any]], Any], hello: Callable[[], dict[str, Any]]) -> None:
    """Answer requests on stdin until it closes: ``build(scope, args,
    kwargs)`` makes a target; ``hello()`` says what this child runs.
    Everything printed goes to stderr: stdout carries answers only."""
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    requests_in = sys.stdin.buffer
    targets: dict[int, Any] = {}
    requests: dict[int, Request] = {}
    built = 0

    def unship(value: Any) -> Any:
        if not isinstance(value, _Shipped):
            return value
        known = requests.get(value.token)
        if known is None:
            known = requests[value.token] = Request.__new__(Request)
        known.__dict__.update(value.fields)
        return known

    def invoke(handle: int, op: str, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        return getattr(targets[handle], op)(*map(unship, args), **{k: unship(v) for k, v in kwargs.items()})

    while True:
        try:
            dropped, message = _read(requests_in)
        except EOFError:
            return
        for kind, key in dropped:
            (targets if kind == "target" else requests).pop(key, None)
        if message[0] in ("call", "outcome") and message[1] not in targets:
            _write(answers, ("broken", f"no target {message[1]} here (was this child restarted?)"))
            continue
        try:
            if message[0] == "hello":
                answer = ("ok", hello())
            elif message[0] == "build":
                _, scope, args, kwargs = message
                built += 1
                targets[built] = build(scope, args, kwargs)
                answer = ("ok", built)
            elif message[0] == "call":
                answer = ("ok", invoke(*message[1:]))
            else:  # "outcome": the call, whatever it raised, then the snapshot and the events
                target, result, error = targets[message[1]], None, None
                try:
                    result = invoke(*message[1:])
                except Exception as raised:
                    error = travelling(raised)
                answer = ("ok", (result, error, target.snapshot(), target.take_events()))
        except Exception as error:
            answer = ("raised", travelling(error))
        except BaseException as error:  # SystemExit, KeyboardInterrupt: the child's harness, not the target
            answer = ("broken", f"{type(error).__name__}: {error}")
        try:
            _write(answers, answer)
        except (pickle.PicklingError, TypeError, AttributeError) as unpicklable:
            _write(answers, ("broken", f"an answer that cannot travel: {unpicklable}"))


def travelling(error: Exception) -> Exception:
    """An error as it can travel to a parent that may lack its module: a
    built-in exception as it is, any other as the first built-in kind it
    is (:data:`REFUSALS`; lockstep compares kinds), its class named in the
    message."""
    if type(error).__module__ == "builtins":
        try:
            pickle.dumps(error)
            return error
        except Exception:  # an argument that cannot be pickled
            pass
    kind = next((k for k in REFUSALS if isinstance(error, k)), RuntimeError)
    return kind(f"{type(error).__name__}: {error}")
