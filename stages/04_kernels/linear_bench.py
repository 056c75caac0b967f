"""`python -m stages.04_kernels --kernels`, second table: the linears every stage shares, three ways, checked and timed.

For a layer's four linears of SmolLM2 (q/k/v, o, gate/up, down) in bfloat16, int8, int4 and w4a8, and the LM head
(49,152 x 576) in bfloat16 and int8:

1. reference (torch): ``x @ W.T`` in float32 on the weights the kernel multiplies by, unrounded: the oracle for
   closeness, and what a learner would write first;
2. old path: torch's linears as the engine ran them where none of ours built (before the portable kernel, every
   AVX2 machine): bfloat16 widened to float32 ``torch.mm``, int8 and int4 torch's packed kernels, each on the row
   tile the load-time check finds (``invariant.choose_row_tile``; where none passes, calls padded to 16 rows);
3. ours: the kernel this machine runs (``native.linear_kernel()``: the portable one on AVX2 and ARM).

w4a8 has no torch path: its second version is int4's kernel on the same weights (the one it stands beside, bfloat16
activations), checked against int4's definition.

Checked: whether each gives the bits of the portable kernel's definition (``common/numerics/linear_reference.py``,
on 4 rows), whether a row's bits alone equal its bits in a call of 64 rows, and the largest difference from the
reference. Timed: µs per call at 1, 8 and 64 rows, the fastest of 5; a layer's linears are called on 30 copies in
turn (SmolLM2's 30 layers), so that their weights come from memory as in a decode step, and the time is per layer.
Two more columns place each time on the roofline: at 1 row a linear reads each weight once for two flops, so what
bounds it is memory (GB/s: the precision's weight bytes, 2, 1 or 0.625 a weight, over the time; compare the
machine's read bandwidth); at 64 rows each weight read serves 64 rows, so what bounds it is arithmetic (GFLOP/s:
compare the reference's, torch's float32 matmul on one copy, from cache).
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager

import torch
from rich.console import Console
from rich.table import Table

from common.numerics import linear_reference, native
from common.numerics.int4 import Int4Linear, q4_1_groups, q4_1_quantize
from common.numerics.int8 import Int8Linear
from common.numerics.invariant import Linear, choose_row_tile

LAYER = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # q/k/v, o, gate/up, down
HEAD = [(49152, 576)]
LAYERS, ROWS, CHECK_ROWS = 30, (1, 8, 64), 4
BYTES_PER_WEIGHT = {"bfloat16": 2.0, "int8": 1.0, "int4": 20 / 32, "w4a8": 20 / 32}  # Q4_1: 32 weights, 20 bytes


@contextmanager
def linear_choice(value: str):
    """STEPWISE_LINEAR set while the linears are built (each reads it once, then keeps its kernel)."""
    old = os.environ.get("STEPWISE_LINEAR")
    os.environ["STEPWISE_LINEAR"] = value
    try:
        yield
    finally:
        os.environ.pop("STEPWISE_LINEAR") if old is None else os.environ.__setitem__("STEPWISE_LINEAR", old)


def build(kind: str, weight: torch.Tensor, blocks=None):
    if kind == "bfloat16":
        return Linear(weight.bfloat16())
    if kind == "int8":
        return Int8Linear(weight)
    return Int4Linear.from_q4_1(blocks, activations=8 if kind == "w4a8" else 16)


def exact_weights(kind: str, weight: torch.Tensor, blocks) -> torch.Tensor:
    """What every version multiplies by, in float32: the bfloat16 weights, int8's q * scale, int4's d * q + m."""
    if kind == "bfloat16":
        return weight.bfloat16().float()
    if kind == "int8":
        return Int8Linear(weight, plain=True).dequantized()
    codes, d, m = (torch.from_numpy(t.astype("float32")) for t in q4_1_groups(blocks))
    return codes * d.repeat_interleave(32, 1) + m.repeat_interleave(32, 1)


def definition(kind: str, x: torch.Tensor, weight: torch.Tensor, blocks) -> torch.Tensor:
    """The portable kernel's bits, from linear_reference (slow: a few rows only)."""
    if kind == "bfloat16":
        return linear_reference.dense(x.float(), weight.bfloat16().float(), torch.bfloat16)
    if kind == "int8":
        lin = Int8Linear(weight, plain=True)
        return linear_reference.int8(x.float(), lin.qweight.float(), lin.scales)
    codes, d, m = (torch.from_numpy(t.astype("float32")) for t in q4_1_groups(blocks))
    return (linear_reference.w4a8 if kind == "w4a8" else linear_reference.int4)(x.float(), codes, d, m)


