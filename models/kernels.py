"""Kernels that consume block tables, and the references they are checked against.

An attention kernel gets, for one KV-cache group and one step, the queries
of every scheduled token, each request's context length and block-table row,
and the paged K/V caches; it must return what dense attention over the
request's own keys and values returns.  The references:

- :func:`dense_attention` -- fp32 softmax attention over contiguous K/V with
  the group's mask (causal, sliding window, chunk, or none for cross
  attention), GQA and attention sinks: the oracle every kernel is held to;
- :func:`reference_attention` -- gathers each request's K/V from the paged
  cache through its block-table row (:func:`gather`) and runs
  :func:`dense_attention`: what the tables say the kernel should read.

The kernels: :func:`flex_attention_paged` (``torch.nn.attention.flex_attention``
over the whole physical cache, masked through an inverse block table --
the way vLLM's FlexAttention backend pages), :func:`vllm_unified_attention`
(vLLM's production Triton kernel; on CPU under Triton's interpreter),
:func:`vllm_mla_decode` (MLA over a latent cache, whose reference is the
same attention with the latent's first values as V), and
:func:`selective_state_update` -- a Mamba-2 recurrent step with the interface
of vLLM's ``selective_state_update`` (state blocks named by
``state_batch_indices`` / ``dst_state_batch_indices``).

Masks in tokens: a query at position ``p`` sees keys ``[lo(p), p]`` where
``lo`` is ``p - window + 1`` for a sliding window, ``p // chunk * chunk`` for
chunked local attention, 0 otherwise; cross attention sees every encoder key.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from kvspec.kv_cache_interface import cdiv

NULL_BLOCK = 0


@dataclass
class AttentionBatch:
    """One attention group's work in one step (requests in batch order)."""

    query: torch.Tensor  # [tokens, heads, head_size]
    query_start: list[int]  # cumulative query lengths, len = requests + 1
    seq_lens: list[int]  # keys each request attends over after this step (encoder length for cross)
    block_table: torch.Tensor  # [requests, width] int32, kernel block ids
    key_cache: torch.Tensor  # [num_kernel_blocks, block_size, kv_heads, head_size]
    value_cache: torch.Tensor  # same shape (for MLA: the latent part of key_cache)
    block_size: int
    scale: float
    window: int | None = None
    chunk: int | None = None
    causal: bool = True
    sinks: torch.Tensor | None = None  # [heads], one logit per head

    @property
    def num_requests(self) -> int:
        return len(self.seq_lens)

    def query_positions(self, r: int) -> torch.Tensor:
        qlen = self.query_start[r + 1] - self.query_start[r]
        return torch.arange(self.seq_lens[r] - qlen, self.seq_lens[r]) if self.causal else torch.zeros(qlen).long()

    def lowest_key(self, positions: torch.Tensor) -> torch.Tensor:
        """The first key each query position sees."""
        if not self.causal:
            return torch.zeros_like(positions)
        if self.window is not None:
            return (positions - self.window + 1).clamp(min=0)
        if self.chunk is not None:
            return positions // self.chunk * self.chunk
        return torch.zeros_like(positions)


