"""The CPU time a process and all its descendants have used, sampled from Linux's /proc while they run.

A load tool that shares the machine with the server takes CPU the server would have had; aiperf runs as a
tree of processes (a controller, dataset and timing managers, workers, record processors), so its share is
the tree's, read over the timed part of its run only, its start-up left out.
"""
from __future__ import annotations

import os
import threading
import time

from ..children import proc_stats

TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(root: int) -> float:
    """User + system seconds of ``root`` and its live descendants (a process that already exited is gone)."""
    stats = proc_stats()
    cpu = {pid: (int(f[11]) + int(f[12])) / TICK for pid, f in stats.items()}
    children: dict[int, list[int]] = {}
    for pid, f in stats.items():
        children.setdefault(int(f[1]), []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo += children.get(pid, [])
    return total


class CpuSampler(threading.Thread):
    """Reads `tree_cpu(pid)` every ``every`` seconds until stopped: ``(time.time_ns(), seconds)`` pairs."""

    def __init__(self, pid: int, every: float = 0.25):
        super().__init__(daemon=True)
        self.pid, self.every, self.samples, self.done = pid, every, [], threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.samples.append((time.time_ns(), tree_cpu(self.pid)))
            self.done.wait(self.every)

    def stop(self) -> None:
        """Stops sampling, with one last reading while the process is there (an exited one not yet waited for
        still is: `os.waitid` with WNOWAIT waits for its end and leaves its times to read)."""
        self.done.set()
        self.join()
        if os.path.exists(f"/proc/{self.pid}"):
            self.samples.append((time.time_ns(), tree_cpu(self.pid)))

    def between(self, start_ns: int, end_ns: int) -> float | None:
        """CPU seconds used from ``start_ns`` to ``end_ns`` (wall clock, ns), from the samples just outside that
        window (so at most one sampling period too long at each end); None if the samples do not span it."""
        before = [c for t, c in self.samples if t <= start_ns]
        after = [c for t, c in self.samples if t >= end_ns]
        return after[0] - before[-1] if before and after else None