def time_us(calls, repeats: int = 5) -> float:
    """The fastest of ``repeats`` passes over ``calls`` (each a function of nothing), in µs per pass."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for call in calls:
            call()
        best = min(best, time.perf_counter() - start)
    return best * 1e6


def measure_op(kind: str, shapes: list, copies: int, gen: torch.Generator) -> list[dict]:
    """The three versions of one op (a layer's linears, or the LM head) in one precision."""
    weights = [torch.randn(o, i, generator=gen) * i ** -0.5 for o, i in shapes]
    blocks = [q4_1_quantize(w) if kind in ("int4", "w4a8") else None for w in weights]
    exact = [exact_weights(kind, w, b) for w, b in zip(weights, blocks)]
    inputs = {rows: [torch.randn(rows, i, generator=gen).bfloat16() for _, i in shapes] for rows in ROWS}
    out, definitions = [], {}
    second = ("int4's kernel", "int4") if kind == "w4a8" else ("old path", "torch")
    for version, choice in (("reference: torch float32", None), second, ("ours", "auto")):
        made = "int4" if choice == "int4" else kind
        if made not in definitions:  # slow (a Python loop over the inputs): once per definition
            definitions[made] = [definition(made, x[:CHECK_ROWS], w, b) for x, w, b in zip(inputs[64], weights, blocks)]
        expected = definitions[made]
        if choice is None:  # one copy: its time is compute, not memory
            used, name, apply = 1, version, [[lambda x, w=w: x.float() @ w.t() for w in exact]]
        else:
            with linear_choice("auto" if choice == "int4" else choice):
                built = [[build(made, w, b) for w, b in zip(weights, blocks)] for _ in range(copies)]
            for lins in built:
                choose_row_tile(lins, torch.bfloat16, torch.device("cpu"))
            used, name = copies, f"{version}: {built[0][0].backend.split(' (')[0]}"
            apply = [[lambda x, lin=lin: lin(x) for lin in lins] for lins in built]
        x64 = inputs[64]
        results = [f(x) for f, x in zip(apply[0], x64)]
        row = {"op": f"{'LM head' if shapes == HEAD else 'a layer'}, {kind}", "version": name,
               "max |diff|": max(float((y.float() - x.float() @ w.t()).abs().max())
                                 for y, x, w in zip(results, x64, exact)),
               "alone = in a call": all(torch.equal(f(x[r:r + 1])[0], y[r])
                                        for f, x, y in zip(apply[0], x64, results) for r in (0, 31, 63)),
               "definition's bits": all(torch.equal(y[:CHECK_ROWS].to(torch.bfloat16), e)
                                        for y, e in zip(results, expected))}
        for rows in ROWS:
            calls = [lambda f=f, x=x: f(x) for fs in apply for f, x in zip(fs, inputs[rows])]
            row[f"µs, {rows} row{'s' if rows > 1 else ''}"] = time_us(calls) / used
        weights_count = sum(o * i for o, i in shapes)
        row["GB/s, 1 row"] = (weights_count * BYTES_PER_WEIGHT[kind] / row["µs, 1 row"] / 1e3 if choice is not None
                              else None)  # the reference's weights come from cache
        row["GFLOP/s, 64 rows"] = 2 * weights_count * 64 / row["µs, 64 rows"] / 1e3
        out.append(row)
        del apply
    return out


def main() -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    rows = []
    for kind in ("bfloat16", "int8", "int4", "w4a8"):
        if kind != "w4a8" or native.w4a8_kernel():  # w4a8 runs on our kernels only
            rows += measure_op(kind, LAYER, LAYERS, gen)
    for kind in ("bfloat16", "int8"):
        rows += measure_op(kind, HEAD, 1, gen)
    table = Table(title=f"SmolLM2's linears on {os.cpu_count()} CPUs: a layer's 4 from memory (30 copies in turn), "
                        "and the LM head; µs per call, fastest of 5")
    columns = ["op", "version", "definition's bits", "alone = in a call", "max |diff|",
               *(f"µs, {r} row{'s' if r > 1 else ''}" for r in ROWS), "GB/s, 1 row", "GFLOP/s, 64 rows"]
    for col in columns:
        table.add_column(col, justify="left" if col in ("op", "version") else "right")
    for r in rows:
        table.add_row(r["op"], r["version"], "yes" if r["definition's bits"] else "no",
                      "yes" if r["alone = in a call"] else "no", f"{r['max |diff|']:.2g}",
                      *(f"{r[c]:,.0f}" for c in columns[5:-2]), f"{r['GB/s, 1 row']:.1f}" if r["GB/s, 1 row"] else "-",
                      f"{r['GFLOP/s, 64 rows']:.1f}")
    Console(width=max(Console().width, 132)).print(table)
    return rows
