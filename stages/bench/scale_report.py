"""The sweep's figures: a rich table, the read-bandwidth ceiling of each point, and two plots (time per token
against weight bytes, log-log with the bandwidth line; time per token against context)."""
from __future__ import annotations

from pathlib import Path

from rich.table import Table

from .shapes import VOCAB_NOTE


def with_ceiling(result: dict, kv_per_token: int, bandwidth: float) -> dict:
    """Bytes one output token reads (its share of the weights, read once a step for every request in flight, and
    its own KV at the mean context), the decode rate that reading them at ``bandwidth`` allows, and the steady
    decode rate's share of it (None where the point has no steady window)."""
    n, context = result["in_flight"], result["prompt"] + result["out_tokens"] / 2
    kv = kv_per_token * context
    per_token = result["weight bytes"] / n + kv
    ceiling = bandwidth / per_token
    steady = result["steady decode tok/s"]
    return result | {"KV bytes/token": kv, "bytes/token": per_token, "ceiling tok/s": ceiling,
                     "of ceiling": None if steady is None else steady / ceiling}


COLUMNS = ("model", "engine", "prompt", "in flight", "TTFT p50 s", "prefill tok/s", "TPOT p50 ms (with stalls)",
           "steady decode tok/s", "weights MB/token", "KV MB/token", "steady of ceiling")
NO_WINDOW = ("steady decode n/a: a request finished before the last one had its first token, so no moment had "
             "every request decoding (more --out-tokens makes one)")


def table(results: list[dict], bandwidth: float, machine: str) -> Table:
    """TPOT p50 is what a user waits per token, the steps that prefill other requests' prompts after its first
    token included; the steady decode rate is tokens a second while every request decodes (steady.py)."""
    n_a = any(r["steady decode tok/s"] is None for r in results)
    t = Table(title=f"How cost grows ({VOCAB_NOTE}); {machine}; read ceiling {bandwidth / 1e9:.1f} GB/s",
              caption=NO_WINDOW if n_a else None)
    for col in COLUMNS:
        t.add_column(col, justify="left" if col in ("model", "engine") else "right")
    for r in results:
        steady, share = r["steady decode tok/s"], r["of ceiling"]
        t.add_row(r["model"], r["engine"], f"{r['prompt']:,}", str(r["in_flight"]), f"{r['TTFT p50 s']:.2f}",
                  f"{r['prefill tok/s']:,.0f}", f"{r['TPOT p50 ms']:.1f}",
                  "n/a" if steady is None else f"{steady:,.1f}", f"{r['weight bytes'] / r['in_flight'] / 1e6:,.1f}",
                  f"{r['KV bytes/token'] / 1e6:.2f}", "n/a" if share is None else f"{share:.0%}")
    return t


def plot(results: list[dict], bandwidth: float, path: Path, machine: str) -> list[Path]:
    """Two PNGs: ``path`` (time per token against weight bytes, one request in flight, the shortest prompt) and
    ``<path>-context.png`` (time per token against context, one request in flight)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    alone = [r for r in results if r["in_flight"] == 1]
    shortest = min((r["prompt"] for r in alone), default=0)
    fig, ax = plt.subplots(figsize=(7, 5))
    for engine in sorted({r["engine"] for r in alone}):
        pts = sorted((r["weight bytes"], r["TPOT p50 ms"]) for r in alone if r["engine"] == engine
                     and r["prompt"] == shortest)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=engine)
    if alone:
        xs = sorted({r["weight bytes"] for r in alone})
        ax.plot(xs, [1e3 * x / bandwidth for x in xs], "k--", label=f"bytes / {bandwidth / 1e9:.1f} GB/s")
    ax.set(xscale="log", yscale="log", xlabel="weight bytes read per token", ylabel="time per output token (ms)",
           title=f"{machine}: one request, {shortest}-token prompt\n({VOCAB_NOTE})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    second = path.with_name(path.stem + "-context.png")
    fig, ax = plt.subplots(figsize=(7, 5))
    for key in sorted({(r["model"], r["engine"]) for r in alone}):
        pts = sorted((r["prompt"], r["TPOT p50 ms"]) for r in alone if (r["model"], r["engine"]) == key)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=" ".join(key))
    ax.set(xscale="log", xlabel="prompt tokens (context)", ylabel="time per output token (ms)",
           title=f"{machine}: time per token against context, one request\n({VOCAB_NOTE})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(second, dpi=110)
    plt.close(fig)
    return [path, second]
