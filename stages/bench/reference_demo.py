"""`python -m stages.bench.reference_demo`: the reference generator chatting on a few prompts, one request at a
time, with its speed."""
from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from common.paths import DEFAULT_MODEL
from common import ReferenceLLM, SamplingParams

QUESTIONS = [
    "What is the capital of France?",
    "Give me three tips for writing clear code.",
    "Explain in two sentences why the sky is blue.",
]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args(argv)
    console = Console()
    llm = ReferenceLLM(args.model, dtype=args.dtype)
    prompts = [llm.tokenizer.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=args.max_tokens), progress=True)
    table = Table(title=f"reference generator, {args.dtype}, one request at a time")
    for col in ("prompt tokens", "output tokens", "finish", "queued s", "TTFT s", "tokens/s"):
        table.add_column(col, justify="right")
    for q, o in zip(QUESTIONS, outs):
        console.print(f"[bold cyan]user:[/] {q}\n[bold green]assistant:[/] {o.text}\n")
        m = o.metrics
        queued = m.first_scheduled_time - m.arrival_time  # one at a time: the others wait
        table.add_row(str(o.num_prompt_tokens), str(o.num_output_tokens), o.finish_reason, f"{queued:.2f}",
                      f"{m.time_to_first_token:.3f}",
                      f"{o.num_output_tokens / (m.finished_time - m.first_scheduled_time):.1f}")
    console.print(table)
    console.print(f"overall: {llm.stats.output_tokens} tokens in {llm.stats.wall_seconds:.1f} s = "
                  f"{llm.stats.output_tokens_per_s:.1f} output tokens/s")


if __name__ == "__main__":
    main()
