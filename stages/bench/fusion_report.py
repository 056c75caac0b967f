"""`python -m stages.bench.fusion_report`: what fusion removes from a decode step, counted by the code itself.

The same batch of requests is brought to the same point by stage 03 and by stage 04, and one
decode step of each is run under a counter that sees every tensor operation torch executes
(views excluded: they move no data). A fused kernel call counts as one operation, moving
its inputs and outputs once. "Bytes moved" adds every operation's input and output bytes: the
memory traffic the step would cost if nothing stayed in cache.
"""
from __future__ import annotations

import argparse
import functools
import importlib
import time
from collections import Counter

import torch
from rich.console import Console
from rich.table import Table
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from common.paths import DEFAULT_MODEL
from common.numerics import native
from stages import workloads
from common.sampling import SamplingParams

FUSED_SOURCE = importlib.import_module("stages.kernels.cpu_fusion").SOURCE

VIEWS = {"view", "_unsafe_view", "as_strided", "slice", "select", "unsqueeze", "squeeze", "expand", "t", "transpose",
         "permute", "alias", "detach", "_reshape_alias", "unbind", "split", "chunk", "narrow", "split_with_sizes",
         "lift_fresh", "_to_copy_noop"}
MAYBE_VIEWS = {"reshape", "contiguous", "flatten", "reshape_as", "view_as"}  # views when the layout allows
GATHERS = {"index_select", "index", "embedding"}
SCATTERS = {"index_copy_", "index_copy", "index_put_", "_index_put_impl_"}


def nbytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(nbytes(v) for v in value)
    return 0


class StepCounter(TorchDispatchMode):
    """Counts tensor operations and the bytes they read and write."""

    def __init__(self):
        super().__init__()
        self.ops, self.bytes, self.by_op, self.bytes_by_op = 0, 0, Counter(), Counter()

    def record(self, name: str, inputs, outputs, extra_bytes: int = 0) -> None:
        """One operation reading ``inputs`` and writing ``outputs``, plus ``extra_bytes`` no tensor stands for."""
        self.ops += 1
        moved = nbytes(inputs) + nbytes(outputs) + extra_bytes
        self.bytes += moved
        self.by_op[name] += 1
        self.bytes_by_op[name] += moved

    # The compiled kernels (common.numerics.native) are bound to Python directly, out of the dispatcher's sight: while
    # counting, each is wrapped so that it counts as one operation and its own allocations inside go unseen.
    def __enter__(self):
        self.restore = []
        for source in (native.SOURCE, native.LINEAR_SOURCE, FUSED_SOURCE):
            module = native.loaded(source)
            for name in dir(module) if module is not None else ():
                kernel = getattr(module, name)
                if callable(kernel) and not name.startswith("_") and name not in ("ready", "pack"):
                    setattr(module, name, functools.partial(self.kernel_call, name, kernel))
                    self.restore.append((module, name, kernel))
        return super().__enter__()

    def __exit__(self, *exc):
        for module, name, kernel in self.restore:
            setattr(module, name, kernel)
        return super().__exit__(*exc)

    def kernel_call(self, name, kernel, *args):
        with _disable_current_modes():
            out = kernel(*args)
            if name == "attention":  # reads its sequences' keys and values, not the whole pool
                q, k_chunks, _, token_seq, token_pos, _, kv_heads, _ = args
                context = torch.zeros(int(token_seq.max()) + 1, dtype=torch.long).scatter_reduce(
                    0, token_seq, token_pos + 1, "amax")
                read = 2 * int(context.sum()) * kv_heads * q.shape[-1] * k_chunks.element_size()
                self.record(name, [q, token_seq, token_pos], out, extra_bytes=read)
            elif name == "linear":
                self.record(name, args[:3], out)
            # the fused kernels are counted by FusedCPU itself, as "fused <name>"
        return out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in GATHERS:  # reads the gathered rows (not the whole source) and writes them
            indices = [a for a in args if isinstance(a, torch.Tensor) and not a.is_floating_point()]
            self.record(name, [out] + indices, out)
        elif name in SCATTERS:  # reads the values and writes them into place (not the whole destination)
            values = args[-1] if isinstance(args[-1], torch.Tensor) else args[3]
            others = [a for a in args[1:] if isinstance(a, torch.Tensor) and a is not values]
            self.record(name, [values] + others, values)
        elif name in MAYBE_VIEWS and isinstance(out, torch.Tensor) and any(
                isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()
                for a in args):
            pass  # returned a view: no data moved
        elif name not in VIEWS:
            self.record(name, list(args) + list((kwargs or {}).values()), out)
        return out


