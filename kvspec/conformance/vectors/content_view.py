"""Content-view vectors (spec chapter 10): cases of the rules stated over
an engine's content view, each with the verdict the spec's predicates give.

A case is one view after an operation -- the usable blocks, the free
blocks, each running request's table, the hold counts, the index's content
keys -- with the requests (tenant and tokens), what was written into each
block, and, for an admission, the view before it and its hit.  Its
``expect`` is the set of rules the spec's predicates find broken
(:func:`kvspec.spec.engines.check_view` and
:func:`kvspec.spec.engines.admission`); a port of chapter 10 must find the
same.  ``kvspec vectors generate`` writes them as ``content-view.jsonl``
(one case per line) beside the corpus, and ``kvspec vectors check``
replays them against the spec's predicates.  The format: docs/VECTORS.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvspec.spec import engines
from kvspec.spec.engines import CacheView, GroupedView, content_key

FILE = "content-view.jsonl"

A, B_ = "adapter-a", None  # two tenants


def _view(blocks: int, free: set[int], tables: dict[str, tuple], holds: dict[int, int],
          cached: dict[int, tuple], block_size: int = 2) -> CacheView:
    return CacheView(frozenset(range(1, blocks + 1)), block_size, frozenset(free), tables, holds, cached)


def _key(tenant: Any, tokens: list[int], end: int) -> tuple:
    return content_key(tenant, tokens, end)


P = [1, 2, 3, 4, 5]  # a prompt: blocks of 2 hold (1,2), (3,4), and 5 partly
Q = [1, 2, 3, 4, 6]  # shares P's two full blocks
R = [1, 2, 9, 9]  # shares P's first block only


def _base() -> dict[str, Any]:
    """r0 runs P in blocks 1, 2, 3; blocks 1 and 2 are cached; 4..6 free."""
    requests = {"r0": (None, P)}
    written = {1: _key(None, P, 2), 2: _key(None, P, 4), 3: _key(None, P, 5)}
    view = _view(6, {4, 5, 6}, {"r0": (1, 2, 3)}, {1: 1, 2: 1, 3: 1}, {1: written[1], 2: written[2]})
    return {"view": view, "requests": requests, "written": written}


def _replace(case: dict[str, Any], **fields: Any) -> dict[str, Any]:
    view: CacheView = case["view"]
    values = {name: getattr(view, name) for name in ("blocks", "block_size", "free", "tables", "holds", "cached")}
    values.update(fields)
    return {**case, "view": CacheView(**values)}


def _admitted(tokens: list[int], tenant: Any, hit: int, table: tuple, *, holds: dict[int, int],
              free: set[int], cap: int | None = None, window: int | None = None) -> dict[str, Any]:
    """``r1`` (``tokens``, ``tenant``) admitted beside the base's r0 with ``hit`` and ``table``."""
    case = _base()
    before = case["view"]
    written = dict(case["written"])
    for i, b in enumerate(table):
        if b is not None and i >= (hit or 0) // 2 and i * 2 < len(tokens):
            written[b] = _key(tenant, tokens, min((i + 1) * 2, len(tokens)))
    after = CacheView(before.blocks, 2, frozenset(free), {**before.tables, "r1": table}, holds, before.cached)
    return {"view": after, "requests": {**case["requests"], "r1": (tenant, tokens)}, "written": written,
            "admission": {"before": before, "request": "r1", "tenant": tenant, "tokens": tokens, "hit": hit,
                          "engine_cap": cap, "window": window}}


def _unserved_hit() -> dict[str, Any]:
    """``Q`` admitted with a hit of one block (2 tokens) in block 4, which holds ``Q``'s first block but
    which the index does not serve (blocks 1 and 2 serve ``Q``'s first 4 tokens)."""
    case = _admitted(Q, None, 2, (4, 5, 6), holds={1: 1, 2: 1, 3: 1, 4: 1, 5: 1, 6: 1}, free=set())
    return {**case, "written": {**case["written"], 4: _key(None, Q, 2)}}


# A hybrid model (chapter 10, "Several groups per request"): a full-attention group, blocks 1..6, and a
# sliding-window group of 2 tokens, blocks 11..16, one slot per token in each.  r0 runs P.
SWA_WINDOW = 2


def _grouped(full: CacheView, swa: CacheView, window: int = SWA_WINDOW) -> GroupedView:
    return GroupedView({"full": full, "swa": swa}, {"full": None, "swa": window})


