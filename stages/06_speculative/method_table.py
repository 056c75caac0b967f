"""Tokens per step by drafting method: the same requests, one at a time and in order, drafted by each method with
every draft fed, so the table shows what each proposer finds, not what the policy chose to feed. One at a time so
that suffix decoding's global tree holds the answers of the requests before (an agent's earlier turns)."""
from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from .defaults import DRAFT_ALWAYS
from .engine import LLM
from .measure import kv_budget
from .workloads import build

# suffix: spec factor 4 (vLLM's default is 1), chosen on extract, never on agentic (docs/speculative.md, 2026-12-07)
METHODS = {"ngram": DRAFT_ALWAYS,
           "suffix": {"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_spec_factor": 4.0,
                      "enable_adaptive_verification": False}}


def method_rows(args, methods: list[str]) -> list[tuple]:
    """(workload, method, acceptance, tokens per step, drafts per step) for each workload and method."""
    rows = []
    for method in methods:
        llm = LLM(args.model, dtype=args.dtype, quantization=args.quantization, max_num_seqs=1,
                  kv_cache_memory=kv_budget(args, 1), max_model_len=args.max_model_len,
                  speculative_config=json.dumps(METHODS[method]))
        for workload in args.workloads:
            prompts, params = build(workload, llm.tokenizer, args.num_requests, args.max_tokens)
            llm.generate(prompts, params)
            s = llm.spec_stats
            steps = sum(s.decode_steps.values()) or 1
            rows.append((workload, method, s.acceptance_rate, s.mean_tokens_per_step, s.drafted / steps))
        del llm
    return rows


def report(rows: list[tuple], console: Console) -> None:
    t = Table(title="tokens per decoding step by method (1 in flight, requests in order, every draft fed)")
    for name in ("workload", "method", "acceptance", "tokens/step", "drafted/step"):
        t.add_column(name, justify="left" if name in ("workload", "method") else "right")
    for workload, method, acceptance, per_step, drafted in rows:
        t.add_row(workload, method, f"{acceptance:.1%}", f"{per_step:.2f}",
                  f"{drafted:.2f}")
    console.print(t)
    for method in dict.fromkeys(m for _, m, *_ in rows):
        console.print(f"  {method}: {json.dumps(METHODS[method])}")
    by = {(w, m): tps for w, m, _, tps, _ in rows}
    for w in dict.fromkeys(w for w, *_ in rows):
        if (w, "ngram") in by and (w, "suffix") in by and by[(w, "ngram")]:
            console.print(f"  {w}: suffix decoding keeps {by[(w, 'suffix')] / by[(w, 'ngram')] - 1:+.0%} tokens per "
                          f"step against n-gram")
