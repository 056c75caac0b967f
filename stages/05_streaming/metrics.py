"""Latency metrics a serving engine is judged by, kept as Prometheus histograms.

* time to first token (TTFT): arrival -> first token; what a user waits before anything shows.
* inter-token latency (ITL): the gap between consecutive tokens of one request; its mean
  after the first token is the time per output token (TPOT).
* end-to-end latency: arrival -> last token.
"""
from __future__ import annotations

import bisect
import threading

from common.engine import EngineState
from common.events import StepEvent
from common.sequence import Sequence
from common.stats import hit_rate

TTFT_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]
ITL_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5]


class Histogram:
    def __init__(self, buckets: list[float]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def render(self, name: str, help_text: str) -> list[str]:
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        cumulative = 0
        for bound, n in zip(self.buckets + ["+Inf"], self.counts):
            cumulative += n
            lines.append(f'{name}_bucket{{le="{bound}"}} {cumulative}')
        return lines + [f"{name}_sum {self.sum}", f"{name}_count {self.count}"]


class EngineMetrics:
    def __init__(self):
        self.lock = threading.Lock()
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(TTFT_BUCKETS)
        self.finished: dict[str, int] = {}
        self.output_tokens = 0
        self.preemptions = 0

    def on_step(self, event: StepEvent) -> None:
        """An observer of every step: its preemptions, and the requests it finished."""
        self.preemptions += len(event.preempted)
        for s in event.seqs:
            if s.finish_reason is not None:
                self.observe(s.seq)

    def observe(self, seq: Sequence) -> None:
        """Record a finished request."""
        m = seq.metrics
        with self.lock:
            self.finished[seq.finish_reason] = self.finished.get(seq.finish_reason, 0) + 1
            self.output_tokens += len(seq.output_token_ids)
            if m.time_to_first_token is not None:
                self.ttft.observe(m.time_to_first_token)
            for a, b in zip(m.token_times, m.token_times[1:]):
                self.itl.observe(b - a)
            if m.e2e_latency is not None:
                self.e2e.observe(m.e2e_latency)

    def render(self, gauges: dict[str, tuple[float, str]]) -> str:
        """Prometheus text format: the given gauges, then counters and histograms."""
        lines = []
        for name, (value, help_text) in gauges.items():
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {value}"]
        with self.lock:
            lines += ["# HELP stepwise_requests_finished_total Finished requests by finish reason",
                      "# TYPE stepwise_requests_finished_total counter"]
            lines += [f'stepwise_requests_finished_total{{finish_reason="{r}"}} {n}' for r, n in self.finished.items()]
            lines += ["# HELP stepwise_output_tokens_total Output tokens of finished requests",
                      "# TYPE stepwise_output_tokens_total counter",
                      f"stepwise_output_tokens_total {self.output_tokens}"]
            lines += self.ttft.render("stepwise_time_to_first_token_seconds", "Arrival to first token")
            lines += self.itl.render("stepwise_inter_token_latency_seconds", "Gap between consecutive tokens")
            lines += self.e2e.render("stepwise_e2e_request_latency_seconds", "Arrival to last token")
        return "\n".join(lines) + "\n"


class Gauges:
    """The engine's state after its last step, as a server shows it: an observer of every step that replaces its
    snapshot whole, so a reader on another thread never sees it half-written."""

    def __init__(self, metrics: EngineMetrics):
        self.metrics = metrics
        self.hit_tokens = self.queried_tokens = 0  # the prefix cache's, across the server's life
        self.snapshot: dict[str, float] = {}

    def on_step(self, event: StepEvent) -> None:
        self.hit_tokens += event.prefix_hit_tokens
        self.queried_tokens += event.prefix_query_tokens
        self.update(event.state)

    def update(self, state: EngineState) -> None:
        blocks = state.blocks
        self.snapshot = {"waiting": state.num_waiting, "running": state.num_running,
                         "kv_blocks_used": blocks.num_used if blocks else 0,
                         "kv_blocks_free": blocks.num_free if blocks else 0,
                         "kv_blocks": blocks.num_blocks if blocks else 0,
                         "prefix_hit_rate": hit_rate(self.hit_tokens, self.queried_tokens),
                         "preemptions": self.metrics.preemptions}
