"""Tokens per step by drafting method: the same requests, one at a time and in order, drafted by each method with
every draft fed, so the table shows what each proposer finds, not what the policy chose to feed. One at a time so
that suffix decoding's global tree holds the answers of the requests before (an agent's earlier turns).

`depth_rows` (``--draft-layers 4,8,16,30``): the int4 draft cut to its first N layers (early exit), for each N
beside stage 05 at 1 in flight: what it costs a pass, what it agrees, and what that buys. The edit requests are
sent without their prediction here, so the draft model drafts them; each run is timed the second time (the first
pays one-time costs)."""
from __future__ import annotations

import json
from dataclasses import replace

from rich.console import Console
from rich.table import Table

from stages import streaming

from .defaults import DRAFT_ALWAYS
from .engine import LLM
from .measure import kv_budget, machine_name
from .workloads import build

# suffix: spec factor 4 (vLLM's default is 1), chosen on extract, never on agentic (docs/speculative.md, 2026-12-07)
METHODS = {"ngram": DRAFT_ALWAYS, "ngram-8": {**DRAFT_ALWAYS, "num_speculative_tokens": 8},  # n-gram at suffix's k
           "ngram-vllm": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,  # vLLM's rule,
                          "prompt_lookup_max": 5, "enable_adaptive_verification": False},  # the old default
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
        for ngram in ("ngram", "ngram-8"):
            if (w, ngram) in by and (w, "suffix") in by and by[(w, ngram)]:
                console.print(f"  {w}: suffix decoding keeps {by[(w, 'suffix')] / by[(w, ngram)] - 1:+.0%} tokens per "
                              f"step against {ngram} (k={METHODS[ngram]['num_speculative_tokens']})")


def depth_rows(args, layers: list[int]) -> list[tuple]:
    """(workload, N, draft pass ms, target step ms, acceptance, tokens per step, fed, proposed, 05 tok/s, 06 tok/s,
    same tokens) for each workload and N, at 1 in flight; adaptive unless ``--draft-always``."""
    options = dict(dtype=args.dtype, quantization=args.quantization, max_num_seqs=1,
                   kv_cache_memory=kv_budget(args, 1), max_model_len=args.max_model_len)
    base, work = streaming.LLM(args.model, **options), {}
    base.generate([[1, 2, 3]], {"temperature": 0, "max_tokens": 2})  # one-time costs outside the timing
    for workload in args.workloads:
        prompts, params = build(workload, base.tokenizer, args.num_requests, args.max_tokens)
        params = [replace(p, prediction=None) for p in params]  # the draft model drafts, not the prediction
        base.generate(prompts, params)  # once untimed: the first run of a prompt's shapes pays one-time costs
        work[workload] = (prompts, params, base.generate(prompts, params), base.stats.output_tokens_per_s)
    del base
    rows = []
    for n in layers:
        config = {"method": "draft_model", "num_speculative_tokens": 4, "draft_num_layers": n,
                  **({"enable_adaptive_verification": False} if args.draft_always else {})}
        llm = LLM(args.model, speculative_config=json.dumps(config), **options)
        llm.generate([[1, 2, 3]], {"temperature": 0, "max_tokens": 2})
        draft, policy = llm.engine.scheduler.proposers[-1], llm.engine.scheduler.policy
        for workload, (prompts, params, expected, base_tps) in work.items():
            llm.generate(prompts, params)  # untimed, as stage 05's (the policy learns from it, as it would)
            before = dict(policy.counts) if policy is not None else {}
            got, s = llm.generate(prompts, params), llm.spec_stats
            proposed = policy.counts["proposed"] - before.get("proposed", 0) if policy is not None else s.drafted
            step = policy.cost.seconds(1, 1) * 1e3 if policy is not None else float("nan")
            rows.append((workload, n, draft.pass_cost.seconds(1) * 1e3, step, s.acceptance_rate,
                         s.mean_tokens_per_step, s.drafted, proposed, base_tps, llm.stats.output_tokens_per_s,
                         [o.token_ids for o in got] == [o.token_ids for o in expected]))
        del llm
    return rows


def depth_report(rows: list[tuple], args, console: Console) -> None:
    policy = "every draft fed" if args.draft_always else "the adaptive policy"
    t = Table(title=f"early exit: the int4 draft's first N layers and its head (draft_model, k=4, {policy}), 1 in "
                    f"flight, {args.model}, {args.dtype}, up to {args.max_tokens} new tokens; {machine_name()}")
    for name in ("workload", "draft layers", "draft pass ms", "target step ms", "acceptance", "tokens/step",
                 "drafts fed", "05 tok/s", "06 tok/s", "speedup", "same tokens"):
        t.add_column(name, justify="left" if name == "workload" else "right")
    for w, n, pass_ms, step_ms, acc, per_step, fed, proposed, base_tps, tps, same in rows:
        t.add_row(w, str(n), f"{pass_ms:.2f}",
                  f"{step_ms:.2f}" if step_ms == step_ms else "-", f"{acc:.1%}" if fed else "-", f"{per_step:.2f}",
                  f"{fed}/{proposed}", f"{base_tps:.1f}", f"{tps:.1f}", f"{tps / base_tps:.2f}x" if base_tps else "-",
                  "yes" if same else "NO")
    console.print(t)
    console.print("  draft pass ms / target step ms: one row, from the fitted lines the policy prices drafts by "
                  "(cost_model.py: PassCost, StepCost); edit is sent without its prediction, so the draft drafts it")
