"""`vllm bench serve`'s saved result (--save-result) read into the figures compared, and the side-by-side table.

vLLM names its figures in the JSON as it prints them: ``output_throughput`` (output tokens over the benchmark's
duration), ``median_ttft_ms`` and ``p99_ttft_ms`` (with --metric-percentiles 50,99 the median is also
``p50_...``), ``median_tpot_ms`` (per request: (E2EL - TTFT) / (output tokens - 1)), ``median_itl_ms`` (gaps
between streamed chunks, all requests pooled). Its definitions are those `metrics` reproduces for `load`.
"""
from __future__ import annotations

from rich.table import Table

ROWS = (("Successful requests", "completed", ",.0f"), ("Failed requests", "failed", ",.0f"),
        ("Benchmark duration (s)", "duration", ",.2f"), ("Total input tokens", "total_input_tokens", ",.0f"),
        ("Total generated tokens", "total_output_tokens", ",.0f"),
        ("Output token throughput (tok/s)", "output_throughput", ",.1f"),
        ("Median TTFT (ms)", "median_ttft_ms", ",.1f"), ("P99 TTFT (ms)", "p99_ttft_ms", ",.1f"),
        ("Median TPOT (ms)", "median_tpot_ms", ",.2f"), ("P99 TPOT (ms)", "p99_tpot_ms", ",.2f"),
        ("Median ITL (ms)", "median_itl_ms", ",.2f"), ("P99 ITL (ms)", "p99_itl_ms", ",.2f"),
        ("Server CPU per output token (ms)", "server_cpu_ms_per_token", ",.2f"),
        ("Client CPU in the timed run (s)", "client_cpu_s", ",.2f"))
TARGET_THROUGHPUT = 1.3  # issue 54: ours at least 1.3x vllm serve's output tok/s, with median TPOT no worse


def figures(result: dict) -> dict:
    """The compared figures from one saved result (plus the CPU `vllm_client` read); what is missing is None."""
    out = {key: result.get(key) for _, key, _ in ROWS}
    cpu, tokens = result.get("server_cpu_s"), result.get("total_output_tokens")
    out["server_cpu_ms_per_token"] = 1000 * cpu / tokens if cpu is not None and tokens else None
    return out


def verdict(ours: dict, theirs: dict) -> str:
    """Issue 54's served target, checked on these figures."""
    ratio = ours["output_throughput"] / theirs["output_throughput"]
    tpot_ok = ours["median_tpot_ms"] <= theirs["median_tpot_ms"]
    met = ratio >= TARGET_THROUGHPUT and tpot_ok
    return (f"output tok/s {ratio:.2f}x vllm serve's (target {TARGET_THROUGHPUT}x), median TPOT "
            f"{ours['median_tpot_ms']:.1f} vs {theirs['median_tpot_ms']:.1f} ms ({'no worse' if tpot_ok else 'worse'}):"
            f" target {'met' if met else 'not met'}")


def side_by_side(results: dict[str, dict], model: str, stage: str, s, machine: str) -> Table:
    """One column per server that ran (``results``: "ours" and/or "vllm" -> `figures`), and ours / vLLM's."""
    both = "ours" in results and "vllm" in results
    table = Table(title=f"vllm bench serve against each server: {s.num_prompts} requests, {s.input_len} random tokens "
                        f"in, {s.output_len} out (EOS ignored), {s.max_concurrency} concurrent ({model})",
                  caption=f"{machine}; the client on the same machine"
                          + (f"\n{verdict(results['ours'], results['vllm'])}" if both else ""))
    names = {"ours": f"stage {stage} serve", "vllm": "vllm serve"}
    table.add_column("figure")
    for server in results:
        table.add_column(names[server], justify="right")
    if both:
        table.add_column("ours / vLLM's", justify="right")
    for label, key, fmt in ROWS:
        values = [results[server].get(key) for server in results]
        cells = ["-" if v is None else format(v, fmt) for v in values]
        if both:
            ours, theirs = results["ours"].get(key), results["vllm"].get(key)
            cells.append(f"{ours / theirs:.3f}" if ours is not None and theirs else "-")
        table.add_row(label, *cells)
    return table
