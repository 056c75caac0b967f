"""Does the ladder climb? Each stage's throughput against its predecessor's, and a picture of the run."""
from __future__ import annotations

STAGE_ORDER = ["01 static", "02 continuous", "03 paged", "04 kernels", "05 streaming", "06 speculative",
               "07 structured"]


def climb(rows: dict[str, dict]) -> list[tuple[str, str, float]]:
    """(stage, predecessor, ratio of output tok/s) for each stage whose predecessor also ran, in ladder order."""
    ran = [name for name in STAGE_ORDER if name in rows]
    return [(b, a, rows[b]["output tok/s"] / rows[a]["output tok/s"]) for a, b in zip(ran, ran[1:])]


def within_spread(rows: dict[str, dict], stage: str, before: str) -> str | None:
    """Where both stages ran several rounds (``--rounds``) and their ranges overlap (``stage``'s best round at least
    ``before``'s worst), the fall of their kept runs is the machine's drift, not the stage's: the two ranges, else
    None."""
    a, b = rows[before].get("rounds"), rows[stage].get("rounds")
    if not a or not b or max(b) < min(a):
        return None
    return f"{min(b):.1f}-{max(b):.1f} against {min(a):.1f}-{max(a):.1f} tok/s"


def verdict(rows: dict[str, dict]) -> tuple[bool, str]:
    """Whether every stage is at least as fast as the one before it, and a sentence that says so. A fall within
    the rounds' spread is named as such and does not count against the climb."""
    steps = climb(rows)
    if not steps:
        return True, "one stage ran: nothing to climb"
    falls, drifts = [], []
    for b, a, r in steps:
        if r < 1:
            spread = within_spread(rows, b, a)
            (drifts if spread else falls).append(f"{b} is {r:.2f}x {a}" + (f" (rounds {spread})" if spread else ""))
    text = "; ".join(f"{b} / {a} = {r:.2f}x" for b, a, r in steps)
    drift = f"; within the rounds' spread: {', '.join(drifts)}" if drifts else ""
    if falls:
        return False, f"the ladder does not climb everywhere: {', '.join(falls)}{drift} ({text})"
    return True, f"every stage is at least as fast as the one before it{drift} ({text})"


def steps_against_rows(rows: dict[str, dict]) -> str | None:
    """What stage 02's fewer steps are worth, from stages 01 and 02 of one run.

    Both compute the same rows (each prompt token and each output token once), stage 02 in fewer steps. A
    step's time is a part every step pays whatever it holds (reading every weight, launching the work) plus
    a part per row (its arithmetic, its attention). Fewer steps save only the first: alone they are worth
    steps_01 / steps_02, all of it where rows cost nothing, less the more rows cost (measured ratios move
    around that with the machine's speed). None without both stages, or if they differ in rows."""
    static, continuous = rows.get("01 static"), rows.get("02 continuous")
    if static is None or continuous is None:
        return None
    n = static["prompt tokens"] + static["output tokens"]
    if n != continuous["prompt tokens"] + continuous["output tokens"]:
        return None
    s1, s2 = static["steps"], continuous["steps"]
    return (f"02 / 01 = {continuous['output tok/s'] / static['output tok/s']:.2f}x; stage 02 takes "
            f"{s1 / s2:.2f}x fewer steps ({s1:,} vs {s2:,}) for the same {n:,} rows, which alone is worth "
            f"{s1 / s2:.2f}x where a step costs the same whatever it holds, less where each row costs time too")


def latency_verdict(rows: dict[str, dict]) -> str | None:
    """Which rungs pay in latency: each stage's TTFT p99 and queue wait p99 against its predecessor's."""
    ran = [name for name in STAGE_ORDER if name in rows]
    parts = []
    for a, b in zip(ran, ran[1:]):
        ra, rb = rows[a], rows[b]
        if "queue wait p99 s" not in ra or not rb["TTFT p99 s"] > 0:
            continue
        parts.append(f"{a} -> {b}: TTFT p99 {ra['TTFT p99 s']:.2f} -> {rb['TTFT p99 s']:.2f} s, queue wait p99 "
                     f"{ra['queue wait p99 s']:.2f} -> {rb['queue wait p99 s']:.2f} s")
    return "; ".join(parts) or None


def best_stage(rows: dict[str, dict]) -> tuple[str, float] | None:
    """The stage (plain math aside) with the most output tok/s among these rows, and that rate."""
    ran = [(name, rows[name]["output tok/s"]) for name in STAGE_ORDER if name in rows]
    return max(ran, key=lambda r: r[1]) if ran else None


def peer_verdicts(stages: dict[int, dict[str, dict]], peers: dict[int, dict[str, dict]],
                  single: tuple[str, float] | None, single_peers: dict[str, float], labels: dict[str, str],
                  alone_labels: dict[str, str]) -> list[dict]:
    """Stepwise's best stage over each peer: output tok/s at each in-flight limit (``stages[n]`` and ``peers[n]``
    are that limit's rows, peers keyed by name), then decode tok/s for one request alone (``single``: the best
    stage's name and rate; ``single_peers``: each peer's rate)."""
    out = []

    def add(peer, n, stage, ours, theirs, text):
        out.append({"peer": peer, "in flight": n, "stage": stage, "ours": ours, "theirs": theirs,
                    "ratio": ours / theirs, "text": f"{text} = {ours / theirs:.2f}x"})

    for n, rows in peers.items():
        best = best_stage(stages.get(n, {}))
        for peer, r in rows.items() if best else ():
            add(peer, n, *best, r["output tok/s"], f"vs {labels[peer]} at {n} in flight: {best[0]} {best[1]:,.1f} / "
                                                   f"{r['output tok/s']:,.1f} output tok/s")
    for peer, rate in single_peers.items() if single else ():
        add(peer, 1, *single, rate, f"vs {alone_labels[peer]}, one request alone: {single[0]} {single[1]:,.1f} / "
                                    f"{rate:,.1f} decode tok/s")
    return out


def plot(rows: dict[str, dict], path: str, title: str, peers: tuple[str, ...] = ()) -> None:
    """Output tok/s, TTFT p50 and TPOT p50 per engine, side by side (matplotlib, for READMEs and slides); the
    engines named in ``peers`` drawn apart from the stages and the baselines."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    panels = [("output tok/s", "output tokens/s (higher: better)", "%.0f"),
              ("TTFT p50 s", "time to first token p50, s", "%.2f"),
              ("TPOT p50 ms", "time per output token p50, ms", "%.0f")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 0.9 + 0.42 * len(names)), constrained_layout=True)
    colors = ["#dd8452" if "plain" in n else "#4c72b0" if any(n.startswith(s) for s in STAGE_ORDER) else
              "#55a868" if n in peers else "#999999" for n in names]  # stages blue, peers green, baselines grey
    for ax, (metric, label, fmt) in zip(axes, panels):
        values = [rows[n].get(metric, float("nan")) for n in names]
        bars = ax.barh(names, values, color=colors)
        ax.bar_label(bars, fmt=fmt, padding=3, fontsize=8)
        ax.set_title(label, fontsize=10)
        ax.invert_yaxis()
        ax.margins(x=0.25)
    fig.suptitle(title, fontsize=11)
    fig.savefig(path, dpi=120)
    plt.close(fig)
