"""python -m stages.xray.bench: what the X-ray costs. The engine's output tokens/s with the recording on and off
(rounds alternate, so a busy machine hurts both alike), and the page of that run: its size and how long
headless Chromium takes to open it. Run it alone on the machine for figures worth quoting."""
from __future__ import annotations

import argparse
import importlib
import random
import statistics
import tempfile
import time
from pathlib import Path

from common import SamplingParams

from . import page
from common.trace import Recorder


def workload(n: int, tokens: int, seed: int = 0):
    """n random prompts of 16-256 tokens, each generating exactly ``tokens`` tokens."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(17, 1024) for _ in range(rng.randint(16, 256))] for _ in range(n)]
    return prompts, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)


class Timed(Recorder):
    """The recorder, timing itself: the seconds its on_step took, a figure a busy machine disturbs far less than
    two runs' tokens/s."""

    seconds = 0.0

    def on_step(self, event) -> None:
        start = time.perf_counter()
        super().on_step(event)
        self.seconds += time.perf_counter() - start


def one_run(llm, prompts, params, record: bool) -> tuple[float, float, Timed | None]:
    """(output tokens/s, the run's seconds, the recorder)."""
    rec = llm.add_observer(Timed("bench")) if record else None
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    if rec is not None:
        rec.end_run(write=False)
        llm.remove_observer(rec)
    return sum(len(o.token_ids) for o in outs) / seconds, seconds, rec


def open_times(path: Path, times: int) -> list[float]:
    from .browser import launch, open_offline
    out = []
    with launch() as browser:
        for _ in range(times):
            pg, seconds, tried, errors = open_offline(browser, path)
            assert not tried and not errors, (tried, errors)
            out.append(seconds)
            pg.close()
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m stages.xray.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--stage", default="03_paged_kv")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--num-requests", type=int, default=96)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3, help="runs with the recording off and on, alternating")
    ap.add_argument("--out", default=None, help="where to write the page (default: a temporary folder)")
    args = ap.parse_args(argv)
    stage = importlib.import_module(f"stages.{args.stage}")
    prompts, params = workload(args.num_requests, args.max_tokens)
    one_run(stage.LLM(args.model, max_num_seqs=args.max_num_seqs), prompts[:4], params, False)  # warm-up
    off, on, share, rec = [], [], [], None
    for _ in range(args.rounds):  # a fresh engine each run: no run finds another's prompts in its prefix cache
        off.append(one_run(stage.LLM(args.model, max_num_seqs=args.max_num_seqs), prompts, params, False)[0])
        rate, seconds, rec = one_run(stage.LLM(args.model, max_num_seqs=args.max_num_seqs), prompts, params, True)
        on.append(rate)
        share.append(rec.seconds / seconds)
    path = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="xray-bench-")) / "bench.html"
    size = page.write(rec.trace(), path)
    steps = len(rec.runs[0].steps)
    figures = {"output tok/s off": statistics.median(off), "output tok/s on": statistics.median(on),
               "page bytes": size, "steps": steps}
    figures["on / off"] = figures["output tok/s on"] / figures["output tok/s off"]
    figures["recorder share of run"] = statistics.median(share)  # the time its on_step took, over the run's
    figures["recorder ms per step"] = rec.seconds / steps * 1e3
    try:
        figures["open s (median of 3)"] = statistics.median(open_times(path, 3))
    except RuntimeError as e:  # no chromium here
        figures["open s (median of 3)"] = str(e)
    print(f"{args.stage}, {args.model}, {args.num_requests} requests x {args.max_tokens} tokens, "
          f"max_num_seqs {args.max_num_seqs}, {args.rounds} rounds; page {path}")
    for k, v in figures.items():
        print(f"  {k:<22} {v:,.3f}" if isinstance(v, float) else f"  {k:<22} {v}")
    print(f"  rounds off: {', '.join(f'{x:.1f}' for x in off)}; on: {', '.join(f'{x:.1f}' for x in on)}")
    return figures


if __name__ == "__main__":
    main()
