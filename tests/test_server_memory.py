"""The server's malloc settings (stages/05_streaming/server/memory.py): a trim gives freed heap pages back.

The oracle is the kernel's own count of the process's resident pages (/proc/self/status), read apart from the
module's ``rss_bytes``. The heap is fragmented on purpose: 2,000 blocks of 100 kB (under the mmap threshold) are freed
except the last, which pins the heap's top, so glibc's automatic trim (of the top only) cannot give them back.
"""
from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, sys
sys.path.insert(0, {root!r})
import importlib
memory = importlib.import_module("stages.streaming.server.memory")

def vmrss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

settled = memory.settle_malloc()
blocks = [b"x" * 100_000 for _ in range(2000)]  # 200 MB, each under the 128 KiB threshold: from the heap
held = blocks[-1]
del blocks
freed = vmrss()
trimmer = memory.Trimmer()
released = trimmer.trim()
print(json.dumps(dict(settled=settled, freed=freed, after=vmrss(), released=released, trims=trimmer.trims)))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc and /proc are Linux's")
def test_a_trim_gives_freed_heap_pages_back():
    from pathlib import Path
    root = str(Path(__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(root=root)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["settled"] is True, "glibc took neither the mmap threshold nor the arena bound"
    assert r["trims"] == 1
    given_back = r["freed"] - r["after"]
    assert given_back > 150e6, f"the trim gave back {given_back / 2**20:.0f} MiB of the 190 MiB freed"
    assert abs(r["released"] - given_back) < 20e6, "the trimmer's own count disagrees with the kernel's"


class FakeHeap:
    """RSS as a list the test sets, and a malloc_trim that gives back what the test says is free."""
    def __init__(self, rss: int):
        self.rss, self.free = rss, 0

    def malloc_trim(self, pad: int) -> int:
        self.rss -= self.free
        self.free = 0
        return 1


def test_the_trimmer_trims_when_rss_grows_and_gives_back_what_a_large_request_frees(monkeypatch):
    memory = importlib.import_module("stages.streaming.server.memory")
    MiB = 2**20
    heap = FakeHeap(1000 * MiB)
    heap.free = 200 * MiB  # the model's loading left 200 MiB freed
    monkeypatch.setattr(memory, "glibc", lambda: heap)
    monkeypatch.setattr(memory, "rss_bytes", lambda: heap.rss)
    trimmer = memory.Trimmer(check_s=1.0, grow_bytes=16 * MiB, every_s=30.0)
    assert trimmer.trim() == 200 * MiB and trimmer.mark == 800 * MiB
    now = trimmer.last
    assert not trimmer.due(810 * MiB, now + 1)  # grown less than grow_bytes
    assert trimmer.due(817 * MiB, now + 1)
    assert trimmer.due(800 * MiB, now + 30)  # every_s regardless

    heap.rss = 950 * MiB  # a large request in flight: its memory in use, nothing to give back
    assert trimmer.due(heap.rss, now + 1) and trimmer.trim() == 0
    assert trimmer.mark == 816 * MiB, "a trim that found the memory in use raised the mark by grow_bytes at most"
    heap.free = 150 * MiB  # the request ended: its memory freed, still resident
    assert trimmer.due(heap.rss, now + 2) and trimmer.trim() == 150 * MiB
    assert trimmer.mark == 800 * MiB

    heap.rss = 900 * MiB  # memory the server keeps using (a cache filling): the mark catches up, trims then stop
    trims = 0
    for second in range(3, 30):
        if trimmer.due(heap.rss, now + second):
            trimmer.trim()
            trims += 1
    assert trims == 6 and trimmer.mark == 896 * MiB and not trimmer.due(heap.rss, now + 29)
