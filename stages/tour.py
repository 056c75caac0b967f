"""python -m stages tour: the interview walkthrough, the article's four jobs run live with this machine's figures.

Prepare (bytes per precision, load time, what int8/int4 cost in perplexity), schedule (the toy timeline: static
vs continuous), cache (the article's reserved vs paged capacity, SmolLM2's on this machine, a block table as it
grows), kernels and streaming (the decode ceiling from measured bandwidth, a decode step's achieved bytes per
second against it, TTFT and TPOT). Then the Staff-level answer with the measured figures, common mistakes each
answered by a measurement, and the variants pointed at the stages that answer them. Every figure comes from the
engine's counters or a measurement made here, never typed in: ``tour`` returns them for the test to check.
``--quick`` runs the tiny model (seconds); the default, SmolLM2-135M.
"""
from __future__ import annotations

import argparse
import importlib
import time

from rich.console import Console
from rich.table import Table

from common.paths import DEFAULT_MODEL
from common import ReferenceLLM, SamplingParams
from common.loader import parse_memory
from stages import workloads
from stages.bench import machine, quality, roofline
from stages.report import print_timeline

STAGE = {n: f"stages.{n}" for n in ("01_static_batch", "02_continuous_batch", "03_paged_kv", "05_streaming")}


def stage(name: str):
    return importlib.import_module(STAGE[name])


def table(title: str, columns: list[str], rows: list[list]) -> Table:
    t = Table(title=title)
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*(f"{v:,.3f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v) for v in r))
    return t


def prepare(console: Console, model: str, text_tokens: int) -> tuple[dict, ReferenceLLM]:
    """The precision table, and the bfloat16 reference it loaded, which the later sections reuse."""
    console.rule("1. Prepare: bytes per precision, load time, what quantizing costs")
    out, ids, ref = {}, None, None
    for q in (None, "int8", "int4"):
        start = time.perf_counter()
        llm = ReferenceLLM(model, dtype="bfloat16", quantization=q)
        load = time.perf_counter() - start
        ref = ref or llm
        ids = ids or quality.text_ids(llm)[:text_tokens]
        ppl, _ = quality.score_text(llm, ids, window=len(ids))
        out[quality.label(q)] = {"weight bytes": llm.model.weight_bytes, "load s": load, "perplexity": ppl}
    base = out["bfloat16"]["perplexity"]
    console.print(table(f"{model}: perplexity on the first {len(ids)} tokens of Pride and Prejudice",
                        ["precision", "weight bytes", "load s", "perplexity", "vs bfloat16"],
                        [[k, v["weight bytes"], v["load s"], v["perplexity"], f"{v['perplexity'] / base - 1:+.1%}"]
                         for k, v in out.items()]))
    return out, ref


def schedule(console: Console) -> dict:
    console.rule("2. Schedule: the toy run, static vs continuous (tiny model: the toy is about steps)")
    prompts, params = workloads.toy()
    out = {}
    for name, label in (("01_static_batch", "01 static"), ("02_continuous_batch", "02 continuous")):
        llm = stage(name).LLM("tiny", max_num_seqs=4)
        llm.generate(prompts, params)
        print_timeline(console, label, list(llm.timeline))
        out[name] = llm.stats.steps
    console.print(f"static {out['01_static_batch']} steps -> continuous {out['02_continuous_batch']} steps "
                  f"for the same {sum(workloads.TOY_LENGTHS)} tokens")
    console.print("See it step by step: python -m stages.01_static_batch --toy --xray toy.html (open it in a browser)")
    return out


def cache(console: Console, model: str, prompt: list[int]) -> tuple[dict, object]:
    """The capacity table and a block table as it grows; and the stage-03 engine, which `same_tokens` reuses."""
    console.rule("3. Cache: reserve the maximum, or page what is written")
    a = roofline.Article().figures()
    out = {"article reserving": a["sequences reserving 2,048"], "article paged": a["sequences paged at 400"]}
    llm = stage("03_paged_kv").LLM(model, block_size=16)
    per_token, budget = llm.config.kv_bytes_per_token(llm.model.dtype.itemsize), parse_memory("0.1", "cpu")
    out["smollm2 reserving"] = roofline.capacity.seqs_reserving(budget, 2048, per_token)
    out["smollm2 paged"] = roofline.capacity.seqs_paged(budget, 400, per_token)
    console.print(table("Sequences that fit", ["model, KV budget", "reserving 2,048", "paged at 400"],
                        [["article 13B, 46 GB", out["article reserving"], out["article paged"]],
                         [f"{model}, 10% of this machine's free RAM ({budget / 1e9:.1f} GB)", out["smollm2 reserving"],
                          out["smollm2 paged"]]]))
    growth = []

    class Growth:  # an observer: the block table after each step that changed it
        def on_step(self, event):
            for s in event.seqs:
                table_now = event.state.blocks.tables.get(s.seq_id, [])
                if s.finish_reason is None and (not growth or growth[-1][1] != table_now):
                    growth.append((s.start + s.fed, list(table_now)))

    watcher = llm.add_observer(Growth())
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    llm.remove_observer(watcher)
    for tokens, blocks in growth:
        console.print(f"  {tokens:>4} tokens computed -> block table {blocks}")
    out["block table growth"] = growth
    console.print("See the pool fill and preempt: python -m stages.03_paged_kv --alone --model tiny --num-requests 12 "
                  "--max-tokens 48 --kv-memory 512KiB --max-num-seqs 8 --xray paged.html")
    return out, llm


def kernels_and_streaming(console: Console, model: str, prompt: list[int], mb: int) -> dict:
    console.rule("4. Kernels and streaming: the decode ceiling, a step against it, TTFT and TPOT")
    llm = stage("05_streaming").LLM(model)
    weights = llm.model.weight_bytes
    bandwidth = machine.measure_read_bandwidth("cpu" if llm.device.type == "cpu" else str(llm.device), mb)
    chunks = list(llm.stream(prompt, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)))
    m = chunks[-1].metrics
    tpot, ttft = m.time_per_output_token, m.time_to_first_token
    context = len(prompt) + 16  # the mean context of the decode steps
    step_bytes = weights + context * llm.config.kv_bytes_per_token(llm.model.dtype.itemsize)
    out = {"read bandwidth GB/s": bandwidth / 1e9, "weight bytes": weights,
           "ceiling tok/s": bandwidth / step_bytes, "achieved tok/s": 1 / tpot,
           "achieved GB/s": step_bytes / tpot / 1e9, "TTFT s": ttft, "TPOT ms": tpot * 1e3,
           "chunks": len(chunks), "tokens": sum(len(c.token_ids) for c in chunks)}
    out["fraction of ceiling"] = out["achieved tok/s"] / out["ceiling tok/s"]
    console.print(table("One request decoding, stage 05", ["figure", "value"], [[k, v] for k, v in out.items()]))
    llm.shutdown()
    return out


