"""The edge lesson, measured: for each precision, the bytes one token reads, the time they imply, the time taken.

    python -m common.tools.edge [--model smollm2-135m] [--tokens 64] [--rounds 3] [--no-llama-cpp]
                                [--side-by-side 12]
    (``python -m common.tools.roofline`` prints the same table after the article's.)

Each precision runs in a fresh process, so its peak resident memory at load is its own
(the checkpoint is memory-mapped: only the tensors a precision uses are ever read). Per
precision: the weight bytes one decode step reads, the per-token time they imply at the
measured read bandwidth, the per-token time measured (one request alone, greedy, EOS
ignored; the reference, then stage 04 with its fused CPU kernels), time to first token for a
short chat prompt and a 512-token one, and memory. Then where stage 04's token goes: its linears,
timed call by call (the projections' calls fitted as ``a fixed cost per call + bytes / bandwidth``:
the cost per call does not shrink with the bytes, which is why fewer bits per weight gain less
than their ratio), and the rest of the step.
llama.cpp (llama-cpp-python, if installed) runs the GGUF itself the same way, same threads.
These are timings: run them on a quiet machine. With ``--rounds R`` every precision (and llama.cpp) runs
R times, interleaved, so a slow minute hits them alike; the table shows each figure's median, and the
speed ratios the targets are about (int8 against bfloat16, int4 against llama.cpp) are taken round by
round, side by side, and printed with every round's value. Then (``--side-by-side TURNS``) one more process
holds stage 04 in all three precisions and decodes the same request with each in turn, the order rotating:
those ratios divide times taken about a second apart, where a round's fresh processes are up to a minute apart
on a machine whose speed drifts by tens of percent from one minute to the next.
"""
from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import time
from collections import defaultdict

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from common.tools.roofline import measure_read_bandwidth

PRECISIONS = ("none", "int8", "int4")
LONG_PROMPT = 512
TARGET_MS = 100.0  # the lesson's latency target: a token, and the first one, within 100 ms


def memory_mb(field: str) -> float:
    """VmRSS (resident now) or VmHWM (peak resident) of this process, in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / 1e6
    return float("nan")


def prompts(tokenizer) -> tuple[list[int], list[int]]:
    from common.tools.quality import TEXT
    chat = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": "How do vaccines work?"}]))
    return chat, tokenizer.encode(TEXT.read_text(encoding="utf-8"))[:LONG_PROMPT]


def decode_times(token_times: list[float]) -> float:
    return (token_times[-1] - token_times[0]) / (len(token_times) - 1)


def measure_stepwise(model: str, quantization: str | None, tokens: int) -> dict:
    """In a fresh process: load (memory), then one request alone (time per token, time to first token)."""
    from common import ReferenceLLM, SamplingParams

    before = memory_mb("VmRSS")
    llm = ReferenceLLM(model, dtype="bfloat16", quantization=quantization)
    row = {"weight MB": llm.model.weight_bytes / 1e6, "peak MB at load": memory_mb("VmHWM"),
           "load MB over bare process": memory_mb("VmHWM") - before, "resident MB after load": memory_mb("VmRSS")}
    chat, long = prompts(llm.tokenizer)
    llm.generate([chat], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm-up
    m = llm.generate([chat], SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))[0].metrics
    row.update({"ms per token": 1e3 * decode_times(m.token_times),
                f"TTFT ms, {len(chat)}-token prompt": 1e3 * m.time_to_first_token})
    m = llm.generate([long], SamplingParams(temperature=0, max_tokens=1))[0].metrics
    row[f"TTFT ms, {len(long)}-token prompt"] = 1e3 * m.time_to_first_token
    # The same request through stage 04, whose fused CPU kernels the reference does not use (same tokens).
    kernels = importlib.import_module("stages.04_kernels").LLM(model, dtype="bfloat16", quantization=quantization,
                                                                max_num_seqs=1)
    kernels.generate([chat], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    m = kernels.generate([chat], SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))[0].metrics
    row["ms per token, stage 04"] = 1e3 * decode_times(m.token_times)
    row.update(linear_breakdown(kernels, chat, tokens))
    row["rest of the step ms, stage 04"] = row["ms per token, stage 04"] - row["linears ms per token, stage 04"]
    return row


def measure_side_by_side(model: str, tokens: int, alternations: int) -> dict[str, list[float]]:
    """In one process: stage 04 in every precision, one request alone, decoding the same prompt in turns (each
    turn a fresh request; the order rotates every turn), so that the times a ratio divides were taken within
    about a second of each other. Per precision, ms per token of every turn."""
    from common import SamplingParams

    stage = importlib.import_module("stages.04_kernels")
    engines = {("bfloat16" if q == "none" else q): stage.LLM(model, dtype="bfloat16", max_num_seqs=1,
                                                             quantization=None if q == "none" else q)
               for q in PRECISIONS}
    chat, _ = prompts(engines["bfloat16"].tokenizer)
    for llm in engines.values():  # warm-up
        llm.generate([chat], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    names, times = list(engines), defaultdict(list)
    for turn in range(alternations):
        for name in names[turn % len(names):] + names[:turn % len(names)]:
            out = engines[name].generate([chat], SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
            times[name].append(1e3 * decode_times(out[0].metrics.token_times))
    return dict(times)


def side_by_side_ratios(times: dict[str, list[float]]) -> dict[str, list[float]]:
    """int8 and int4 against bfloat16, turn by turn (each a quotient of two times from the same turn)."""
    return {f"{q} / bfloat16, stage 04": [b / t for b, t in zip(times["bfloat16"], times[q])]
            for q in ("int8", "int4") if q in times}


def time_per_call_fit(samples: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``seconds = fixed + bytes / bandwidth`` over (bytes, seconds) samples: (fixed s, bytes/s)."""
    nbytes, seconds = np.asarray(samples, dtype=float).T
    per_byte, fixed = np.polyfit(nbytes, seconds, 1)
    return float(fixed), float(1 / per_byte)


