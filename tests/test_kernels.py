"""Every Triton kernel against a plain torch reference, interpreted on CPU (TRITON_INTERPRET=1, set in
conftest) or compiled on CUDA; plus a compile check for an sm_90 target that needs no GPU."""
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.numerics import ops

pytest.importorskip("triton")
ew = importlib.import_module("stages.kernels.elementwise")
pa = importlib.import_module("stages.kernels.paged_attention")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# fp32 -> bf16 stores truncate in the interpreter: allow one bf16 step (2^-7 relative) there.
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3),
       torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2)}


def randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)


def same_as_reference(got, expected, dtype):
    """Compiled on CUDA the kernels reproduce common.numerics.ops bit for bit; the CPU interpreter is bit-exact in
    float32 only (it truncates float32 -> 16-bit stores instead of rounding, and its exp is numpy's)."""
    if DEVICE == "cuda" or dtype == torch.float32:
        assert torch.equal(got, expected)
    else:
        torch.testing.assert_close(got.float(), expected.float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, hidden, with_residual", [(3, 48, True), (5, 96, False), (2, 576, True)])
def test_add_rms_norm(dtype, rows, hidden, with_residual):
    x, res = randn(rows, hidden, dtype=dtype) * 4, randn(rows, hidden, dtype=dtype, seed=1) * 4
    w = randn(hidden, dtype=dtype, seed=2)
    expected, expected_res = ops.add_rms_norm(x, res.clone() if with_residual else None, w, 1e-5)
    out, new_res = ew.add_rms_norm(x, res if with_residual else None, w, 1e-5)
    assert new_res.data_ptr() == (res if with_residual else x).data_ptr()  # updated in place
    same_as_reference(new_res, expected_res, dtype)
    same_as_reference(out, expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens, heads, head_dim", [(4, 3, 8), (2, 9, 64), (3, 5, 12)])
def test_rope_in_place(dtype, tokens, heads, head_dim):
    x = randn(tokens, heads, head_dim, dtype=dtype)
    positions = torch.tensor([7, 0, 300, 42][:tokens], device=DEVICE)
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(512).float(), inv).to(DEVICE)
    cos, sin = ops.rope_tables(freqs.cos()[positions], freqs.sin()[positions])
    expected = ops.rope(x, cos, sin)
    got = ew.rope_(x, cos, sin)
    assert got.data_ptr() == x.data_ptr()
    same_as_reference(x, expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, ffn", [(3, 40), (2, 1536), (1, 7)])
def test_swiglu(dtype, rows, ffn):
    gate_up = randn(rows, 2 * ffn, dtype=dtype) * 3
    got, expected = ew.swiglu(gate_up), ops.swiglu(gate_up)
    if DEVICE == "cuda":
        assert torch.equal(got, expected)
    else:  # numpy's exp in the interpreter vs torch's vectorized exp: equal to a unit in the last place
        torch.testing.assert_close(got.float(), expected.float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv_into_paged_slots(dtype):
    blocks, kvh, block_size, d = 6, 3, 4, 8
    k_cache = torch.zeros(blocks, kvh, block_size, d, dtype=dtype, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    k, v = randn(5, kvh, d, dtype=dtype), randn(5, kvh, d, dtype=dtype, seed=1)
    # Token t at position p of block b goes, for head h, to row (b * kvh + h) * block_size + p; -1: padding.
    token_slots = [(3, 1), (0, 2), (5, 3), None, (0, 0)]
    rows = torch.tensor([[-1] * kvh if ts is None else [(ts[0] * kvh + h) * block_size + ts[1] for h in range(kvh)]
                         for ts in token_slots], device=DEVICE)
    ew.store_kv(k, v, k_cache, v_cache, rows)
    for t, ts in enumerate(token_slots):
        if ts is not None:
            for h in range(kvh):
                assert torch.equal(k_cache[ts[0], h, ts[1]], k[t, h]) and torch.equal(v_cache[ts[0], h, ts[1]], v[t, h])
    written = {(b, p) for ts in token_slots if ts is not None for b, p in [ts]}
    for b in range(blocks):
        for p in range(block_size):
            if (b, p) not in written:
                assert k_cache[b, :, p].abs().sum() == 0 and v_cache[b, :, p].abs().sum() == 0


def torch_decode_attention(q, k_cache, v_cache, table, ctx):
    """One sequence's decode attention, read through its block table with plain torch."""
    kvh, block_size, d = k_cache.shape[1:]
    blocks = table[:-(-ctx // block_size)].long()
    # [blocks, kvh, block_size, d] -> the sequence's positions in order: [ctx, kvh, d]
    k = k_cache[blocks].transpose(1, 2).reshape(-1, kvh, d)[:ctx]
    v = v_cache[blocks].transpose(1, 2).reshape(-1, kvh, d)[:ctx]
    group = q.shape[0] // kvh
    k, v = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    p = (torch.einsum("hd,khd->hk", q.float(), k) / d ** 0.5).softmax(-1)
    return torch.einsum("hk,khd->hd", p, v)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads, kv_heads, head_dim, block_size", [(6, 2, 32, 4), (3, 3, 16, 16), (9, 3, 64, 16),
                                                                    (5, 5, 24, 8)])
def test_paged_decode_attention(dtype, heads, kv_heads, head_dim, block_size):
    ctx = [1, 13, 70, 45]  # ends mid-block; with split size 32, up to three splits
    num_blocks = sum(-(-c // block_size) for c in ctx) + 3
    k_cache = randn(num_blocks, kv_heads, block_size, head_dim, dtype=dtype)
    v_cache = randn(num_blocks, kv_heads, block_size, head_dim, dtype=dtype, seed=1)
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(3)).tolist()
    width = max(-(-c // block_size) for c in ctx)
    tables = torch.zeros(len(ctx), width, dtype=torch.int32)
    for s, c in enumerate(ctx):
        n = -(-c // block_size)
        tables[s, :n] = torch.tensor(perm[:n])
        perm = perm[n:]
    tables = tables.to(DEVICE)
    q = randn(len(ctx), heads, head_dim, dtype=dtype, seed=2)
    lens = torch.tensor(ctx, dtype=torch.int32, device=DEVICE)
    out = pa.paged_decode_attention(q, k_cache, v_cache, tables, lens, max(ctx), split_size=32)
    for s, c in enumerate(ctx):
        expected = torch_decode_attention(q[s], k_cache, v_cache, tables[s], c)
        torch.testing.assert_close(out[s].float(), expected, **TOL[dtype])
    # Batch invariance: each sequence alone gives the same bits as in the batch.
    for s, c in enumerate(ctx):
        alone = pa.paged_decode_attention(q[s:s + 1], k_cache, v_cache, tables[s:s + 1], lens[s:s + 1], c,
                                          split_size=32)
        assert torch.equal(alone[0], out[s])


def test_compile_for_sm90_without_a_gpu():
    """The real GPU pipeline (TTIR -> TTGIR -> LLVM -> PTX -> cubin) for every kernel, on the CPU."""
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "stages.bench.compile_check"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    for name in ["add_rms_norm", "rope", "swiglu", "store_kv", "paged_decode_split", "paged_decode_merge",
                 "int8_linear", "int4_linear"]:
        assert f"{name}: " in out.stdout and "bytes of sm_90 cubin" in out.stdout


SMALL_DOT = """
import triton
import triton.language as tl


@triton.jit
def small_dot(a_ptr, b_ptr, c_ptr, K: tl.constexpr):
    m, k = tl.arange(0, 16), tl.arange(0, K)
    a = tl.load(a_ptr + m[:, None] * K + k[None, :])
    b = tl.load(b_ptr + k[:, None] * 16 + m[None, :])
    tl.store(c_ptr + m[:, None] * 16 + m[None, :], tl.dot(a, b))
"""


@pytest.mark.parametrize("k, compiles", [(16, True), (8, False)])
def test_compile_check_catches_a_dot_smaller_than_16(tmp_path, k, compiles):
    """A bf16 tl.dot with K < 16 runs in the interpreter but the GPU compiler rejects it: the check must say so."""
    (tmp_path / "small_dot.py").write_text(SMALL_DOT)
    root = Path(__file__).resolve().parents[1]
    code = ("import importlib, small_dot; cc = importlib.import_module('stages.bench.compile_check'); "
            f"cc.compile_for(small_dot.small_dot, {{'a_ptr': '*bf16', 'b_ptr': '*bf16', 'c_ptr': '*fp32'}}, "
            f"{{'K': {k}}})")
    env = {key: v for key, v in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{root}"
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    if compiles:
        assert out.returncode == 0, out.stderr[-2000:]
    else:
        assert out.returncode != 0 and "K >= 16" in out.stderr
