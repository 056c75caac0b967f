"""What the command lines print: a summary table, a slot-by-step timeline, the KV blocks in use, and what
stage 02's fewer steps are worth (a model fitted to stages 01 and 02 of one run)."""
from __future__ import annotations

import statistics

from rich.console import Console
from rich.table import Table
from rich.text import Text

from common.stats import EngineStats
from common.sequence import RequestOutput

LABELS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
COLORS = ["red", "green", "yellow", "blue", "magenta", "cyan", "bright_red", "bright_green",
          "bright_yellow", "bright_blue", "bright_magenta", "bright_cyan"]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def summary_row(stats: EngineStats, outputs: list[RequestOutput], max_num_seqs: int | None = None) -> dict:
    ok = [o for o in outputs if o.finish_reason != "error"]
    ttft = [o.metrics.time_to_first_token for o in ok]
    tpot = [o.metrics.time_per_output_token for o in ok if o.metrics.time_per_output_token is not None]
    wait = [o.metrics.first_scheduled_time - o.metrics.arrival_time for o in ok
            if o.metrics.first_scheduled_time is not None]  # in the queue before a first step
    return {
        "requests": len(ok), "prompt tokens": sum(o.num_prompt_tokens for o in ok),
        "output tokens": stats.output_tokens, "wall s": stats.wall_seconds,
        "output tok/s": stats.output_tokens_per_s, "steps": stats.steps,
        "slots (max_num_seqs)": max_num_seqs or 0, "peak in flight": stats.peak_running,
        "slot util": stats.slot_utilization, "KV reserved MB": stats.kv_bytes_reserved / 1e6,
        "KV used MB": stats.kv_bytes_used / 1e6, "KV waste": stats.kv_waste,
        "preemptions": stats.preemptions, "prefix hit rate": stats.prefix_hit_rate,
        "queue wait p50 s": percentile(wait, 50), "queue wait p99 s": percentile(wait, 99),
        "TTFT p50 s": percentile(ttft, 50), "TTFT p99 s": percentile(ttft, 99),
        "TPOT p50 ms": 1e3 * statistics.median(tpot) if tpot else float("nan"),
    }


def format_value(metric: str, v) -> str:
    if metric in ("slot util", "KV waste", "prefix hit rate", "bandwidth use", "compute use"):
        return f"{v:.1%}"
    if isinstance(v, str):
        return v
    return f"{v:,.2f}" if isinstance(v, float) else f"{v:,}"


def summary_table(rows: dict[str, dict], title: str) -> Table:
    """Metrics down, engines across (fits a narrow terminal)."""
    table = Table(title=title)
    table.add_column("metric")
    for name in rows:
        table.add_column(name, justify="right")
    for metric in next(iter(rows.values())):
        table.add_row(metric, *(format_value(metric, r[metric]) for r in rows.values()))
    return table


def step_cost_model(rows: dict[str, dict]) -> dict | None:
    """A model, not a measurement: fit a run's time as ``steps x a + rows x b`` from stages 01 and 02 of one run.

    Both stages compute the same rows (every prompt token and every output token once), so their two wall times
    give the fixed cost of a step ``a`` (reading every weight, launching the work) and the cost of a row ``b``
    (its arithmetic and attention). Where a step's cost is nearly flat in its rows, as on a GPU whose step reads
    the weights, ``b`` -> 0 and stage 02's fewer steps turn into time one for one: its modelled speed-up is then
    steps_01 / steps_02. None without both stages, if they differ in rows, or if the fit is unphysical (a run
    whose noise outweighs the steps saved gives a negative cost)."""
    static, continuous = rows.get("01 static"), rows.get("02 continuous")
    if static is None or continuous is None:
        return None
    n = static["prompt tokens"] + static["output tokens"]
    if n != continuous["prompt tokens"] + continuous["output tokens"] or static["steps"] == continuous["steps"]:
        return None
    (s1, t1), (s2, t2) = (static["steps"], static["wall s"]), (continuous["steps"], continuous["wall s"])
    a = (t1 - t2) / (s1 - s2)
    b = (t1 - s1 * a) / n
    if a <= 0 or b < 0:
        return None
    return {"ms per step": 1e3 * a, "ms per row": 1e3 * b, "rows a step costs": a / b if b else float("inf"),
            "measured 02 / 01": t1 / t2, "modelled 02 / 01, flat steps": s1 / s2}


def describe_step_cost(rows: dict[str, dict]) -> str | None:
    m = step_cost_model(rows)
    if m is None:
        return None
    return (f"a model, not a measurement: fitting this run's times as steps x {m['ms per step']:.1f} ms + rows x "
            f"{m['ms per row']:.2f} ms (a step costs as much as {m['rows a step costs']:.0f} rows here), stage 02 "
            f"measured {m['measured 02 / 01']:.2f}x stage 01; where a step costs the same whatever rows it holds "
            f"(a GPU reading its weights), the same steps would give {m['modelled 02 / 01, flat steps']:.2f}x")


def timeline(steps: list[list[int | None]], width: int = 70) -> Text:
    """Slots down, steps across; each cell names the request in the slot, '·' when idle."""
    text = Text()
    slots = max((len(s) for s in steps), default=0)
    for start in range(0, len(steps), width):
        chunk = steps[start:start + width]
        text.append(f"steps {start + 1}-{start + len(chunk)}\n", style="dim")
        for slot in range(slots):
            text.append(f"slot {slot:>2} ")
            for step in chunk:
                req = step[slot] if slot < len(step) else None
                if req is None:
                    text.append("·", style="dim")
                else:
                    text.append(LABELS[req % len(LABELS)], style=COLORS[req % len(COLORS)])
            text.append("\n")
    return text


def print_timeline(console: Console, name: str, steps: list[list[int | None]]) -> None:
    idle = sum(1 for s in steps for r in s if r is None)
    total = sum(len(s) for s in steps)
    console.print(f"[bold]{name}[/]: {len(steps)} steps, {idle} of {total} slot-steps idle")
    console.print(timeline(steps, width=max(20, console.width - 10)))


SPARK = " ▁▂▃▄▅▆▇█"


def print_blocks(console: Console, name: str, used: list[int], total: int) -> None:
    """KV blocks in use over the run, one column per group of steps (a sparkline scaled to the pool)."""
    if not used:
        return
    width = max(20, min(len(used), console.width - 12))
    per = -(-len(used) // width)
    cols = [max(used[i:i + per]) for i in range(0, len(used), per)]
    line = "".join(SPARK[min(8, round(8 * u / total))] for u in cols)
    console.print(f"[bold]{name}[/]: KV blocks in use over {len(used)} steps (pool of {total:,}, "
                  f"peak {max(used):,} = {max(used) / total:.0%})")
    console.print(f"  [cyan]{line}[/]")