def linear_breakdown(llm, prompt: list[int], tokens: int) -> dict:
    """Decode ``tokens`` tokens of one request with a timer around every linear call; each linear's median
    call, their sum per token, and the fit of those medians against the bytes each linear reads."""
    from common import SamplingParams
    from common.invariant import RowTiled

    calls, untimed = defaultdict(list), RowTiled.__call__

    def timed(linear, x):
        start = time.perf_counter()
        out = untimed(linear, x)
        if x.shape[0] == 1:  # decode steps only, not the prompt
            calls[linear].append(time.perf_counter() - start)
        return out

    RowTiled.__call__ = timed
    try:
        llm.generate([prompt], SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
    finally:
        RowTiled.__call__ = untimed
    medians = {linear: float(np.median(t)) for linear, t in calls.items()}
    # The fit takes the layers' projections: the LM head is the int8 token table in int4 mode, another kernel.
    projections = [(linear.nbytes, t) for linear, t in medians.items() if linear is not llm.model.lm_head]
    fixed, bandwidth = time_per_call_fit(projections)
    return {"linears ms per token, stage 04": 1e3 * sum(medians.values()),
            "projections GB/s (fit)": bandwidth / 1e9, "µs per projection call besides bytes (fit)": 1e6 * fixed,
            "linear calls per token": len(medians)}


def measure_llama_cpp(tokens: int, threads: int) -> dict:
    """llama.cpp on the GGUF file itself (memory-mapped), one request alone, greedy, EOS ignored."""
    import gguf
    from llama_cpp import Llama

    from common.paths import resolve_model, smollm2_gguf_path
    from common.tokenizer import Tokenizer

    path = smollm2_gguf_path()
    weights = sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors)
    before = memory_mb("VmRSS")
    llm = Llama(model_path=str(path), n_ctx=2048, n_threads=threads, n_batch=512, verbose=False)
    row = {"weight MB": weights / 1e6, "peak MB at load": memory_mb("VmHWM"),
           "load MB over bare process": memory_mb("VmHWM") - before, "resident MB after load": memory_mb("VmRSS")}
    chat, long = prompts(Tokenizer(resolve_model("smollm2-135m")))

    def run(prompt, n):
        llm.reset()
        start, times = time.perf_counter(), []
        for _ in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
            times.append(time.perf_counter())
            if len(times) == n:
                break
        return start, times

    run(chat, 4)  # warm-up
    start, times = run(chat, tokens)
    row.update({"ms per token": 1e3 * decode_times(times),
                f"TTFT ms, {len(chat)}-token prompt": 1e3 * (times[0] - start)})
    start, times = run(long, 1)
    row[f"TTFT ms, {len(long)}-token prompt"] = 1e3 * (times[0] - start)
    return row


