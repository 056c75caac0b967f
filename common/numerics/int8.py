"""int8 weights, one scale per output channel: the linear and the embedding lookup that share its table."""
from __future__ import annotations

import torch

from common.numerics import native
from common.numerics.quant import QuantizedLinear, check_shape, cuda_kernels


class Int8Linear(QuantizedLinear):
    """Per-output-channel int8. On a CPU with AMX, our kernel (``native/linear.cpp``) widens each block of
    weights to bfloat16 (exact: 7 significant bits) and multiplies on the tiles like the bfloat16 linear; with
    AVX-512 or on any other CPU, our AVX-512 or portable kernel widens them to float32 (exact) in registers and
    scales each output once at the end; on CUDA, ``quant_cuda.py``'s Triton kernel; where none of ours built, or
    in plain mode, ``torch._weight_int8pack_mm``."""

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
        if self.native_kernels is None:
            self.ours = None
        elif native.is_portable(self.kernel_name):  # plain int8 in the portable kernel's order
            self.ours = self.native_kernels.pack_portable(q)
        else:  # sign and magnitude in the AVX-512 kernels' widening order
            self.ours = self.native_kernels.pack(q, self.interleave)
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
