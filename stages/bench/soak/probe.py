"""What the soak samples from the server every few seconds: its process (RSS, open file descriptors, threads,
read from /proc) and its own /metrics (KV blocks in use and in all, the grammar cache's bytes, requests running
and waiting)."""
from __future__ import annotations

import os
import re

import httpx

METRICS = {"kv_used": "stepwise_kv_blocks_used", "kv_free": "stepwise_kv_blocks_free",
           "grammar_bytes": "stepwise_grammar_cache_bytes", "running": "stepwise_requests_running",
           "waiting": "stepwise_requests_waiting"}


def process(pid: int) -> dict:
    status = open(f"/proc/{pid}/status").read()
    field = lambda name: int(re.search(rf"^{name}:\s+(\d+)", status, re.M).group(1))  # noqa: E731
    return {"rss": field("VmRSS") * 1024, "threads": field("Threads"), "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def server_metrics(url: str) -> dict:
    text = httpx.get(url + "/metrics", timeout=30).text
    found = {}
    for key, name in METRICS.items():
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        found[key] = float(m.group(1)) if m else 0.0
    found["kv_total"] = found["kv_used"] + found["kv_free"]
    return found


def sample(url: str, pid: int, t: float) -> dict:
    return {"t": round(t, 2)} | process(pid) | server_metrics(url)
