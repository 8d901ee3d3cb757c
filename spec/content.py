"""What a block holds: the content model behind the content rules.

A block's hash names a content -- the tokens of the whole prefix and the
extra keys (see :mod:`kvspec.hashing`).  The rules must know what the block
*actually* holds to say whether a hit is sound.  The caller, playing the
model runner, records every write in a :class:`Shadow`; this module states
what each write leaves where:

- an attention group holds one token's KV per slot: token ``t`` lands in slot
  ``t % B`` of the block at position ``t // B`` of the request's table; its
  content (:func:`token_content`) is the tenant, every token up to ``t`` and
  the other inputs given by then;
- a Mamba group holds one recurrent state per block
  (:func:`mamba_token_positions`, :func:`mamba_states_written`,
  :func:`state_content`);
- a window forgets: :func:`window_start` and :func:`out_of_window` say which
  table positions a request never reads again.

:func:`key_for` names the key block ``i`` of a request must carry in group
``g``.  Nothing here inspects a manager: these are facts about requests and
layouts, and the Shadow's record of writes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from kvspec.hashing import block_hashes_for_size, make_block_hash_with_group_id, prompt_embeds_bytes
from kvspec.kv_cache_interface import AttentionKind, cdiv
from kvspec.spec.interface import NULL_BLOCK_ID
from kvspec.spec.layout import GroupView, Layout

NULL = NULL_BLOCK_ID
ATTENTION_KINDS = (AttentionKind.FULL_ATTENTION, AttentionKind.RSWA, AttentionKind.SLIDING_WINDOW,
                   AttentionKind.CHUNKED_LOCAL_ATTENTION)


def blocks_to_save(table: Sequence[int], kind: str, block_size: int, num_computed_tokens: int) -> list[int]:
    """What a KV connector saves of one group's table once a request has
    computed ``num_computed_tokens`` tokens (chapter 7): for an attention
    kind the first ``cdiv(n, B)`` blocks -- the blocks of those tokens, no
    more (positions out of the window stay null) --; for cross attention
    and Mamba the whole table."""
    if kind not in ATTENTION_KINDS:
        return list(table)
    return list(table[:cdiv(num_computed_tokens, block_size)])


def hashes_for(request: Any, layout: Layout, g: int):
    """The request's block hashes at group ``g``'s block size."""
    return block_hashes_for_size(request.block_hashes, layout.hash_block_size, layout.views[g].block_size)


def key_for(request: Any, layout: Layout, g: int, i: int) -> bytes | None:
    """The key block ``i`` of ``request`` carries once cached in group ``g``
    (``None``: the request has no hash that far)."""
    hashes = hashes_for(request, layout, g)
    return make_block_hash_with_group_id(hashes[i], g) if i < len(hashes) else None


def partial_keys_for(request: Any, layout: Layout, g: int, i: int) -> frozenset[bytes]:
    """The keys of the prefixes of ``request`` that end at a hash-block
    boundary strictly inside block ``i`` of group ``g``: the partial entries
    that block may carry (chapter 1, ``cache_partial_block``)."""
    hbs, size = layout.hash_block_size, layout.views[g].block_size
    return frozenset(make_block_hash_with_group_id(request.block_hashes[k - 1], g)
                     for k in range(i * size // hbs + 1, min((i + 1) * size // hbs, len(request.block_hashes) + 1)))


def tenant(request: Any) -> tuple[Any, Any]:
    """Who may share a request's blocks: its cache salt and LoRA adapter."""
    lora = getattr(request, "lora_request", None)
    return getattr(request, "cache_salt", None), (lora.lora_name if lora else None)


