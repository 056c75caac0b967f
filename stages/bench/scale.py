"""How cost grows (issue 54): model sizes x prompt lengths x requests in flight, stage 04/05 (bfloat16, int4) beside
llama.cpp (one at a time and batched) on the same random weights, each point in a child process of its own.

    python -m stages.bench.make_model --shape llama-3.2-1b --out ~/.cache/stepwise/scale-models/llama-3.2-1b \\
        --gguf bfloat16,q4_1 --int4-blocks
    python -m stages.bench.scale --models-dir ~/.cache/stepwise/scale-models --prompts 128,1024 --in-flight 1,16 \\
        --json /tmp/scale.json --plot /tmp/scale.png
    python -m stages.bench.scale --dry-run      # the plan and the skips, nothing loaded

Per point, two figures for decoding, which differ when many requests arrive at once: TPOT p50, what a user waits
per token (the steps that prefill other requests' prompts after its first token included), and the steady decode
rate, tokens a second while every request is decoding (stages/bench/steady.py; "n/a" where no such moment came).
scale_run.py says how each figure is taken. Timings are only worth reading from a machine with nothing else running
(docs/scale.md).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from common.config import ModelConfig
from common.paths import home

from . import children
from .scale_plan import ENGINES, plan
from .scale_report import plot, table, with_ceiling
from .shapes import SHAPES, VOCAB_NOTE

console = Console(stderr=True)


def find_models(models_dir: Path, names: list[str]) -> dict[str, Path]:
    """``name`` -> folder: each name a folder under ``models_dir`` (a shape made by make_model) or a path."""
    found = {}
    for name in names:
        folder = Path(name) if os.sep in name else models_dir / name
        if not (folder / "config.json").exists():
            raise FileNotFoundError(f"no checkpoint for {name!r} at {folder}: make it with `python -m "
                                    f"stages.bench.make_model --shape {name} --out {folder} --gguf bfloat16,q4_1 "
                                    f"--int4-blocks`")
        found[folder.name] = folder
    return found


def machine_name() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    return f"{cpu}, {os.cpu_count()} cores"


def available_bytes() -> int:
    from stages.paged_kv.kv_budget import available_memory
    return available_memory("cpu") or 0


def run_child(point, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "stages.bench.scale_run", point.to_json()]
    try:
        done = children.run(cmd, timeout=timeout, capture_output=True, text=True)
    except Exception as e:  # a timeout: the point is reported, the sweep goes on
        return {"error": f"{type(e).__name__}: {e}"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        return {"error": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:] or ['']}"}
    return json.loads(lines[-1][7:])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models-dir", type=Path, default=home() / "scale-models")
    ap.add_argument("--models", default=",".join(SHAPES), help="folders under --models-dir, or paths")
    ap.add_argument("--prompts", default="128,1024,4096,8192")
    ap.add_argument("--in-flight", default="1,16,64")
    ap.add_argument("--engines", default=",".join(e for e in ENGINES if not e.startswith("05")))
    ap.add_argument("--out-tokens", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds one point may take")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path)
    args = ap.parse_args(argv)
    ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    models = find_models(args.models_dir, [m for m in args.models.split(",") if m])
    vllm = Path(".venv-vllm/bin/python")
    points, skips = plan(models, ints(args.prompts), ints(args.in_flight), args.engines.split(","), args.out_tokens,
                         available_bytes(), vllm if vllm.exists() else None)
    console.print(f"{len(points)} points ({VOCAB_NOTE}); {len(skips)} skipped:")
    for line in skips:
        console.print(f"  skip {line}")
    if args.dry_run:
        for p in points:
            console.print(f"  {p.model} {p.engine} prompt {p.prompt} x {p.in_flight}")
        return {"points": [asdict(p) for p in points], "skips": skips}
    from .machine import measure_read_bandwidth
    bandwidth, machine = measure_read_bandwidth(), machine_name()
    results = []
    with Progress(console=console) as progress:
        task = progress.add_task("sweep", total=len(points))
        for p in points:
            progress.update(task, description=f"{p.model} {p.engine} {p.prompt}x{p.in_flight}")
            got = run_child(p, args.timeout)
            if "error" in got:
                skips.append(f"{p.model} {p.engine} prompt {p.prompt} x {p.in_flight}: failed, {got['error']}")
            else:
                kv = ModelConfig.from_folder(p.folder).kv_bytes_per_token(2)
                results.append(with_ceiling(asdict(p) | got, kv, bandwidth))
            progress.advance(task)
    console.print(table(results, bandwidth, machine))
    for line in skips:
        console.print(f"skipped: {line}")
    report = {"machine": machine, "read_bandwidth_bytes_per_s": bandwidth, "note": VOCAB_NOTE,
              "results": results, "skips": skips}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    if args.plot and results:
        for path in plot(results, bandwidth, args.plot, machine):
            console.print(f"wrote {path}")
    return report


if __name__ == "__main__":
    main()
