"""The roofline and capacity arithmetic: how fast decoding can go, and how many requests fit.

Decoding one step reads every weight once, plus every running request's KV cache, so
a step can take no less than ``bytes read / memory bandwidth``. Batching shares the
weight read among requests; the KV read grows with them. Capacity is the same
arithmetic on memory: bytes per token times tokens held.

``python -m stages.bench.roofline`` prints the article's worked example, then the same
figures for SmolLM2 on this machine (copy bandwidth and matmul rate measured by `machine`).
``--config PATH`` (a config.json or a checkpoint folder, repeatable; stages/bench/model_configs/ holds
the published configs of a few common models) prints, from the config alone, the weight bytes, KV bytes
per token, the memory a batch needs and the decode ceilings at ``--bandwidth`` GB/s: nothing is loaded.
"""
from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass

import torch
from rich.console import Console
from rich.table import Table

from common.config import kv_bytes
from common.paths import DEFAULT_MODEL

from .machine import measure_bandwidth, measure_compute

capacity = importlib.import_module("stages.paged_kv.capacity")  # how many requests fit: stage 03's lesson

GB = 1e9


def weight_bytes(num_params: float, bits: int) -> float:
    return num_params * bits / 8


def step_seconds(weights: float, bandwidth: float, kv_bytes: float = 0.0) -> float:
    """Lower bound on one decode step: every weight and every cached KV byte read once."""
    return (weights + kv_bytes) / bandwidth


def decode_tokens_per_s(weights: float, bandwidth: float, batch: int = 1, context: int = 0,
                        per_token: int = 0) -> float:
    """Ceiling on output tokens/s for ``batch`` requests each holding ``context`` cached tokens."""
    return batch / step_seconds(weights, bandwidth, batch * context * per_token)


@dataclass
class Article:
    """The article's illustrative 13B model on an 80 GB, 2,000 GB/s accelerator."""
    params: float = 13e9
    layers: int = 40
    kv_heads: int = 40
    head_dim: int = 128
    bandwidth: float = 2000 * GB
    cache_budget: float = capacity.ARTICLE_BUDGET  # 46 GB
    max_len: int = 2048
    avg_len: int = 400
    batch: int = 32

    def figures(self) -> dict[str, float]:
        w16, per_token = weight_bytes(self.params, 16), kv_bytes(self.layers, self.kv_heads, self.head_dim, 2)
        reserved = capacity.seqs_reserving(self.cache_budget, self.max_len, per_token)
        one = step_seconds(w16, self.bandwidth)  # the weights-only single-request step
        many = step_seconds(w16, self.bandwidth, self.batch * self.avg_len * per_token)
        return {
            "weights GB (16-bit)": w16 / GB, "weights GB (8-bit)": weight_bytes(self.params, 8) / GB,
            "tok/s, 1 request (weights only)": decode_tokens_per_s(w16, self.bandwidth),
            "tok/s, 32 requests (weights only)": decode_tokens_per_s(w16, self.bandwidth, self.batch),
            "KV GB read, 32 x 400 tokens": self.batch * self.avg_len * per_token / GB,
            "step cost vs 1 request": many / one,
            "tok/s, 32 x 400 tokens": decode_tokens_per_s(w16, self.bandwidth, self.batch, self.avg_len, per_token),
            "tok/s, 1 x 400 tokens": decode_tokens_per_s(w16, self.bandwidth, 1, self.avg_len, per_token),
            "KV bytes per token": per_token, "GB per 2,048-token sequence": self.max_len * per_token / GB,
            "sequences reserving 2,048": reserved,
            "sequences paged at 400": capacity.seqs_paged(self.cache_budget, self.avg_len, per_token),
            "KV GB read, 27 x 2,048 tokens": reserved * self.max_len * per_token / GB,
            "tok/s, 27 x 2,048 tokens": decode_tokens_per_s(w16, self.bandwidth, reserved, self.max_len, per_token),
        }


def edge_figures(params: float = 3e9, bandwidth: float = 100 * GB) -> dict[str, float]:
    """The article's on-device example: a 3B model at 100 GB/s."""
    out = {f"weights GB ({b}-bit)": weight_bytes(params, b) / GB for b in (16, 8, 4)}
    out.update({f"ms per token ({b}-bit)": 1e3 * step_seconds(weight_bytes(params, b), bandwidth) for b in (8, 4)})
    return out


def config_params(c) -> tuple[int, int]:
    """(parameters, parameters one decode step reads) of a ``common.config.ModelConfig``: an untied embedding
    table is read a row at a time, so a step reads the LM head but not the table; a tied one is both."""
    h, f, d = c.hidden_size, c.intermediate_size, c.head_dim
    q, kv = c.num_attention_heads * d, c.num_key_value_heads * d
    layer = h * (q + 2 * kv) + q * h + 3 * h * f + 2 * h  # projections, MLP, the two norms
    layer += (q + 2 * kv) * c.qkv_bias + h * c.o_bias + 2 * d * c.qk_norm
    table = c.vocab_size * h
    total = c.num_hidden_layers * layer + h + table * (1 if c.tie_word_embeddings else 2)
    return total, total - (0 if c.tie_word_embeddings else table)


