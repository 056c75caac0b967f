"""What `vllm bench serve` reports, computed from the timestamps `load`'s clients recorded.

Each request's record (`load.one_request`) holds when it was sent (``start``), when each streamed chunk that
carried a choice arrived (``chunk_times``; ``content_times`` for those with text), and the server's own
``usage`` counts. From those, as vLLM's `benchmarks/serve.py` defines them:

* TTFT: first chunk - start. E2EL: last chunk - start (the finishing chunk counts; the usage-only and
  ``[DONE]`` lines after it do not). ITL: the gaps between consecutive chunks, all requests pooled.
* TPOT: (E2EL - TTFT) / (output tokens - 1), per request with more than one output token: the decode time
  spread over the tokens after the first, whether they came one chunk each or several to a chunk.
* Output tokens: the server's ``usage.completion_tokens`` (EOS included, as the engine generated it), never
  the streamed text re-tokenized; input tokens: its ``usage.prompt_tokens`` (the chat template included).
* Throughputs: completed requests, output tokens, and input + output tokens, each over the benchmark
  duration (the arrival schedule's start to the last request done, the warm-up excluded).
* Goodput: requests that met every SLO given (``--goodput ttft:MS tpot:MS e2el:MS``, a value at or under
  its SLO meets it; a one-token request's TPOT counts as 0) over the duration, as DistServe defines it.
* Percentiles are numpy's (linear interpolation between ranks), as vLLM's are. A latency no request
  produced (TPOT when every answer is one token) is shown as "-", where vLLM prints 0.
"""
from __future__ import annotations

import math

import numpy as np
from rich.table import Table

LATENCIES = (("ttft", "TTFT", "Time to First Token"), ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
             ("itl", "ITL", "Inter-token Latency"), ("e2el", "E2EL", "End-to-end Latency"))


def request_latencies(record: dict, times: str = "chunk_times") -> dict:
    """One successful request's TTFT, E2EL and TPOT (seconds; TPOT None below two tokens) and its ITLs."""
    start, times, tokens = record["start"], record[times], record["output_tokens"]
    ttft, e2el = times[0] - start, times[-1] - start
    return {"ttft": ttft, "e2el": e2el, "tpot": (e2el - ttft) / (tokens - 1) if tokens > 1 else None,
            "itl": [b - a for a, b in zip(times, times[1:])]}


def peak_concurrency(records: list[dict], times: str = "chunk_times") -> int:
    """The most requests in flight at once, from send to last chunk, over the half-open intervals (as vLLM)."""
    events = sorted([(r["start"], 1) for r in records] + [(r[times][-1], -1) for r in records])
    peak = level = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def calculate_metrics(records: list[dict], duration: float, percentiles: list[float] = (99,),
                      goodput: dict[str, float] | None = None, times: str = "chunk_times") -> dict:
    """The benchmark's figures under vLLM's names (``mean_ttft_ms``, ``p99_itl_ms``, ``request_goodput``...).

    ``times="content_times"`` times only the chunks that carried text, as aiperf does: its TTFT, E2EL
    (``request_latency``), TPOT (``inter_token_latency``) and ITL (``inter_chunk_latency``) from the same
    requests, so that a difference between the two tools' figures can be told from a difference in definition.
    """
    ok = [r for r in records if r["success"] and r[times]]
    per = [request_latencies(r, times) for r in ok]
    values = {"ttft": [p["ttft"] for p in per], "tpot": [p["tpot"] for p in per if p["tpot"] is not None],
              "itl": [gap for p in per for gap in p["itl"]], "e2el": [p["e2el"] for p in per]}
    total_in, total_out = sum(r["prompt_tokens"] for r in ok), sum(r["output_tokens"] for r in ok)
    out = {"completed": len(ok), "failed": len(records) - len(ok), "duration": duration,
           "total_input_tokens": total_in, "total_output_tokens": total_out,
           "request_throughput": len(ok) / duration, "output_throughput": total_out / duration,
           "total_token_throughput": (total_in + total_out) / duration,
           "max_concurrent_requests": peak_concurrency(ok, times), "request_goodput": None}
    if goodput:
        good = sum(all((p[m] or 0.0) <= slo / 1e3 for m, slo in goodput.items()) for p in per)
        out["request_goodput"] = good / duration
    for name, *_ in LATENCIES:
        v = np.array(values[name]) * 1e3
        out[f"mean_{name}_ms"] = float(v.mean()) if v.size else None
        out[f"median_{name}_ms"] = float(np.median(v)) if v.size else None
        for p in percentiles:
            out[f"p{p:g}_{name}_ms"] = float(np.percentile(v, p)) if v.size else None
    return out


def metrics_table(m: dict, title: str, percentiles: list[float] = (99,), max_concurrency: int | None = None,
                  request_rate: float = math.inf) -> Table:
    """The figures laid out as `vllm bench serve` prints them, in a rich table."""
    def num(v, fmt=",.2f"):
        return "-" if v is None else format(v, fmt)

    table = Table(title=title)
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows = [("Successful requests", num(m["completed"], ",")), ("Failed requests", num(m["failed"], ","))]
    if max_concurrency is not None:
        rows.append(("Maximum request concurrency", num(max_concurrency, ",")))
    if not math.isinf(request_rate):
        rows.append(("Request rate configured (RPS)", num(request_rate)))
    rows += [("Benchmark duration (s)", num(m["duration"])), ("Total input tokens", num(m["total_input_tokens"], ",")),
             ("Total generated tokens", num(m["total_output_tokens"], ",")),
             ("Request throughput (req/s)", num(m["request_throughput"]))]
    if m["request_goodput"] is not None:
        rows.append(("Request goodput (req/s)", num(m["request_goodput"])))
    rows += [("Output token throughput (tok/s)", num(m["output_throughput"])),
             ("Peak concurrent requests", num(m["max_concurrent_requests"], ",")),
             ("Total token throughput (tok/s)", num(m["total_token_throughput"]))]
    for name, short, header in LATENCIES:
        rows.append((f"[bold]{header}[/]", ""))
        rows += [(f"Mean {short} (ms)", num(m[f"mean_{name}_ms"])),
                 (f"Median {short} (ms)", num(m[f"median_{name}_ms"]))]
        rows += [(f"P{p:g} {short} (ms)", num(m[f"p{p:g}_{name}_ms"])) for p in percentiles]
    for row in rows:
        table.add_row(*row)
    return table
