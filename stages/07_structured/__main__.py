"""python -m stages.07_structured [demo | serve --host H --port P | coverage [--out F.json] [--generate N]]

demo: the schema suite (30 constrained requests) on SmolLM2 with every output checked, the tokens the grammar forced
(steps with and without), the mask's cost per request per step, and the time per output token with and without a
constraint at each --in-flight limit, with each piece of a step's time (forward, mask fill, apply, forced look-ahead,
sampler; --time-only: that table alone); serve: stage 05's OpenAI-compatible server on this stage's engine
(response_format json_schema / json_object, vLLM's structured_outputs); coverage: JSONSchemaBench's schemas
compiled by each backend, and with --generate N greedy outputs validated (coverage.py)."""
from __future__ import annotations

import argparse
import json
from statistics import median

from rich.console import Console
from rich.table import Table

from common.paths import DEFAULT_MODEL
from common.sampling import SamplingParams
from common.validate import InvalidParam
from stages.cli import device_arg
from stages.xray import cli as xray
from stages.structured.bench import PIECES, chat_ids, mask_cost, per_step, pieces, run_suite, summary, time_per_token
from stages.structured.engine import LLM
from stages.structured.suite import CASES


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("command", nargs="?", default="demo", choices=["demo", "serve", "coverage"])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--device", default="auto", type=device_arg)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512,
                    help="tokens one step feeds, prompt chunks and decodes together (vLLM's CPU server: 2048)")
    ap.add_argument("--kv-memory", default="512MiB", help="KV budget: bytes, '256MiB', or a fraction of free memory")
    ap.add_argument("--num-forced-tokens", type=int, default=16, help="most forced tokens fed in one step (0: none)")
    ap.add_argument("--grammar-cache-mb", type=float, default=256,
                    help="compiled grammars kept, MiB (least recently used out first; grammar_cache.py)")
    ap.add_argument("--grammar-compile-budget-s", type=float, default=2.0,
                    help="seconds a grammar may take to compile; past them its request fails alone (coverage: "
                         "a slower compile is counted refused)")
    ap.add_argument("--in-flight", default="1,16,64", help="demo: the in-flight limits the time per token is taken at")
    ap.add_argument("--forced-budget-us", type=float, default=2000,
                    help="the forced tokens' look-ahead a step: a request's starts while less is spent (-1: no bound)")
    ap.add_argument("--time-only", action="store_true", help="demo: the time per output token table alone")
    ap.add_argument("--rounds", type=int, default=3, help="demo: the time per token's runs, taken in turn N times")
    ap.add_argument("--max-tokens", type=int, default=160, help="demo: tokens per answer at most")
    ap.add_argument("--structured-outputs-config.backend", dest="backend", default="auto",
                    choices=["auto", "xgrammar", "guidance", "fsm"], help="the grammar backend (vLLM's names)")
    ap.add_argument("--out", default=None, help="coverage: write the report (JSON) there")
    ap.add_argument("--limit", type=int, default=None, help="coverage: the first N schemas of each split")
    ap.add_argument("--splits", default=None, help="coverage: these splits only (comma-separated)")
    ap.add_argument("--generate", type=int, default=0, help="coverage: greedy outputs for N schemas, validated")
    ap.add_argument("--compact", action="store_true", help="coverage --generate: disable_any_whitespace")
    ap.add_argument("--auto-only", action="store_true", help="coverage: xgrammar only where llguidance refuses")
    ap.add_argument("--speculative-config", default=None, type=json.loads,
                    help="serve: speculative decoding as vLLM's JSON (predictions draft only with it), e.g. "
                         "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--api-key", default=None)
    xray.add_arguments(ap)  # demo: the schema suite's runs with forced tokens
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1 (got {args.rounds}): the runs are taken in turn that many times")
    if args.command == "coverage":
        return coverage_command(args)
    if args.command == "demo" and args.time_only:
        return per_token(args, Console())
    try:
        llm = make_llm(args)
    except InvalidParam as e:
        raise SystemExit(f"error: {e}") from None
    if args.command == "serve":
        from stages.streaming.server.shutdown import serve  # stage 05's server
        try:
            serve(llm, args.host, args.port, args.served_model_name or args.model, api_key=args.api_key)
        finally:
            llm.shutdown()
        return
    recorder = xray.recorder(args, {"model": args.model, "workload": "schema suite"})
    demo(llm, make_llm(args, num_forced_tokens=0), args, Console(), recorder)
    if recorder is not None:
        xray.write_outputs(recorder, args)


def make_llm(args, **changes) -> LLM:
    """This stage's engine with the command line's options (``changes``: another in-flight limit, no forced tokens)."""
    options = dict(dtype=args.dtype, device=args.device, max_num_seqs=args.max_num_seqs, kv_cache_memory=args.kv_memory,
                   max_num_batched_tokens=args.max_num_batched_tokens,
                   num_forced_tokens=args.num_forced_tokens, structured_outputs_config={"backend": args.backend},
                   grammar_cache_mb=args.grammar_cache_mb, grammar_compile_budget_s=args.grammar_compile_budget_s,
                   forced_budget_us=None if args.forced_budget_us < 0 else args.forced_budget_us)
    if getattr(args, "speculative_config", None):
        options["speculative_config"] = args.speculative_config
    return LLM(args.model, **{**options, **changes})


