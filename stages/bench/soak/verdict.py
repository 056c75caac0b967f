"""The soak's verdict on recorded series: what a server that lasts must show, each check with the figures behind it.

The series are samples taken every few seconds (``t`` in seconds from the start; ``rss`` bytes, ``fds``,
``threads``, ``kv_used`` and ``kv_total`` blocks, ``grammar_bytes``), and the requests' outcomes. After the
warm-up (the first ``WARMUP_SHARE`` of the run, at least one minute when the run has it), the server must hold:
* RSS within 5% of its level after warm-up (band: max / median - 1 and 1 - min / median) and no trend (the
  least-squares slope over the window times its length, against the median, under 5% too): a leak of a few MiB
  an hour shows as a slope before it leaves the band. RSS is read as its floor over the last 30 s (`floor`):
  a 1 MB prediction in flight holds tens of MiB for a second or two and gives them back (the soak saw +80 MiB
  peaks that were gone at the next sample); a leak raises the floor;
* file descriptors and threads flat: the median of the last third of the window no higher than the first third's
  median plus a margin (sockets come and go with the requests in flight);
* every KV block free at the end, and the block audit (used <= total, nothing negative) at every sample;
* no 5xx and no invalid 200 (the traffic checks each answer: a schema's output against jsonschema, a pattern's,
  a choice's, a prediction's counts);
* TTFT p99 in the last window within 20% of the first (each window ten minutes of an hour's run, scaled to the
  run's length, and at least a minute: a p99 of a dozen requests is their maximum, noise).
"""
from __future__ import annotations

import statistics

WARMUP_SHARE = 0.2
RSS_BAND = 0.05
TTFT_DRIFT = 0.20
FD_MARGIN, THREAD_MARGIN = 16, 2
FLOOR_S = 30.0


def after_warmup(samples: list[dict]) -> list[dict]:
    if not samples:
        return []
    span = samples[-1]["t"] - samples[0]["t"]
    start = samples[0]["t"] + max(WARMUP_SHARE * span, min(60.0, 0.4 * span))
    return [s for s in samples if s["t"] >= start]


def slope(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of y over x."""
    n = len(points)
    if n < 2:
        return 0.0
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0


def floor(samples: list[dict], key: str, seconds: float = FLOOR_S) -> list[float]:
    """Each sample's value as the lowest over the ``seconds`` before it: what the process keeps, without what a
    request in flight holds for a moment (a 1 MB prediction's body and tokens, freed when it ends)."""
    return [min(p[key] for p in samples if s["t"] - seconds <= p["t"] <= s["t"]) for s in samples]


def rss_check(window: list[dict]) -> tuple[bool, str]:
    rss = floor(window, "rss")
    if len(rss) < 3:
        return False, "too few samples after warm-up"
    mid = statistics.median(rss)
    band = max(max(rss) / mid - 1, 1 - min(rss) / mid)
    trend = slope([(s["t"], r) for s, r in zip(window, rss)]) * (window[-1]["t"] - window[0]["t"]) / mid
    ok = band <= RSS_BAND and abs(trend) <= RSS_BAND
    return ok, f"median {mid / 2**20:.0f} MiB, band {band:.1%}, trend {trend:+.1%} over the window (limit 5%)"


def flat_check(window: list[dict], key: str, margin: float) -> tuple[bool, str]:
    values = [s[key] for s in window]
    if len(values) < 3:
        return False, "too few samples after warm-up"
    third = max(1, len(values) // 3)
    first, last = statistics.median(values[:third]), statistics.median(values[-third:])
    return last <= first + margin, f"median {first:.0f} in the first third, {last:.0f} in the last (margin {margin})"


def kv_check(samples: list[dict]) -> tuple[bool, str]:
    bad = [s["t"] for s in samples if not 0 <= s["kv_used"] <= s["kv_total"]]
    end = samples[-1]["kv_used"] if samples else -1
    ok = not bad and end == 0
    return ok, f"{end} blocks held at the end; audit failed at {len(bad)} sample(s)"


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def ttft_check(ttfts: list[tuple[float, float]], start: float, end: float, minutes: float) -> tuple[bool, str]:
    """``ttfts``: (arrival time, seconds to the first token) of the streamed requests."""
    width = max(60.0, 600.0 * min(1.0, minutes / 60.0))  # a p99 needs more than a dozen requests per window
    first = [v for t, v in ttfts if start <= t < start + width]
    last = [v for t, v in ttfts if end - width <= t <= end]
    if len(first) < 10 or len(last) < 10:
        return False, f"too few streamed requests per window ({len(first)}, {len(last)})"
    p_first, p_last = percentile(first, 99), percentile(last, 99)
    return p_last <= p_first * (1 + TTFT_DRIFT), (f"p99 {p_first * 1e3:.0f} ms in the first {width:.0f} s after "
                                                  f"warm-up, {p_last * 1e3:.0f} ms in the last (limit +20%)")


def verdict(samples: list[dict], outcomes: dict, ttfts: list[tuple[float, float]], minutes: float) -> dict:
    """Every check: name -> (passed, what was measured); ``passed`` over all under "ok"."""
    window = after_warmup(samples)
    checks = {"RSS flat": rss_check(window),
              "file descriptors flat": flat_check(window, "fds", FD_MARGIN),
              "threads flat": flat_check(window, "threads", THREAD_MARGIN),
              "KV blocks all free": kv_check(samples),
              "no 5xx": (outcomes.get("5xx", 0) == 0, f"{outcomes.get('5xx', 0)} answers with a 5xx"),
              "every 200 valid": (outcomes.get("invalid", 0) == 0, f"{outcomes.get('invalid', 0)} invalid")}
    if window:
        end = max((t for t, _ in ttfts), default=samples[-1]["t"])  # the last arrival, before the drain
        checks["TTFT p99 stable"] = ttft_check(ttfts, window[0]["t"], end, minutes)
    return {"checks": checks, "ok": all(ok for ok, _ in checks.values())}
