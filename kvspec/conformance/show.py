"""Pictures of a trace: every block of the pool at every step.

``kvspec show TRACE.json`` replays a saved trace and draws the pool after
each step -- blocks across, steps down -- as text on a terminal and, with
``--svg FILE``, as an SVG picture.  Each cell is one block:

- ``.`` free, no key (grey);
- ``c`` free and cached: a hit can take it back (blue);
- ``1``-``9`` (``+`` above 9) held, by that many slots (orange, darker with more);
- ``N`` the null block.

The step where a rule broke (or the target left the spec) is marked, and
so are the blocks its message names.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from html import escape
from typing import Any

from kvspec.conformance.runner import replay, resolve_target
from kvspec.conformance.trace import Trace
from kvspec.spec.interface import NULL_BLOCK_ID, ManagerSnapshot, PoolSnapshot


@dataclass
class Frame:
    """The pool after one step of the trace."""

    step: int
    rule: str
    cells: str  # one character per block (see the module docstring)


@dataclass
class Film:
    """A trace as frames, and where (and on which blocks) it broke."""

    frames: list[Frame] = field(default_factory=list)
    failed_at: int | None = None
    message: str = ""
    blamed: set[int] = field(default_factory=set)


def cells(snap: PoolSnapshot | ManagerSnapshot) -> str:
    pool = snap.pool if isinstance(snap, ManagerSnapshot) else snap
    free = set(pool.free)
    out = []
    for b in range(pool.num_blocks):
        if b == NULL_BLOCK_ID:
            out.append("N")
        elif b in free:
            out.append("c" if b in pool.key_of else ".")
        else:
            ref = pool.ref[b]
            out.append(str(ref) if 0 < ref <= 9 else "+" if ref > 9 else "?")
    return "".join(out)


def film(trace: Trace, target: str, level: str) -> Film:
    """Replay ``trace`` against ``target`` and keep the pool after each step."""
    built: list[Any] = []
    factory = resolve_target(target, trace.scope)

    def recording(*args: Any) -> Any:
        built.append(factory(*args))
        return built[-1]

    out = Film()

    def on_step(i: int, step: Any) -> None:
        out.frames.append(Frame(i, step.rule, cells(built[-1].snapshot())))

    outcome = replay(trace, recording, level, on_step=on_step)
    if not outcome.conforms:
        out.failed_at, out.message = outcome.diverged_at, outcome.message
        out.blamed = {int(b) for b in re.findall(r"block (\d+)", outcome.message)}
        if built and (not out.frames or out.frames[-1].step != outcome.diverged_at):
            at = outcome.diverged_at or 0
            rule = trace.steps[at - 1].rule if 0 < at <= len(trace.steps) else "?"
            out.frames.append(Frame(at, rule, cells(built[-1].snapshot())))
    return out


LEGEND = "N null  . free  c free, cached  1-9 held by that many slots"


def text(f: Film, color: bool = False) -> list[str]:
    """The film as terminal lines (ANSI colours with ``color``)."""
    paint: Callable[[str], str] = _ansi if color else (lambda s: s)
    width = len(f.frames[0].cells) if f.frames else 0
    ruler = "".join(str(b % 10) for b in range(width))
    lines = [f"{'step':>5} {'':<16} {ruler}"]
    for frame in f.frames:
        mark = " <- " + f.message.splitlines()[0][:80] if frame.step == f.failed_at else ""
        lines.append(f"{frame.step:>5} {frame.rule[:16]:<16} {''.join(map(paint, frame.cells))}{mark}")
    if f.blamed:
        lines.append(" " * 23 + "".join("^" if b in f.blamed else " " for b in range(width)))
    lines.append(LEGEND)
    return lines


def _ansi(cell: str) -> str:
    code = {"N": "90", ".": "37", "c": "34"}.get(cell, "33")
    return f"\x1b[{code}m{cell}\x1b[0m"


COLOURS = {"N": "#6c757d", ".": "#e9ecef", "c": "#8ecae6"}
HELD = ["#ffd6a5", "#ffb870", "#fb8500", "#d45d00", "#9c4400"]


def svg(f: Film, title: str, cell: int = 14) -> str:
    """The film as an SVG picture: blocks across, steps down."""
    width = len(f.frames[0].cells) if f.frames else 0
    left, top = 130, 40
    w, h = left + width * cell + 10, top + len(f.frames) * cell + 60
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="monospace" '
           f'font-size="10">', f'<text x="4" y="14" font-size="12">{escape(title)}</text>']
    for b in range(width):
        if b % 5 == 0:
            out.append(f'<text x="{left + b * cell}" y="{top - 6}">{b}</text>')
    for row, frame in enumerate(f.frames):
        y = top + row * cell
        out.append(f'<text x="4" y="{y + cell - 3}">{frame.step} {escape(frame.rule[:14])}</text>')
        for b, c in enumerate(frame.cells):
            fill = COLOURS.get(c) or HELD[min(int(c) if c.isdigit() else 5, 5) - 1]
            stroke = ' stroke="#d00000" stroke-width="2"' if frame.step == f.failed_at and b in f.blamed else ""
            out.append(f'<rect x="{left + b * cell}" y="{y}" width="{cell - 1}" height="{cell - 1}" '
                       f'fill="{fill}"{stroke}><title>block {b}: {c}</title></rect>')
        if frame.step == f.failed_at:
            out.append(f'<rect x="{left - 2}" y="{y - 1}" width="{width * cell + 2}" height="{cell + 1}" '
                       'fill="none" stroke="#d00000" stroke-width="1.5"/>')
    y = top + len(f.frames) * cell + 16
    if f.failed_at is not None:
        out.append(f'<text x="4" y="{y}" fill="#d00000">step {f.failed_at}: '
                   f'{escape(f.message.splitlines()[0][:120])}</text>')
    out.append(f'<text x="4" y="{y + 16}">{escape(LEGEND)} (darker: more)</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
