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
import textwrap
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
    first = f.message.splitlines()[0] if f.message else ""
    for frame in f.frames:
        mark = " <- " + (first if len(first) <= 80 else first[:79] + "...") if frame.step == f.failed_at else ""
        lines.append(f"{frame.step:>5} {frame.rule[:16]:<16} {''.join(map(paint, frame.cells))}{mark}")
    if f.blamed:
        lines.append(" " * 23 + "".join("^" if b in f.blamed else " " for b in range(width)))
    if f.failed_at is not None and (len(first) > 80 or len(f.message.splitlines()) > 1):
        # the whole message, the spec's (or the upstream's) half included, which the mark cuts off
        lines += textwrap.wrap(f"step {f.failed_at}: {first}", WRAP) + f.message.splitlines()[1:]
    lines.append(LEGEND)
    return lines


def _ansi(cell: str) -> str:
    code = {"N": "90", ".": "37", "c": "34"}.get(cell, "33")
    return f"\x1b[{code}m{cell}\x1b[0m"


COLOURS = {"N": "#6c757d", ".": "#e9ecef", "c": "#8ecae6"}
HELD = ["#ffd6a5", "#ffb870", "#fb8500", "#d45d00", "#9c4400"]
KEY = (("N", "null"), (".", "free"), ("c", "free, cached"), ("1", "held by 1 slot"), ("3", "by 3"),
       ("+", "by more than 9"))
CHAR_WIDTH = {10: 6.1, 12: 7.3}  # px per character of the monospace font at each size used (generous)
WRAP = 100  # characters per line of the failure message


def _fill(c: str) -> str:
    return COLOURS.get(c) or HELD[min(int(c) if c.isdigit() else 5, 5) - 1]


def _ink(c: str) -> str:
    """A glyph's colour: white on the two darkest fills, else black."""
    return "#ffffff" if _fill(c) in (HELD[3], HELD[4], COLOURS["N"]) else "#000000"


def svg(f: Film, title: str, cell: int = 14) -> str:
    """The film as an SVG picture: blocks across, steps down, each cell its
    colour and its glyph (readable without colour), the failure's message
    wrapped under it and a legend of swatches; sized to fit all of it."""
    width = len(f.frames[0].cells) if f.frames else 0
    left, top = 130, 40
    message = [] if f.failed_at is None else \
        textwrap.wrap(f"step {f.failed_at}: {f.message.splitlines()[0] if f.message else ''}", WRAP)
    legend_y = top + len(f.frames) * cell + 16 + 14 * len(message) + 6
    key_width = sum(cell + 6 + len(label) * CHAR_WIDTH[10] + 14 for _, label in KEY)
    w = int(max(left + width * cell + 10, 8 + len(title) * CHAR_WIDTH[12],
                8 + max((len(line) for line in message), default=0) * CHAR_WIDTH[10], 8 + key_width)) + 4
    h = legend_y + cell + 10
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="monospace" '
           f'font-size="10">', f'<text x="4" y="14" font-size="12">{escape(title)}</text>']
    for b in range(width):
        if b % 5 == 0:
            out.append(f'<text x="{left + b * cell}" y="{top - 6}">{b}</text>')
    for row, frame in enumerate(f.frames):
        y = top + row * cell
        out.append(f'<text x="4" y="{y + cell - 3}">{frame.step} {escape(frame.rule[:14])}</text>')
        for b, c in enumerate(frame.cells):
            blamed = frame.step == f.failed_at and b in f.blamed
            out.append(_cell(left + b * cell, y, cell, c, f"block {b}: {c}", blamed))
        if frame.step == f.failed_at:
            out.append(f'<rect x="{left - 2}" y="{y - 1}" width="{width * cell + 2}" height="{cell + 1}" '
                       'fill="none" stroke="#d00000" stroke-width="1.5"/>')
    y = top + len(f.frames) * cell + 16
    for i, line in enumerate(message):
        out.append(f'<text x="4" y="{y + 14 * i}" fill="#d00000">{escape(line)}</text>')
    x = 4.0
    for c, label in KEY:
        out.append(_cell(x, legend_y, cell, c, label, False))
        out.append(f'<text x="{x + cell + 4:.0f}" y="{legend_y + cell - 3}">{escape(label)}</text>')
        x += cell + 6 + len(label) * CHAR_WIDTH[10] + 14
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _cell(x: float, y: float, cell: int, c: str, tip: str, blamed: bool) -> str:
    """One block: its fill, its glyph and a tooltip; a red frame where the failure names it."""
    stroke = ' stroke="#d00000" stroke-width="2"' if blamed else ""
    return (f'<rect x="{x:.0f}" y="{y}" width="{cell - 1}" height="{cell - 1}" fill="{_fill(c)}"{stroke}>'
            f'<title>{escape(tip)}</title></rect><text x="{x + (cell - 1) / 2:.1f}" y="{y + cell - 4}" '
            f'text-anchor="middle" font-size="9" fill="{_ink(c)}">{escape(c)}</text>')
