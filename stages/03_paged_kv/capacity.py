"""The capacity lesson, computed: how many sequences fit when reserving vs paging."""
from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from common.config import ModelConfig, kv_bytes
from common.loader import parse_dtype, parse_memory
from common.prepare import resolve_model

# The article's illustrative 13B model on an 80 GB GPU, 90% of it usable: 46 GB left for the cache after 26 GB of
# 16-bit weights (stages/bench/roofline.py: Article, the rest of its example).
ARTICLE_BUDGET = 46e9


def seqs_reserving(budget: float, max_len: int, per_token: int) -> int:
    """Sequences that fit when each reserves ``max_len`` tokens up front (stages 01-02)."""
    return int(budget // (max_len * per_token))


def seqs_paged(budget: float, avg_len: int, per_token: int, block_size: int = 16) -> int:
    """Sequences that fit when each holds whole blocks for the tokens it has (stage 03)."""
    blocks = -(-avg_len // block_size)
    return int(budget // (blocks * block_size * per_token))


def capacity(per_token: int, budget: float, max_len: int, avg_len: int, block_size: int) -> dict:
    return {
        "KV bytes per token": per_token, "KV budget bytes": int(budget),
        "max length (reserved per request)": max_len, "bytes per reservation": max_len * per_token,
        "sequences that fit, reserving": seqs_reserving(budget, max_len, per_token),
        "average length": avg_len, "block size": block_size,
        "sequences that fit, paged": seqs_paged(budget, avg_len, per_token, block_size),
    }


def print_capacity(console: Console, args: argparse.Namespace, avg_len: int = 160) -> None:
    rows = {"article 13B, 46 GB": capacity(kv_bytes(40, 40, 128, 2), ARTICLE_BUDGET,
                                           2048, 400, 16)}
    config = ModelConfig.from_folder(resolve_model(args.model))
    per_token = config.kv_bytes_per_token(parse_dtype(args.dtype).itemsize)
    max_len = args.max_model_len or min(config.max_position_embeddings, 2048)
    budget = parse_memory(args.kv_memory, args.device)
    rows[f"{args.model}, {args.kv_memory}"] = capacity(per_token, budget, max_len, avg_len, args.block_size)
    table = Table(title="Capacity: reserve the maximum length, or page at the average length")
    table.add_column("figure")
    for name in rows:
        table.add_column(name, justify="right")
    for label in next(iter(rows.values())):
        table.add_row(label, *(f"{r[label]:,}" for r in rows.values()))
    console.print(table)
