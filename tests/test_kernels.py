"""Kernels over paged caches agree with dense attention, whatever the block
table, window, chunk, sinks or GQA; the Mamba step reads and writes the
blocks it is told."""

import pytest
import torch

from kvspec.models import kernels as K


def paged_batch(seed=0, *, block_size=4, num_blocks=40, kv_heads=2, heads=4, head=16, seq_lens=(20, 37),
                qlens=(5, 1), **options):
    gen = torch.Generator().manual_seed(seed)
    key = torch.randn(num_blocks, block_size, kv_heads, head, generator=gen)
    value = torch.randn(num_blocks, block_size, kv_heads, head, generator=gen)
    width = max(seq_lens) // block_size + 2
    table = torch.stack([torch.randperm(num_blocks - 1, generator=gen)[:width] + 1 for _ in seq_lens]).int()
    query = torch.randn(sum(qlens), heads, head, generator=gen)
    starts = [0]
    for q in qlens:
        starts.append(starts[-1] + q)
    return K.AttentionBatch(query, starts, list(seq_lens), table, key, value, block_size, head ** -0.5, **options)


def contiguous_reference(batch):
    """Dense attention over K/V copied out block by block (independent of gather())."""
    outs = []
    for r in range(batch.num_requests):
        blocks = batch.block_table[r].long()
        k = batch.key_cache[blocks].reshape(-1, *batch.key_cache.shape[2:])
        v = batch.value_cache[blocks].reshape(-1, *batch.value_cache.shape[2:])
        q_pos = batch.query_positions(r)
        k_pos = torch.arange(batch.seq_lens[r])
        outs.append(K.dense_attention(batch.query[batch.query_start[r]:batch.query_start[r + 1]],
                                      k[: batch.seq_lens[r]], v[: batch.seq_lens[r]], q_pos, k_pos,
                                      scale=batch.scale, lowest=batch.lowest_key(q_pos), causal=batch.causal,
                                      sinks=batch.sinks))
    return torch.cat(outs)


OPTIONS = {
    "full": {},
    "sliding window": {"window": 8},
    "window not block-aligned": {"window": 7},
    "chunked local": {"chunk": 8},
    "sinks": {"sinks": torch.tensor([0.5, -1.0, 2.0, 0.0])},
    "cross attention": {"causal": False},
}


@pytest.mark.parametrize("name", OPTIONS)
def test_reference_and_flex_agree_with_dense(name):
    batch = paged_batch(**OPTIONS[name])
    want = contiguous_reference(batch)
    assert torch.allclose(K.reference_attention(batch), want, atol=1e-5)
    assert K.close(K.flex_attention_paged(batch), want, torch.float32)


def test_flex_reads_poisoned_masked_slots_safely():
    """flex_attention computes masked slots too: NaN there must not spread."""
    batch = paged_batch(window=8)
    want = K.reference_attention(batch)
    used = set(batch.block_table[:, :10].flatten().tolist())
    for b in range(1, batch.key_cache.shape[0]):
        if b not in used:
            batch.key_cache[b] = float("nan")
            batch.value_cache[b] = float("nan")
    assert K.close(K.flex_attention_paged(batch), want, torch.float32)


def test_gather_reads_through_the_row():
    batch = paged_batch()
    row = batch.block_table[0]
    got = K.gather(batch.key_cache, row, torch.tensor([0, 5, 19]), 4)
    assert torch.equal(got[1], batch.key_cache[row[1], 1])


def test_chunks_as_requests():
    """vLLM runs chunked local attention as one request per chunk with queries."""
    batch = paged_batch(chunk=8, seq_lens=(20,), qlens=(6,))
    pieces = K.chunks_as_requests(batch)
    assert pieces.seq_lens == [8, 4] and pieces.query_start == [0, 2, 6]
    assert torch.equal(pieces.block_table[1, :2], batch.block_table[0, 4:6])
    assert torch.allclose(K.reference_attention(pieces), K.reference_attention(batch), atol=1e-6)


def test_mamba_step_reads_and_writes_the_named_blocks():
    torch.manual_seed(0)
    state = torch.randn(6, 2, 4, 3)
    before = state.clone()
    x, dt = torch.randn(2, 2, 4), torch.rand(2, 2, 4)
    A, D, bias = -torch.rand(2, 4, 3), torch.randn(2, 4), torch.zeros(2, 4)
    B, C = torch.randn(2, 1, 3), torch.randn(2, 1, 3)
    src, dst = torch.tensor([1, 0]), torch.tensor([4, 5])  # the second entry is padding
    out = K.selective_state_update(state, x, dt, A, B, C, D, bias, state_batch_indices=src,
                                   dst_state_batch_indices=dst)
    expected = before[1] * torch.exp(A * dt[0][..., None]) + (B[0, 0] * dt[0][..., None]) * x[0][..., None]
    assert torch.allclose(state[4], expected, atol=1e-6)
    assert torch.equal(state[5], before[5]) and torch.equal(state[1], before[1])
    assert torch.equal(out[1], torch.zeros(2, 4))


def test_scan_resumes_from_a_saved_state():
    """Scanning [0, n) in two pieces through a state block equals one scan."""
    torch.manual_seed(1)
    n, heads, dim, dstate = 7, 2, 4, 3
    x, dt = torch.randn(n, heads, dim), torch.randn(n, heads, dim)
    A, D, bias = -torch.rand(heads, dim, dstate), torch.randn(heads, dim), torch.zeros(heads, dim)
    B, C = torch.randn(n, 1, dstate), torch.randn(n, 1, dstate)
    whole = K.scan(x, dt, A, B, C, D, bias)
    state = torch.zeros(3, heads, dim, dstate)
    outs = []
    for t in range(n):
        src = torch.tensor([1 if t < 4 else 2])
        dst = torch.tensor([1 if t < 3 else 2])  # from token 4 on, the state lives in block 2
        outs.append(K.selective_state_update(state, x[t:t + 1], dt[t:t + 1], A, B[t:t + 1], C[t:t + 1], D, bias,
                                             dt_softplus=True, state_batch_indices=src, dst_state_batch_indices=dst))
    assert torch.allclose(torch.cat(outs), whole, atol=1e-6)


def test_tolerances():
    assert K.tolerance(torch.bfloat16) == (2e-2, 1.6e-2)
    assert K.close(torch.ones(3), torch.ones(3) + 5e-5, torch.float32)
    assert not K.close(torch.ones(3), torch.ones(3) + 1e-3, torch.float32)
