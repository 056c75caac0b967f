"""python -m stages.bench.invariance: what batch-invariant math buys, and what it costs.

The chat workload runs twice through the same math: once one request at a time (the
reference), once batched by stage 03. With plain torch math (``batch_invariant=False``:
one matmul per linear on the whole batch, torch's fused attention on a padded batch) the
kernels pick their blocking by shape, so a request's bits, then sooner or later its
tokens, depend on what it was batched with. With the engine's invariant math, none do.
The batched runs also give the price: invariant vs plain output tokens per second.
"""
from __future__ import annotations

import argparse
import statistics

from rich.console import Console
from rich.table import Table

from common.paths import DEFAULT_MODEL
from common import ReferenceLLM, SamplingParams
from stages import workloads


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where two outputs differ (None: identical)."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def compare(model: str, dtype: str, prompts: list, params: SamplingParams, max_num_seqs: int,
            batch_invariant: bool) -> dict:
    alone = ReferenceLLM(model, dtype=dtype, batch_invariant=batch_invariant).generate(prompts, params)
    from stages import paged_kv as paged
    llm = paged.LLM(model, dtype=dtype, max_num_seqs=max_num_seqs, batch_invariant=batch_invariant)
    batched = llm.generate(prompts, params)
    diverged = [d for d in (first_difference(a.token_ids, b.token_ids) for a, b in zip(alone, batched))
                if d is not None]
    return {"requests": len(prompts), "diverged": len(diverged), "first differing token": diverged,
            "output tok/s": llm.stats.output_tokens_per_s, "linears": llm.model.row_tile_note,
            "attention": llm.model.attention_note}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-num-seqs", type=int, default=32)
    args = ap.parse_args(argv)
    console = Console()
    tokenizer = ReferenceLLM(args.model, dtype=args.dtype).tokenizer
    prompts, _ = workloads.chat(tokenizer, args.num_requests)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    rows = {"plain torch math": compare(args.model, args.dtype, prompts, params, args.max_num_seqs, False),
            "batch-invariant math": compare(args.model, args.dtype, prompts, params, args.max_num_seqs, True)}
    table = Table(title=f"{args.num_requests} chat requests, up to {args.max_tokens} greedy tokens, {args.model}, "
                        f"{args.dtype}: batched by stage 03 ({args.max_num_seqs} in flight) vs one at a time")
    for col in ("math", "requests whose tokens changed", "first changed token (min / median)",
                "batched output tok/s"):
        table.add_column(col, justify="right")
    for name, r in rows.items():
        firsts = r["first differing token"]
        where = f"{min(firsts)} / {statistics.median(firsts):g}" if firsts else "-"
        table.add_row(name, f"{r['diverged']} of {r['requests']}", where, f"{r['output tok/s']:.1f}")
    console.print(table)
    plain, invariant = rows["plain torch math"], rows["batch-invariant math"]
    console.print(f"price of invariance: {invariant['output tok/s'] / plain['output tok/s']:.2f}x the plain math's "
                  f"throughput ({invariant['linears']}; {invariant['attention']})")
    return rows


if __name__ == "__main__":
    main()
