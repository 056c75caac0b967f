"""The soak's verdict on recorded series (tests/data/soak_*.json). soak_flat.json, a closed-loop run of the tiny model
recorded under load, passed every check but TTFT's (p90 623 ms over the first 20 streamed requests after
warm-up, 795 ms over the last: the machine's load average was 10); with a warm-up planted (RSS climbing 6% in
the first quarter, then level) the verdict must say the same; with a slow leak planted after the warm-up (+4%
over the window: inside the 5% band) or a fast one, it must fail RSS too; each other fault its own check. The
TTFT check is tested on soak_open_loop.json, an earlier run whose latency held. Then a one-minute soak of the
real server on the tiny model with the same verdict (a real run: it fails when the server leaks, holds a block,
answers a 5xx or an invalid 200)."""
import copy
import json
import re
from pathlib import Path

import pytest

from stages.bench.soak import report
from stages.bench.soak import verdict as v
from workloads import profile

DATA = Path(__file__).parent / "data"
RECORDED_FAILS = ["TTFT stable"]  # soak_flat.json's run, under load (the docstring)


def recorded(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def judge(run: dict) -> dict:
    return v.verdict(run["samples"], run["outcomes"], [tuple(x) for x in run["ttfts"]])


def failed(result: dict) -> list[str]:
    return [name for name, (ok, _) in result["checks"].items() if not ok]


@pytest.mark.parametrize("name", ["soak_flat.json", "soak_warmup.json"])
def test_a_flat_run_passes_and_so_does_one_that_warms_up_first(name):
    result = judge(recorded(name))
    assert failed(result) == RECORDED_FAILS, result["checks"]


@pytest.mark.parametrize("name", ["soak_slow_leak.json", "soak_leak.json"])
def test_a_leak_after_warm_up_fails_the_rss_check(name):
    result = judge(recorded(name))
    assert failed(result) == ["RSS flat", *RECORDED_FAILS], result["checks"]


def test_the_slow_leak_stays_inside_the_band_and_is_caught_by_its_growth():
    """+4% over the window is about +-2% around the median: the band alone would pass it."""
    ok, why = v.rss_check(v.after_warmup(recorded("soak_slow_leak.json")["samples"]))
    band = float(re.search(r"band ([\d.]+)%", why).group(1))
    assert not ok and band <= 100 * v.RSS_BAND, why


def test_the_warm_up_is_left_out_and_the_window_is_level():
    run = recorded("soak_warmup.json")
    rss = [s["rss"] for s in run["samples"]]
    assert max(rss) / min(rss) - 1 > v.RSS_BAND  # over the whole run, RSS moved more than the band
    ok, why = v.rss_check(v.after_warmup(run["samples"]))
    assert ok, why


def gap(run, grow):
    """Grammar-cache bytes growing through the window (below the bound): a cache that never stops filling."""
    for i, s in enumerate(run["samples"]):
        s["grammar_bytes"] = grow * i


@pytest.mark.parametrize("fault, check", [
    (lambda r: r["samples"][-1].update(kv_used=3), "KV blocks all free"),
    (lambda r: r["samples"][5].update(kv_used=r["samples"][5]["kv_total"] + 1), "KV blocks all free"),
    (lambda r: r["outcomes"].update({"5xx": 1}), "no 5xx"),
    (lambda r: r["outcomes"].update(invalid=2), "every 200 valid"),
    (lambda r: [s.update(fds=s["fds"] + 40) for s in r["samples"][len(r["samples"]) * 3 // 4:]],
     "file descriptors flat"),
    (lambda r: [s.update(threads=s["threads"] + 1 + i) for i, s in enumerate(r["samples"])], "threads flat"),
    (lambda r: [s.update(in_flight=2) for s in r["samples"]], "load (requests in flight)"),
    (lambda r: [s.update(in_flight=40) for s in r["samples"]], "load (requests in flight)"),
    (lambda r: gap(r, 2**17), "caches bounded"),
    (lambda r: r["samples"][-3].update(grammar_bytes=r["samples"][-3]["grammar_max"] + 1), "caches bounded"),
    (lambda r: r["samples"][-3].update(rss=r["samples"][-3]["rss"] + r["samples"][-3]["kv_size"] + 4096 -
                                       r["samples"][-3]["kv_rss"], kv_rss=r["samples"][-3]["kv_size"] + 4096),
     "caches bounded"),
])
def test_each_fault_fails_its_own_check(fault, check):
    run = copy.deepcopy(recorded("soak_flat.json"))
    fault(run)
    assert [name for name in failed(judge(run)) if name not in RECORDED_FAILS] == [check]


def test_ttft_compares_the_first_and_the_last_quarter_of_the_streamed_requests():
    """The recorded run's own figures fail (its load changed); the same requests with the last quarter's latencies
    replaced by the first quarter's pass; the tail doubled fails; an eighth of the requests are too few."""
    run = recorded("soak_flat.json")
    ttfts = sorted(tuple(x) for x in run["ttfts"])
    start = v.after_warmup(run["samples"])[0]["t"]
    ok, why = v.ttft_check(ttfts, start)
    assert not ok and re.fullmatch(r"p90 623 ms .* first 20 .*, 795 ms over the last 20 .*", why), why
    after = [i for i, (t, _) in enumerate(ttfts) if t >= start]
    n = max(len(after) // 4, min(20, len(after) // 2))
    steady = ttfts[:after[-n]] + [(t, ttfts[after[k]][1]) for k, (t, _) in enumerate(ttfts[after[-n]:])]
    assert v.ttft_check(steady, start)[0], v.ttft_check(steady, start)
    doubled = steady[:after[-n]] + [(t, 2 * x) for t, x in steady[after[-n]:]]
    assert not v.ttft_check(doubled, start)[0]
    ok, why = v.ttft_check(ttfts[::8], start)
    assert not ok and "too few" in why, why


def test_the_kv_pools_first_touch_is_not_counted_as_growth():
    """RSS climbing with the KV pool's resident pages (blocks written for the first time) is bounded by the pool
    and passes; the same climb outside the pool fails."""
    run = copy.deepcopy(recorded("soak_flat.json"))
    t0, t1 = run["samples"][0]["t"], run["samples"][-1]["t"]
    for s in run["samples"]:
        touched = int(0.3 * s["kv_size"] * (s["t"] - t0) / (t1 - t0))
        s["rss"], s["kv_rss"] = s["rss"] - s["kv_rss"] + touched, touched
    assert failed(judge(run)) == RECORDED_FAILS, judge(run)["checks"]
    for s in run["samples"]:
        s["kv_rss"] = 0
    assert failed(judge(run)) == ["RSS flat", *RECORDED_FAILS]


def test_a_cache_that_grows_while_it_evicts_is_at_its_bound_and_passes():
    """Bytes rising in the window (entries of different sizes) while the cache evicts: it is full, not filling."""
    run = copy.deepcopy(recorded("soak_flat.json"))
    gap(run, 2**14)
    for i, s in enumerate(run["samples"]):
        s["grammar_evictions"] = i
    assert failed(judge(run)) == RECORDED_FAILS


def test_a_steady_leak_fails_the_rss_check_even_in_a_one_minute_run():
    """The real soak below runs a minute: its window after warm-up (36 s) is barely longer than the 30-s floor, which
    once reached back to the window's start, so a leak of +10% a minute read as flat (+0.2%). The floor now
    reaches a sixth of the window at most; the hour's windows keep 30 s."""
    def run(leak_per_minute):
        samples = [{"t": t, "rss": 2**30 * (1 + leak_per_minute * t / 60), "kv_rss": 0} for t in range(0, 61, 2)]
        return v.rss_check(v.after_warmup(samples))
    assert not run(0.10)[0] and run(0.0)[0], (run(0.10), run(0.0))


def test_a_short_soak_of_the_server_on_the_tiny_model_holds_the_verdict():
    """A real run, closed loop at 12 clients: its verdict, not a stand-in's; it fails when the server leaks outside
    its bounded pools, holds a block, answers a 5xx or an invalid 200, or grows its fds or threads. Every check but
    TTFT's: latency is a target for a run alone (docs/soak.md), never a timed test on a shared CI machine (a
    3-minute run under load: p90 292 ms over the first quarter, 752 ms over the last, as a 1 MB prediction took
    the cores). Three minutes in the deep profile (CI's `.ci/run`, as issue 56 asks), one in quick (a learner's
    `make test`: docs/measuring.md). Without 1 MB predictions: each burst of them steps RSS up (by 32 MiB once on
    the tiny model, docs/soak.md), which a window of under a minute cannot tell from growth; test_soak_probe.py and
    test_prepare_off_thread.py send them, and the hour judges their steps. The tiny model keeps it to about a
    minute and a half. A 4 MiB KV pool (512 blocks), filled in the first seconds: the prefix cache keeps a hash
    and the tokens of every block it has seen (about 0.5 KB a block, bounded by the pool), and the block manager
    hands out never-used blocks before evicting cached ones, so with the soak's 256 MiB (32,768 tiny-model
    blocks) that bookkeeping grew for the whole run, and a 3-minute window could not tell it from a leak
    (docs/soak.md, 2026-12-07)."""
    from stages.bench.soak.__main__ import arguments, run_soak
    from stages.bench.soak.traffic import KINDS
    kinds = ",".join(k for k in KINDS if k != "big_prediction")
    minutes = "3" if profile() == "deep" else "1"
    args = arguments(["--minutes", minutes, "--concurrency", "12", "--model", "tiny", "--max-tokens", "24",
                      "--sample-every", "2", "--grammar-cache-mb", "4", "--kv-memory", "4MiB", "--kinds", kinds])
    result = run_soak(args)
    assert result["outcomes"]["ok"] > 100 and sum(result["counts"]["hostile"].values()) > 0
    assert "TTFT stable" in result["checks"]
    failed = {name: said for name, (ok, said) in result["checks"].items() if not ok}
    assert list(failed) in ([], ["TTFT stable"]), "\n".join([f"{k}: {v}" for k, v in failed.items()]
                                                             + [str(p) for p in result["problems"][:5]])


def test_the_latency_table_compares_the_first_and_the_last_ten_minutes():
    """The verdict's percentiles of the requests that arrived in each window: an hour of points, the first ten
    minutes at 100-199 ms and the last ten at 300-399 ms (the middle elsewhere), so each window's p50 and p99 are
    known by hand; a run of 15 minutes compares its first and last five."""
    ttfts = [(t * 1.0, 0.1 + (t % 100) / 1000) for t in range(0, 600)]
    ttfts += [(t * 1.0, 0.2) for t in range(600, 3000)] + [(t * 1.0, 0.3 + (t % 100) / 1000) for t in range(3000, 3601)]
    w = report.windows(ttfts, 3600.0)
    assert len(w["first"]) == 600 and len(w["last"]) == 601 and max(w["first"]) < 0.2 and min(w["last"]) >= 0.3
    assert v.percentile(w["first"], 50) == pytest.approx(0.150)  # index round(0.5 * 599) = 300: the 51st value
    assert v.percentile(w["first"], 99) == pytest.approx(0.198)
    assert v.percentile([1.0, 2.0, 3.0], 99) == 3.0 and v.percentile([5.0], 50) == 5.0
    assert len(report.windows([(t * 1.0, 0.1) for t in range(900)], 900.0)["first"]) == 300
    rows = report.latency_table(ttfts, ttfts).row_count
    assert rows == 4
