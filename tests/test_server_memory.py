"""The server's malloc settings (stages/05_streaming/server/memory.py): a trim gives freed heap pages back.

The oracle is the kernel's own count of the process's resident pages (/proc/self/status), read apart from the
module's ``rss_bytes``. The heap is fragmented on purpose: 2,000 blocks of 100 kB (under the mmap threshold) are freed
except the last, which pins the heap's top, so glibc's automatic trim (of the top only) cannot give them back.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, sys
sys.path.insert(0, {root!r})
import importlib
memory = importlib.import_module("stages.05_streaming.server.memory")

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
