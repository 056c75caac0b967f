"""Fused element-wise kernels on CPU: the reference's own functions, compiled ahead of time.

``common.ops`` spells out every rounding of the model's element-wise math. Here those same
Python functions are exported (``torch.export``) and compiled by AOTInductor into C++
kernels: one pass over memory per function instead of one per operation, and one call
instead of a dozen. Three settings keep the bits of the reference:

* ``emulate_precision_casts``: round to the model's dtype wherever eager torch rounds;
* inductor's defaults ``-ffp-contract=off`` and no unsafe math: no multiply-add is fused
  into one rounding and no sum is reordered;
* the functions hold no ``exp`` of their own (``silu`` is the same vectorized code in
  both); the attention's ``exp`` stays in torch, whose CPU ``exp`` differs from
  inductor's in the last bit.

Compiling takes tens of seconds per model shape and dtype, so the packages are cached in
``$STEPWISE_HOME/fused`` (keyed by the machine, torch, the shapes and the source of
``common.ops``) and that time is reported apart from any throughput.
"""
from __future__ import annotations

import hashlib
import inspect
import platform
import time

import torch

from common import ops
from common.config import ModelConfig
from common.paths import home

FORMAT = 2  # bump when the exported functions or their inputs change


class _Norm(torch.nn.Module):
    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x, residual, weight):
        return ops.add_rms_norm(x, residual, weight, self.eps)


class _RopeQKV(torch.nn.Module):
    def __init__(self, heads: int, kv_heads: int):
        super().__init__()
        self.heads, self.kv_heads = heads, kv_heads

    def forward(self, qkv, cos, sin):
        return ops.rope_qkv(qkv, cos, sin, self.heads, self.kv_heads)


class _SwiGLU(torch.nn.Module):
    def forward(self, gate_up):
        return ops.swiglu(gate_up)


class FusedCPU:
    """AOTInductor packages of ``ops.add_rms_norm``, ``ops.rope_qkv`` and ``ops.swiglu`` for one model shape."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype):
        c, d = config, config.head_dim
        tokens = torch.export.Dim("tokens", min=1, max=c.max_position_embeddings)
        # Distinct example tensors: inputs that alias each other would be traced as one input.
        example = lambda *shape, dt=dtype: torch.randn(*shape).to(dt)  # noqa: E731
        qkv_width = (c.num_attention_heads + 2 * c.num_key_value_heads) * d
        specs = {  # name: (module, example inputs, which input dims follow the step's token count)
            "add_rms_norm": (_Norm(c.rms_norm_eps), (example(8, c.hidden_size), example(8, c.hidden_size),
                                                      example(c.hidden_size)), ({0: tokens}, {0: tokens}, None)),
            "rope_qkv": (_RopeQKV(c.num_attention_heads, c.num_key_value_heads),
                         (example(8, qkv_width), example(8, 1, d, dt=torch.float32),
                          example(8, 1, d, dt=torch.float32)),
                         ({0: tokens}, {0: tokens}, {0: tokens})),
            "swiglu": (_SwiGLU(), (example(8, 2 * c.intermediate_size),), ({0: tokens},)),
        }
        key = _cache_key(config, dtype)
        folder = home() / "fused"
        folder.mkdir(parents=True, exist_ok=True)
        self.compile_seconds, self.cached = 0.0, True
        start = time.perf_counter()
        self.kernels = {}
        for name, (module, example, dynamic) in specs.items():
            path = folder / f"{name}-{key}.pt2"
            if not path.exists():
                self.cached = False
                compiled = time.perf_counter()
                with torch._inductor.config.patch(emulate_precision_casts=True):
                    exported = torch.export.export(module, example, dynamic_shapes=dynamic)
                    torch._inductor.aoti_compile_and_package(exported, package_path=str(path))
                self.compile_seconds += time.perf_counter() - compiled
            self.kernels[name] = torch._inductor.aoti_load_package(str(path))
        self.load_seconds = time.perf_counter() - start - self.compile_seconds
        self.calls = 0  # kernel calls
        self.counter = None  # fusion_report.StepCounter while the report counts a step

    @property
    def note(self) -> str:
        how = "loaded from cache" if self.cached else f"compiled in {self.compile_seconds:.0f} s, now cached"
        return f"{len(self.kernels)} AOTInductor kernels, {how}"

    def add_rms_norm(self, x, residual, weight):
        return self._call("add_rms_norm", x.contiguous(), residual, weight)

    def rope_qkv(self, qkv, cos, sin):
        return self._call("rope_qkv", qkv.contiguous(), cos, sin)

    def swiglu(self, gate_up):
        return self._call("swiglu", gate_up.contiguous())[0]

    def _call(self, name: str, *inputs) -> tuple[torch.Tensor, ...]:
        self.calls += 1
        outputs = self.kernels[name](*inputs)
        outputs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)  # one output comes bare
        if self.counter is not None:
            self.counter.record(f"fused {name}", inputs, outputs)
        return outputs


def _cache_key(config: ModelConfig, dtype: torch.dtype) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu += "".join(line for line in f if line.startswith(("model name", "flags")))
    except OSError:
        pass
    raw = f"{FORMAT}|{torch.__version__}|{cpu}|{dtype}|{config}|{inspect.getsource(ops)}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]
