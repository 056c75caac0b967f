"""The Llama forward pass with its element-wise operations fused: Triton kernels on CUDA, hand-written C++ kernels
on CPU. Both reproduce ``common.numerics.ops`` bit for bit, so the tokens stay the reference's.
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
        return False, f"no Triton on {device.type}"
    try:
        import triton
    except ImportError:
        return False, "torch path: triton is not installed (pip install triton)"
    return True, f"Triton {triton.__version__} kernels on {torch.cuda.get_device_name(device)}"


def describe_path(device: torch.device) -> str:
    """Which fused kernels a stage-04 engine on ``device`` runs (before building one)."""
    available, path = kernels_available(device)
    if available:
        return path
    if device.type == "cpu" and os.environ.get("STEPWISE_NO_FUSION") != "1":
        return "fused CPU kernels (C++, compiled once per machine, then cached)"
    return f"torch path on {device.type} ({path})"


class KernelLlama(Llama):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.use_kernels, self.path = kernels_available(self.device)
        self.fused = None
        if self.use_kernels:
            from . import elementwise
            self.kernels = elementwise
        elif self.device.type == "cpu" and os.environ.get("STEPWISE_NO_FUSION") != "1":
            from .cpu_fusion import FusedCPU
            try:
                self.fused = FusedCPU(self.config, self.dtype)
                self.path = f"fused CPU kernels ({self.fused.note})"
            except RuntimeError as e:  # no working C++ compiler: stage 03's torch code, and say why
                self.path = f"torch path on cpu ({e})"
        else:
            self.path = f"torch path on {self.device.type} ({self.path})"

    def add_rms_norm(self, x, residual, weight):
        if self.use_kernels:
            return self.kernels.add_rms_norm(x, residual, weight, self.config.rms_norm_eps)
        if self.fused is not None and residual is not None:
            return self.fused.add_rms_norm(x, residual, weight)
        return super().add_rms_norm(x, residual, weight)

    def rope_qkv(self, qkv, cos, sin):
        if self.fused is not None:
            return self.fused.rope_qkv(qkv, cos, sin)
        if not self.use_kernels:
            return super().rope_qkv(qkv, cos, sin)
        # The kernel rotates q and k where they lie in the merged projection's output.
        nq, nkv, d = self.config.num_attention_heads, self.config.num_key_value_heads, self.config.head_dim
        qk = self.kernels.rope_(qkv[:, :(nq + nkv) * d].view(-1, nq + nkv, d), cos, sin)
        return qk[:, :nq], qk[:, nq:], qkv[:, (nq + nkv) * d:].view(-1, nkv, d)

    def attend(self, layer, qkv, cos, sin, attention):
        # On CPU, RoPE and the KV write into the paged cache are one kernel (on CUDA the cache's own kernel writes).
        if self.fused is not None and hasattr(attention, "store_target"):
            return attention.attend(layer, self.fused.rope_qk_store(qkv, cos, sin, *attention.store_target(layer)))
        return super().attend(layer, qkv, cos, sin, attention)

    def swiglu(self, gate_up):
        if self.use_kernels:
            return self.kernels.swiglu(gate_up)
        if self.fused is not None:
            return self.fused.swiglu(gate_up)
        return super().swiglu(gate_up)