def same_tokens(ref: ReferenceLLM, paged, prompts: list[list[int]]) -> dict:
    """The reference one request at a time against stage 03's engine batching all of them (the first prompt's
    blocks still in its prefix cache from section 3)."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    expected = [o.token_ids for o in ref.generate(prompts, params)]
    got = [o.token_ids for o in paged.generate(prompts, params)]
    return {"requests": len(prompts), "identical": sum(a == b for a, b in zip(expected, got))}


def tour(quick: bool = False, console: Console | None = None) -> dict:
    console = console or Console()
    model = "tiny" if quick else DEFAULT_MODEL
    figures = {"model": model}
    figures["prepare"], ref = prepare(console, model, 128 if quick else 512)  # each model is loaded once
    prompts = quality.chat_prompts(ref, 4)
    figures["schedule"] = schedule(console)
    figures["cache"], paged = cache(console, model, prompts[0])
    figures["kernels"] = kernels_and_streaming(console, model, prompts[0], 64 if quick else 1024)
    figures["same tokens"] = same_tokens(ref, paged, prompts)
    answer(console, figures)
    return figures


def answer(console: Console, f: dict) -> None:
    p, s, c, k, same = f["prepare"], f["schedule"], f["cache"], f["kernels"], f["same tokens"]
    console.rule("The Staff-level answer, with this machine's figures")
    console.print(
        f"Decoding is memory-bound: each step reads every weight ({p['bfloat16']['weight bytes']:,} bytes in "
        f"bfloat16, {p['int8']['weight bytes']:,} in int8, {p['int4']['weight bytes']:,} in int4), so at "
        f"{k['read bandwidth GB/s']:.1f} GB/s one request can decode at most {k['ceiling tok/s']:.0f} tokens/s; "
        f"this engine reaches {k['achieved tok/s']:.0f} ({k['fraction of ceiling']:.0%} of it; TTFT "
        f"{k['TTFT s']:.3f} s, TPOT {k['TPOT ms']:.1f} ms). Batching shares that read: continuous batching cut the "
        f"toy run from {s['01_static_batch']} to {s['02_continuous_batch']} steps, and paging fits "
        f"{c['smollm2 paged']:,} sequences where reserving fits {c['smollm2 reserving']:,} (the article's "
        f"{c['article reserving']} vs {c['article paged']}).")
    console.rule("Common mistakes, each answered by a measurement")
    console.print(f"* \"Paging changes the answers\": {same['identical']} of {same['requests']} requests gave "
                  f"identical tokens in stage 03 and in the one-at-a-time reference.")
    console.print(f"* \"Quantizing is free\": int8 moves perplexity by "
                  f"{p['int8']['perplexity'] / p['bfloat16']['perplexity'] - 1:+.1%}, int4 by "
                  f"{p['int4']['perplexity'] / p['bfloat16']['perplexity'] - 1:+.1%}.")
    console.print(f"* \"Static batching is as good\": {s['01_static_batch']} vs {s['02_continuous_batch']} steps for "
                  f"the same tokens.")
    console.rule("Variants")
    console.print("* A toy engine: stages 01-03 (python -m stages.lab start 01, 02, 03).\n"
                  "* A TensorRT-style build step: stage 04's compile and kernel cache (stages/04_kernels).\n"
                  "* An edge device: the precision table above (python -m stages.bench.edge).")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m stages tour", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the tiny model (seconds) instead of SmolLM2-135M")
    args = ap.parse_args(argv)
    return tour(args.quick)