def in_fresh_process(args: list[str]) -> dict:
    run = subprocess.run([sys.executable, "-m", "common.tools.edge", *args], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"common.tools.edge {' '.join(args)} failed:\n{run.stderr[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def measure(model: str = "smollm2-135m", tokens: int = 64, llama_cpp: bool = True,
            rounds: int = 1) -> tuple[float, dict, list[dict]]:
    """Read bandwidth, each precision's figures (medians over ``rounds`` interleaved runs) and every round's rows."""
    bandwidth = measure_read_bandwidth()
    children = {("bfloat16" if q == "none" else q): ["--child", q, "--model", model, "--tokens", str(tokens)]
                for q in PRECISIONS}
    if llama_cpp and model == "smollm2-135m":
        try:
            import llama_cpp  # noqa: F401
            children["llama.cpp Q4_1"] = ["--child", "llama.cpp", "--tokens", str(tokens)]
        except ImportError:
            pass
    by_round = [{name: in_fresh_process(args) for name, args in children.items()} for _ in range(rounds)]
    rows = {name: {figure: float(np.median([r[name][figure] for r in by_round])) for figure in by_round[0][name]}
            for name in children}
    for row in rows.values():
        row["estimated ms per token"] = 1e3 * row["weight MB"] * 1e6 / bandwidth
        row["measured / estimated"] = row["ms per token"] / row["estimated ms per token"]
    return bandwidth, rows, by_round


def speed_ratios(by_round: list[dict]) -> dict[str, list[float]]:
    """Decode-rate ratios per round (each a quotient of two times measured in the same round): int8 and int4
    against bfloat16, on the reference's path and through stage 04, and int4 against llama.cpp."""
    pairs = {"int8 / bfloat16": ("int8", "bfloat16"), "int4 / bfloat16": ("int4", "bfloat16"),
             "int4 / llama.cpp": ("int4", "llama.cpp Q4_1")}
    ratios = {}
    for label, (fast, base) in pairs.items():
        if base not in by_round[0]:
            continue
        for path, figure in (("reference", "ms per token"), ("stage 04", "ms per token, stage 04")):
            base_figure = "ms per token" if base == "llama.cpp Q4_1" else figure
            ratios[f"{label}, {path}"] = [r[base][base_figure] / r[fast][figure] for r in by_round]
    return ratios


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=1, help="interleaved runs of every precision (medians)")
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--side-by-side", type=int, default=12, metavar="TURNS",
                    help="then every precision's stage 04 in one process, in this many turns (0: skip)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child == "side-by-side":
        times = measure_side_by_side(args.model, args.tokens, args.side_by_side)
        print(json.dumps(times))
        return times
    if args.child:
        threads = torch.get_num_threads()
        row = (measure_llama_cpp(args.tokens, threads) if args.child == "llama.cpp" else
               measure_stepwise(args.model, None if args.child == "none" else args.child, args.tokens))
        print(json.dumps(row))
        return row
    bandwidth, rows, by_round = measure(args.model, args.tokens, not args.no_llama_cpp, args.rounds)
    order = ["weight MB", "estimated ms per token", "ms per token", "ms per token, stage 04", "measured / estimated",
             "linears ms per token, stage 04", "rest of the step ms, stage 04", "projections GB/s (fit)",
             "µs per projection call besides bytes (fit)"]
    figures = order + [k for k in next(iter(rows.values())) if k not in order]
    medians = f", medians of {args.rounds} interleaved rounds" if args.rounds > 1 else ""
    table = Table(title=f"{args.model}, one request alone, {torch.get_num_threads()} threads{medians}: read bandwidth "
                        f"{bandwidth / 1e9:.1f} GB/s; target {TARGET_MS:.0f} ms per token and to the first token")
    table.add_column("figure")
    for name in rows:
        table.add_column(name, justify="right")
    for figure in figures:
        digits = 2 if figure == "measured / estimated" else 0 if figure == "linear calls per token" else 1
        table.add_row(figure, *(f"{rows[n][figure]:,.{digits}f}" if figure in rows[n] else "-" for n in rows))
    console = Console()
    console.print(table)
    ratios = speed_ratios(by_round)
    for label, values in ratios.items():  # each round's ratio is of two times taken minutes apart at most
        rounds = f" (rounds {' / '.join(f'{v:.2f}' for v in values)})" if len(values) > 1 else ""
        console.print(f"decode speed {label}: {float(np.median(values)):.2f}x{rounds}")
    side = {}
    if args.side_by_side > 0:  # minutes apart at most above; here a second apart, many times over
        times = in_fresh_process(["--child", "side-by-side", "--model", args.model, "--tokens", str(args.tokens),
                                  "--side-by-side", str(args.side_by_side)])
        side = side_by_side_ratios(times)
        for q in ("int8", "int4"):
            values = side[f"{q} / bfloat16, stage 04"]
            low, mid, high = np.percentile(values, [25, 50, 75])
            console.print(f"decode speed {q} / bfloat16, stage 04, side by side in one process: {mid:.2f}x (quartiles "
                          f"{low:.2f}-{high:.2f} over {len(values)} turns; ms per token "
                          f"{np.median(times['bfloat16']):.1f} / {np.median(times[q]):.1f})")
    return {"read bandwidth GB/s": bandwidth / 1e9, "rows": rows, "speed ratios": ratios, "side by side": side}


if __name__ == "__main__":
    main()
