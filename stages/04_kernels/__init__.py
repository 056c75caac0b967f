"""Stage 04: fused Triton kernels for the hot path (CUDA), stage 03's torch code elsewhere.

The kernel modules (`elementwise`, `paged_attention`) import triton; they are loaded
only when a CUDA device will run them, or by the tests (interpreted on CPU)."""
from .engine import LLM
from .kernel_cache import KernelPagedCache
from .model import KernelLlama, kernels_available

__all__ = ["LLM", "KernelLlama", "KernelPagedCache", "kernels_available"]