def inputs_before(request: Any, end: int) -> tuple[Any, ...]:
    """The inputs besides token ids that tokens ``[0, end)`` were computed
    from: multimodal inputs starting by then, and the prompt's embeddings
    (when the prompt came as embeddings, its token ids are placeholders)."""
    mm = tuple((f.identifier, f.mm_position.offset)
               for f in getattr(request, "mm_features", None) or () if f.mm_position.offset < end)
    embeds = getattr(request, "prompt_embeds", None)
    if embeds is None:
        return mm
    return mm + (("prompt embeds", hashlib.sha256(prompt_embeds_bytes(embeds, 0, end)).hexdigest()),)


def token_content(request: Any, t: int) -> tuple[Any, ...]:
    """What the KV of token ``t`` of ``request`` depends on: the tenant, every
    token up to ``t`` and the other inputs given by then."""
    return tenant(request), tuple(request.all_token_ids[: t + 1]), inputs_before(request, t + 1)


def state_content(request: Any, n: int) -> tuple[Any, ...]:
    """What a recurrent state after ``n`` tokens depends on."""
    return tenant(request), tuple(request.all_token_ids[:n]), inputs_before(request, n)


def mamba_token_positions(group: GroupView, start: int, end: int) -> list[int]:
    """Where a Mamba group's step over tokens ``[start, end)`` keeps the
    running state after each token: token ``t`` leaves the state after
    ``t + 1`` tokens at position ``cdiv(t + 1, B) - 1`` of the request's
    table -- so the state at every block boundary stays behind in that
    boundary's block -- except in align mode, where every token of the step
    writes the one block of the step's final state, ``cdiv(end, B) - 1``.
    The step reads its initial state from position ``cdiv(start, B) - 1``
    (none when ``start`` is 0)."""
    bs = group.block_size
    if group.mamba_cache_mode == "align":
        return [cdiv(end, bs) - 1] * (end - start)
    return [cdiv(t + 1, bs) - 1 for t in range(start, end)]


def mamba_states_written(group: GroupView, start: int, end: int) -> list[int]:
    """The states a Mamba step over ``[start, end)`` leaves in the request's
    blocks, as token counts ``n`` (the state after ``n`` tokens, at position
    ``cdiv(n, B) - 1``): the last one written to each position by
    :func:`mamba_token_positions`, plus, in align mode with speculative
    blocks, the boundary state the model runner copies (see :class:`Shadow`)."""
    last: dict[int, int] = {}
    for t, p in zip(range(start, end), mamba_token_positions(group, start, end), strict=True):
        last[p] = t + 1
    written = sorted(last.values())
    bs, spec = group.block_size, group.num_speculative_blocks
    if group.mamba_cache_mode == "align" and spec and end - start <= 1 + spec:
        boundary = end // bs * bs
        if start < boundary < end:
            written.insert(0, boundary)
    return written


