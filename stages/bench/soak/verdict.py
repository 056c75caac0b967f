"""The soak's verdict on recorded series: what a server that lasts must show, each check with the figures behind it.

The series are samples taken every few seconds (``t`` in seconds from the start; ``rss`` bytes, ``fds``,
``threads``, ``kv_used`` and ``kv_total`` blocks, ``kv_rss`` and ``kv_size`` bytes of the KV pool's pages,
``grammar_bytes`` and its bound ``grammar_max``, ``in_flight`` requests), and the requests' outcomes. The first
quarter of the run is warm-up (at least a minute when the run has it): the allocator's arenas, torch's first
allocations for each shape and the grammar cache fill there, and RSS climbs for reasons that end. After it, the
server must hold:
* the load asked for: the median of requests in flight within ``IN_FLIGHT`` (a soak that did not load the
  server proves nothing; one that drowned it measures its queue, whose bodies grow RSS with the backlog);
* RSS flat, less the KV pool's resident pages (sampler.py: the pool is touched block by block for the first time
  over as long as the run takes to reach every block, bounded by its size, and judged by that bound instead),
  read as its floor over the last 30 s, or a sixth of a shorter window (`floor`: a 1 MB prediction in flight holds
  tens of MiB for a second or two and gives them back; a leak raises the floor): within 5% of its median, and not
  growing: the median of the window's last third at most ``RSS_GROWTH`` above its first third's, and the
  least-squares trend over the window under 5%. Warm-up that ends leaves the thirds level; a leak, however slow,
  keeps them apart;
* the caches bounded: the grammar cache never over its bound, and at its bound (evicting) or flat (a cache that
  fills must stop filling); the KV pool's resident pages never more than the pool;
* file descriptors and threads flat: the last third's median no higher than the first third's plus a margin
  (sockets come and go with the requests in flight);
* every KV block free at the end, and the block audit (used <= total, nothing negative) at every sample;
* no 5xx and no invalid 200 (the traffic checks each answer: a schema's output against jsonschema, a pattern's,
  a choice's, a prediction's counts);
* TTFT stable (`ttft_check`): the p99 of the last quarter of the streamed requests after warm-up within 20% of
  the first quarter's.
"""
from __future__ import annotations

import statistics

WARMUP_SHARE = 0.25
IN_FLIGHT = (8, 16)
RSS_BAND, RSS_GROWTH = 0.05, 0.02
TTFT_DRIFT = 0.20
FD_MARGIN, THREAD_MARGIN = 16, 2
FLOOR_S = 30.0


def after_warmup(samples: list[dict]) -> list[dict]:
    """The samples after the first quarter of the run (after a minute where that is shorter, and the run has it)."""
    if not samples:
        return []
    span = samples[-1]["t"] - samples[0]["t"]
    start = samples[0]["t"] + max(WARMUP_SHARE * span, min(60.0, 0.4 * span))
    return [s for s in samples if s["t"] >= start]


