"""What this machine can do, measured: memory bandwidth (a copy, and a read alone) and the matmul rate.

A decode step is bounded by the bytes it reads over the read bandwidth (`roofline`), so these are the ceilings'
denominators. Each is the best of a few repeats: the fastest run is the one least disturbed by the rest of the
machine.
"""
from __future__ import annotations

import time

import torch


def measure_bandwidth(device: str = "cpu", mb: int = 256, repeats: int = 5) -> float:
    """Copy bandwidth in bytes/s (read + write counted), best of ``repeats``."""
    src = torch.empty(mb * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * src.numel() / best


def measure_read_bandwidth(device: str = "cpu", mb: int = 1024, repeats: int = 5) -> float:
    """Read-only bandwidth in bytes/s, best of ``repeats``: a sum reads every byte once and writes one number.

    The buffer must be larger than the last-level cache (a server CPU can hold hundreds of MB), or the
    cache, not memory, is what gets measured. Decoding reads its weights; it writes almost nothing."""
    buf = torch.ones(mb * 2**20 // 4, dtype=torch.float32, device=device)
    buf.sum()  # first touch: page faults are not bandwidth
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        buf.sum()
        sync(device)
        best = min(best, time.perf_counter() - t)
    return buf.numel() * 4 / best


def measure_matmul_flops(device: str = "cpu", dtype: torch.dtype = torch.bfloat16, n: int = 1024) -> float:
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    a @ b
    sync(device)
    t, reps = time.perf_counter(), 0
    while time.perf_counter() - t < 0.5:
        a @ b
        reps += 1
    sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t)


def measure_compute(device: str = "cpu", dtype: torch.dtype = torch.bfloat16) -> tuple[float, str]:
    """The compute ceiling stages are held against, FLOP/s, and a note naming it: the faster of ``dtype``'s
    matmul and float32's. Where a CPU has no fast 16-bit path (AVX2: torch's bfloat16 matmul takes a scalar path,
    docs/measuring.md), our kernels multiply in float32 fused multiply-adds, so float32's rate is what they can
    reach; where it has one (AVX-512 BF16, AMX, a GPU), the 16-bit rate is the higher."""
    rate = measure_matmul_flops(device, dtype)
    if dtype in (torch.float32, torch.float64):
        return rate, ""
    wide = measure_matmul_flops(device, torch.float32)
    if wide <= rate:
        return rate, ""
    return wide, f" (float32; {str(dtype).removeprefix('torch.')} {rate / 1e9:,.0f})"


def sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
