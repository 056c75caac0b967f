"""What a server that runs for hours asks of glibc's malloc, so that its resident memory follows what it uses.

glibc keeps freed memory inside the process to hand out again, which a short script never notices and a server
serving for hours does: after the model loads, SmolLM2's server held about 200 MiB of freed heap (mallinfo2's
``fordblks``) that no request used again, and a burst of large requests (1 MB predictions, tokenized on worker
threads) left RSS a step higher for the rest of the hour (docs/soak.md). Three settings, each a no-op where the C
library is not glibc:

* ``M_MMAP_THRESHOLD`` fixed at 128 KiB: glibc raises it (up to 32 MiB) each time a large block is freed, after
  which large request buffers come from the heap and stay there; fixed, each gets its own mapping, returned when
  freed.
* ``M_ARENA_MAX`` 2: otherwise each thread that allocates may get an arena of its own (the engine's, HTTP's, the
  threads that prepare requests and compile grammars), each keeping its own freed memory.
* ``malloc_trim(0)`` hands freed pages inside the heaps back to the system (glibc >= 2.8 releases whole free pages
  in every arena, not only the heap's top). When: in a soak's server RSS jumped by 80-150 MiB about every 5 s, the
  rate of its 1 MB predictions, and stayed there until the next trim; so a thread reads RSS every second and trims
  once it has grown ``grow_bytes`` over what the last trim left (and every ``every_s`` seconds regardless). A trim
  with nothing to give back still walks the free chunks (about 5 ms on a badly fragmented 600 MiB heap here), so
  it does not run blindly every second.
"""
from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass

MMAP_THRESHOLD = 128 * 1024  # glibc's initial threshold, kept
ARENA_MAX = 2
M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8  # mallopt's parameters (malloc.h)


def glibc():
    """The C library if it is glibc (it has ``malloc_trim``), else None."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


def rss_bytes() -> int:
    """This process's resident set, from /proc (0 where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096
    except OSError:
        return 0


def settle_malloc() -> bool:
    """Fix the mmap threshold and bound the arenas, before the server's threads start; True where glibc took them."""
    libc = glibc()
    return bool(libc and libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and libc.mallopt(M_ARENA_MAX, ARENA_MAX))


@dataclass
class Trimmer:
    """Gives freed heap pages back once RSS has grown ``grow_bytes`` over the mark the last trim left, at most once
    a ``check_s``, and every ``every_s`` seconds regardless; counts what that gave back and cost (``trims``,
    ``released_bytes``, ``seconds``: a trim walks every arena under its lock, so it is timed). A trim that finds the
    memory still in use (a large request in flight) raises the mark by at most ``grow_bytes``, so what the request
    frees when it ends is given back within a check or two, not at the next ``every_s``."""
    check_s: float = 1.0
    grow_bytes: int = 16 * 2**20
    every_s: float = 30.0
    trims: int = 0
    released_bytes: int = 0
    seconds: float = 0.0
    mark: int = 0  # RSS the last trim left, raised by at most grow_bytes a trim
    last: float = 0.0  # time.monotonic() of the last trim

    def due(self, rss: int, now: float) -> bool:
        return rss > self.mark + self.grow_bytes or now - self.last >= self.every_s

    def trim(self) -> int:
        """One ``malloc_trim(0)``; the bytes of RSS it gave back (0 where the C library is not glibc)."""
        libc = glibc()
        if libc is None:
            return 0
        before, t0 = rss_bytes(), time.perf_counter()
        libc.malloc_trim(0)
        self.seconds += time.perf_counter() - t0
        after = rss_bytes()
        released = max(0, before - after)
        self.trims += 1
        self.released_bytes += released
        self.mark = after if self.trims == 1 else min(after, self.mark + self.grow_bytes)
        self.last = time.monotonic()
        return released

    def start(self, stop: threading.Event) -> threading.Thread:
        """Trim now (the model's loading left its freed buffers behind), then as ``due`` says until ``stop``."""
        def run() -> None:
            self.trim()
            while not stop.wait(self.check_s):
                if self.due(rss_bytes(), time.monotonic()):
                    self.trim()
        thread = threading.Thread(target=run, name="malloc-trim", daemon=True)
        thread.start()
        return thread
