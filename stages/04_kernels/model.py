"""The Llama forward pass with its element-wise operations fused into Triton kernels (CUDA only).

On CPU every method falls back to the torch version in `common.model`: the
Triton interpreter is far too slow to serve with, and tokens stay the reference's.
"""
from __future__ import annotations

import os

import torch

from common.model import Llama


def kernels_available(device: torch.device) -> tuple[bool, str]:
    """Whether this device runs the Triton kernels, and a sentence saying which path the engine takes."""
    if os.environ.get("STEPWISE_FORCE_KERNELS") == "1":  # tests: the kernels interpreted on CPU
        return True, "Triton kernels forced on (STEPWISE_FORCE_KERNELS=1)"
    if device.type != "cuda":
        return False, f"torch path on {device.type}: the Triton kernels need CUDA (tests run them interpreted)"
    try:
        import triton
    except ImportError:
        return False, "torch path: triton is not installed (pip install triton)"
    return True, f"Triton {triton.__version__} kernels on {torch.cuda.get_device_name(device)}"


class KernelLlama(Llama):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.use_kernels, self.path = kernels_available(self.device)
        if self.use_kernels:
            from . import elementwise
            self.kernels = elementwise

    def add_rms_norm(self, x, residual, weight):
        if not self.use_kernels:
            return super().add_rms_norm(x, residual, weight)
        return self.kernels.add_rms_norm(x, residual, weight, self.config.rms_norm_eps)

    def rope(self, x, cos, sin):
        # x is a strided view into the fused qkv output: the kernel rotates it where it lies.
        return self.kernels.rope_(x, cos, sin) if self.use_kernels else super().rope(x, cos, sin)

    def swiglu(self, gate_up):
        return self.kernels.swiglu(gate_up) if self.use_kernels else super().swiglu(gate_up)