# --- references -----------------------------------------------------------------------------------------------


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                    *, scale: float, lowest: torch.Tensor | None, causal: bool = True,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax attention in fp32: ``q`` [n, H, D], ``k`` [m, Hkv, D], ``v``
    [m, Hkv, Dv]; query ``i`` sees key ``j`` when ``lowest[i] <= k_pos[j] <=
    q_pos[i]`` (causal) or always (not causal).  Runs where ``k`` is;
    returns [n, H, Dv] on the CPU."""
    device = k.device
    q, v, q_pos, k_pos = q.to(device), v.to(device), q_pos.to(device), k_pos.to(device)
    lowest = lowest.to(device) if lowest is not None else None
    sinks = sinks.to(device) if sinks is not None else None
    heads, kv_heads = q.shape[1], k.shape[1]
    k = k.float().repeat_interleave(heads // kv_heads, dim=1)
    v = v.float().repeat_interleave(heads // kv_heads, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    if causal:
        visible = (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] >= lowest[:, None])
        scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        sink = sinks.float()[:, None, None].expand(heads, scores.shape[1], 1)
        probs = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]
    else:
        probs = scores.softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, v).cpu()


def slots(block_row: torch.Tensor, positions: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(kernel block, offset) of each position through one block-table row."""
    return block_row[positions // block_size].long(), positions % block_size


def gather(cache: torch.Tensor, block_row: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """The cache rows of ``positions`` through ``block_row``: [n, ...]."""
    blocks, offsets = slots(block_row, positions.to(block_row.device), block_size)
    return cache[blocks, offsets]


def key_positions(batch: AttentionBatch, r: int) -> torch.Tensor:
    """The key positions request ``r``'s queries see, together."""
    q_pos = batch.query_positions(r)
    if not batch.causal:
        return torch.arange(batch.seq_lens[r])
    return torch.arange(int(batch.lowest_key(q_pos).min()), batch.seq_lens[r])


def reference_attention(batch: AttentionBatch) -> torch.Tensor:
    """Each request's K/V gathered through its block-table row, then
    :func:`dense_attention` (fp32)."""
    out = []
    for r in range(batch.num_requests):
        q = batch.query[batch.query_start[r]:batch.query_start[r + 1]]
        q_pos, k_pos = batch.query_positions(r), key_positions(batch, r)
        row = batch.block_table[r]
        k, v = gather(batch.key_cache, row, k_pos, batch.block_size), gather(batch.value_cache, row, k_pos,
                                                                               batch.block_size)
        out.append(dense_attention(q, k, v, q_pos, k_pos, scale=batch.scale, lowest=batch.lowest_key(q_pos),
                                   causal=batch.causal, sinks=batch.sinks))
    return torch.cat(out) if out else batch.query.new_zeros(0, *batch.query.shape[1:]).float()


# --- flex_attention ------------------------------------------------------------------------------------------------

FLEX_POISON = 1.0e4
"""flex_attention computes scores for masked slots too (and multiplies their
values by 0): a NaN there would spread, so it reads NaN as this finite value."""


def used_blocks(batch: AttentionBatch) -> torch.Tensor:
    """The physical blocks the batch's rows name for its context (sorted)."""
    rows = [batch.block_table[r, : cdiv(batch.seq_lens[r], batch.block_size)].long().cpu()
            for r in range(batch.num_requests)]
    ids = torch.unique(torch.cat(rows)) if rows else torch.zeros(0, dtype=torch.long)
    return ids[ids != NULL_BLOCK]


def inverse_block_table(batch: AttentionBatch, blocks: torch.Tensor) -> torch.Tensor:
    """``inv[r, j]``: the logical block index of physical block ``blocks[j]``
    in request ``r``'s row, -1 where the row does not hold it (later
    positions win: an earlier one is a block released out of the window)."""
    index = {int(b): j for j, b in enumerate(blocks.tolist())}
    inv = torch.full((batch.num_requests, len(index)), -1, dtype=torch.long)
    for r in range(batch.num_requests):
        row = batch.block_table[r].long().cpu().tolist()
        for i in range(cdiv(batch.seq_lens[r], batch.block_size)):
            if row[i] != NULL_BLOCK:
                inv[r, index[row[i]]] = i
    return inv


def flex_attention_paged(batch: AttentionBatch) -> torch.Tensor:
    """See :func:`prepare_flex_attention_paged`: the same, run once, on the host."""
    return prepare_flex_attention_paged(batch)().cpu()


def prepare_flex_attention_paged(batch: AttentionBatch, compiled: bool = False) -> Callable[[], torch.Tensor]:
    """``torch.nn.attention.flex_attention`` with the physical cache as the
    key sequence and a block mask built from the tables: query ``i`` of
    request ``r`` sees slot ``s`` when the block of ``s`` sits in ``r``'s
    row at a position the mask allows (vLLM's FlexAttention backend pages
    this way).  Eager flex_attention computes every (query, slot) score, so
    the key sequence is the blocks the batch's rows name, not the whole pool.
    The gather and the mask are built here; the call that is returned runs
    the attention and nothing else (``compiled``: through ``torch.compile``,
    as on a GPU)."""
    from torch.nn.attention.flex_attention import flex_attention

    attend = torch.compile(flex_attention) if compiled else flex_attention

    blocks = used_blocks(batch)
    bs = batch.block_size
    idx = blocks.to(batch.key_cache.device)
    keys = torch.nan_to_num(batch.key_cache[idx].float(), nan=FLEX_POISON).flatten(0, 1)
    values = torch.nan_to_num(batch.value_cache[idx].float(), nan=FLEX_POISON).flatten(0, 1)
    req_of = torch.repeat_interleave(torch.arange(batch.num_requests),
                                     torch.tensor([batch.query_start[r + 1] - batch.query_start[r]
                                                   for r in range(batch.num_requests)]))
    q_pos = torch.cat([batch.query_positions(r) for r in range(batch.num_requests)])
    lowest = batch.lowest_key(q_pos)
    inv = inverse_block_table(batch, blocks)
    seq_lens = torch.tensor(batch.seq_lens)
    causal = batch.causal

    device = keys.device
    req_of, inv, seq_lens = req_of.to(device), inv.to(device), seq_lens.to(device)
    q_pos, lowest = q_pos.to(device), lowest.to(device)
    # Which (query, slot) pairs the tables allow, all at once (eager flex would evaluate a
    # mask function per element through vmap, which costs more than the attention here).
    kv_idx = torch.arange(keys.shape[0], device=device)
    logical = inv[req_of][:, kv_idx // bs]  # [tokens, slots]
    pos = logical * bs + kv_idx % bs
    allowed = (logical >= 0) & (pos < seq_lens[req_of][:, None])
    if causal:
        allowed &= (pos <= q_pos[:, None]) & (pos >= lowest[:, None])

    def mask_mod(b, h, q_idx, kv_idx):
        return allowed[q_idx, kv_idx]

    mask = block_mask_from_dense(allowed, mask_mod)
    q = batch.query.float().to(device).transpose(0, 1)[None]
    k, v = keys.transpose(0, 1)[None], values.transpose(0, 1)[None]
    sinks = None if batch.sinks is None else batch.sinks.float().to(device)

    def run() -> torch.Tensor:
        with warnings.catch_warnings():  # eager by default: on a CPU, compiling buys nothing here
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            out, lse = _flex_with_lse(attend, q, k, v, mask, batch.scale, q.shape[1] != k.shape[1])
        out, lse = out[0].transpose(0, 1), lse[0].transpose(0, 1)  # [tokens, heads, D], [tokens, heads]
        if sinks is not None:  # a sink is one more key with no value: rescale by Z / (Z + e^sink)
            out = out * torch.sigmoid(lse - sinks[None, :])[..., None]
        return out

    return run


def block_mask_from_dense(allowed: torch.Tensor, mask_mod, block: int = 128) -> Any:
    """A flex_attention ``BlockMask`` from a dense [queries, keys] boolean
    mask: tiles with no allowed pair are skipped, tiles with every pair
    allowed need no mask, the rest ask ``mask_mod``."""
    from torch.nn.attention.flex_attention import BlockMask

    rows, cols = allowed.shape
    padded = torch.nn.functional.pad(allowed, (0, -cols % block, 0, -rows % block))
    tiles = padded.view(padded.shape[0] // block, block, padded.shape[1] // block, block)
    some, every = tiles.any(dim=3).any(dim=1), tiles.all(dim=3).all(dim=1)
    partial = some & ~every

    def as_indices(which: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        counts = which.sum(-1).int()
        order = torch.argsort((~which).int(), dim=-1, stable=True).int()  # the chosen tiles first
        return counts[None, None], order[None, None]

    num, idx = as_indices(partial)
    full_num, full_idx = as_indices(every)
    return BlockMask.from_kv_blocks(num, idx, full_num, full_idx, BLOCK_SIZE=block, mask_mod=mask_mod,
                                   seq_lengths=(rows, cols))


def _flex_with_lse(flex_attention, q, k, v, mask, scale, gqa):
    """flex_attention's output and log-sum-exp (``return_aux`` where this
    torch has it, ``return_lse`` before).  Off the GPU it runs its eager
    reference directly: through torch.compile's "eager" wrapper, every new
    shape would be traced again (the switch is the one torch documents for
    debugging; it matters only for backward passes, which this never takes)."""
    import torch.nn.attention.flex_attention as flex_module

    if q.is_cuda:  # the fused Triton kernel: eager flex would materialise every score
        return _flex_call(_compiled_flex(), q, k, v, mask, scale, gqa)
    direct = q.device.type == "cpu" and hasattr(flex_module, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG")
    saved = getattr(flex_module, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", False)
    if direct:
        flex_module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    try:
        return _flex_call(flex_attention, q, k, v, mask, scale, gqa)
    finally:
        if direct:
            flex_module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = saved


_COMPILED_FLEX: list = []


def _compiled_flex():
    if not _COMPILED_FLEX:
        from torch.nn.attention.flex_attention import flex_attention

        _COMPILED_FLEX.append(torch.compile(flex_attention, dynamic=True))
    return _COMPILED_FLEX[0]


def _flex_call(flex_attention, q, k, v, mask, scale, gqa):
    try:
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:
        return flex_attention(q, k, v, block_mask=mask, scale=scale, enable_gqa=gqa, return_lse=True)
    out, aux = flex_attention(q, k, v, block_mask=mask, scale=scale, enable_gqa=gqa, return_aux=AuxRequest(lse=True))
    return out, aux.lse


# --- Triton ------------------------------------------------------------------------------------


def triton_cannot_run() -> str | None:
    """Why Triton kernels cannot run here (Triton being importable), or None:
    there is a GPU, or Triton's interpreter was chosen before Triton was
    imported."""
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return "no GPU, and TRITON_INTERPRET=1 was not set before Triton was imported"
    return None


def chunks_as_requests(batch: AttentionBatch) -> AttentionBatch:
    """Chunked local attention as vLLM runs it: every (request, chunk) with
    queries becomes a request of its own whose keys are that chunk and whose
    block-table row starts at the chunk's first block (``make_local_attention_virtual_batches``)."""
    chunk, bs = batch.chunk, batch.block_size
    if chunk % bs:
        raise ValueError(f"chunk {chunk} is not a multiple of the kernel block size {bs}")
    starts, lens, rows, pieces = [0], [], [], []
    for r in range(batch.num_requests):
        q_pos = batch.query_positions(r)
        first = batch.query_start[r]
        for c in sorted(set((q_pos // chunk).tolist())):
            in_chunk = (q_pos // chunk) == c
            idx = torch.nonzero(in_chunk).flatten()
            pieces.append(batch.query[first + idx])
            starts.append(starts[-1] + len(idx))
            lens.append(int(q_pos[idx].max()) + 1 - c * chunk)
            row = batch.block_table[r, c * chunk // bs:]
            rows.append(torch.nn.functional.pad(row, (0, batch.block_table.shape[1] - row.shape[0])))
    return replace(batch, query=torch.cat(pieces), query_start=starts, seq_lens=lens,
                   block_table=torch.stack(rows), chunk=None)


# --- Mamba ------------------------------------------------------------------------------------------------------


def selective_state_update(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                           B: torch.Tensor, C: torch.Tensor, D: torch.Tensor, dt_bias: torch.Tensor,
                           z: torch.Tensor | None = None, dt_softplus: bool = False, *,
                           state_batch_indices: torch.Tensor, dst_state_batch_indices: torch.Tensor,
                           null_block_id: int = NULL_BLOCK) -> torch.Tensor:
    """One Mamba-2 step for a batch, in torch, with the interface of vLLM's
    ``selective_state_update``: ``state`` [blocks, heads, dim, dstate] is
    the paged state cache; request ``i`` reads ``state[state_batch_indices[i]]``
    and writes ``state[dst_state_batch_indices[i]]``; entries equal to
    ``null_block_id`` are padding (skipped, output 0).  ``x``, ``dt``, ``z``
    [batch, heads, dim]; ``A`` [heads, dim, dstate]; ``B``, ``C`` [batch,
    groups, dstate]; ``D``, ``dt_bias`` [heads, dim].  Returns [batch,
    heads, dim]."""
    heads, groups = x.shape[1], B.shape[1]
    live = state_batch_indices != null_block_id
    out = torch.zeros_like(x, dtype=torch.float32)
    if not bool(live.any()):
        return out
    src, dst = state_batch_indices[live].long(), dst_state_batch_indices[live].long()
    dt_ = dt[live].float() + dt_bias.float()
    if dt_softplus:
        dt_ = torch.nn.functional.softplus(dt_)
    dA = torch.exp(A.float()[None] * dt_[..., None])
    Bh = B[live].float().repeat_interleave(heads // groups, dim=1)
    Ch = C[live].float().repeat_interleave(heads // groups, dim=1)
    xs = x[live].float()
    new = state[src].float() * dA + (Bh[:, :, None, :] * dt_[..., None]) * xs[..., None]
    y = (new * Ch[:, :, None, :]).sum(-1) + xs * D.float()
    if z is not None:
        y = y * torch.nn.functional.silu(z[live].float())
    state[dst] = new.to(state.dtype)
    out[live] = y
    return out


def scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor,
         dt_bias: torch.Tensor, *, dt_softplus: bool = True) -> torch.Tensor:
    """The Mamba-2 layer over one sequence from a zero state, no cache at all
    (the ground truth): [tokens, heads, dim] outputs."""
    return scan_from(None, x, dt, A, B, C, D, dt_bias, dt_softplus=dt_softplus)[0]


def scan_from(state: torch.Tensor | None, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
              C: torch.Tensor, D: torch.Tensor, dt_bias: torch.Tensor, *,
              dt_softplus: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`scan` continued from ``state`` [heads, dim, dstate] (``None``:
    zero): the outputs, and the state after the last token.  Token by token,
    the same operations as a scan from the start, so continuing a scan from
    its own state gives bitwise what one scan over the whole sequence gives."""
    heads, dim, dstate = x.shape[1], x.shape[2], B.shape[-1]
    states = torch.zeros(2, heads, dim, dstate)
    if state is not None:
        states[1] = state
    idx = torch.tensor([1])
    outs = [selective_state_update(states, x[t:t + 1], dt[t:t + 1], A, B[t:t + 1], C[t:t + 1], D, dt_bias,
                                   dt_softplus=dt_softplus, state_batch_indices=idx, dst_state_batch_indices=idx)
            for t in range(x.shape[0])]
    return (torch.cat(outs) if outs else x.new_zeros(0, heads, dim)), states[1].clone()


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) of a kernel against the fp32 reference."""
    return {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 1e-3), torch.bfloat16: (2e-2, 1.6e-2)}[dtype]


def close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
    atol, rtol = tolerance(dtype)
    return bool(torch.allclose(a.float(), b.float(), atol=atol, rtol=rtol))


def max_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0