def _grouped_base(swa_cached: tuple[int, ...] = (11, 12)) -> dict[str, Any]:
    """r0 runs P: full (1, 2, 3); the window's group holds only the block its next token reads, 13 (11 and
    12 were released from its row, and stay in its index where ``swa_cached`` says)."""
    written = {1: _key(None, P, 2), 2: _key(None, P, 4), 3: _key(None, P, 5),
               11: _key(None, P, 2), 12: _key(None, P, 4), 13: _key(None, P, 5)}
    full = _view(6, {4, 5, 6}, {"r0": (1, 2, 3)}, {1: 1, 2: 1, 3: 1}, {1: written[1], 2: written[2]})
    swa = CacheView(frozenset(range(11, 17)), 2, frozenset({14, 15, 16} | {11, 12} - set(swa_cached)),
                    {"r0": (None, None, 13)}, {13: 1}, {b: written[b] for b in swa_cached})
    return {"view": _grouped(full, swa), "requests": {"r0": (None, P)}, "written": written}


def _grouped_admitted(hit: int, full_row: tuple, swa_row: tuple, *, swa_cached: tuple[int, ...] = (11, 12),
                      swa_written: dict[int, tuple] | None = None) -> dict[str, Any]:
    """``Q`` admitted as r1 beside r0 with ``hit`` and a row in each group; fresh blocks written with Q."""
    case = _grouped_base(swa_cached)
    before: GroupedView = case["view"]
    written = dict(case["written"])
    for row in (full_row, swa_row):
        for i, b in enumerate(row):
            if b is not None and i >= hit // 2:
                written[b] = _key(None, Q, min((i + 1) * 2, len(Q)))
    written.update(swa_written or {})
    views = {}
    for name, row in (("full", full_row), ("swa", swa_row)):
        group = before.groups[name]
        holds = dict(group.holds)
        for b in row:
            if b is not None:
                holds[b] = holds.get(b, 0) + 1
        free = group.free - {b for b in row if b is not None}
        views[name] = CacheView(group.blocks, 2, free, {**group.tables, "r1": row}, holds, group.cached)
    return {"view": _grouped(views["full"], views["swa"]), "requests": {"r0": (None, P), "r1": (None, Q)},
            "written": written, "admission": {"before": before, "request": "r1", "tenant": None, "tokens": Q,
                                              "hit": hit, "engine_cap": None, "window": None}}


