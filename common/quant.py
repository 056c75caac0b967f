"""Weight-only quantization: linears that read 8 or 4 bits per weight instead of 16.

Why: decoding one token reads every weight once, so on a bandwidth-bound machine the
bytes per weight set the time per token (see ``common.tools.roofline``). The activations stay
bfloat16; only the stored weights shrink, and each kernel widens them on the fly.

* ``int8``: one scale per output channel, symmetric (``w = q * s``, ``q`` in -127..127),
  made from the dense weights.
* ``int4``: SmolLM2's GGUF stores its projections as Q4_1: groups of 32 weights along the
  input features with an fp16 scale ``d`` and minimum ``m``, ``w = d * q + m``, ``q`` in 0..15.
  ``common.prepare`` keeps those blocks in the checkpoint folder and they become int4's groups
  without re-quantizing. Our kernels (AMX on CPU, Triton on CUDA) keep the GGUF's codes, ``d``
  and ``m`` exactly (they never form ``w``: per group they take ``d * (x . q) + m * sum(x)``), so
  read back, their weights are the GGUF's. torch's CPU kernel
  (``torch._weight_int4pack_mm_for_cpu``, ATen's ``int4mm_kernel.cpp``; where there is no AMX)
  computes ``w = (q - 8) * scale + zero`` with ``scale = d``, ``zero = m + 8 d`` held in
  bfloat16 (8 significant bits against fp16's 11): that rounding is its only difference from
  the GGUF's weights (``tests/test_oracle_hf.py`` states the largest). A checkpoint without
  Q4_1 blocks (the tiny model) is quantized with Q4_1's own recipe.

What is quantized: every projection (q, k, v, o, gate, up, down). The tied embedding / LM
head table becomes int8 per row in both modes (the GGUF holds it at 8 bits too, as Q8_0,
which the int4 kernel cannot hold); the embedding lookup dequantizes the rows it reads
from that same table. Norms stay in the model dtype.

Kernels on CUDA: Triton kernels that widen the weights in registers (``common.quant_cuda``), int4
on the GGUF's own bytes with its fp16 ``d`` and ``m`` unrounded. Kernels on a CPU with Intel AMX:
our own (``common/native/linear.cpp``, int4 in ``linear_int4.h``). int8: the weights are widened to
bfloat16 (exactly) a tile at a time and multiplied like the bfloat16 linear, then scaled per output;
on a CPU with AVX-512 and no AMX, the same packed int8 weights widen in registers for
``linear_avx512.h``'s kernels (int4 there on VDPBF16PS). int4: the codes
are widened to bfloat16 (exactly: 0..15), each tile product is one group's ``x . q``, and the
outputs add ``d * (x . q) + m * sum(x)`` group by group in float32; one request's row takes
several groups per tile round trip, with the same bits. Elsewhere, and in plain mode, torch's
kernels (``torch._weight_int8pack_mm``, ``torch._weight_int4pack_mm_for_cpu``). A step's
projections at SmolLM2's shapes on the build machine, against torch's: int8 1.5x as fast for one
request and 6x at 32 rows; int4 about 1.2x for one request (1.1x on a whole stage-04 step) and 5x
at 32 rows (torch's kernels widen the weights again for every 4 rows).

Batch invariance: every kernel computes each output row from its own input row alone, in one
fixed order over the input features, with no split over them (ours by construction; torch's
checked on the build machine: a row's bits are the same alone or inside a call of any row
count from 1 to 80, and 127-129, 256, 512, 1,024, with 1 and 2 threads). Like every linear,
they run on the row tile the load-time check (``common.invariant``) finds.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from common import native
from common.invariant import Linear, RowTiled
from common.native.arena import WeightArena

QUANTIZATIONS = ("int8", "int4")
GROUP_SIZE = 32  # int4 weights per scale/zero: Q4_1's block
Q4_1_BLOCK_BYTES = 20  # fp16 d, fp16 m, 16 bytes of nibbles
Q4_1_SUFFIX = ".q4_1_blocks"  # checkpoint tensors holding a projection's GGUF blocks (see common.prepare)


def parse_quantization(quantization: str | None, dtype: torch.dtype, device: torch.device) -> str | None:
    if quantization in (None, "none", "None", ""):
        return None
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization={quantization!r} is not supported; use None, 'int8' or 'int4'")
    if dtype != torch.bfloat16:
        raise ValueError(f"quantization={quantization!r} computes in bfloat16 (the kernels' fast path): "
                         f"pass dtype='bfloat16', not {dtype}")
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            raise ValueError(f"quantization={quantization!r} on CUDA runs Triton kernels: pip install triton") from None
    elif device.type != "cpu":
        raise ValueError(f"quantization={quantization!r} runs on CPU or CUDA, not on device={device.type!r}")
    return quantization


def cuda_kernels(device: torch.device | str | None):
    """common.quant_cuda's Triton kernels for weights on a CUDA device, else None (imported only when needed)."""
    if device is None or torch.device(device).type != "cuda":
        return None
    from common import quant_cuda
    return quant_cuda


