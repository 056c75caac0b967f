"""What the soak samples from the server every few seconds: its process (RSS, open file descriptors, threads,
read from /proc), the KV pool's resident pages, and its own /metrics (KV blocks in use and in all, the grammar
cache's bytes and bound, requests running and waiting).

The KV pool (common/kv_cache.py's `zeroed`) is anonymous shared memory that the kernel hands out on first touch,
so RSS climbs as blocks are written for the first time, for as long as the run takes to reach every block (a
3- or 4-minute SmolLM2 soak touched 113-169 MiB of 256: docs/soak.md). That climb is bounded by the pool's size and
is not a leak, so the pool's pages (its mappings show as /dev/zero in /proc/PID/smaps) are sampled apart:
``kv_rss`` resident, ``kv_size`` mapped."""
from __future__ import annotations

import os
import re

import httpx

METRICS = {"kv_used": "stepwise_kv_blocks_used", "kv_free": "stepwise_kv_blocks_free",
           "grammar_bytes": "stepwise_grammar_cache_bytes",
           "grammar_max": "stepwise_grammar_cache_max_bytes", "grammar_evictions": "stepwise_grammar_cache_evictions",
           "running": "stepwise_requests_running",
           "waiting": "stepwise_requests_waiting"}


def process(pid: int) -> dict:
    status = open(f"/proc/{pid}/status").read()
    field = lambda name: int(re.search(rf"^{name}:\s+(\d+)", status, re.M).group(1))  # noqa: E731
    return {"rss": field("VmRSS") * 1024, "threads": field("Threads"), "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def kv_pool(pid: int) -> dict:
    """Resident and mapped bytes of the shared anonymous mappings (/dev/zero): the KV pool's tensors."""
    rss = size = 0
    inside = False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if line[0] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                inside = "/dev/zero" in line
            elif inside and line.startswith(("Rss:", "Size:")):
                kb = int(line.split()[1]) * 1024
                rss, size = (rss + kb, size) if line.startswith("Rss:") else (rss, size + kb)
    return {"kv_rss": rss, "kv_size": size}


def server_metrics(url: str) -> dict:
    text = httpx.get(url + "/metrics", timeout=30).text
    found = {}
    for key, name in METRICS.items():
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        found[key] = float(m.group(1)) if m else 0.0
    found["kv_total"] = found["kv_used"] + found["kv_free"]
    return found


def sample(url: str, pid: int, t: float) -> dict:
    return {"t": round(t, 2)} | process(pid) | kv_pool(pid) | server_metrics(url)