CASES: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
    "sound": ("one request, its full blocks cached: nothing is broken", _base),
    "hit-sound": ("a second request hits the two cached blocks and takes a fresh one",
                  lambda: _admitted(Q, None, 4, (1, 2, 4), holds={1: 2, 2: 2, 3: 1, 4: 1}, free={5, 6})),
    "lock-kept": ("a finished request's hold is still counted (ref-conservation)",
                  lambda: _replace({**_base(), "requests": {}}, tables={}, holds={1: 1, 2: 1},
                                   free=frozenset({3, 4, 5, 6}))),
    "block-lost": ("a block neither free, held nor cached (free-queue-consistency)",
                   lambda: _replace(_base(), free=frozenset({4, 5}))),
    "free-and-held": ("a block handed out while still free (free-queue-consistency)",
                      lambda: _replace(_base(), free=frozenset({3, 4, 5, 6}))),
    "index-names-other-content": ("a cached block served as content it does not hold (hash-map-consistency)",
                                  lambda: _replace(_base(), cached={1: _key(None, P, 2), 2: _key(None, R, 4)})),
    "partial-block-cached": ("a partly written block in the index (hash-map-consistency)",
                             lambda: _replace(_base(), cached={1: _key(None, P, 2), 2: _key(None, P, 4),
                                                               3: _key(None, P, 5)})),
    "computed-overwritten": ("a running request's block rewritten with another's tokens (content-soundness)",
                             lambda: {**_base(), "written": {**_base()["written"], 2: _key(None, R, 4)},
                                      "view": _replace(_base(), cached={1: _key(None, P, 2)})["view"]}),
    "tenants-share": ("another tenant given the base tenant's blocks (tenant-isolation, hit-soundness)",
                      lambda: _admitted(Q, A, 4, (1, 2, 4), holds={1: 2, 2: 2, 3: 1, 4: 1}, free={5, 6})),
    "aliased-positions": ("two blocks in use given again, at other positions (no-aliasing, no-eviction-in-use; "
                          "the rewrite breaks what the index and r0 read)",
                          lambda: _admitted([3, 4, 1, 2, 7], None, 0, (2, 1, 4),
                                            holds={1: 2, 2: 2, 3: 1, 4: 1}, free={5, 6})),
    "hit-whole-prompt": ("a hit of the whole prompt: nothing left to compute (hit-soundness)",
                         lambda: _admitted([1, 2, 3, 4], None, 4, (1, 2), holds={1: 2, 2: 2, 3: 1},
                                           free={4, 5, 6})),
    "hit-unaligned": ("a hit that ends inside a block (hit-soundness)",
                      lambda: _admitted(Q, None, 3, (1, 2, 4), holds={1: 2, 2: 2, 3: 1, 4: 1}, free={5, 6})),
    "fresh-block-in-use": ("a block another request holds, given as fresh for other content "
                           "(no-eviction-in-use, no-aliasing)",
                           lambda: _admitted([7, 8, 9], None, 0, (3, 4), holds={1: 1, 2: 1, 3: 2, 4: 1},
                                             free={5, 6})),
    "identical-block-merged": ("a prompt of exactly one cached block (no hit: a token must be computed) given "
                               "the indexed copy of it: allowed",
                               lambda: _admitted([1, 2], None, 0, (1,), holds={1: 2, 2: 1, 3: 1}, free={4, 5, 6})),
    "hit-shorter-than-served": ("a hit of one block where the index served two (hit-optimality)",
                                lambda: _admitted(Q, None, 2, (1, 4, 5), holds={1: 2, 2: 1, 3: 1, 4: 1, 5: 1},
                                                  free={6})),
    "engine-cap": ("a hit cut at the engine's own cap of 2 tokens: sound and optimal under the cap",
                   lambda: _admitted(Q, None, 2, (1, 4, 5), holds={1: 2, 2: 1, 3: 1, 4: 1, 5: 1}, free={6},
                                     cap=2)),
    "refused-but-holds": ("an admission refused (no hit) whose request holds blocks (allocation-accounting)",
                          lambda: _admitted([7, 8, 9], None, None, (4, 5), holds={1: 1, 2: 1, 3: 1, 4: 1, 5: 1},
                                            free={6})),
    "window-released": ("with a window of 2, the block before it released: allowed",
                        lambda: _replace({**_base(), "window": 2}, tables={"r0": (None, 2, 3)},
                                         holds={2: 1, 3: 1}, free=frozenset({4, 5, 6}))),
    "window-read-released": ("with a window of 4, a block still read released (content-soundness)",
                             lambda: _replace({**_base(), "window": 4}, tables={"r0": (None, None, 3)},
                                              holds={3: 1}, free=frozenset({2, 4, 5, 6}),
                                              cached={1: _key(None, P, 2)})),
    "hit-unsound-and-short": ("a hit of one whole block, within the cap, that the index did not serve (the block "
                              "holds the right tokens but is not cached) where the index served two: an unsound "
                              "hit is still judged for optimality (hit-soundness, hit-optimality)",
                              _unserved_hit),
    "hit-unaligned-few-slots": ("a hit that ends inside a block, admitted with slots for 4 of its 5 tokens: a hit "
                                "that is not a length is hit-soundness alone of the admission, not "
                                "allocation-accounting (the view's own rules judge the token with no slot)",
                                lambda: _admitted(Q, None, 3, (1, 2), holds={1: 2, 2: 2, 3: 1}, free={4, 5, 6})),
    "few-slots-one-in-use": ("no hit, slots for 2 of 3 tokens, one of them a block r0 holds: too few slots is "
                             "allocation-accounting and nothing else of the admission, not no-eviction-in-use "
                             "(the view's own rules still judge the shared block)",
                             lambda: _admitted([7, 8, 9], None, 0, (3,), holds={1: 1, 2: 1, 3: 2}, free={4, 5, 6})),
    "grouped-sound": ("a hybrid model: a full-attention group and a window of 2 tokens, the window's row "
                      "released before the block its next token reads: allowed", _grouped_base),
    "grouped-window-read-released": ("the same row under a window of 4 tokens, which still reads block 12: "
                                     "released while read (content-soundness, in the window's group)",
                                     lambda: {**_grouped_base(), "view": _grouped(
                                         *_grouped_base()["view"].groups.values(), window=4)}),
    "grouped-hit-sound": ("Q hits 4 tokens: the full group's two blocks, and the one block the window's group "
                          "reads for the next token",
                          lambda: _grouped_admitted(4, (1, 2, 4), (None, 12, 14))),
    "grouped-hit-short": ("Q hits 2 tokens where every group served 4 (hit-optimality)",
                          lambda: _grouped_admitted(2, (1, 4, 5), (11, 14, 15))),
    "grouped-hit-unsound-in-one-group": ("Q hits 4 tokens, the window's group giving a block it did not serve, "
                                         "written with other content (hit-soundness, in that group)",
                                         lambda: _grouped_admitted(4, (1, 2, 4), (None, 14, 15),
                                                                   swa_written={14: _key(None, R, 4)})),
    "grouped-hit-past-a-tombstone": ("the window's group lost Q's first block (a tombstone) but serves its "
                                     "second, all the next token reads: 4 tokens are served though 2 are "
                                     "not, and a hit of none is short (hit-optimality; what is served is not "
                                     "monotone in the length)",
                                     lambda: _grouped_admitted(0, (4, 5, 6), (14, 15, 16), swa_cached=(12,))),
}


