"""The design that makes batched and unbatched results bit-identical (see common/invariant.py)."""
import torch
from hypothesis import given, settings, strategies as st

from common.invariant import AttentionMetadata, Linear, attention, contiguous_key_index, key_tiles_len, pad_rows


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 70), st.integers(0, 69), st.sampled_from([torch.float32, torch.bfloat16]),
       st.sampled_from([(576, 1536), (1536, 576), (192, 576), (576, 960), (576, 3072), (576, 49152)]))
def test_linear_row_does_not_depend_on_batch(rows, pick, dtype, shape):
    gen = torch.Generator().manual_seed(rows * 100 + pick)
    w_t = torch.randn(shape, generator=gen).to(dtype)
    x = torch.randn(rows, shape[0], generator=gen).to(dtype)
    i = pick % rows
    linear = Linear(w_t.t())
    alone = linear(pad_rows(x[i:i + 1]))[0]
    batched = linear(pad_rows(x))[i]
    assert torch.equal(alone, batched)
    torch.testing.assert_close(batched.float(), (x[i].float() @ w_t.float()), rtol=2e-2, atol=2e-2)


def torch_attention(q, k, v, start):
    """Plain causal attention for one sequence: q [n, H, d] at positions start.., k/v [L, KV, d]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1).float(), v.repeat_interleave(group, 1).float()
    s = torch.einsum("qhd,khd->hqk", q.float(), k) / q.shape[-1] ** 0.5
    mask = torch.arange(k.shape[0])[None, :] > (start + torch.arange(q.shape[0]))[:, None]
    p = s.masked_fill(mask, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", p, v)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 90), st.integers(0, 150)), min_size=1, max_size=5),
       st.sampled_from([(6, 2), (9, 3), (4, 4)]))
def test_attention_is_exact_and_batch_invariant(seqs, heads):
    """Each sequence's output equals its output alone, bit for bit, and torch's within rounding."""
    nh, nkv = heads
    d, gen = 32, torch.Generator().manual_seed(len(seqs))
    qlens = [n for n, _ in seqs]
    ctx = [n + c for n, c in seqs]
    L = -(-max(ctx) // 64) * 64 + 64
    k = torch.randn(len(seqs), nkv, L, d, generator=gen).to(torch.bfloat16)
    v = torch.randn(len(seqs), nkv, L, d, generator=gen).to(torch.bfloat16)
    q = torch.randn(sum(qlens), nh, d, generator=gen).to(torch.bfloat16)

    def run(q, qlens, ctx, slots):
        index = contiguous_key_index(slots, nkv, L, key_tiles_len(ctx))
        return attention(q, k.view(-1, d), v.view(-1, d), AttentionMetadata.build(qlens, ctx, nh, nkv, index))

    out = run(q, qlens, ctx, list(range(len(seqs))))
    t0 = 0
    for s, (n, c) in enumerate(zip(qlens, ctx)):
        alone = run(q[t0:t0 + n], [n], [c], [s])
        assert torch.equal(out[t0:t0 + n], alone)
        expected = torch_attention(q[t0:t0 + n], k[s, :, :c].transpose(0, 1), v[s, :, :c].transpose(0, 1), c - n)
        torch.testing.assert_close(alone.float(), expected, rtol=2e-2, atol=2e-2)
        if n > 1:  # a chunk of the same queries sees the same bits (chunked prefill)
            chunk = run(q[t0 + 1:t0 + n], [n - 1], [c], [s])
            assert torch.equal(chunk, alone[1:])
        t0 += n
