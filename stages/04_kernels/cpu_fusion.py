"""Fused element-wise kernels on CPU: ``cpu_kernels.cpp``, hand-written like the Triton ones on CUDA.

``common.numerics.ops`` spells out every rounding of the model's element-wise math; the C++ kernels
repeat those steps in one pass over a row (``add_rms_norm``: the residual add, the float64
sum of squares in ``ops.LANES`` lanes, the root, the scale; ``rope_qk``: q and k rotated where
they lie in the merged projection's output; ``rope_qk_store``: the same, with the rotated keys
and the values written straight into the paged cache's rows, so the KV write is no separate
copy; ``swiglu``: silu of the gate times up) and give the same bits (``-ffp-contract=off``, no
fast-math; ``tests/test_stage_04.py`` checks hidden states and logits bit for bit on the real
model). ``silu`` rounds through torch's own vectorized ``exp``, which no formula of ours can promise
to repeat; but a bfloat16 (or float16) gate takes only 65,536 values, so at load torch computes
silu of every one of them into a table (256 KB as float32, in L2) and the kernel looks each gate up. In
float32 SwiGLU stays torch's two ops.

Why hand-written rather than generated: an earlier version compiled ``common.numerics.ops`` with
AOTInductor. Its kernels were exact too, but each call cost about 25 µs in the runner's
Python wrapper, and its generated RMSNorm kept the float64 scan scalar, so at one request the
fused step was no faster than the eager one. These cost a few microseconds a call (measured in
the stage README). The library is compiled once per machine by ``common.numerics.native`` (about 20 s)
into ``$STEPWISE_HOME/native``; that time is reported apart from any throughput.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from common.numerics import native, ops
from common.config import ModelConfig

SOURCE = Path(__file__).with_name("cpu_kernels.cpp")


class FusedCPU:
    """The fused CPU kernels for one model: ``add_rms_norm``, ``rope_qkv``, ``rope_qk_store`` and, for 16-bit
    dtypes, ``swiglu``."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype):
        self.config, self.dtype = config, dtype
        start = time.perf_counter()
        if not native.load(SOURCE):
            raise RuntimeError(f"the fused CPU kernels {native.build_note(SOURCE)}")
        self.kernels = native.kernels(SOURCE)
        self.silu_table = silu_table(dtype) if dtype in (torch.bfloat16, torch.float16) else None
        self.compile_seconds = time.perf_counter() - start
        self.cached = native.build_note(SOURCE) == "cached build"
        self.calls = 0  # kernel calls
        self.counter = None  # fusion_report.StepCounter while the report counts a step

    @property
    def note(self) -> str:
        return f"{3 if self.silu_table is None else 4} C++ kernels, {native.build_note(SOURCE)}"

    def add_rms_norm(self, x, residual, weight):
        return self._call("add_rms_norm", self.kernels.add_rms_norm, x, residual, weight,
                          self.config.rms_norm_eps)

    def rope_qkv(self, qkv, cos, sin):
        c = self.config
        qk = self._call("rope_qk", self.kernels.rope_qk, qkv, cos, sin, c.num_attention_heads,
                        c.num_key_value_heads)[0]
        q_and_k = (c.num_attention_heads + c.num_key_value_heads) * c.head_dim
        return (qk[:, :c.num_attention_heads], qk[:, c.num_attention_heads:],
                qkv[:, q_and_k:].view(qkv.shape[0], c.num_key_value_heads, c.head_dim))

    def rope_qk_store(self, qkv, cos, sin, k_rows, v_rows, write_rows):
        """q rotated; k rotated and v copied into the cache rows ``write_rows`` (RoPE and the KV write fused)."""
        c = self.config
        kernel = self.kernels.rope_qk_store
        self.calls += 1
        q = kernel(qkv, cos, sin, c.num_attention_heads, c.num_key_value_heads, k_rows, v_rows, write_rows)
        if self.counter is not None:  # reads qkv, the tables and the rows; writes q, and k and v into the cache
            self.counter.record("fused rope_qk_store", [qkv, cos, sin, write_rows], q,
                                extra_bytes=2 * write_rows.numel() * c.head_dim * qkv.element_size())
        return q

    def swiglu(self, gate_up):
        if self.silu_table is None:
            return ops.swiglu(gate_up)
        return self._call("swiglu", self.kernels.swiglu, gate_up, self.silu_table)[0]

    def _call(self, name: str, kernel, *inputs) -> tuple[torch.Tensor, ...]:
        self.calls += 1
        outputs = kernel(*inputs)
        outputs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
        if self.counter is not None:
            self.counter.record(f"fused {name}", [a for a in inputs if isinstance(a, torch.Tensor)], outputs)
        return outputs


def silu_table(dtype: torch.dtype) -> torch.Tensor:
    """torch's silu of every 16-bit value, indexed by the value's bits. Computed 64 values per call, so each one
    goes through torch's vector path (the path the model's [rows, ffn] rows take) and never a scalar tail."""
    bits = torch.arange(1 << 16, dtype=torch.int32)
    values = torch.where(bits >= 1 << 15, bits - (1 << 16), bits).to(torch.int16).view(dtype)
    return torch.cat([torch.nn.functional.silu(chunk) for chunk in values.split(64)]).float()  # widening: exact
