"""python -m stages.bench.vllm_check: a workload through vLLM's CPU backend (stages/bench/peer_vllm.py) alone,
its row printed, and with --check stage 04 on the same prompt token ids, to compare the greedy tokens.

    make vllm-venv   # once: vLLM in .venv-vllm
    python -m stages.bench.vllm_check --num-requests 16 --max-num-seqs 8 --check

The ladder (python -m stages) runs the same peer beside the stages; this is the short check of one setting.
"""
from __future__ import annotations

from rich.console import Console

from common import ReferenceLLM
from common.prepare import resolve_model
from stages import workloads
from stages.report import format_value
from stages.cli import make_llm, parser

from .peer_vllm import DTYPES, Row, vllm_available, vllm_cpu, vllm_cpu_single


def agreement(ours: list[list[int]], theirs: list[list[int]]) -> str:
    """How far two engines' greedy tokens agree: identical requests, and where the others first differ."""
    firsts = [next((i for i, (a, b) in enumerate(zip(o, t)) if a != b), min(len(o), len(t)))
              for o, t in zip(ours, theirs) if o != t]
    return (f"{len(ours) - len(firsts)} of {len(ours)} requests identical"
            + (f"; the others first differ at token {', '.join(map(str, sorted(firsts)))}" if firsts else ""))


def main(argv=None) -> Row:
    ap = parser(__doc__)
    ap.set_defaults(num_requests=16, max_num_seqs=8, max_tokens=96)
    ap.add_argument("--check", action="store_true", help="run stage 04 on the same prompts and compare tokens")
    ap.add_argument("--single", type=int, default=0, help="then one request alone, this many tokens: decode tok/s")
    args = ap.parse_args(argv)
    if args.temperature > 0 or args.dtype not in DTYPES or args.quantization or args.n > 1:
        ap.error(f"the vLLM peer runs one greedy sample per request, dense weights, in {' or '.join(DTYPES)}")
    console, ref = Console(), ReferenceLLM(args.model, dtype=args.dtype)
    system = workloads.SYSTEM_PROMPT if args.system_prompt else None
    prompts, params = workloads.build(args.workload, ref.tokenizer, args.num_requests, args.max_tokens,
                                      ref.config.vocab_size, system=system)
    ids = [p if isinstance(p, list) else ref.tokenizer.encode(p) for p in prompts]
    eos = [] if all(p.ignore_eos for p in params) else list(ref.config.eos_token_ids)
    if reason := vllm_available():
        raise SystemExit(reason)
    r = vllm_cpu(resolve_model(args.model), ids, [p.max_tokens for p in params], eos, args.max_num_seqs, args.dtype)
    tokens = r.pop("tokens")
    for k, v in r.items():
        console.print(f"{k:>14}: {format_value(k, v)}")
    if args.check:
        llm = make_llm("stages.04_kernels", args)
        ours = [o.token_ids for o in llm.generate(ids, params)]
        console.print(f"stage 04 ({llm.stats.output_tokens / llm.stats.wall_seconds:.1f} output tok/s here): "
                      f"{agreement(ours, tokens)}")
    if args.single:
        rate = vllm_cpu_single(resolve_model(args.model), ids[0], args.single, args.dtype)
        console.print(f"one request alone ({args.single} tokens): vLLM decodes {rate:.1f} tok/s")
    return r


if __name__ == "__main__":
    main()
