"""vLLM's production kernels over kvspec's :class:`~kvspec.models.kernels.AttentionBatch`:
``unified_attention`` (Triton; on CPU under Triton's interpreter), the
Triton MLA decode kernel (``decode_attention_fwd``) and the Mamba-2
``selective_state_update`` (a GPU: it does not run under the interpreter).
Each takes what kvspec's own kernels take (:mod:`kvspec.models.kernels`)
and is held to the same references.  vLLM is imported inside the
functions."""

from __future__ import annotations

from collections.abc import Callable

import torch

from kvspec.models.kernels import NULL_BLOCK, AttentionBatch, chunks_as_requests, triton_cannot_run


def vllm_kernels_available() -> str | None:
    """None when vLLM's Triton kernels can run here, else why not."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    problem = triton_cannot_run()
    if problem is not None:
        return problem
    try:
        from vllm.v1.attention.ops.triton_unified_attention import unified_attention  # noqa: F401
    except Exception as error:  # ImportError, or vLLM's Triton probe refusing
        return f"vLLM's Triton attention does not import ({type(error).__name__}: {error})"
    return None


def vllm_unified_attention(batch: AttentionBatch) -> torch.Tensor:
    """vLLM 0.25.1's ``unified_attention`` (Triton) over the batch."""
    if batch.chunk is not None:  # the pieces keep every request's queries in order
        return vllm_unified_attention(chunks_as_requests(batch))
    return prepare_vllm_unified_attention(batch)().float().cpu()


def prepare_vllm_unified_attention(batch: AttentionBatch) -> Callable[[], torch.Tensor]:
    """vLLM's ``unified_attention`` over ``batch`` with every input already
    on the cache's device and the output allocated: the call that is
    returned runs the kernel and nothing else (what a benchmark times)."""
    from vllm.v1.attention.backends.triton_attn import MIN_LAUNCH_GRID_SIZE_2D, NUM_PAR_SOFTMAX_SEGMENTS
    from vllm.v1.attention.ops.triton_unified_attention import unified_attention

    device = batch.key_cache.device
    q = batch.query.to(device=device, dtype=batch.key_cache.dtype).contiguous()
    out = torch.empty_like(q)
    # The segmented-softmax buffers vLLM's Triton backend allocates: with them, a decode-only batch of at
    # most `threshold` sequences takes the kernel's 3D (parallel segments) path, as in production.
    threshold = MIN_LAUNCH_GRID_SIZE_2D // batch.key_cache.shape[2]
    heads, padded = q.shape[1], 1 << (q.shape[2] - 1).bit_length()
    segments = dict(
        seq_threshold_3D=threshold, num_par_softmax_segments=NUM_PAR_SOFTMAX_SEGMENTS,
        softmax_segm_output=torch.empty(threshold, heads, NUM_PAR_SOFTMAX_SEGMENTS, padded, dtype=torch.float32,
                                        device=device),
        softmax_segm_max=torch.empty(threshold, heads, NUM_PAR_SOFTMAX_SEGMENTS, dtype=torch.float32, device=device),
        softmax_segm_expsum=torch.empty(threshold, heads, NUM_PAR_SOFTMAX_SEGMENTS, dtype=torch.float32,
                                        device=device))
    qlens = [batch.query_start[r + 1] - batch.query_start[r] for r in range(batch.num_requests)]
    window = (batch.window - 1, 0) if batch.window is not None else (-1, -1)
    arguments = dict(
        q=q, k=batch.key_cache, v=batch.value_cache, out=out,
        cu_seqlens_q=torch.tensor(batch.query_start, dtype=torch.int32, device=device),
        max_seqlen_q=max(qlens), seqused_k=torch.tensor(batch.seq_lens, dtype=torch.int32, device=device),
        max_seqlen_k=max(batch.seq_lens), softmax_scale=batch.scale, causal=batch.causal, window_size=window,
        block_table=batch.block_table.to(device), softcap=0, q_descale=None, k_descale=None, v_descale=None,
        sinks=None if batch.sinks is None else batch.sinks.to(device=device, dtype=torch.float32), **segments,
    )

    def run() -> torch.Tensor:
        unified_attention(**arguments)
        return out

    return run


def vllm_mla_decode(batch: AttentionBatch, latent: int) -> torch.Tensor:
    """vLLM's Triton MLA decode kernel (``decode_attention_fwd``); every
    request must have exactly one query."""
    from vllm.v1.attention.ops.triton_decode_attention import decode_attention_fwd

    requests = batch.num_requests
    if batch.query.shape[0] != requests:
        raise ValueError("the MLA decode kernel takes one query per request")
    device = batch.key_cache.device
    heads, width = batch.query.shape[1], batch.key_cache.shape[-1]
    q = batch.query.to(device=device, dtype=batch.key_cache.dtype).contiguous()
    o = torch.zeros(requests, heads, latent, dtype=q.dtype, device=device)
    lse = torch.zeros(requests, heads, dtype=q.dtype, device=device)
    splits = 2
    logits = torch.empty(requests, heads, splits, latent + 1, dtype=torch.float32, device=device)
    cache = batch.key_cache  # [blocks, block_size, 1, latent + rope]
    decode_attention_fwd(q, cache, cache[..., :latent], o, lse, batch.block_table.to(device),
                         torch.tensor(batch.seq_lens, dtype=torch.int32, device=device), logits, splits,
                         batch.scale, batch.block_size, is_mla=True)
    assert width == q.shape[-1]
    return o.float().cpu()


def vllm_selective_state_update(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                                B: torch.Tensor, C: torch.Tensor, D: torch.Tensor, dt_bias: torch.Tensor,
                                z: torch.Tensor | None = None, dt_softplus: bool = False, *,
                                state_batch_indices: torch.Tensor, dst_state_batch_indices: torch.Tensor,
                                null_block_id: int = NULL_BLOCK) -> torch.Tensor:
    """vLLM's Triton ``selective_state_update`` (a GPU: it does not run under
    Triton's interpreter)."""
    from vllm.model_executor.layers.mamba.ops.mamba_ssm import selective_state_update as kernel

    out = torch.empty_like(x)
    kernel(state, x, dt, A, B, C, D, dt_bias, z=z, dt_softplus=dt_softplus,
           state_batch_indices=state_batch_indices.int(), dst_state_batch_indices=dst_state_batch_indices.int(),
           null_block_id=null_block_id, out=out)
    return out.float()