def verdict(case: dict[str, Any]) -> list[str]:
    """The rules the spec's predicates find broken in ``case``."""
    requests = {r: (t, list(tokens)) for r, (t, tokens) in case["requests"].items()}
    window = case.get("window")
    found = {v.rule for v in engines.check_view(case["view"], requests, case["written"], window)}
    if (adm := case.get("admission")) is not None:
        found |= {v.rule for v in engines.admission(adm["before"], case["view"], adm["request"], adm["tenant"],
                                                     adm["tokens"], adm["hit"], case["written"],
                                                     adm["engine_cap"], adm["window"])}
    return sorted(found)


# --- JSON --------------------------------------------------------------------------------------


def _key_json(key: tuple) -> dict[str, Any]:
    return {"tenant": key[0], "tokens": list(key[1])}


def _view_json(view: CacheView | GroupedView) -> dict[str, Any]:
    if isinstance(view, GroupedView):  # several groups per request: each group's view, and its window
        return {"groups": {name: _view_json(group) for name, group in view.groups.items()},
                "windows": dict(view.windows)}
    return {"blocks": sorted(view.blocks), "block_size": view.block_size, "free": sorted(view.free),
            "tables": {r: list(t) for r, t in sorted(view.tables.items())},
            "holds": {str(b): n for b, n in sorted(view.holds.items())},
            "cached": {str(b): _key_json(k) for b, k in sorted(view.cached.items())}}


def _view_of(doc: dict[str, Any]) -> CacheView | GroupedView:
    if "groups" in doc:
        return GroupedView({name: _view_of(group) for name, group in doc["groups"].items()}, doc["windows"])
    return CacheView(frozenset(doc["blocks"]), doc["block_size"], frozenset(doc["free"]),
                     {r: tuple(t) for r, t in doc["tables"].items()}, {int(b): n for b, n in doc["holds"].items()},
                     {int(b): (k["tenant"], tuple(k["tokens"])) for b, k in doc["cached"].items()})


def to_json(name: str, description: str, case: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": name, "description": description, "window": case.get("window"),
        "view": _view_json(case["view"]),
        "requests": {r: {"tenant": t, "tokens": list(tokens)} for r, (t, tokens) in sorted(case["requests"].items())},
        "written": {str(b): _key_json(k) for b, k in sorted(case["written"].items())},
        "admission": None, "expect": verdict(case)}
    if (adm := case.get("admission")) is not None:
        out["admission"] = {"before": _view_json(adm["before"]), "request": adm["request"], "tenant": adm["tenant"],
                            "tokens": list(adm["tokens"]), "hit": adm["hit"], "engine_cap": adm["engine_cap"],
                            "window": adm["window"]}
    return out


def from_json(doc: dict[str, Any]) -> dict[str, Any]:
    case: dict[str, Any] = {
        "view": _view_of(doc["view"]), "window": doc.get("window"),
        "requests": {r: (v["tenant"], list(v["tokens"])) for r, v in doc["requests"].items()},
        "written": {int(b): (k["tenant"], tuple(k["tokens"])) for b, k in doc["written"].items()}}
    if (adm := doc.get("admission")) is not None:
        case["admission"] = {**adm, "before": _view_of(adm["before"])}
    return case


def generate(out: Path) -> Path:
    """Write every case, with the spec's verdict, to ``out/content-view.jsonl``."""
    path = out / FILE
    lines = [json.dumps(to_json(name, what, build()), sort_keys=True) for name, (what, build) in CASES.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def check(path: Path) -> list[str]:
    """Replay the cases in ``path`` against the spec's predicates: the
    differences (a case whose verdict is not its ``expect``)."""
    problems = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        doc = json.loads(line)
        got = verdict(from_json(doc))
        if got != doc["expect"]:
            problems.append(f"{path.name}:{n} ({doc['name']}): the spec finds {got or 'nothing'} broken, "
                            f"the case expects {doc['expect'] or 'nothing'}")
    return problems
