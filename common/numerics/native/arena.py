"""Packed weights on 2 MiB pages: one arena per model that our CPU linears read from.

Why: decoding one token streams every weight once, 134 MB (int8) to 269 MB (bfloat16) for SmolLM2. On 4 KiB
pages that is 33,000 to 66,000 pages a step, each a TLB miss and a page walk the first time the step touches
it, and the walks cost more in a virtual machine (two levels of page tables). On 2 MiB pages the same
weights are 70 to 140 pages. Linux gives a process 2 MiB pages for memory it marks with
``madvise(MADV_HUGEPAGE)`` before touching it (where transparent huge pages are ``always`` or ``madvise``,
as on the machines measured); torch's allocator does not mark memory the size of one projection. So the
model's packed weights are copied, one after another as they are built, into one private anonymous mapping
so marked. The mapping reserves generous address space and only what is written becomes resident (in 2 MiB
steps), and the heap's copies are handed back, so the process holds what it held before. Measured in README.md
("Weights on 2 MiB pages"); no bit changes (the same bytes, elsewhere).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os

import torch

HUGE_PAGE = 2 << 20
ALIGN = 4096  # each weight starts on a 4 KiB page of its own (and so on a 64-byte line, as the kernels read)
TRIM_EVERY = 32 << 20  # bytes placed between two returns of freed heap memory (each takes ~15 ms)


class WeightArena:
    """Copies tensors into one ``MADV_HUGEPAGE`` mapping; ``place(t)`` returns the copy (or ``t`` where the
    platform cannot, or ``STEPWISE_HUGE_PAGES=0``)."""

    def __init__(self, reserve_bytes: int):
        self.buffer = self.tensor = None
        self.used = self.start = self.trimmed_at = 0
        flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0) | getattr(mmap, "MAP_NORESERVE", 0)
        if os.environ.get("STEPWISE_HUGE_PAGES", "1") == "0" or not hasattr(mmap, "MADV_HUGEPAGE") or not flags:
            return
        size = reserve_bytes + HUGE_PAGE
        try:
            buffer = mmap.mmap(-1, size, flags=flags)
            buffer.madvise(mmap.MADV_HUGEPAGE)
        except (OSError, ValueError):  # no huge pages here: the weights stay where torch put them
            return
        self.buffer, self.tensor = buffer, torch.frombuffer(buffer, dtype=torch.uint8)
        self.start = self.used = (-self.tensor.data_ptr()) % HUGE_PAGE  # the first weight on a 2 MiB boundary
        self.trimmed_at = self.start

    def place(self, t: torch.Tensor) -> torch.Tensor:
        if self.tensor is None or t.device.type != "cpu" or not t.is_contiguous():
            return t
        n = t.nbytes
        if self.used + n > self.tensor.numel():
            return t
        copy = self.tensor[self.used:self.used + n].view(t.dtype).view(t.shape)
        copy.copy_(t)
        self.used += -(-n // ALIGN) * ALIGN
        if self.used - self.trimmed_at >= TRIM_EVERY:
            _give_back_freed_memory()
            self.trimmed_at = self.used
        return copy

    def finish(self) -> None:
        """Call once every weight is placed: the heap's last freed pages go back too."""
        if self.tensor is not None:
            _give_back_freed_memory()

    @property
    def placed_bytes(self) -> int:
        return self.used - self.start


def _give_back_freed_memory() -> None:
    """Returns the heap's free pages to the system (glibc's ``malloc_trim``): the weights copied, and the
    packing's scratch, would otherwise stay resident beside their copies in the arena (int8: 140 MB more)."""
    if _libc is not None:
        _libc.malloc_trim(0)


_libc = ctypes.CDLL(ctypes.util.find_library("c")) if os.name == "posix" else None
if _libc is not None and not hasattr(_libc, "malloc_trim"):  # not glibc
    _libc = None