class QuantizedLinear(RowTiled):
    """``x @ W.T`` with a quantized W: row tiles as ``common.invariant.Linear`` (the load-time check covers it)."""
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


class Int8Linear(QuantizedLinear):
    """Per-output-channel int8. On a CPU with AMX, our kernel (``common/native/linear.cpp``) widens each block of
    weights to bfloat16 (exact: 7 significant bits) and multiplies on the tiles like the bfloat16 linear;
    on CUDA, ``common.quant_cuda``'s Triton kernel; elsewhere, or in plain mode, ``torch._weight_int8pack_mm``."""

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype = torch.bfloat16, plain: bool = False,
                 device: torch.device | str | None = None):
        check_shape(weight.shape)
        self.out_features, self.in_features = weight.shape
        self.plain = plain
        w = weight.float()
        amax = w.abs().amax(1)
        self.scales = torch.where(amax > 0, amax / 127, 1.0).to(dtype)
        # Rounded against the scale as stored, so q * scale is the weight the kernel sees.
        q = torch.round(w / self.scales.float()[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        self.nbytes = q.numel() + self.scales.numel() * self.scales.element_size()
        device = torch.device(device or "cpu")
        self.triton = cuda_kernels(device)  # on CUDA, plain mode too: the kernel keeps rows apart anyway
        self.kernel_name = native.linear_kernel() if self.triton is None and not plain else None
        self.native_kernels = native.kernels(native.LINEAR_SOURCE) if self.kernel_name else None
        self.kernel_arg = native.LINEAR_KERNELS.get(self.kernel_name)  # linear.cpp's name for it
        self.interleave = native.block_interleave(self.kernel_arg, self.out_features)
        self.ours = None if self.native_kernels is None else self.native_kernels.pack(q, self.interleave)
        self._qweight = q.to(device) if self.ours is None else None  # our CPU kernels keep only their packed copy
        self.scales = self.scales.to(device)
        self._scales_f32 = self.scales.float()

    def place_weights(self, place) -> None:
        if self.ours is not None:
            self.ours = place(self.ours)

    @property
    def backend(self) -> str:
        if self.triton is not None:
            return "Triton Int8 kernel (stepwise)"
        return f"{self.kernel_name} Int8 kernel (stepwise)" if self.ours is not None else "torch Int8 kernel"

    @property
    def qweight(self) -> torch.Tensor:
        """The int8 weights [out, in]."""
        return self._qweight if self._qweight is not None else self.rows(torch.arange(self.out_features))

    def rows(self, ids: torch.Tensor, dequantize: bool = False) -> torch.Tensor:
        """The int8 weights of the given output rows (token ids, for the embedding lookup); ``dequantize``: times
        their scales, in the model dtype. Our packed copy is read in place (linear.cpp's ``int8_rows``)."""
        if self._qweight is None:
            return self.native_kernels.int8_rows(self.ours, ids, self.in_features, self.interleave,
                                                 self._scales_f32 if dequantize else None)
        q = self._qweight[ids]
        return (q.float() * self.scales[ids].float()[:, None]).to(self.scales.dtype) if dequantize else q

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        if self.ours is not None:
            return self.native_kernels.linear(x, self.ours, self._scales_f32, self.out_features, self.kernel_arg,
                                              self.interleave)
        if self.triton is not None:
            return self.triton.int8_linear(x, self._qweight, self._scales_f32)
        if x.data_ptr() % 64:  # torch's int8 kernel reads rows with aligned vector loads
            x = x.clone()
        return torch._weight_int8pack_mm(x, self._qweight, self.scales)

    def dequantized(self) -> torch.Tensor:
        return self.qweight.float() * self.scales.float()[:, None]


class Int8Embedding:
    """The embedding lookup reading an int8 table (the tied LM head's): the rows it needs, widened."""

    def __init__(self, table: Int8Linear, dtype: torch.dtype):
        self.table, self.dtype = table, dtype
        self.nbytes = table.nbytes
        self.shape = (table.out_features, table.in_features)

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table.rows(ids, dequantize=True)


def q4_1_groups(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GGUF Q4_1 blocks [rows, groups * 20] bytes -> codes [rows, groups * 32] (0..15), d and m [rows, groups]."""
    rows = blocks.shape[0]
    b = np.ascontiguousarray(blocks).reshape(rows, -1, Q4_1_BLOCK_BYTES)
    d = b[..., 0:2].copy().view(np.float16)[..., 0]
    m = b[..., 2:4].copy().view(np.float16)[..., 0]
    nibbles = b[..., 4:]  # byte j holds weight j (low nibble) and weight j + 16 (high nibble)
    codes = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).reshape(rows, -1)
    return codes, d, m


def q4_1_quantize(weight: torch.Tensor) -> np.ndarray:
    """Dense [rows, cols] -> Q4_1 blocks, with gguf's own Q4_1 recipe (for checkpoints that hold none)."""
    import gguf

    w = weight.float().numpy()
    return gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_1).reshape(w.shape[0], -1)


class Int4Linear(QuantizedLinear):
    """GGUF Q4_1 groups: ``w = d * q + m``. On a CPU with AMX or AVX-512 BF16, our kernels (``linear_int4.h``,
    ``linear_avx512.h``) on the GGUF's codes, d and m, reordered at load; on CUDA, ``common.quant_cuda``'s Triton
    kernel on the GGUF's bytes; elsewhere, or in plain mode, ``torch._weight_int4pack_mm_for_cpu``."""

    def __init__(self, codes: np.ndarray, d: np.ndarray, m: np.ndarray, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str | None = None, plain: bool = False):
        """codes [out, in] in 0..15; d, m [out, in / 32]: the weight is d * q + m group by group."""
        check_shape(codes.shape)
        self.out_features, self.in_features = codes.shape
        self.group_size = self.in_features // d.shape[1]
        self.plain = plain
        self.triton = cuda_kernels(device)
        self.records = None
        if self.triton is not None:  # the GGUF's bytes and its fp16 d and m, as they are
            self.nibbles = self.triton.q4_1_nibbles(codes).to(device)
            self.d, self.m = (torch.from_numpy(t.astype(np.float16)).to(device) for t in (d, m))
            self.nbytes = self.nibbles.numel() + 2 * self.d.numel() * self.d.element_size()
            return
        if not plain and (kernel := native.int4_kernel()):  # the GGUF's codes, d and m, in our kernels' order
            self.kernel_name, self.native_kernels = kernel, native.kernels(native.LINEAR_SOURCE)
            self.kernel_arg = native.LINEAR_KERNELS[kernel]
            self.records = self.native_kernels.pack_int4(*(torch.from_numpy(np.ascontiguousarray(t)) for t in
                                                        (codes.astype(np.uint8), d.astype(np.float16),
                                                         m.astype(np.float16))))
            self.nbytes = self.records.numel()
            return
        scale = torch.from_numpy(d.astype(np.float32))
        zero = torch.from_numpy(m.astype(np.float32)) + 8 * scale  # (q - 8) * d + (m + 8 d) = d * q + m
        # [groups, out, 2]: the layout the kernel reads
        self.scales_and_zeros = torch.stack([scale, zero], -1).transpose(0, 1).to(dtype).contiguous()
        q = torch.from_numpy(codes.astype(np.int32))
        self.packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)  # layout depends on the CPU: packed at load
        self.nbytes = self.packed.numel() + self.scales_and_zeros.numel() * self.scales_and_zeros.element_size()

    @classmethod
    def from_q4_1(cls, blocks: np.ndarray, dtype: torch.dtype = torch.bfloat16,
                  device: torch.device | str | None = None, plain: bool = False) -> "Int4Linear":
        return cls(*q4_1_groups(blocks), dtype=dtype, device=device, plain=plain)

    def place_weights(self, place) -> None:
        if self.records is not None:
            self.records = place(self.records)

    @property
    def backend(self) -> str:
        if self.triton is not None:
            return "Triton Int4 kernel (stepwise)"
        return f"{self.kernel_name} Int4 kernel (stepwise)" if self.records is not None else "torch Int4 kernel"

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        if self.records is not None:
            return self.native_kernels.linear(x, self.records, None, self.out_features, self.kernel_arg)
        if self.triton is not None:
            return self.triton.int4_linear(x, self.nibbles, self.d, self.m)
        return torch._weight_int4pack_mm_for_cpu(x, self.packed, self.group_size, self.scales_and_zeros)

    def dequantized(self, columns: int | None = None) -> torch.Tensor:
        """The weights [out, columns or in] as the kernel reads them. Ours and CUDA: d * q + m in float32, read
        back from the kernel's records or the GGUF's bytes. Otherwise: fed rows of the identity in float32,
        torch's kernel returns one weight per output, (q - 8) * scale + zero, unpacked from the packed layout the
        bfloat16 path reads (float32 takes torch's scalar path: slow, for tests)."""
        if self.records is not None:
            blocks, chunks = self.records.shape[:2]
            d, m = (self.records[..., i:i + 32].contiguous().view(torch.float16).float().transpose(1, 2)
                    for i in (0, 32))  # [blocks, 16 outputs, chunks]
            # linear.cpp's pack_int4: byte 16 L + 8 h + r of each 64 bytes g holds word 8 L + r of tile row 4g + h
            # (low nibble) and of tile row 4g + 2 + h (high nibble); word 2o + p of row j is input 2j + p of output o
            b = self.records[..., 64:].view(blocks, chunks, 4, 4, 2, 8)  # [.., g, L, h, r]
            rows = torch.stack([b & 0xF, b >> 4], 3).permute(0, 1, 2, 3, 5, 4, 6).reshape(blocks, chunks, 16, 16, 2)
            q = rows.permute(0, 3, 1, 2, 4).reshape(blocks, 16, -1).float()  # [blocks, output, 32 c + 2 j + p]
            w = q * d.repeat_interleave(GROUP_SIZE, -1) + m.repeat_interleave(GROUP_SIZE, -1)
            return w.reshape(-1, self.in_features)[:self.out_features, :columns]
        if self.triton is not None:
            b = self.nibbles.view(self.out_features, -1, 16)
            q = torch.stack([b & 0xF, b >> 4], 2).view(self.out_features, -1, GROUP_SIZE).float()
            w = q * self.d.float()[..., None] + self.m.float()[..., None]
            return w.view(self.out_features, -1)[:, :columns]
        eye = torch.eye(self.in_features)[:columns]
        return torch._weight_int4pack_mm_for_cpu(eye, self.packed, self.group_size, self.scales_and_zeros.float()).t()


class LinearFactory:
    """Builds the model's linears and its embedding in the precision asked for (None: the model dtype).

    ``names`` lists checkpoint tensors stacked along the output features (q, k, v -> one
    matmul). ``weights`` maps names to the checkpoint's tensors, memory-mapped: a tensor's
    bytes are read only when used, so int4 never reads the dense projections.
    """

    def __init__(self, weights: Mapping[str, torch.Tensor], quantization: str | None, dtype: torch.dtype,
                 device: torch.device, plain: bool = False):
        self.quantization = parse_quantization(quantization, dtype, device)
        self.weights, self.dtype, self.device, self.plain = weights, dtype, device, plain
        self.built: dict[str, torch.Tensor | Int8Linear] = {}
        # Our CPU kernels' packed weights, on 2 MiB pages (address space only: what is placed becomes resident)
        reserve = 2 * sum(t.nbytes for t in weights.values()) if self.device.type == "cpu" and not plain else 0
        self.arena = WeightArena(reserve) if reserve else None

    def finish(self) -> None:
        """Every linear is built."""
        if self.arena is not None:
            self.arena.finish()

    def placed(self, linear):
        """``linear``, its packed weights moved into the arena (if it has both)."""
        if self.arena is not None:
            linear.place_weights(self.arena.place)
        return linear

    def dense(self, name: str) -> torch.Tensor:
        return self.weights[name].to(device=self.device, dtype=self.dtype)

    def embedding(self, name: str):
        if self.quantization is None:
            return self.built.setdefault(name, self.dense(name))
        return Int8Embedding(self.table(name), self.dtype)

    def table(self, name: str) -> Int8Linear:
        """A token table (embedding or LM head) in int8, built once: a tied head and the lookup share it."""
        if name not in self.built:
            self.built[name] = self.placed(Int8Linear(self.weights[name], self.dtype, self.plain, self.device))
        return self.built[name]

    def lm_head(self, tied: bool):
        name = "model.embed_tokens.weight" if tied else "lm_head.weight"
        if self.quantization is None:
            return self.placed(Linear(self.embedding(name) if tied else self.dense(name), self.plain))
        return self.table(name)

    def linear(self, names: list[str]):
        if self.quantization is None:
            weight = torch.cat([self.dense(n) for n in names]) if len(names) > 1 else self.dense(names[0])
            return self.placed(Linear(weight, self.plain))
        if self.quantization == "int8":
            return self.placed(Int8Linear(torch.cat([self.weights[n].float() for n in names]), self.dtype, self.plain,
                                          self.device))
        return self.placed(Int4Linear.from_q4_1(np.concatenate([self.q4_1_blocks(n) for n in names]), self.dtype,
                                                self.device, self.plain))

    def q4_1_blocks(self, name: str) -> np.ndarray:
        """The GGUF's own Q4_1 blocks when the checkpoint keeps them, else the dense weight quantized like them."""
        stored = name.removesuffix(".weight") + Q4_1_SUFFIX
        if stored in self.weights:
            return self.weights[stored].numpy()
        return q4_1_quantize(self.weights[name])


def precision_bytes(shapes: Mapping[str, tuple[int, ...]], precision: str) -> int:
    """Bytes of weights held (and read by one decode step, for a tied model) in ``precision``:
    'float32', 'bfloat16', 'float16', 'int8' or 'int4', scales and zeros included."""
    if precision in ("float32", "bfloat16", "float16"):
        return sum(int(np.prod(s)) for s in shapes.values()) * getattr(torch, precision).itemsize
    total = 0
    for name, shape in shapes.items():
        n = int(np.prod(shape))
        if name.endswith("_proj.weight") and precision == "int4":
            total += n // 2 + n // GROUP_SIZE * 2 * 2  # nibbles, a 16-bit scale and minimum (or zero) per group
        elif name.endswith("_proj.weight") or len(shape) == 2:  # projections and token tables in int8
            total += n + shape[0] * 2  # a byte per weight, a bfloat16 scale per row
        else:
            total += n * 2  # norms stay bfloat16
    return total