class Shadow:
    """What every (group, block) holds, as the caller wrote it.

    Attention groups hold one token's KV per slot: writing tokens
    ``[start, end)`` of a request puts token ``t`` into slot ``t % B`` of the
    block at position ``t // B`` of its table.  Mamba groups hold one state per
    block: a step that computes ``[start, end)`` writes the state after
    ``end`` into the block at position ``cdiv(end, B) - 1`` (the running
    state) and, except in align mode, the state at every block boundary it
    crosses into the block at that position.  In align mode with ``s > 0``
    speculative blocks, a step of at most ``1 + s`` tokens is a speculative
    decode step (one token plus accepted drafts); when it crosses a block
    boundary without ending on it, vLLM's model runner copies the state at
    the last boundary crossed into that boundary's block
    (``postprocess_mamba`` in ``vllm/v1/worker/mamba_utils.py``), and so does
    the shadow.  (A longer step -- a prefill chunk -- writes only its final
    state: a chunk that does not end on a boundary leaves the boundary's
    block stale, which is why align mode needs block-aligned chunks.)  Null
    entries are not written.  Freeing a block does not erase it (that is
    what makes a cache hit possible); only new writes do.

    The shadow also knows *when*: writes belong to the scheduler step in
    which they were scheduled (:meth:`new_step` starts the next).  A state is
    the end of a scan over the step's tokens, so it exists only once that
    step's forward pass is over; an attention layer writes every token's KV
    before it reads any, so KV written in a step is readable within it.
    """

    def __init__(self, layout: Layout):
        self.layout = layout
        self.slots: dict[tuple[int, int], dict[int, tuple[Any, ...]]] = {}
        self.states: dict[tuple[int, int], tuple[Any, ...]] = {}
        self.step = 0
        self.state_step: dict[tuple[int, int], int] = {}  # the step that wrote each state
        self._contents: dict[tuple[str, int], tuple[Any, ...]] = {}

    def content(self, request: Any, t: int) -> tuple[Any, ...]:
        """:func:`token_content` of ``request``'s token ``t``, computed once:
        a request's tokens up to one it has never change, and the rules ask
        for every slot of every cached block after every operation.  (One
        object per content also makes comparing two contents cheap.)"""
        key = (request.request_id, t)
        content = self._contents.get(key)
        if content is None:
            content = token_content(request, t)
            if t < len(request.all_token_ids):  # a token not yet there may still come
                self._contents[key] = content
        return content

    def new_step(self) -> None:
        """A scheduler step begins: what earlier steps wrote is now readable."""
        self.step += 1

    def state_written_this_step(self, g: int, block_id: int) -> bool:
        """Whether the state in block ``block_id`` of group ``g`` is still
        being computed: written by the current step's forward pass."""
        return self.state_step.get((g, block_id)) == self.step

    def write(self, request: Any, tables: tuple[list[int], ...], start: int, end: int,
              kinds: tuple[str, ...] | None = None) -> None:
        """Record that ``request`` computed tokens ``[start, end)`` into its
        ``tables`` (one list per group, as the manager returned them); with
        ``kinds``, only into groups of those kinds."""
        for g, (group, table) in enumerate(zip(self.layout.views, tables, strict=True)):
            bs = group.block_size
            if group.kind == AttentionKind.CROSS_ATTENTION or (kinds is not None and group.kind not in kinds):
                continue
            if group.kind == AttentionKind.MAMBA:
                for n in mamba_states_written(group, start, end):
                    p = cdiv(n, bs) - 1
                    if p < len(table) and table[p] != NULL:
                        self.states[(g, table[p])] = state_content(request, n)
                        self.state_step[(g, table[p])] = self.step
                continue
            for t in range(start, end):
                p = t // bs
                if p < len(table) and table[p] != NULL:
                    self.slots.setdefault((g, table[p]), {})[t % bs] = self.content(request, t)

    def scribble(self, request: Any, tables: tuple[list[int], ...], start: int, end: int) -> None:
        """Record that attention slots of tokens ``[start, end)`` hold KV no
        position names (rejected draft tokens), until overwritten."""
        for g, (group, table) in enumerate(zip(self.layout.views, tables, strict=True)):
            if group.kind not in ATTENTION_KINDS:
                continue
            for t in range(start, end):
                p = t // group.block_size
                if p < len(table) and table[p] != NULL:
                    self.slots.setdefault((g, table[p]), {})[t % group.block_size] = (
                        tenant(request), ("rejected draft", request.request_id, t), ())

    def holds(self, g: int, block_id: int, request: Any, position: int) -> list[str]:
        """How block ``block_id`` of group ``g`` differs from what position
        ``position`` of ``request`` names (empty: it holds exactly that)."""
        group = self.layout.views[g]
        bs = group.block_size
        if group.kind == AttentionKind.MAMBA:
            want = state_content(request, (position + 1) * bs)
            have = self.states.get((g, block_id))
            return [] if have == want else [f"holds state {_short(have)}, position {position} names {_short(want)}"]
        slots = self.slots.get((g, block_id), {})
        for s in range(bs):
            want = self.content(request, position * bs + s)
            if slots.get(s) != want:
                return [f"slot {s} holds {_short(slots.get(s))}, position {position} names {_short(want)}"]
        return []

    def backs(self, g: int, table: tuple[int, ...], request: Any, n: int) -> list[str]:
        """How group ``g``'s ``table`` fails to hold what ``request``'s next
        step reads after ``n`` computed tokens (empty: it holds it all).
        Attention: the KV of every computed token the window still reads
        (every one, for full attention; R-SWA: the prompt and the window);
        Mamba: the state after ``n`` tokens at position ``cdiv(n, B) - 1``;
        cross attention: nothing (the encoder's output is not a prefix)."""
        group = self.layout.views[g]
        bs = group.block_size
        if n == 0 or group.kind == AttentionKind.CROSS_ATTENTION:
            return []
        if group.kind == AttentionKind.MAMBA:
            p = cdiv(n, bs) - 1
            have = self.states.get((g, table[p])) if p < len(table) and table[p] != NULL else None
            want = state_content(request, n)
            return [] if have == want else [f"position {p} holds state {_short(have)}, not the state after {n}"]
        gone = set(out_of_window(group, n, getattr(request, "num_prompt_tokens", None)))
        for t in range(n):
            p = t // bs
            if p in gone:
                continue
            block = table[p] if p < len(table) else NULL
            have = None if block == NULL else self.slots.get((g, block), {}).get(t % bs)
            if have != self.content(request, t):
                where = "no block" if block == NULL else f"block {block} slot {t % bs} holds {_short(have)}"
                return [f"token {t} (position {p}): {where}"]
        return []

    def writers(self, g: int, block_id: int) -> set[tuple[Any, Any]]:
        """The tenants whose writes the block holds."""
        if self.layout.views[g].kind == AttentionKind.MAMBA:
            state = self.states.get((g, block_id))
            return set() if state is None else {state[0]}
        return {content[0] for content in self.slots.get((g, block_id), {}).values()}


