"""What a precision costs in quality: perplexity on a fixed text and agreement with bfloat16.

    python -m stages.bench.quality                       # SmolLM2: bfloat16, int8, int4, w4a8
    python -m stages.bench.quality --prompts 16 --tokens 64 --window 1024

* perplexity: exp(mean negative log-likelihood) of each token of a public-domain text
  (``tests/data``: two chapters of *Pride and Prejudice*), scored in windows of ``--window``
  tokens that do not overlap (each window's first token is context only);
* top-1 agreement on the text: how often the precision's most likely next token is
  bfloat16's, position by position (teacher-forced, so one difference does not cascade);
* greedy agreement: ``--prompts`` chat prompts, ``--tokens`` new tokens each (EOS ignored):
  how many continuations are identical to bfloat16's, and the mean length of the common prefix.

Quality figures, not timings: it is safe to run anywhere.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from common.paths import DEFAULT_MODEL
from common.kv_cache import ContiguousKVCache
from common.reference import ReferenceLLM
from common.sampling import SamplingParams
from stages.workloads import CHAT_QUESTIONS

TEXT = Path(__file__).resolve().parents[2] / "tests" / "data" / "pride_and_prejudice_ch2-3.txt"
PRECISIONS = (None, "int8", "int4", "w4a8")


def label(quantization: str | None) -> str:
    return quantization or "bfloat16"


def text_ids(llm: ReferenceLLM, path: Path = TEXT) -> list[int]:
    return llm.tokenizer.encode(path.read_text(encoding="utf-8"))


@torch.inference_mode()
def window_logits(llm: ReferenceLLM, ids: list[int]) -> torch.Tensor:
    """Float32 logits [len(ids), vocab]: one prefill of the window."""
    cache = ContiguousKVCache(llm.config, 1, len(ids), llm.dtype, llm.device)
    cache.prepare([0], [len(ids)], [len(ids)])
    hidden = llm.model.forward(torch.tensor(ids, device=llm.device), torch.arange(len(ids), device=llm.device), cache)
    return llm.model.compute_logits(hidden)


def score_text(llm: ReferenceLLM, ids: list[int], window: int) -> tuple[float, torch.Tensor]:
    """(perplexity, argmax next token at each scored position)."""
    nll, count, top1 = 0.0, 0, []
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start:start + window]
        if len(chunk) < 2:
            break
        logits = window_logits(llm, chunk)[:-1]
        target = torch.tensor(chunk[1:], device=logits.device)
        nll += torch.nn.functional.cross_entropy(logits, target, reduction="sum").item()
        count += len(chunk) - 1
        top1.append(logits.argmax(-1).cpu())
    return math.exp(nll / count), torch.cat(top1)


def chat_prompts(llm: ReferenceLLM, n: int) -> list[list[int]]:
    if n > len(CHAT_QUESTIONS):
        raise ValueError(f"at most {len(CHAT_QUESTIONS)} prompts")
    return [llm.tokenizer.encode(llm.tokenizer.apply_chat_template([{"role": "user", "content": q}]))
            for q in CHAT_QUESTIONS[:n]]


def greedy(llm: ReferenceLLM, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    return [o.token_ids for o in llm.generate(prompts, params)]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def measure(model: str = DEFAULT_MODEL, precisions=PRECISIONS, prompts: int = 16, tokens: int = 64,
            window: int = 1024, text: Path = TEXT, max_text_tokens: int | None = None) -> dict[str, dict]:
    """Figures per precision; the first precision is the baseline the agreements compare to. w4a8 is skipped
    where our kernels did not build (it has no other)."""
    from common.numerics import native
    rows, base = {}, None
    for q in [q for q in precisions if q != "w4a8" or native.w4a8_kernel()]:
        llm = ReferenceLLM(model, dtype="bfloat16", quantization=q)
        ids = text_ids(llm, text)[:max_text_tokens]
        ppl, top1 = score_text(llm, ids, window)
        outs = greedy(llm, chat_prompts(llm, prompts), tokens) if prompts else []
        if base is None:
            base = top1, outs
        row = {"text tokens": len(ids), "perplexity": ppl,
               "top-1 agreement on text": (top1 == base[0]).float().mean().item()}
        if prompts:
            row["identical continuations"] = sum(o == b for o, b in zip(outs, base[1]))
            row["mean common prefix"] = sum(common_prefix(o, b) for o, b in zip(outs, base[1])) / len(outs)
        row["weight MB"] = llm.model.weight_bytes / 1e6
        rows[label(q)] = row
        del llm
    return rows


def format_figure(figure: str, v, prompts: int) -> str:
    if "agreement" in figure:
        return f"{v:.2%}"
    if isinstance(v, float):
        return f"{v:,.3f}"
    return f"{v}/{prompts}" if "continuations" in figure else f"{v:,}"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--window", type=int, default=1024)
    args = ap.parse_args(argv)
    rows = measure(args.model, PRECISIONS, args.prompts, args.tokens, args.window)
    first = next(iter(rows))
    table = Table(title=f"{args.model}: quality per precision ({TEXT.name}; {args.prompts} prompts x "
                        f"{args.tokens} greedy tokens, compared to {first})")
    table.add_column("figure")
    for name in rows:
        table.add_column(name, justify="right")
    for figure in next(iter(rows.values())):
        cells = [rows[n][figure] for n in rows]
        table.add_row(figure, *(format_figure(figure, v, args.prompts) for v in cells))
    Console().print(table)
    return rows


if __name__ == "__main__":
    main()
