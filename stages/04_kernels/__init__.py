"""Stage 04: fused kernels for the hot path: Triton on CUDA, hand-written C++ on CPU.

The Triton modules (`elementwise`, `paged_attention`) import triton; they are loaded only when a
CUDA device will run them, or by the tests (interpreted on CPU). `cpu_fusion` builds the C++
kernels (`cpu_kernels.cpp`, the reference's element-wise math of common/numerics/ops.py, bit for bit) once
per machine and caches them."""
import sys

from stages import kernels

# A name beginning with a digit cannot follow an import statement, so this folder's modules are loaded once, as
# stages.kernels (stages/kernels.py, whose package path is this folder), and this name is that module.
sys.modules[__name__] = kernels
