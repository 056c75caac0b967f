"""Several chat requests streaming side by side in a live terminal view, then their latency figures."""
from __future__ import annotations

import queue

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.columns import Columns

from stages.report import percentile
from common.sampling import SamplingParams

from .engine import LLM

QUESTIONS = ["What is the capital of France?", "Write a haiku about autumn leaves.",
             "Give me three tips for writing clear code.", "Explain in two sentences why the sky is blue.",
             "How do vaccines work?", "Suggest a name for a bakery that sells only croissants."]


def run_demo(llm: LLM, max_tokens: int = 96, console: Console | None = None) -> list[dict]:
    console = console or Console()
    prompts = [llm.tokenizer.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    streams = [llm.add_request(p, params) for p in prompts]  # all join the running batch at once
    texts, done, finals = [""] * len(streams), [False] * len(streams), [None] * len(streams)

    def view():
        panels = [Panel(texts[i] or "[dim]waiting for the first token…[/]", width=max(30, console.width // 3 - 1),
                        title=f"[bold]{QUESTIONS[i][:34]}[/]", border_style="green" if done[i] else "cyan",
                        height=9) for i in range(len(streams))]
        return Group(Columns(panels), f"{sum(done)} of {len(streams)} finished")

    with Live(view(), console=console, refresh_per_second=15, transient=False) as live:
        while not all(done):
            llm.loop.run_step()  # one engine step, on this thread: every stream that ran gets its new text
            for i, stream in enumerate(streams):
                while not done[i]:
                    try:
                        chunk = stream.chunks.get_nowait()
                    except queue.Empty:
                        break
                    texts[i] += chunk.text
                    if chunk.finish_reason is not None:
                        done[i], finals[i] = True, chunk
            live.update(view())
    rows = []
    table = Table(title=f"streaming: {len(streams)} requests, {str(llm.dtype).removeprefix('torch.')}")
    table.add_column("request", no_wrap=True, max_width=36)
    for col in ("tokens", "finish", "TTFT s", "TPOT ms", "tokens/s"):
        table.add_column(col, justify="right")
    for q, stream, final in zip(QUESTIONS, streams, finals):
        m = final.metrics
        n = len(stream.seq.output_token_ids)
        tpot = m.time_per_output_token
        rows.append({"ttft": m.time_to_first_token, "tpot": tpot, "tokens": n, "e2e": m.e2e_latency})
        table.add_row(q, str(n), final.finish_reason, f"{m.time_to_first_token:.2f}",
                      f"{1e3 * tpot:.0f}" if tpot else "-", f"{n / m.e2e_latency:.1f}")
    console.print(table)
    total = sum(r["tokens"] for r in rows)
    wall = max(r["e2e"] for r in rows)
    console.print(f"TTFT p50 {percentile([r['ttft'] for r in rows], 50):.2f} s; "
                  f"{total} tokens in {wall:.1f} s = {total / wall:.1f} output tokens/s across the batch")
    three_ways(llm, prompts[0], QUESTIONS[0], max_tokens, console)
    return rows


def three_ways(llm: LLM, prompt: str, question: str, max_tokens: int, console: Console) -> None:
    """One question answered greedily (a small model often loops), with vLLM's repetition penalty, and sampled
    three times (n=3: the samples share the prompt's KV blocks, each with its own seed)."""
    ways = [("greedy", SamplingParams(temperature=0, max_tokens=max_tokens)),
            ("greedy, repetition_penalty=1.3", SamplingParams(temperature=0, max_tokens=max_tokens,
                                                              repetition_penalty=1.3)),
            ("sampled, n=3, temperature=0.8, seed=0", SamplingParams(temperature=0.8, seed=0, n=3,
                                                                    max_tokens=max_tokens))]
    outputs = llm.generate([prompt] * len(ways), [p for _, p in ways])
    table = Table(title=f"one question three ways: {question}")
    table.add_column("sampling", no_wrap=True)
    table.add_column("answer")
    for (name, _), out in zip(ways, outputs):
        for c in out.outputs:
            table.add_row(name + (f" #{c.index}" if len(out.outputs) > 1 else ""), c.text.strip())
    console.print(table)