def thirds(values: list[float]) -> tuple[float, float]:
    """The medians of the first and the last third."""
    third = max(1, len(values) // 3)
    return statistics.median(values[:third]), statistics.median(values[-third:])


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
    # The floor's reach is at most a sixth of the window: over a window not much longer than FLOOR_S, every floor
    # would reach back to the window's start and a steady leak would read as flat (a one-minute run's 36 s window
    # passed +10% a minute).
    span = window[-1]["t"] - window[0]["t"] if window else 0.0
    rss = floor([s | {"rss": s["rss"] - s.get("kv_rss", 0)} for s in window], "rss", min(FLOOR_S, span / 6))
    if len(rss) < 6:
        return False, "too few samples after warm-up"
    mid = statistics.median(rss)
    band = max(max(rss) / mid - 1, 1 - min(rss) / mid)
    first, last = thirds(rss)
    growth = last / first - 1
    trend = slope([(s["t"], r) for s, r in zip(window, rss)]) * (window[-1]["t"] - window[0]["t"]) / mid
    ok = band <= RSS_BAND and growth <= RSS_GROWTH and abs(trend) <= RSS_BAND
    return ok, (f"less the KV pool: median {mid / 2**20:.0f} MiB, band {band:.1%}, first third to last {growth:+.1%} "
                f"(limit {RSS_GROWTH:.0%}), trend {trend:+.1%} over the window (limit 5%)")


def flat_check(window: list[dict], key: str, margin: float) -> tuple[bool, str]:
    values = [s[key] for s in window]
    if len(values) < 3:
        return False, "too few samples after warm-up"
    first, last = thirds(values)
    return last <= first + margin, f"median {first:.0f} in the first third, {last:.0f} in the last (margin {margin})"


def cache_check(window: list[dict]) -> tuple[bool, str]:
    """The grammar cache within its bound at every sample, and either at its bound (it evicted during the window:
    a full cache evicts to take a new grammar) or flat (+1% of the bound); the KV pool's resident pages within
    its size."""
    if not window or "grammar_max" not in window[0]:
        return False, "no grammar-cache bound sampled"
    bound = window[0]["grammar_max"]
    over = sum(s["grammar_bytes"] > s["grammar_max"] for s in window)
    first, last = thirds([s["grammar_bytes"] for s in window])
    kv_over = sum(s.get("kv_rss", 0) > s.get("kv_size", 0) for s in window)
    evicted = window[-1].get("grammar_evictions", 0) - window[0].get("grammar_evictions", 0)
    ok = not over and not kv_over and (evicted > 0 or last <= first + 0.01 * bound)
    kv = window[-1].get("kv_rss", 0) / 2**20, window[-1].get("kv_size", 0) / 2**20
    return ok, (f"grammars {first / 2**20:.1f} -> {last / 2**20:.1f} MiB of {bound / 2**20:.0f} MiB (first third to "
                f"last), {evicted:g} evicted, over the bound at {over} sample(s); KV pool {kv[0]:.0f} of "
                f"{kv[1]:.0f} MiB resident at the end, over at {kv_over}")


def in_flight_check(window: list[dict], band: tuple[int, int]) -> tuple[bool, str]:
    values = [s.get("in_flight", 0) for s in window]
    if not values:
        return False, "no samples after warm-up"
    med, p10, p90 = statistics.median(values), percentile(values, 10), percentile(values, 90)
    return band[0] <= med <= band[1], f"median {med:g} (p10 {p10:g}, p90 {p90:g}); asked {band[0]}-{band[1]}"


def kv_check(samples: list[dict]) -> tuple[bool, str]:
    bad = [s["t"] for s in samples if not 0 <= s["kv_used"] <= s["kv_total"]]
    end = samples[-1]["kv_used"] if samples else -1
    ok = not bad and end == 0
    return ok, f"{end:g} blocks held at the end; audit failed at {len(bad)} sample(s)"


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def ttft_check(ttfts: list[tuple[float, float]], start: float) -> tuple[bool, str]:
    """``ttfts``: (arrival time, seconds to the first token) of the streamed requests. The first quarter of those
    that arrived after warm-up is compared with the last quarter (an hour's run at 8-16 in flight on SmolLM2: over
    ten minutes each), or the first half with the second where a quarter would hold under 20. Their p99 where
    each holds 100 or more; with fewer, a p99 is the window's maximum, one unlucky request (an arrival beside a
    1 MB prediction), so p90 is compared instead, and the check says which. Under 20 in each, it fails: a soak
    too short to judge its latency has not shown that it holds."""
    after = [v for t, v in sorted(ttfts) if t >= start]
    n = max(len(after) // 4, min(20, len(after) // 2))
    if n < 20:
        return False, f"too few streamed requests after warm-up ({len(after)}; 40 needed)"
    first, last = after[:n], after[-n:]
    q = 99 if n >= 100 else 90
    p_first, p_last = percentile(first, q), percentile(last, q)
    return p_last <= p_first * (1 + TTFT_DRIFT), (
        f"p{q} {p_first * 1e3:.0f} ms over the first {n} streamed requests after warm-up, {p_last * 1e3:.0f} ms over "
        f"the last {n} (limit +20%)")


def verdict(samples: list[dict], outcomes: dict, ttfts: list[tuple[float, float]], minutes: float = 0.0,
            in_flight: tuple[int, int] = IN_FLIGHT) -> dict:
    """Every check: name -> (passed, what was measured); ``passed`` over all under "ok". (``minutes`` is kept for
    recorded runs that pass it: the windows follow the samples.)"""
    window = after_warmup(samples)
    checks = {"load (requests in flight)": in_flight_check(window, in_flight),
              "RSS flat": rss_check(window),
              "caches bounded": cache_check(window),
              "file descriptors flat": flat_check(window, "fds", FD_MARGIN),
              "threads flat": flat_check(window, "threads", THREAD_MARGIN),
              "KV blocks all free": kv_check(samples),
              "no 5xx": (outcomes.get("5xx", 0) == 0, f"{outcomes.get('5xx', 0)} answers with a 5xx"),
              "every 200 valid": (outcomes.get("invalid", 0) == 0, f"{outcomes.get('invalid', 0)} invalid")}
    if window:
        checks["TTFT stable"] = ttft_check(ttfts, window[0]["t"])
    return {"checks": checks, "ok": all(ok for ok, _ in checks.values())}