def coverage_command(args) -> None:
    """Compiling needs the tokenizer only; the model loads for --generate."""
    from common.config import ModelConfig
    from common.prepare import resolve_model
    from stages.structured.coverage import main as coverage
    folder = str(resolve_model(args.model))
    config = ModelConfig.from_folder(folder)
    coverage(args, make_llm, folder, config.vocab_size, tuple(sorted(config.eos_token_ids or [config.eos_token_id])))


def demo(llm, plain_llm, args, console: Console, recorder=None) -> None:
    """``llm`` feeds forced tokens, ``plain_llm`` decodes one masked token a step: the same outputs, other steps."""
    console.print(f"[bold]stage 07[/] on {args.model}, {args.dtype}: the schema suite, {len(CASES)} requests")
    for compact in (False, True):
        plain = run_suite(plain_llm, args.max_tokens, compact)
        if recorder is not None:  # the X-ray (--xray/--trace): the suite with forced tokens, step by step
            llm.add_observer(recorder)
            recorder.begin_run("07 compact JSON" if compact else "07 JSON", {"requests": len(CASES)})
        forced = run_suite(llm, args.max_tokens, compact)
        if recorder is not None:
            recorder.end_run(write=False)
            llm.remove_observer(recorder)
        same = [o.token_ids for o in plain.outputs] == [o.token_ids for o in forced.outputs]
        label = "compact JSON (disable_any_whitespace)" if compact else "JSON with free whitespace (vLLM's default)"
        table = Table(title=label)
        for col in ("case", "output", "check"):
            table.add_column(col, overflow="fold")
        for name, out, problem in zip(forced.names, forced.outputs, forced.problems):
            table.add_row(name, out.text[:120], "[green]ok[/]" if problem is None else f"[red]{problem}[/]")
        console.print(table)
        valid = sum(p is None for p in forced.problems)
        console.print(f"{valid} of {len(CASES)} outputs parse and match. {forced.output_tokens} tokens: with forced "
                      f"tokens {forced.output_tokens - forced.accepted} request-steps (one per token not fed as a "
                      f"kept draft; {forced.accepted} of {forced.drafted} drafts kept: "
                      f"{forced.accepted / max(1, forced.output_tokens):.1%} of the tokens), without "
                      f"{plain.output_tokens}; engine steps {forced.steps} / {plain.steps}; same tokens: "
                      f"{'yes' if same else 'NO'}")
        costs = mask_cost(llm, forced, compact=compact)
        table = Table(title=f"the mask per request per step, µs ({label})")
        for col in ("constraint", "steps", "p50", "p99", "mean"):
            table.add_column(col, justify="right")
        for kind, values in costs.items():
            p50, p99, mean = summary(values)
            table.add_row(kind, str(len(values)), f"{p50:.0f}", f"{p99:.0f}", f"{mean:.0f}")
        console.print(table)
    per_token(args, console)


def per_token(args, console: Console) -> None:
    """The JSON cases at each in-flight limit: unconstrained (the same number of tokens per request, EOS ignored),
    constrained one token a step, constrained with forced tokens; with each piece's time per step (bench.pieces).
    The three runs take turns, --rounds times: this VM's speed drifts over a minute, so each round's ratio is taken
    against that round's unconstrained run, and the median of the rounds is printed (the rounds' spread beside it)."""
    json_cases = [c for c in CASES if "json" in c[2]]
    table = Table(title=f"time per output token, ms (after each request's first; the median of {args.rounds} "
                        "rounds), and each piece's µs per step")
    for col in ("in flight", "run", "ms / token", "vs unconstrained", "rounds' range", "steps", *PIECES,
                "mask p99 / row"):
        table.add_column(col, justify="right")
    for limit in [int(x) for x in args.in_flight.split(",")]:
        plain_llm, llm = (make_llm(args, max_num_seqs=limit, num_forced_tokens=n) for n in (0, args.num_forced_tokens))
        cases = (json_cases * (limit // len(json_cases) + 1))[:max(limit, 4)]
        prompts = [chat_ids(llm, prompt) for _, prompt, _ in cases]
        constrained = [SamplingParams(temperature=0, max_tokens=args.max_tokens, structured_outputs=so)
                       for _, _, so in cases]
        lengths = [len(o.token_ids) for o in plain_llm.generate(prompts, constrained)]  # also warms the grammar cache
        llm.generate(prompts, constrained)  # warm too: a cold prefix cache prefilled 2x the rows (docs/structured.md)
        free = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
        runs = (("unconstrained", plain_llm, free), ("JSON schema", plain_llm, constrained),
                ("JSON + forced", llm, constrained))
        got = {name: [] for name, _, _ in runs}  # name -> per round (ms, ratio, steps, cost)
        for _ in range(args.rounds):
            base = None  # this round's unconstrained ms / token
            for name, engine, params in runs:
                before = pieces(engine)
                ms, _, steps = time_per_token(engine, prompts, params)
                base = base or ms
                got[name].append((ms, ms / base - 1, steps, per_step(before, pieces(engine))))
        for name, rounds in got.items():
            ratios = sorted(r[1] for r in rounds)
            cost = {k: median([r[3][k] for r in rounds]) for k in (*PIECES, "mask p99")}
            table.add_row(str(limit), name, f"{median([r[0] for r in rounds]):.2f}", f"{median(ratios):+.1%}",
                          f"{ratios[0]:+.1%} .. {ratios[-1]:+.1%}", str(rounds[-1][2]),
                          *(f"{cost[k]:.0f}" for k in PIECES), f"{cost['mask p99']:.0f}")
    console.print(table)


if __name__ == "__main__":
    main()