def config_figures(c, bandwidths_gbs: list[float], batch: int = 32, context: int = 1024) -> dict[str, float]:
    """What a model needs and how fast it can decode, from its config alone (16-bit weights and KV)."""
    total, read = config_params(c)
    w16, r16, per_token = weight_bytes(total, 16), weight_bytes(read, 16), c.kv_bytes_per_token(2)
    out = {"parameters (millions)": total / 1e6, "weights GB (16-bit)": w16 / GB,
           "weights GB (8-bit, about)": weight_bytes(total, 8) / GB, "weight GB read per decode step": r16 / GB,
           "KV bytes per token (16-bit)": per_token,
           f"memory GB, weights + {batch} x {context:,} tokens of KV": (w16 + batch * context * per_token) / GB}
    for bw in bandwidths_gbs:
        out[f"tok/s at {bw:,.0f} GB/s, 1 request"] = decode_tokens_per_s(r16, bw * GB)
        out[f"tok/s at {bw:,.0f} GB/s, {batch} x {context:,} tokens"] = decode_tokens_per_s(
            r16, bw * GB, batch, context, per_token)
    return out


def read_config(path: str):
    """A ModelConfig from a checkpoint folder or a config.json file (refused, as at load, if not understood)."""
    import json
    from pathlib import Path

    from common.config import ModelConfig
    p = Path(path)
    return ModelConfig.from_folder(p) if p.is_dir() else ModelConfig.from_dict(json.loads(p.read_text()), str(p))


def table(title: str, figures: dict[str, float]) -> Table:
    t = Table(title=title)
    t.add_column("figure")
    t.add_column("value", justify="right")
    for k, v in figures.items():
        t.add_row(k, f"{v:,.0f}" if isinstance(v, int) else f"{v:,.3f}" if v < 10 else f"{v:,.2f}")
    return t


def machine_figures(model: str = DEFAULT_MODEL, dtype: str = "bfloat16", device: str = "cpu") -> dict[str, float]:
    from common.loader import load_model, parse_dtype
    from common.prepare import resolve_model
    llm = load_model(resolve_model(model), parse_dtype(dtype), torch.device(device))
    c, weights = llm.config, llm.weight_bytes
    per_token = c.kv_bytes_per_token(parse_dtype(dtype).itemsize)
    bw, (flops, _) = measure_bandwidth(device), measure_compute(device, parse_dtype(dtype))
    return {
        "weight MB": weights / 1e6, "KV bytes per token": per_token,
        "copy bandwidth GB/s": bw / GB, "matmul GFLOP/s": flops / 1e9,
        "decode ceiling tok/s, 1 request": decode_tokens_per_s(weights, bw),
        "decode ceiling tok/s, 16 x 400 tokens": decode_tokens_per_s(weights, bw, 16, 400, per_token),
        "compute ceiling tok/s (2 FLOP per weight)": flops / (2 * weights / parse_dtype(dtype).itemsize),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="auto", help="cpu, cuda, or auto (CUDA when torch sees a GPU)")
    ap.add_argument("--article-only", action="store_true")
    ap.add_argument("--config", action="append", default=[], help="a config.json or checkpoint folder: its figures "
                    "from the config alone (repeatable; e.g. stages/bench/model_configs/qwen3-0.6b.json)")
    ap.add_argument("--bandwidth", default="100,1000,4800", help="GB/s for --config's decode ceilings")
    ap.add_argument("--batch", type=int, default=32, help="--config: requests in flight")
    ap.add_argument("--context", type=int, default=1024, help="--config: tokens each holds")
    args = ap.parse_args()
    if args.config:
        bandwidths = [float(b) for b in args.bandwidth.split(",")]
        for path in args.config:
            c = read_config(path)
            Console().print(table(f"{path} ({c.family}, from its config alone)",
                                  config_figures(c, bandwidths, args.batch, args.context)))
        return
    from common.loader import resolve_device
    args.device = str(resolve_device(args.device))
    console = Console()
    console.print(table("The article's 13B example (illustrative inputs)", Article().figures()))
    console.print(table("The article's edge example: 3B at 100 GB/s", edge_figures()))
    if not args.article_only:
        console.print(table(f"{args.model} on this machine ({args.device}, {args.dtype})",
                            machine_figures(args.model, args.dtype, args.device)))
    if not args.article_only:
        console.print("Each precision measured (bytes, time per token, memory): python -m stages.bench.edge")


if __name__ == "__main__":
    main()
