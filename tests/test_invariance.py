"""The design that makes batched and unbatched results bit-identical (common/numerics/invariant.py, attention*.py).

Data is drawn by hypothesis (seeds, scales, shapes), in float32 and bfloat16."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from common.paths import DEFAULT_MODEL
from common.numerics import native, ops
from common.numerics import attention_tiles as attention_module
from common.numerics.attention import AttentionMetadata, attention
from common.numerics.attention_tiles import decode_tile_rows
from common.numerics.invariant import (CANDIDATE_TILES, ROW_TILE, Linear, choose_row_tile, find_row_tile,
                                       order_revealing_rows)
from workloads import examples

DTYPES = [torch.float32, torch.bfloat16]
# The compiled CPU kernel where this machine builds it (common.numerics.native), and the tensor-op tiles everywhere.
IMPLEMENTATIONS = [False] + ([True] if native.load() else [])
CPU = torch.device("cpu")
SMOLLM2_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)]  # qkv, o, gate_up, down, head


def randn(gen, *shape, scale=1.0, dtype=torch.float32):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


@settings(max_examples=examples(40), deadline=None)
@given(rows=st.integers(1, 70), pick=st.integers(0, 69), dtype=st.sampled_from(DTYPES),
       shape=st.sampled_from(SMOLLM2_SHAPES[:4] + [(192, 1024), (512, 192)]), seed=st.integers(0, 2**32 - 1),
       scale=st.sampled_from([1e-2, 1.0, 30.0]))
def test_linear_row_does_not_depend_on_batch(rows, pick, dtype, shape, seed, scale):
    out_features, in_features = shape
    gen = torch.Generator().manual_seed(seed)
    linear = Linear(randn(gen, out_features, in_features, scale=in_features ** -0.5, dtype=dtype))
    choose_row_tile([linear], dtype, CPU)
    x = randn(gen, rows, in_features, scale=scale, dtype=dtype)
    i = pick % rows
    alone = linear(x[i:i + 1])[0]
    assert torch.equal(alone, linear(x)[i])
    expected = x[i].float() @ linear.matmul(torch.eye(in_features, dtype=dtype)).float()
    torch.testing.assert_close(alone.float(), expected, rtol=2e-2, atol=2e-2 * scale)


def test_tile_check_finds_a_tile_and_rejects_a_batch_dependent_matmul():
    gen = torch.Generator().manual_seed(0)
    linears = [Linear(randn(gen, o, i, scale=i ** -0.5, dtype=torch.bfloat16)) for o, i in SMOLLM2_SHAPES]

    class RowByRow(Linear):  # invariant by construction: every row multiplied alone
        def matmul(self, x):
            return torch.cat([super(RowByRow, self).matmul(x[r:r + 1]) for r in range(x.shape[0])])

    class BatchDependent(Linear):  # what a kernel chosen by the row count looks like from outside
        def matmul(self, x):
            return super().matmul(x) + 0.05 * x.shape[0]

    weight = linears[1].matmul(torch.eye(576, dtype=torch.bfloat16)).t()
    assert find_row_tile([RowByRow(weight)], torch.bfloat16, CPU) == max(CANDIDATE_TILES)
    assert find_row_tile([BatchDependent(weight)], torch.bfloat16, CPU) is None
    tile = find_row_tile(linears, torch.bfloat16, CPU)
    note = choose_row_tile(linears, torch.bfloat16, CPU)
    if tile is None:  # e.g. an AVX2-only CPU, where bfloat16 widens to float32 torch.mm: exact 16-row calls
        assert "no tile keeps rows' bits" in note and all(lin.exact_tiles for lin in linears)
        return
    assert tile >= ROW_TILE
    # A real one: this machine's linear above the tile it passed (oneDNN changes its blocking past 32 rows).
    if tile < max(CANDIDATE_TILES):
        x = order_revealing_rows(2 * tile, 576).to(torch.bfloat16)
        lin = linears[1]
        alone = torch.cat([lin.matmul(x[r:r + 1]) for r in range(2 * tile)])
        assert not torch.equal(lin.matmul(x), alone)
    assert f"up to {tile} rows" in note and all(lin.row_tile == tile and not lin.exact_tiles for lin in linears)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_portable_kernel_keeps_rows_bits_in_the_largest_tile(monkeypatch, dtype):
    """Our portable linear (any CPU; forced here, the default where there is no AVX-512) takes bfloat16 and float32
    weights as they are (nothing widened to float32) and passes the load-time check at the largest tile, so no call
    is padded: a row's sums never depend on the call (tests/test_native_linear.py checks its bits)."""
    if not native.load(native.LINEAR_SOURCE):
        pytest.skip("linear.cpp did not build here")
    monkeypatch.setenv("STEPWISE_LINEAR", "portable")
    gen = torch.Generator().manual_seed(0)
    linears = [Linear(randn(gen, o, i, scale=i ** -0.5, dtype=dtype)) for o, i in SMOLLM2_SHAPES[:4] + [(100, 70)]]
    assert all(native.is_portable(lin.kernel_name) and not lin.widen and lin.ours.dtype == dtype for lin in linears)
    assert find_row_tile(linears, dtype, CPU) == max(CANDIDATE_TILES)


