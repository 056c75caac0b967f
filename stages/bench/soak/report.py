"""The soak's output: a live table while it runs, the verdict's table, the requests by kind, and a plot of the
sampled series over time (``--plot``)."""
from __future__ import annotations

from rich.table import Table

from .verdict import percentile  # the verdict's own: the table and the TTFT check read alike


def live_table(samples: list[dict], traffic, minutes: float) -> Table:
    s = samples[-1] if samples else {}
    t = Table(title=f"soak: {s.get('t', 0) / 60:.1f} of {minutes:g} min")
    for col in ("RSS MiB", "fds", "threads", "KV used", "grammar MiB", "in flight", "ok", "4xx", "5xx", "invalid"):
        t.add_column(col, justify="right")
    if s:
        o = traffic.outcomes
        t.add_row(f"{s['rss'] / 2**20:.0f}", str(s["fds"]), str(s["threads"]), f"{s['kv_used']:.0f}",
                  f"{s['grammar_bytes'] / 2**20:.1f}", str(traffic.in_flight), str(o["ok"]), str(o["4xx"]),
                  str(o["5xx"]), str(o["invalid"]))
    return t


def verdict_table(result: dict) -> Table:
    t = Table(title=f"soak verdict: {'PASS' if result['ok'] else 'FAIL'}")
    t.add_column("check")
    t.add_column("result")
    t.add_column("measured", overflow="fold")
    for name, (ok, why) in result["checks"].items():
        t.add_row(name, "[green]pass[/]" if ok else "[red]FAIL[/]", why)
    return t


def kinds_table(counts: dict[str, dict[str, int]]) -> Table:
    t = Table(title="requests by kind")
    outcomes = ("ok", "4xx", "5xx", "invalid", "other")
    for col in ("kind", *outcomes):
        t.add_column(col, justify="right")
    for kind, c in counts.items():
        t.add_row(kind, *(str(c.get(o, 0)) for o in outcomes))
    t.add_row("all", *(str(sum(c.get(o, 0) for c in counts.values())) for o in outcomes))
    return t


def windows(points: list[tuple[float, float]], span: float) -> dict[str, list[float]]:
    """The values of (arrival, seconds) points that arrived in the run's first and last ten minutes (a third of the
    run each where it is shorter than half an hour): the issue's "first vs last ten minutes", warm-up included."""
    width = min(600.0, span / 3)
    return {"first": [v for t, v in points if t < width], "last": [v for t, v in points if t >= span - width]}


def latency_table(ttfts: list[tuple[float, float]], latencies: list[tuple[float, float]]) -> Table:
    span = max((t for t, _ in ttfts + latencies), default=0.0)  # the last arrival (warm-up included)
    width = min(600.0, span / 3)
    t = Table(title=f"latency, the first vs the last {width / 60:.1f} minutes (ms)")
    for col in ("series", "window", "requests", "p50", "p90", "p99"):
        t.add_column(col, justify="right")
    for name, points in (("TTFT (streamed)", ttfts), ("whole answer", latencies)):
        for window, values in windows(points, span).items():
            cells = [f"{percentile(values, q) * 1e3:.0f}" for q in (50, 90, 99)] if values else ["-"] * 3
            t.add_row(name, window, str(len(values)), *cells)
    return t


def plot(samples: list[dict], ttfts: list[tuple[float, float]], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    series = [("RSS (MiB)", lambda s: s["rss"] / 2**20),
              ("RSS less KV pool (MiB)", lambda s: (s["rss"] - s.get("kv_rss", 0)) / 2**20),
              ("KV pool resident (MiB)", lambda s: s.get("kv_rss", 0) / 2**20),
              ("in flight", lambda s: s.get("in_flight", 0)), ("open fds", lambda s: s["fds"]),
              ("threads", lambda s: s["threads"]), ("KV blocks used", lambda s: s["kv_used"]),
              ("grammar cache (MiB)", lambda s: s["grammar_bytes"] / 2**20)]
    fig, axes = plt.subplots(len(series) + 1, 1, figsize=(9, 2 * (len(series) + 1)), sharex=True)
    minutes = [s["t"] / 60 for s in samples]
    for ax, (label, get) in zip(axes, series):
        ax.plot(minutes, [get(s) for s in samples])
        ax.set_ylabel(label, fontsize=8)
    axes[-1].scatter([t / 60 for t, _ in ttfts], [v * 1e3 for _, v in ttfts], s=2)
    axes[-1].set_ylabel("TTFT (ms)", fontsize=8)
    axes[-1].set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
