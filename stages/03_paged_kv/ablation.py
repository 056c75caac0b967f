"""The ablation: stage 03's four ideas, each turned off in turn, on one workload and one KV budget.

Paging is always on (it is the stage); prefix caching, chunked prefill and preemption can be
switched off (`enable_prefix_caching`, `enable_chunked_prefill`, `enable_preemption`). Without
preemption a request is admitted only with blocks for the longest it can grow, so fewer run
at once; without prefix caching the shared system prompt is computed and stored once per
request; without chunked prefill a prompt waits for a step with room for all of it. Every
variant must still produce the same tokens: the table says whether it did.
"""
from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from stages import workloads
from stages.cli import make_llm
from stages.report import format_value, percentile

VARIANTS = {"all on": {}, "no prefix caching": {"no_prefix_caching": True},
            "no chunked prefill": {"no_chunked_prefill": True}, "no preemption": {"no_preemption": True}}


def ablate(args: argparse.Namespace, console: Console | None = None) -> tuple[dict[str, dict], dict[str, list]]:
    """Run the workload once per variant: a row of measured figures and the output tokens per variant."""
    console = console or Console()
    rows, tokens = {}, {}
    for name, off in VARIANTS.items():
        llm = make_llm("stages.03_paged_kv", argparse.Namespace(**{**vars(args), **off}))
        system = workloads.SYSTEM_PROMPT if args.system_prompt else None
        prompts, params = workloads.build(args.workload, llm.tokenizer, args.num_requests, args.max_tokens,
                                          llm.config.vocab_size, system=system)
        console.print(f"[bold]{name}[/]")
        outputs = llm.generate(prompts, params, progress=True)
        st, ok = llm.stats, [o for o in outputs if o.finish_reason != "error"]
        if not ok:  # a table of zeros would only hide the reason
            raise SystemExit(f"{name}: every request failed: {outputs[0].error}")
        ttft = [o.metrics.time_to_first_token for o in ok]
        tpot = [o.metrics.time_per_output_token for o in ok if o.metrics.time_per_output_token is not None]
        tokens[name] = [o.token_ids for o in outputs]
        rows[name] = {
            "requests done": len(ok), "steps": st.steps, "peak in flight": st.peak_running,
            "peak KV blocks used": max(st.block_timeline, default=0),
            "KV blocks": llm.engine.scheduler.block_manager.num_blocks,
            "tokens computed": st.prefill_tokens + st.decode_tokens, "output tokens": st.output_tokens,
            "prefix hit rate": st.prefix_hit_rate, "preemptions": st.preemptions,
            "TTFT p50 s": percentile(ttft, 50), "TTFT p99 s": percentile(ttft, 99),
            "TPOT p99 ms": 1e3 * percentile(tpot, 99) if tpot else float("nan"),
            "output tok/s": st.output_tokens_per_s,
        }
    base = tokens["all on"]
    for name in rows:
        rows[name]["same tokens as all on"] = tokens[name] == base
    return rows, tokens


def print_ablation(console: Console, rows: dict[str, dict], title: str) -> None:
    """The variants side by side, then each one against all on as ratios."""
    table = Table(title=title)
    table.add_column("metric")
    for name in rows:
        table.add_column(name, justify="right")
    for metric in next(iter(rows.values())):
        table.add_row(metric, *(("yes" if r[metric] else "NO") if isinstance(r[metric], bool)
                                else format_value(metric, r[metric]) for r in rows.values()))
    console.print(table)
    on = rows["all on"]
    for name, r in rows.items():
        if name != "all on":
            console.print(f"{name}: {r['tokens computed'] / on['tokens computed']:.2f}x the tokens computed, "
                          f"{r['steps'] / on['steps']:.2f}x the steps, "
                          f"{r['output tok/s'] / on['output tok/s']:.2f}x the output tok/s of all on")