def test_a_cached_tile_is_keyed_on_our_kernels_source(monkeypatch):
    """The row tile found for our kernel is cached per machine; an edited kernel must be checked again, not
    trusted from the cache: its source is part of the key (a torch backend's key does not change with it)."""
    import common.numerics.invariant as invariant

    args = (torch.bfloat16, CPU, [("Linear", 576, 576)])
    ours = invariant._machine_key("AMX kernel (stepwise)", *args)
    theirs = invariant._machine_key("oneDNN prepacked", *args)
    monkeypatch.setattr(invariant.native, "source_key", lambda source=None: "an edited linear.cpp")
    assert invariant._machine_key("AMX kernel (stepwise)", *args) != ours
    assert invariant._machine_key("oneDNN prepacked", *args) == theirs


def torch_attention(q, k, v, start):
    """Plain causal attention for one sequence: q [n, H, d] at positions start.., k/v [L, KV, d]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1).float(), v.repeat_interleave(group, 1).float()
    s = torch.einsum("qhd,khd->hqk", q.float(), k) / q.shape[-1] ** 0.5
    mask = torch.arange(k.shape[0])[None, :] > (start + torch.arange(q.shape[0]))[:, None]
    p = s.masked_fill(mask, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", p, v)


class PagedStorage:
    """K/V in blocks of ``block_size`` positions laid out [blocks, kv_heads, block_size, d], blocks shuffled."""

    def __init__(self, gen, contexts, kvh, d, block_size, dtype, scale):
        self.bs, self.kvh, self.chunk_len = block_size, kvh, math.gcd(block_size, 64)
        need = [-(-c // block_size) for c in contexts]
        order = torch.randperm(sum(need) + 2, generator=gen).tolist()
        self.tables = [order[sum(need[:i]):sum(need[:i + 1])] for i in range(len(contexts))]
        self.k = randn(gen, sum(need) + 2, kvh, block_size, d, scale=scale, dtype=dtype)
        self.v = randn(gen, sum(need) + 2, kvh, block_size, d, dtype=dtype)
        self.d = d

    def keys(self, s, ctx):
        """Sequence s's keys and values in position order: [ctx, kvh, d]."""
        blocks = torch.tensor(self.tables[s])
        k = self.k[blocks].transpose(1, 2).reshape(-1, self.kvh, self.d)[:ctx]
        return k, self.v[blocks].transpose(1, 2).reshape(-1, self.kvh, self.d)[:ctx]

    def run(self, q, seqs, query_lens, context_lens, num_heads, native=None):
        g, bs = self.chunk_len, self.bs
        width = -(-max(context_lens) // g)
        table = np.zeros((len(seqs), width), dtype=np.int64)
        for i, s in enumerate(seqs):
            n = -(-context_lens[i] // g)
            pos = np.arange(n) * g
            table[i, :n] = np.asarray(self.tables[s])[pos // bs] * self.kvh * (bs // g) + (pos % bs) // g
        meta = AttentionMetadata.build(query_lens, context_lens, num_heads, self.kvh, table, g, bs // g,
                                       native=native, head_dim=self.d, kv_dtype=self.k.dtype)
        return attention(q, self.k.view(-1, g, self.d), self.v.view(-1, g, self.d), meta)


@settings(max_examples=examples(60), deadline=None)
@given(seqs=st.lists(st.tuples(st.integers(1, 150), st.integers(0, 200)), min_size=1, max_size=5),
       heads=st.sampled_from([(6, 2), (9, 3), (4, 4), (8, 1)]), d=st.sampled_from([32, 64]),
       block_size=st.sampled_from([1, 4, 16, 48, 128]), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**32 - 1), scale=st.sampled_from([0.1, 1.0, 8.0]),
       native=st.sampled_from(IMPLEMENTATIONS), data=st.data())
def test_attention_is_exact_and_batch_invariant(seqs, heads, d, block_size, dtype, seed, scale, native, data):
    """Each sequence's output equals its output alone bit for bit, whatever else is in the step, the arrival
    order, or how its prompt is chunked; and it equals plain torch attention within rounding. Both
    implementations: the compiled CPU kernel (native) and the tensor-op tiles."""
    nh, nkv = heads
    gen = torch.Generator().manual_seed(seed)
    qlens, ctx = [n for n, _ in seqs], [n + past for n, past in seqs]
    store = PagedStorage(gen, ctx, nkv, d, block_size, dtype, scale)
    q = randn(gen, sum(qlens), nh, d, scale=scale, dtype=dtype)
    starts = np.concatenate([[0], np.cumsum(qlens)])
    out = store.run(q, list(range(len(seqs))), qlens, ctx, nh, native)
    order = data.draw(st.permutations(range(len(seqs))))
    permuted = store.run(torch.cat([q[starts[s]:starts[s + 1]] for s in order]), order,
                         [qlens[s] for s in order], [ctx[s] for s in order], nh, native)
    p_starts = np.concatenate([[0], np.cumsum([qlens[s] for s in order])])
    for s, (n, c) in enumerate(zip(qlens, ctx)):
        mine = q[starts[s]:starts[s + 1]]
        alone = store.run(mine, [s], [n], [c], nh, native)
        assert torch.equal(out[starts[s]:starts[s + 1]], alone)
        i = order.index(s)
        assert torch.equal(permuted[p_starts[i]:p_starts[i + 1]], alone)
        k, v = store.keys(s, c)
        torch.testing.assert_close(alone.float(), torch_attention(mine, k, v, c - n), rtol=3e-2, atol=3e-2)
        if n > 1:  # chunked prefill: the first `cut` queries in one step, the rest in a later one
            cut = data.draw(st.integers(1, n - 1))
            first = store.run(mine[:cut], [s], [cut], [c - n + cut], nh, native)
            second = store.run(mine[cut:], [s], [n - cut], [c], nh, native)
            assert torch.equal(torch.cat([first, second]), alone)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group, below", [(3, 7), (3, 2), (9, 11)])
def test_decode_tiles_are_padded_until_bmm_keeps_every_rows_bits(monkeypatch, kv_dtype, group, below):
    """The rows of a decode tile are checked, not assumed: under a bmm that sums each product in one order, but in
    reverse below a few rows (as a matrix-vector path may take another order), decode tiles get the fewest rows,
    from the group's up, at which the order is the prefill tile's."""
    def other_order_below(a, b):
        products = a.unsqueeze(-1) * b.unsqueeze(-3)  # [pairs, rows, inner, cols], summed over inner
        return (products.flip(-2) if a.shape[1] < below else products).sum(-2)

    monkeypatch.setattr(torch, "bmm", other_order_below)
    monkeypatch.setattr(attention_module, "_decode_rows", {})
    assert decode_tile_rows(torch.device("cpu"), group, 32, kv_dtype) == max(group, below)


@pytest.mark.skipif(True not in IMPLEMENTATIONS, reason="the compiled CPU attention did not build here")
@settings(max_examples=examples(40), deadline=None)
@given(seqs=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 200)), min_size=1, max_size=4),
       heads=st.sampled_from([(6, 2), (9, 3), (4, 4), (8, 1)]), d=st.sampled_from([16, 32, 48, 64, 128]),
       block_size=st.sampled_from([1, 4, 16, 48, 128]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), seed=st.integers(0, 2**32 - 1),
       scale=st.sampled_from([0.1, 1.0, 8.0]))