def decode_step_counts(module: str, requests: int, context: int, model: str = DEFAULT_MODEL) -> dict:
    """Run ``requests`` chat requests to about ``context`` tokens, then count one decode step."""
    stage = importlib.import_module(module)
    llm = stage.LLM(model, max_num_seqs=requests, max_num_batched_tokens=4096)
    prompts, _ = workloads.chat(llm.tokenizer, requests)
    params = SamplingParams(temperature=0, max_tokens=4 * context, ignore_eos=True)
    engine = llm.engine
    for prompt in prompts:
        engine.add(llm.make_samples(prompt, params)[0])
    while engine.scheduler.waiting or min(len(s) for s in engine.scheduler.running) < context:
        engine.step()
    fused = getattr(llm.model, "fused", None)
    counter = StepCounter()
    if fused is not None:
        fused.counter = counter
    with counter:
        engine.step()
    if fused is not None:
        fused.counter = None
    times = []
    for _ in range(20):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return {"ops": counter.ops, "bytes": counter.bytes, "by_op": counter.by_op, "bytes_by_op": counter.bytes_by_op,
            "step ms": 1e3 * min(times),
            "path": getattr(llm, "execution_path", "torch")}


def main(requests: int = 32, context: int = 128) -> None:
    console = Console()
    rows = {name: decode_step_counts(module, requests, context)
            for name, module in (("03 paged (unfused)", "stages.03_paged_kv"),
                                 ("04 kernels (fused)", "stages.04_kernels"))}
    table = Table(title=f"one decode step: {requests} requests at ~{context} tokens, SmolLM2-135M, bfloat16")
    table.add_column("figure")
    for name in rows:
        table.add_column(name, justify="right")
    a, b = rows.values()
    table.add_row("tensor operations", f"{a['ops']:,}", f"{b['ops']:,}")
    table.add_row("bytes moved (MB)", f"{a['bytes'] / 1e6:,.1f}", f"{b['bytes'] / 1e6:,.1f}")
    table.add_row("fastest of 20 steps (ms)", f"{a['step ms']:.1f}", f"{b['step ms']:.1f}")
    console.print(table)
    fused_ops = {k: v for k, v in b["by_op"].items() if k.startswith("fused ")}
    console.print(f"fused kernel calls per step: {dict(fused_ops)}; stage 04 path: {b['path']}")
    for name, r in rows.items():
        top = ", ".join(f"{k} {v / 1e6:,.0f}" for k, v in r["bytes_by_op"].most_common(8))
        console.print(f"{name}, MB moved by the largest: {top}")
    gone = {k: a["by_op"][k] - b["by_op"].get(k, 0) for k in a["by_op"] if a["by_op"][k] > b["by_op"].get(k, 0)}
    by_count = sorted(gone.items(), key=lambda x: -x[1])
    console.print("operations fusion removed per step: " + ", ".join(f"{k} {v}" for k, v in by_count))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-num-seqs", type=int, default=16, help="requests in the decode step counted")
    ap.add_argument("--context", type=int, default=128, help="tokens each request holds when it is counted")
    args = ap.parse_args()
    main(args.max_num_seqs, args.context)
