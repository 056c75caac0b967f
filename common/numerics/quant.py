"""Weight-only quantization: what the int8 and int4 linears share, and the bytes each precision holds.

Why: decoding one token reads every weight once, so on a bandwidth-bound machine the bytes per
weight set the time per token (``common.tools.roofline`` computes the ceiling). The activations
stay bfloat16; only the stored weights shrink, and each kernel widens them on the fly.

* ``int8`` (``int8.py``): one scale per output channel, symmetric (``w = q * s``, ``q`` in -127..127),
  made from the dense weights.
* ``int4`` (``int4.py``): SmolLM2's GGUF stores its projections as Q4_1: groups of 32 weights along
  the input features with an fp16 scale ``d`` and minimum ``m``, ``w = d * q + m``, ``q`` in 0..15.
  ``common.prepare`` keeps those blocks in the checkpoint folder and they become int4's groups
  without re-quantizing; a checkpoint without them (the tiny model) is quantized with Q4_1's recipe.
* ``w4a8``: int4's weights, and the activations rounded to int8 per group of 32 on the way in, so a
  group's products are integers summed by one instruction per 4 inputs (what llama.cpp's Q4_1 x
  Q8_1 does; ``native/linear_portable_w4a8.h``). Not weight-only: each input moves by up to half
  of its group's step (1/254 of its largest). CPU only, on our native kernels.

What is quantized: every projection (q, k, v, o, gate, up, down). The token table (the tied
embedding / LM head) becomes int8 per row in both modes (the GGUF holds it at 8 bits too, as
Q8_0); the embedding lookup dequantizes the rows it reads from that same table. Norms stay in
the model dtype.

Which kernel runs: ours on CPU (``native/linear.cpp`` with AMX, ``linear_avx512.h`` with AVX-512),
Triton on CUDA (``quant_cuda.py``), torch's packed kernels elsewhere and in plain mode. Each
computes an output row from its own input row alone in one fixed order over the input features,
so like every linear they are batch-invariant on the row tile the load-time check finds
(``invariant.py``). docs/quantization.md holds the measurements.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from common.numerics.invariant import RowTiled

QUANTIZATIONS = ("int8", "int4", "w4a8")
GROUP_SIZE = 32  # int4 weights per scale/zero: Q4_1's block
Q4_1_BLOCK_BYTES = 20  # fp16 d, fp16 m, 16 bytes of nibbles
Q4_1_SUFFIX = ".q4_1_blocks"  # checkpoint tensors holding a projection's GGUF blocks (see common.prepare)


def parse_quantization(quantization: str | None, dtype: torch.dtype, device: torch.device) -> str | None:
    if quantization in (None, "none", "None", ""):
        return None
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization={quantization!r} is not supported; use None, 'int8', 'int4' or 'w4a8'")
    if dtype != torch.bfloat16:
        raise ValueError(f"quantization={quantization!r} computes in bfloat16 (the kernels' fast path): "
                         f"pass dtype='bfloat16', not {dtype}")
    if quantization == "w4a8":
        from common.numerics import native
        if device.type != "cpu":
            raise ValueError(f"quantization='w4a8' runs on stepwise's CPU kernels, not on device={device.type!r}: "
                             "use 'int4' there (the same weights, bfloat16 activations)")
        if native.w4a8_kernel() is None:
            raise ValueError("quantization='w4a8' runs on stepwise's native CPU kernels, which did not build here "
                             f"({native.build_note(native.LINEAR_SOURCE)}); use 'int4'")
        return quantization
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            raise ValueError(f"quantization={quantization!r} on CUDA runs Triton kernels: pip install triton") from None
    elif device.type != "cpu":
        raise ValueError(f"quantization={quantization!r} runs on CPU or CUDA, not on device={device.type!r}")
    return quantization


def cuda_kernels(device: torch.device | str | None):
    """quant_cuda.py's Triton kernels for weights on a CUDA device, else None (imported only when needed)."""
    if device is None or torch.device(device).type != "cuda":
        return None
    from common.numerics import quant_cuda
    return quant_cuda


class QuantizedLinear(RowTiled):
    """``x @ W.T`` with a quantized W: row tiles as ``invariant.Linear`` (the load-time check covers it)."""
    out_features: int
    in_features: int
    nbytes: int  # bytes one call reads: the quantized weights and their scales

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def dequantized(self) -> torch.Tensor:
        """The float32 weights [out, in] the kernel multiplies by (for tests and quality checks)."""
        raise NotImplementedError

    @property
    def backend(self) -> str:
        return f"torch {type(self).__name__.removesuffix('Linear')} kernel"

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel(x)


def check_shape(weight_shape, name: str = "weight") -> None:
    out_features, in_features = weight_shape
    if in_features % GROUP_SIZE or out_features % 16:
        raise ValueError(f"{name} is {out_features}x{in_features}: the quantized kernels need the input features "
                         f"to be a multiple of {GROUP_SIZE} and the output features a multiple of 16")


def precision_bytes(shapes: Mapping[str, tuple[int, ...]], precision: str) -> int:
    """Bytes of weights held (and read by one decode step, for a tied model) in ``precision``:
    'float32', 'bfloat16', 'float16', 'int8', 'int4' or 'w4a8', scales and zeros included."""
    if precision in ("float32", "bfloat16", "float16"):
        return sum(int(np.prod(s)) for s in shapes.values()) * getattr(torch, precision).itemsize
    total = 0
    for name, shape in shapes.items():
        n = int(np.prod(shape))
        if name.endswith("_proj.weight") and precision in ("int4", "w4a8"):
            total += n // 2 + n // GROUP_SIZE * 2 * 2  # nibbles, a 16-bit scale and minimum (or zero) per group
        elif name.endswith("_proj.weight") or len(shape) == 2:  # projections and token tables in int8
            total += n + shape[0] * 2  # a byte per weight, a bfloat16 scale per row
        else:
            total += n * 2  # norms stay bfloat16
    return total
