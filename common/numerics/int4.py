"""int4 weights in GGUF Q4_1 groups (``w = d * q + m``, 32 weights a group), read from the GGUF's own blocks."""
from __future__ import annotations

import numpy as np
import torch

from common.numerics import native
from common.numerics.quant import GROUP_SIZE, Q4_1_BLOCK_BYTES, QuantizedLinear, check_shape, cuda_kernels


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
    """GGUF Q4_1 groups: ``w = d * q + m``. On CPU our kernels (``linear_int4.h`` on AMX, ``linear_avx512.h`` with
    AVX-512 BF16, ``linear_portable.h`` elsewhere) on the GGUF's codes, d and m, reordered at load; on CUDA,
    ``quant_cuda.py``'s Triton kernel on the GGUF's bytes; where none of ours built, or in plain mode,
    ``torch._weight_int4pack_mm_for_cpu``. ``activations=8`` (w4a8): the portable kernel's records, every row
    rounded to int8 per group and multiplied in integers (``linear_portable_w4a8.h``), on CPU only, plain or not
    (its rows are independent anyway)."""

    def __init__(self, codes: np.ndarray, d: np.ndarray, m: np.ndarray, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str | None = None, plain: bool = False, activations: int = 16):
        """codes [out, in] in 0..15; d, m [out, in / 32]: the weight is d * q + m group by group."""
        check_shape(codes.shape)
        self.out_features, self.in_features = codes.shape
        self.group_size = self.in_features // d.shape[1]
        self.plain, self.activations = plain, activations
        self.triton = None if activations == 8 else cuda_kernels(device)
        self.records = None
        if activations == 8 and (not native.w4a8_kernel() or torch.device(device or "cpu").type != "cpu"):
            raise ValueError("w4a8 runs on stepwise's native CPU kernels only; use int4")
        if self.triton is not None:  # the GGUF's bytes and its fp16 d and m, as they are
            self.nibbles = self.triton.q4_1_nibbles(codes).to(device)
            self.d, self.m = (torch.from_numpy(t.astype(np.float16)).to(device) for t in (d, m))
            self.nbytes = self.nibbles.numel() + 2 * self.d.numel() * self.d.element_size()
            return
        # w4a8: the portable kernel's records, plain or not (its rows are independent anyway)
        kernel = native.w4a8_kernel() if activations == 8 else None if plain else native.int4_kernel()
        if kernel:  # the GGUF's codes, d and m, in our kernels' order
            self.kernel_name, self.native_kernels = kernel, native.kernels(native.LINEAR_SOURCE)
            self.kernel_arg = "w4a8" if activations == 8 else native.LINEAR_KERNELS[kernel]
            ops = self.native_kernels
            pack = ops.pack_int4_portable if self.kernel_arg in ("portable", "w4a8") else ops.pack_int4
            self.records = pack(*(torch.from_numpy(np.ascontiguousarray(t)) for t in
                                  (codes.astype(np.uint8), d.astype(np.float16), m.astype(np.float16))))
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
                  device: torch.device | str | None = None, plain: bool = False,
                  activations: int = 16) -> "Int4Linear":
        return cls(*q4_1_groups(blocks), dtype=dtype, device=device, plain=plain, activations=activations)

    def place_weights(self, place) -> None:
        if self.records is not None:
            self.records = place(self.records)

    @property
    def backend(self) -> str:
        if self.triton is not None:
            return "Triton Int4 kernel (stepwise)"
        if self.activations == 8:
            return f"{self.kernel_name} kernel (stepwise): int4 weights x int8 activations"
        return f"{self.kernel_name} Int4 kernel (stepwise)" if self.records is not None else "torch Int4 kernel"

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        if self.records is not None:
            return self.native_kernels.linear(x, self.records, None, self.out_features, self.kernel_arg)
        if self.triton is not None:
            return self.triton.int4_linear(x, self.nibbles, self.d, self.m)
        return torch._weight_int4pack_mm_for_cpu(x, self.packed, self.group_size, self.scales_and_zeros)

    def dequantized(self, columns: int | None = None) -> torch.Tensor:
        """The weights [out, columns or in] as the kernel reads them (w4a8's too: its rounding is the inputs').
        Ours and CUDA: d * q + m in float32, read back from the kernel's records or the GGUF's bytes. Otherwise:
        fed rows of the identity in float32, torch's kernel returns one weight per output, (q - 8) * scale + zero,
        unpacked from the packed layout the bfloat16 path reads (float32 takes torch's scalar path: slow, for
        tests)."""
        if self.records is not None:
            blocks, chunks = self.records.shape[:2]
            d, m = (self.records[..., i:i + 32].contiguous().view(torch.float16).float().transpose(1, 2)
                    for i in (0, 32))  # [blocks, 16 outputs, chunks]
            if self.kernel_arg in ("portable", "w4a8"):  # linear_portable_pack.h: run 2c + h, word j, nibble t
                b = self.records[..., 64:].reshape(blocks, chunks, 4, 2, 8, 4)  # [.., c, h, j, byte]
                t = torch.stack([b & 0xF, b >> 4], -1).reshape(blocks, chunks, 4, 2, 8, 8)  # [.., c, h, j, t]
                q = t.permute(0, 3, 4, 1, 2, 5).reshape(blocks, 16, -1).float()  # [blocks, output 8h + j, 32g + 8c + t]
                w = q * d.repeat_interleave(GROUP_SIZE, -1) + m.repeat_interleave(GROUP_SIZE, -1)
                return w.reshape(-1, self.in_features)[:self.out_features, :columns]
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
