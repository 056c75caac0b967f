"""`python -m stages.04_kernels --kernels`, last table: what a few more rows cost the linears (a verify step's).

Stage 06 checks k drafted tokens in one step, so every linear takes 1 + k rows instead of 1. Decoding one row reads
each weight once for one multiply-add per row, so one row is bound by memory; while the rows' multiply-adds fit in
the time the weights take to arrive, more rows cost little more. The kernels read each weight once for all the rows
of a call (up to 5-8 rows in registers, then tiles that stay in L1), and every row's sum stays one chain in one
order, so a row's bits are the same alone and beside others (checked below).

For each precision, a layer's four linears of SmolLM2 (q/k/v, o, gate/up, down; 30 copies on 2 MiB pages, as the
engine places them, called in turn so that the weights come from memory) at 1, 2, 5 and 8 rows, on the kernel this
machine runs (named): µs per layer and the ratio to one row. The figure is the 10th percentile of 30 copies x 7
passes, the rows' sizes taken in turn, so that other processes on a shared machine move it less; run it alone.
Where a precision's multiply-adds outrun the memory (int4 and int8 on AVX2: one float multiply-add per weight and
row), the ratio grows with the rows: docs/native-kernels.md ("verify rows") has what bounds each.
"""
from __future__ import annotations

import os
import time

import torch
from rich.console import Console
from rich.table import Table

from common.numerics import native
from common.numerics.int4 import Int4Linear, q4_1_quantize
from common.numerics.int8 import Int8Linear
from common.numerics.invariant import Linear
from common.numerics.native.arena import WeightArena

LAYER = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # q/k/v, o, gate/up, down
ROWS, COPIES, PASSES = (1, 2, 5, 8), 30, 7
PRECISIONS = ("float32", "bfloat16", "int8", "int4", "w4a8")


def build(kind: str, weight: torch.Tensor, blocks):
    if kind in ("float32", "bfloat16"):
        return Linear(weight.to(getattr(torch, kind)))
    if kind == "int8":
        return Int8Linear(weight)
    return Int4Linear.from_q4_1(blocks, activations=8 if kind == "w4a8" else 16)


def layers(kind: str, gen: torch.Generator) -> list[list]:
    """COPIES copies of a layer's linears, their packed weights on 2 MiB pages."""
    weights = [torch.randn(o, i, generator=gen) * i ** -0.5 for o, i in LAYER]
    blocks = [q4_1_quantize(w) if kind in ("int4", "w4a8") else None for w in weights]
    copies = [[build(kind, w, b) for w, b in zip(weights, blocks)] for _ in range(COPIES)]
    arena = WeightArena(sum(lin.nbytes + 8192 for lins in copies for lin in lins))
    for lins in copies:
        for lin in lins:
            lin.place_weights(arena.place)
    arena.finish()
    return copies


def alone_equals_together(lins: list, inputs: list[torch.Tensor]) -> bool:
    """Whether every row's outputs, called alone, are the bits it got in the call of all the rows."""
    return all(torch.equal(lin.matmul(x[r:r + 1])[0], y[r])
               for lin, x in zip(lins, inputs) for y in [lin.matmul(x)] for r in range(x.shape[0]))


def measure(kind: str, gen: torch.Generator) -> dict:
    copies = layers(kind, gen)
    dtype = torch.float32 if kind == "float32" else torch.bfloat16
    inputs = {rows: [torch.randn(rows, i, generator=gen).to(dtype) for _, i in LAYER] for rows in ROWS}
    first = copies[0]
    same = alone_equals_together(first, inputs[max(ROWS)])
    times = {rows: [] for rows in ROWS}
    for p in range(PASSES):
        for rows in ROWS if p % 2 == 0 else ROWS[::-1]:
            for lins in copies:
                start = time.perf_counter()
                for lin, x in zip(lins, inputs[rows]):
                    lin.matmul(x)
                times[rows].append((time.perf_counter() - start) * 1e6)
    us = {rows: sorted(t)[len(t) // 10] for rows, t in times.items()}
    return {"precision": kind, "kernel": first[0].backend.split(" (")[0].removesuffix(" kernel"), "us": us,
            "same": same}


def main() -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    kinds = [k for k in PRECISIONS if k != "w4a8" or native.w4a8_kernel()]  # w4a8 runs on our kernels only
    results = [measure(kind, gen) for kind in kinds]
    table = Table(title=f"A layer's 4 linears at 1-8 rows (SmolLM2, weights from memory, {torch.get_num_threads()} "
                        f"threads of {os.cpu_count()} CPUs): µs per layer, 10th percentile of {COPIES} x {PASSES}")
    for col in ("precision", "kernel", *(f"{r} row{'s' if r > 1 else ''}" for r in ROWS), "alone = in a call"):
        table.add_column(col, justify="left" if col in ("precision", "kernel") else "right")
    for r in results:
        base = r["us"][ROWS[0]]
        cells = [f"{r['us'][rows]:,.0f}" + ("" if rows == ROWS[0] else f" ({r['us'][rows] / base:.2f}x)")
                 for rows in ROWS]
        table.add_row(r["precision"], r["kernel"], *cells, "yes" if r["same"] else "NO")
    Console(width=max(Console().width, 120)).print(table)
    return results


if __name__ == "__main__":
    main()
