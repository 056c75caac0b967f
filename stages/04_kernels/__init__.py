"""Stage 04: fused kernels for the hot path: Triton on CUDA, hand-written C++ on CPU.

The Triton modules (`elementwise`, `paged_attention`) import triton; they are loaded only when a
CUDA device will run them, or by the tests (interpreted on CPU). `cpu_fusion` builds the C++
kernels (`cpu_kernels.cpp`, the reference's element-wise math of common/numerics/ops.py, bit for bit) once
per machine and caches them."""
from .engine import LLM, LLMEngine
from .kernel_cache import KernelPagedCache
from .model import KernelLlama, describe_path, kernels_available

__all__ = ["LLM", "LLMEngine", "KernelLlama", "KernelPagedCache", "describe_path", "kernels_available"]
