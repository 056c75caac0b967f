"""`python -m stages.04_kernels --kernels`: each fused op three ways, side by side, checked and timed.

For every element-wise op stage 04 fuses (add + RMSNorm, RoPE on q and k, SwiGLU), in the manner of llm.c's dev/cuda:

1. the reference, ``common/numerics/ops.py``: every rounding spelled out, what stages 01-03 run;
2. the textbook torch version a learner would write first (``torch.rsqrt``, ``rotate_half``, ``silu * up``):
   separate tensor ops, each reading its input from memory and writing its output back;
3. the fused kernel: one pass, one read and one write per tensor. On CPU the hand-written C++ of
   ``cpu_kernels.cpp``; on CUDA the Triton kernels of ``elementwise.py``.

Each version is checked bit for bit against the reference on SmolLM2-shaped rows (the lesson of the
textbook row: fewer spelled-out roundings, other bits, so other tokens sooner or later) and timed at
1 and 32 rows. The linears every stage shares (``common/numerics``) follow in a table of their own on CPU
(``linear_bench.py``); attention is not here.
"""
from __future__ import annotations

import time
from types import SimpleNamespace

import torch
from rich.console import Console
from rich.table import Table

from common.numerics import ops

HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM, EPS = 576, 1536, 9, 3, 64, 1e-5  # SmolLM2-135M's shapes


def textbook_add_rms_norm(x, residual, weight, eps):
    residual = x + residual
    xf = residual.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype), residual


