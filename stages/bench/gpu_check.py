"""`python -m stages.bench.gpu_check`: everything a CUDA machine should confirm, in one run.

1. the kernel tests, compiled (not interpreted), the quantized linears' (common/numerics/quant_cuda.py), and every
   stage's tokens on CUDA against the reference in bfloat16, int8 and int4;
2. each kernel's time and achieved GB/s against the device's measured copy bandwidth;
3. stages 03 and 04 on the real model in bfloat16, same workload: output tokens/s and token agreement.
"""
from __future__ import annotations

import importlib
import sys
import time

import torch
from rich.console import Console
from rich.table import Table

from common.paths import DEFAULT_MODEL
from stages import workloads
from stages.bench import children, machine


def bench(fn, repeats: int = 50) -> float:
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / repeats


def kernel_table(console: Console, dtype=torch.bfloat16) -> None:
    ew = importlib.import_module("stages.kernels.elementwise")
    pa = importlib.import_module("stages.kernels.paged_attention")
    dev, bw = "cuda", machine.measure_bandwidth("cuda", mb=1024)
    rows, hidden, ffn, heads, kvh, d, bs = 64, 576, 1536, 9, 3, 64, 16
    x, res, w = (torch.randn(rows, hidden, device=dev, dtype=dtype) for _ in range(3))
    gate_up = torch.randn(rows, 2 * ffn, device=dev, dtype=dtype)
    q = torch.randn(rows, heads, d, device=dev, dtype=dtype)
    cos = sin = torch.randn(rows, 1, d, device=dev)  # per-token tables, as common.numerics.ops.rope_tables makes them
    seqs, ctx = 64, 1024
    blocks = seqs * ctx // bs
    kc, vc = (torch.randn(blocks, kvh, bs, d, device=dev, dtype=dtype) for _ in range(2))
    tables = torch.randperm(blocks, device=dev, dtype=torch.int32).view(seqs, -1)
    lens = torch.full((seqs,), ctx, device=dev, dtype=torch.int32)
    qd = torch.randn(seqs, heads, d, device=dev, dtype=dtype)
    kv_new = torch.randn(rows, kvh, d, device=dev, dtype=dtype)
    slots = torch.randperm(blocks * kvh * bs, device=dev)[:rows * kvh].view(rows, kvh)  # (token, head) rows
    e = x.element_size()
    cases = {  # name: (call, bytes it must move)
        "add_rms_norm": (lambda: ew.add_rms_norm(x, res, w, 1e-5), 5 * rows * hidden * e),
        "rope (q)": (lambda: ew.rope_(q, cos, sin), 2 * q.numel() * e),
        "swiglu": (lambda: ew.swiglu(gate_up), 1.5 * gate_up.numel() * e),
        "store_kv": (lambda: ew.store_kv(kv_new, kv_new, kc, vc, slots), 4 * kv_new.numel() * e),
        f"paged decode ({seqs} x {ctx} tokens)": (
            lambda: pa.paged_decode_attention(qd, kc, vc, tables, lens, ctx), 2 * kc.numel() * e),
    }
    table = Table(title=f"kernels on {torch.cuda.get_device_name()} (copy bandwidth {bw / 1e9:,.0f} GB/s)")
    for col in ("kernel", "µs", "GB/s", "of copy bandwidth"):
        table.add_column(col, justify="right")
    for name, (fn, nbytes) in cases.items():
        t = bench(fn)
        table.add_row(name, f"{t * 1e6:,.1f}", f"{nbytes / t / 1e9:,.0f}", f"{nbytes / t / bw:.0%}")
    console.print(table)


def end_to_end(console: Console, num_requests: int = 128, max_tokens: int = 128) -> None:
    from stages.report import summary_row, summary_table
    rows, tokens = {}, {}
    for module, name in [("stages.03_paged_kv", "03 paged"), ("stages.04_kernels", "04 kernels")]:
        llm = importlib.import_module(module).LLM(DEFAULT_MODEL, dtype="bfloat16", device="cuda",
                                                  max_num_seqs=64, max_num_batched_tokens=2048)
        prompts, params = workloads.chat(llm.tokenizer, num_requests, max_tokens)
        llm.generate(prompts[:4], params[:4])  # warm up (kernel compilation)
        outputs = llm.generate(prompts, params, progress=True)
        rows[name] = summary_row(llm.stats, outputs, llm.max_num_seqs)
        tokens[name] = [o.token_ids for o in outputs]
        console.print(f"{name}: {getattr(llm, 'execution_path', 'torch path')}")
    console.print(summary_table(rows, f"chat workload, {num_requests} requests, bfloat16, cuda"))
    same = sum(a == b for a, b in zip(*tokens.values()))
    console.print(f"04 vs 03: {rows['04 kernels']['output tok/s'] / rows['03 paged']['output tok/s']:.2f}x output "
                  f"tokens/s; identical token ids for {same} of {num_requests} requests")


def main() -> int:
    console = Console()
    if not torch.cuda.is_available():
        console.print("[red]the GPU check needs a CUDA device; none is visible.[/] On CPU run "
                      "`pytest tests/test_kernels.py` (interpreted) instead.")
        return 2
    t0 = time.perf_counter()
    console.rule("1. kernel tests, compiled, and every stage's tokens on CUDA against the reference")
    tests = children.run([sys.executable, "-m", "pytest", "-q", "tests/test_kernels.py", "tests/test_quant_cuda.py",
                            "tests/test_identical_tokens.py::test_every_stage_on_cuda_gives_the_same_tokens"],
                           text=True, check=False)
    console.rule("2. kernel timings")
    kernel_table(console)
    console.rule("3. stages 03 and 04 end to end")
    end_to_end(console)
    console.print(f"gpu check finished in {time.perf_counter() - t0:.0f} s; kernel and CUDA token tests "
                  f"{'passed' if tests.returncode == 0 else 'FAILED'}")
    return tests.returncode


if __name__ == "__main__":
    import argparse
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    sys.exit(main())