def _short(content: Any) -> str:
    if content is None:
        return "nothing"
    who, tokens, _ = content
    if tokens and tokens[0] == "rejected draft":
        return f"a rejected draft token of {tokens[1]}"
    return f"{who} tokens[:{len(tokens)}]=...{list(tokens[-4:])}"




# --- windows ------------------------------------------------------------------------------------


def out_of_window(group: GroupView, num_computed: int, num_prompt_tokens: int | None) -> range:
    """The table positions a request with ``num_computed`` tokens computed
    (and a prompt of ``num_prompt_tokens``) never reads again: those before
    :func:`window_start`, or for R-SWA (window ``w``) the gap between the
    prompt and the window, positions ``cdiv(P, B)`` up to ``max(P, n - w) // B``."""
    if group.kind != AttentionKind.RSWA:
        return range(window_start(group, num_computed))
    if num_prompt_tokens is None:
        return range(0)
    first_read = max(num_prompt_tokens, num_computed - group.rswa_window)
    return range(cdiv(num_prompt_tokens, group.block_size), first_read // group.block_size)


def window_start(group: GroupView, num_computed: int) -> int:
    """The first table position a request with ``num_computed`` tokens
    computed may still read; every block before it left the attention window:
    sliding window ``w``: tokens before ``num_computed - w + 1``; chunked
    local ``c``: the chunks before the one of token ``num_computed``; Mamba:
    all but the state after ``max(0, num_computed - h)`` tokens, ``h`` the
    tokens it holds back for drafts that may still be rejected
    (:func:`~kvspec.spec.layout.mamba_hold_back`); full and cross
    attention: none (R-SWA: see :func:`out_of_window`)."""
    if group.kind == AttentionKind.SLIDING_WINDOW:
        skipped = num_computed - group.sliding_window + 1
    elif group.kind == AttentionKind.CHUNKED_LOCAL_ATTENTION:
        skipped = num_computed // group.attention_chunk_size * group.attention_chunk_size
    elif group.kind == AttentionKind.MAMBA:
        skipped = max(0, num_computed - group.window_hold_back) - 1
    else:
        skipped = 0
    return max(0, skipped) // group.block_size