def test_compiled_attentions_vector_version_gives_the_portable_versions_bits(seqs, heads, d, block_size, dtype,
                                                                            seed, scale):
    """attention.cpp runs a 16-keys-at-a-time version where it can (a head dimension of 16-128, a multiple of 16):
    AVX-512's, else attention_lanes.h's AVX2, NEON or plain one; it must make the portable reference's sums in the
    reference's order: every bit the same (native/test/attention_test.cpp checks the same without torch, on any
    ISA)."""
    import os
    nh, nkv = heads
    gen = torch.Generator().manual_seed(seed)
    qlens, ctx = [n for n, _ in seqs], [n + past for n, past in seqs]
    store = PagedStorage(gen, ctx, nkv, d, block_size, dtype, scale)
    q = randn(gen, sum(qlens), nh, d, scale=scale, dtype=dtype)
    vector = store.run(q, list(range(len(seqs))), qlens, ctx, nh, True)
    os.environ["STEPWISE_ATTENTION_PORTABLE"] = "1"
    try:
        portable = store.run(q, list(range(len(seqs))), qlens, ctx, nh, True)
    finally:
        del os.environ["STEPWISE_ATTENTION_PORTABLE"]
    assert torch.equal(vector, portable)


@pytest.mark.skipif(True not in IMPLEMENTATIONS, reason="the compiled CPU attention did not build here")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])  # float32 out: every rounding shows
@pytest.mark.parametrize("context", [4096, 8192])
def test_compiled_attention_at_long_context(context, dtype):
    """Issue 54's decode at 8k tokens of context, with few heads so it takes seconds: the kernel's vector version
    gives the portable reference's bits, on one thread as on two, and plain torch attention's values within
    rounding (a decode token at `context` and a 3-token prefill chunk at half of it, blocks shuffled)."""
    import os
    nh, nkv, d = 8, 2, 64
    gen = torch.Generator().manual_seed(context)
    qlens, ctx = [1, 3], [context, context // 2 + 3]
    store = PagedStorage(gen, ctx, nkv, d, 16, dtype, 0.5)
    q = randn(gen, sum(qlens), nh, d, dtype=dtype)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        out = store.run(q, [0, 1], qlens, ctx, nh, True)
        torch.set_num_threads(1)
        assert torch.equal(store.run(q, [0, 1], qlens, ctx, nh, True), out)
        os.environ["STEPWISE_ATTENTION_PORTABLE"] = "1"
        assert torch.equal(store.run(q, [0, 1], qlens, ctx, nh, True), out)
    finally:
        os.environ.pop("STEPWISE_ATTENTION_PORTABLE", None)
        torch.set_num_threads(threads)
    for s, (start, n, c) in enumerate([(0, 1, ctx[0]), (1, 3, ctx[1])]):
        k, v = store.keys(s, c)
        expected = torch_attention(q[start:start + n], k, v, c - n)
        torch.testing.assert_close(out[start:start + n].float(), expected, rtol=2e-2, atol=2e-2)


@settings(max_examples=examples(30), deadline=None)
@given(rows=st.integers(1, 40), pick=st.integers(0, 39), hidden=st.sampled_from([192, 576]),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**32 - 1), scale=st.sampled_from([1e-3, 1.0, 50.0]))
def test_rms_norm_row_does_not_depend_on_batch(rows, pick, hidden, dtype, seed, scale):
    gen = torch.Generator().manual_seed(seed)
    x, res = randn(gen, rows, hidden, scale=scale, dtype=dtype), randn(gen, rows, hidden, dtype=dtype)
    w = (1 + randn(gen, hidden, scale=0.1)).to(dtype)
    i = pick % rows
    out, new_res = ops.add_rms_norm(x, res, w, 1e-5)
    alone, alone_res = ops.add_rms_norm(x[i:i + 1], res[i:i + 1], w, 1e-5)
    assert torch.equal(out[i:i + 1], alone) and torch.equal(new_res[i:i + 1], alone_res)
    r = (x.float() + res.float()).to(dtype).float()
    expected = w.float() * (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + 1e-5))
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=1e-5)