def textbook_rope_qk(qkv, cos, sin, num_heads, num_kv_heads):
    d = HEAD_DIM
    qk = qkv[:, :(num_heads + num_kv_heads) * d].view(qkv.shape[0], -1, d).float()
    half = torch.cat([-qk[..., d // 2:], qk[..., :d // 2]], -1)  # rotate_half
    c, s = cos, sin[..., d // 2:].repeat(1, 1, 2)  # the tables hold (cos, cos) and (-sin, sin): take (sin, sin)
    return (qk * c + half * s).to(qkv.dtype)


def textbook_swiglu(gate_up):
    gate, up = gate_up.chunk(2, -1)
    return torch.nn.functional.silu(gate) * up


def inputs(rows: int, dtype: torch.dtype, device: str, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g).to(device, dtype)  # noqa: E731
    positions = torch.randint(0, 2048, (rows,), generator=g)
    inv = 1.0 / (10000.0 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
    freqs = torch.outer(positions.float(), inv)
    cos, sin = ops.rope_tables(freqs.cos().to(device), freqs.sin().to(device))
    return {"x": r(rows, HIDDEN), "residual": r(rows, HIDDEN), "weight": r(HIDDEN),
            "qkv": r(rows, (HEADS + 2 * KV_HEADS) * HEAD_DIM), "gate_up": r(rows, 2 * FFN),
            "cos": cos, "sin": sin}


def versions(dtype: torch.dtype, device: str) -> dict[str, dict[str, object]]:
    """op -> {version name: a function of the inputs dict returning the op's output tensor(s)}."""
    rope_ref = lambda a: torch.cat([t.reshape(t.shape[0], -1) for t in ops.rope_qkv(  # noqa: E731
        a["qkv"], a["cos"], a["sin"], HEADS, KV_HEADS)[:2]], -1)
    table = {
        "add + RMSNorm": {"reference": lambda a: ops.add_rms_norm(a["x"], a["residual"], a["weight"], EPS),
                          "textbook torch": lambda a: textbook_add_rms_norm(a["x"], a["residual"], a["weight"], EPS)},
        "RoPE on q and k": {"reference": rope_ref,
                            "textbook torch": lambda a: textbook_rope_qk(a["qkv"], a["cos"], a["sin"], HEADS,
                                                                         KV_HEADS).reshape(a["qkv"].shape[0], -1)},
        "SwiGLU": {"reference": lambda a: ops.swiglu(a["gate_up"]),
                   "textbook torch": lambda a: textbook_swiglu(a["gate_up"])},
    }
    fused = fused_versions(dtype, device)
    for op, fn in fused.items():
        table[op].update(fn)
    return table


def fused_versions(dtype: torch.dtype, device: str) -> dict[str, dict[str, object]]:
    if device == "cuda":
        from . import elementwise as ew
        d = HEAD_DIM
        return {"add + RMSNorm": {"fused Triton": lambda a: ew.add_rms_norm(a["x"], a["residual"].clone(), a["weight"],
                                                                           EPS)},
                "RoPE on q and k": {"fused Triton": lambda a: ew.rope_(
                    a["qkv"][:, :(HEADS + KV_HEADS) * d].clone().view(-1, HEADS + KV_HEADS, d), a["cos"],
                    a["sin"]).reshape(a["qkv"].shape[0], -1)},
                "SwiGLU": {"fused Triton": lambda a: ew.swiglu(a["gate_up"])}}
    from .cpu_fusion import FusedCPU
    config = SimpleNamespace(rms_norm_eps=EPS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                             head_dim=HEAD_DIM)  # what the fused kernels read of a model's config
    try:
        f = FusedCPU(config, dtype)
    except RuntimeError as e:
        return {op: {f"fused C++ (not built: {e})": None} for op in ("add + RMSNorm", "RoPE on q and k", "SwiGLU")}
    rope = lambda a: torch.cat([t.reshape(t.shape[0], -1) for t in f.rope_qkv(a["qkv"], a["cos"], a["sin"])[:2]], -1)  # noqa: E731
    return {"add + RMSNorm": {"fused C++": lambda a: f.add_rms_norm(a["x"], a["residual"], a["weight"])},
            "RoPE on q and k": {"fused C++": rope},
            "SwiGLU": {"fused C++": lambda a: f.swiglu(a["gate_up"])}}


def same_bits(got, expected) -> tuple[bool, float]:
    got, expected = (got if isinstance(got, tuple) else (got,)), (expected if isinstance(expected, tuple) else
                                                                  (expected,))
    equal = all(torch.equal(a, b) for a, b in zip(got, expected))
    diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(got, expected))
    return equal, diff


def time_us(fn, a, device: str, repeats: int = 50) -> float:
    for _ in range(5):
        fn(a)
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn(a)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 1e6 * min(times)  # the fastest call: what the kernel costs when nothing else takes the core


def measure(dtype: torch.dtype = torch.bfloat16, device: str = "cpu", rows=(1, 32)) -> list[dict]:
    """One row per (op, version): bit-exact against the reference on 2,048 rows of random data, and µs per call."""
    table, out = versions(dtype, device), []
    check = inputs(2048, dtype, device, seed=1)  # enough rows for the rare roundings the reference spells out
    timing = {n: inputs(n, dtype, device) for n in rows}
    for op, impls in table.items():
        expected = impls["reference"](check)
        for name, fn in impls.items():
            row = {"op": op, "version": name}
            if fn is not None:
                row["same bits"], row["max |diff|"] = same_bits(fn(check), expected)
                row.update({f"µs, {n} row{'s' if n > 1 else ''}": time_us(fn, timing[n], device) for n in rows})
            out.append(row)
    return out


def main(device: str = "cpu", dtype: torch.dtype = torch.bfloat16) -> list[dict]:
    rows = measure(dtype, device)
    table = Table(title=f"stage 04's fused ops, {str(dtype).removeprefix('torch.')} on {device}, SmolLM2 shapes "
                        f"(fastest of 50 calls)")
    for col in ("op", "version", "same bits as the reference", "µs, 1 row", "µs, 32 rows"):
        table.add_column(col, justify="left" if col in ("op", "version") else "right")
    for r in rows:
        bits = "-" if "same bits" not in r else "yes" if r["same bits"] else f"no (max |diff| {r['max |diff|']:.2g})"
        table.add_row(r["op"], r["version"], bits, *(f"{r[k]:.1f}" if k in r else "-"
                                                    for k in ("µs, 1 row", "µs, 32 rows")))
    Console().print(table)
    return rows
