"""What the gateway sees of its replicas, per replica and in total, as Prometheus text.

Every request passes through the gateway, so it counts exactly: requests pending at the
router (no replica has taken them yet: every replica is at its `max_ongoing_requests`),
and per replica the requests waiting there (taken, no token yet: queued or prefilling),
running (streaming tokens), time to first token as the gateway measures it, and output
tokens per second over the last ``window`` seconds. With several gateways each counts its own.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from ..metrics import TTFT_BUCKETS, Histogram


@dataclass
class ReplicaStats:
    info: dict
    waiting: int = 0
    running: int = 0
    requests: int = 0
    failed: int = 0
    output_tokens: int = 0
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    recent: deque = field(default_factory=deque)  # (time, tokens) for tokens/s


class GatewayMetrics:
    def __init__(self, window: float = 10.0):
        self.window = window
        self.pending = 0
        self.replicas: dict[str, ReplicaStats] = {}

    def accepted(self, info: dict) -> ReplicaStats:
        stats = self.replicas.setdefault(info["replica"], ReplicaStats({k: info[k] for k in ("node", "pid")}))
        stats.requests += 1
        stats.waiting += 1
        return stats

    def tokens(self, stats: ReplicaStats, n: int, first: bool, ttft: float) -> None:
        if first:
            stats.waiting -= 1
            stats.running += 1
            stats.ttft.observe(ttft)
        stats.output_tokens += n
        now = time.monotonic()
        stats.recent.append((now, n))
        while stats.recent and stats.recent[0][0] < now - self.window:
            stats.recent.popleft()

    def ended(self, stats: ReplicaStats, started: bool, failed: bool) -> None:
        if started:
            stats.running -= 1
        else:
            stats.waiting -= 1
        stats.failed += failed

    def tokens_per_s(self, stats: ReplicaStats) -> float:
        now = time.monotonic()
        return sum(n for t, n in stats.recent if t >= now - self.window) / self.window

    def render(self, replica_states: dict[str, int]) -> str:
        reps = sorted(self.replicas.items())
        lines = []

        def family(name: str, kind: str, help_text: str, samples):
            lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])
            lines.extend(f"{name}{labels} {value}" for labels, value in samples)

        def per(value):
            return [(f'{{replica="{r}"}}', value(s)) for r, s in reps]

        family("stepwise_requests_pending", "gauge", "Requests at the router, not yet taken by a replica",
               [("", self.pending)])
        family("stepwise_queue_depth", "gauge", "Requests not yet streaming: pending at the router or waiting "
               "in a replica", [("", self.pending + sum(s.waiting for _, s in reps))])
        family("stepwise_output_tokens_per_second", "gauge", f"Output tokens/s over the last {self.window:g} s",
               [("", sum(self.tokens_per_s(s) for _, s in reps))])
        family("stepwise_replicas", "gauge", "Replicas of the engine deployment by state (Ray Serve's)",
               [(f'{{state="{k}"}}', v) for k, v in sorted(replica_states.items())])
        family("stepwise_replica_info", "gauge", "Each replica that served a request: its node and process",
               [(f'{{replica="{r}",node="{s.info["node"]}",pid="{s.info["pid"]}"}}', 1) for r, s in reps])
        family("stepwise_replica_requests_waiting", "gauge", "Requests in a replica with no token yet",
               per(lambda s: s.waiting))
        family("stepwise_replica_requests_running", "gauge", "Requests a replica is streaming",
               per(lambda s: s.running))
        family("stepwise_replica_requests_total", "counter", "Requests a replica took", per(lambda s: s.requests))
        family("stepwise_replica_requests_failed_total", "counter", "Requests that ended with an error (a replica "
               "that died, an engine error)", per(lambda s: s.failed))
        family("stepwise_replica_output_tokens_total", "counter", "Output tokens a replica streamed",
               per(lambda s: s.output_tokens))
        family("stepwise_replica_output_tokens_per_second", "gauge", f"Output tokens/s over the last "
               f"{self.window:g} s", per(self.tokens_per_s))
        name = "stepwise_time_to_first_token_seconds"
        lines.extend([f"# HELP {name} Arrival at the gateway to the first token, by replica",
                      f"# TYPE {name} histogram"])
        for r, s in reps:
            cumulative = 0
            for bound, n in zip(s.ttft.buckets + ["+Inf"], s.ttft.counts):
                cumulative += n
                lines.append(f'{name}_bucket{{replica="{r}",le="{bound}"}} {cumulative}')
            lines += [f'{name}_sum{{replica="{r}"}} {s.ttft.sum}', f'{name}_count{{replica="{r}"}} {s.ttft.count}']
        return "\n".join(lines) + "\n"