@settings(max_examples=examples(25), deadline=None)
@given(seqs=st.lists(st.tuples(st.integers(1, 90), st.integers(0, 120)), min_size=1, max_size=4),
       heads=st.sampled_from([(6, 2), (4, 4)]), block_size=st.sampled_from([4, 16]), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**32 - 1))
def test_plain_attention_matches_torch(seqs, heads, block_size, dtype, seed):
    """batch_invariant=False: padded batch through torch's fused attention, for comparison; close, not exact."""
    nh, nkv, d = *heads, 32
    gen = torch.Generator().manual_seed(seed)
    qlens, ctx = [n for n, _ in seqs], [n + past for n, past in seqs]
    store = PagedStorage(gen, ctx, nkv, d, block_size, dtype, 1.0)
    q = randn(gen, sum(qlens), nh, d, dtype=dtype)
    g, bs = store.chunk_len, store.bs
    table = np.zeros((len(seqs), -(-max(ctx) // g)), dtype=np.int64)
    for i in range(len(seqs)):
        pos = np.arange(-(-ctx[i] // g)) * g
        table[i, :pos.size] = np.asarray(store.tables[i])[pos // bs] * nkv * (bs // g) + (pos % bs) // g
    meta = AttentionMetadata.build(qlens, ctx, nh, nkv, table, g, bs // g, batch_invariant=False, head_dim=d,
                                   kv_dtype=dtype)
    out = attention(q, store.k.view(-1, g, d), store.v.view(-1, g, d), meta)
    t0 = 0
    for s, (n, c) in enumerate(zip(qlens, ctx)):
        k, v = store.keys(s, c)
        torch.testing.assert_close(out[t0:t0 + n].float(), torch_attention(q[t0:t0 + n], k, v, c - n),
                                   rtol=3e-2, atol=3e-2)
        t0 += n


@pytest.mark.real_model
def test_plain_math_step_is_close_to_the_invariant_one():
    """The same step on the real model, plain math vs batch-invariant math: the logits agree closely."""
    from common.kv_cache import ContiguousKVCache
    from common.loader import load_model
    from common.prepare import resolve_model
    logits = {}
    for invariant in (True, False):
        model = load_model(resolve_model(DEFAULT_MODEL), "float32", batch_invariant=invariant)
        cache = ContiguousKVCache(model.config, 3, 128, torch.float32, CPU, batch_invariant=invariant)
        lens = [40, 7, 19]
        ids = torch.randint(0, 49152, (sum(lens),), generator=torch.Generator().manual_seed(0))
        cache.prepare([0, 1, 2], lens, lens)
        positions = torch.cat([torch.arange(n) for n in lens])
        hidden = model.forward(ids, positions, cache)
        logits[invariant] = model.compute_logits(hidden[torch.tensor(np.cumsum(lens) - 1)])
    torch.testing.assert_close(logits[False], logits[True], rtol=1e-3, atol=1e-3)
