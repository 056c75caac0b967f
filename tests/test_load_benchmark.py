"""`load` as `vllm bench serve`: its figures against a recomputation from the raw timestamps its clients recorded,
goodput against SLOs built from the observed values, Poisson arrivals, the concurrency cap counted inside the
server, bad options refused, and the aiperf command it builds (aiperf itself never runs here)."""
import argparse
import asyncio
import importlib
import json
import math
import statistics
from urllib.parse import urlsplit

import pytest

from common import ReferenceLLM, SamplingParams
from workloads import Server

streaming = importlib.import_module("stages.05_streaming")
main = importlib.import_module("stages.bench.load.__main__").main
load = importlib.import_module("stages.bench.load.client")
load_metrics = importlib.import_module("stages.bench.load.metrics")
load_args = importlib.import_module("stages.bench.load.args")
aiperf = importlib.import_module("stages.bench.load.aiperf")


class InFlight:
    """ASGI middleware: counts the chat completions the server holds, from the request's arrival until the app
    hands over the response's last byte (counted down before it is sent, so the client cannot see it end first)."""

    def __init__(self, app):
        self.app, self.now, self.peak = app, 0, 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            return await self.app(scope, receive, send)
        self.now += 1
        self.peak = max(self.peak, self.now)
        done = False

        async def counted(message):
            nonlocal done
            if message["type"] == "http.response.body" and not message.get("more_body") and not done:
                done = True
                self.now -= 1
            await send(message)

        try:
            await self.app(scope, receive, counted)
        finally:
            if not done:
                self.now -= 1


@pytest.fixture(scope="module")
def server():
    with Server(streaming.LLM("tiny", max_num_seqs=8, max_waiting=64), "tiny", wrap=InFlight) as s:
        yield s


@pytest.fixture(scope="module")
def run(server):
    """One capped load run: 10 requests, at most 3 in flight; its records, duration and the server's peak."""
    server.app.peak = 0
    s = load.LoadSettings("tiny", num_requests=10, max_tokens=12, max_concurrency=3)
    records, duration = asyncio.run(load.run_clients(server.url, s))
    return records, duration, server.app.peak


def interpolated(values, q):
    """numpy's default percentile, written out: linear between the two ranks around q/100 * (n - 1)."""
    v = sorted(values)
    pos = q / 100 * (len(v) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def test_records_hold_the_references_tokens_and_the_clients_own_timestamps(run):
    records, duration, _ = run
    ref = ReferenceLLM("tiny")
    prompts = [ref.tokenizer.encode_chat([{"role": "user", "content": q}])
               for q in load.LoadSettings("tiny", num_requests=10).prompts()]
    want = ref.generate(prompts, SamplingParams(temperature=0, max_tokens=12))
    assert [r["request"] for r in records] == list(range(10)) and all(r["success"] for r in records)
    for r in records:
        assert r["output_tokens"] == len(want[r["request"]].token_ids)
        assert r["prompt_tokens"] == len(prompts[r["request"]])
        assert 1 <= len(r["chunk_times"]) <= r["output_tokens"] and r["chunk_times"] == sorted(r["chunk_times"])
        assert r["arrival_time"] <= r["start"] < r["chunk_times"][0]
        assert set(r["content_times"]) <= set(r["chunk_times"])
        # the EOS step streams a chunk with a finish reason and no text: aiperf's clock stops a step earlier
        ended_by_eos = want[r["request"]].finish_reason == "stop"
        assert (r["content_times"][-1] < r["chunk_times"][-1]) == ended_by_eos


def test_an_answer_ending_in_eos_streams_a_last_chunk_without_text(server):
    """The EOS step's chunk carries the finish reason and no text: vLLM's clock (`load`'s) stops at it, aiperf's
    at the chunk before, one decode step earlier; both count the EOS token, as the server's usage does."""
    question = load.CHAT_QUESTIONS[22]  # tiny answers it greedily with EOS at token 54 (found by search)
    ref = ReferenceLLM("tiny")
    want = ref.generate([ref.tokenizer.encode_chat([{"role": "user", "content": question}])],
                        SamplingParams(temperature=0, max_tokens=64))[0]
    assert want.finish_reason == "stop"
    r = asyncio.run(load.one_request(urlsplit(server.url), "tiny", question, 64))
    assert r["success"] and r["output_tokens"] == len(want.token_ids)
    assert r["content_times"][-1] < r["chunk_times"][-1] and r["content_times"] == r["chunk_times"][:-1]


@pytest.mark.parametrize("times", ["chunk_times", "content_times"])  # vLLM's definitions, then aiperf's
def test_reported_metrics_equal_a_recomputation_from_the_raw_timestamps(run, times):
    records, duration, _ = run
    failed = {"request": 10, "success": False, "error": "refused", "start": 0.0, "chunk_times": [],
              "content_times": [], "output_tokens": 0, "prompt_tokens": 0}
    m = load_metrics.calculate_metrics(records + [failed], duration, (50, 90, 99.5), times=times)
    ttft = [r[times][0] - r["start"] for r in records]
    e2el = [r[times][-1] - r["start"] for r in records]
    tpot = [(e - t) / (r["output_tokens"] - 1) for r, t, e in zip(records, ttft, e2el) if r["output_tokens"] > 1]
    itl = [b - a for r in records for a, b in zip(r[times], r[times][1:])]
    tokens_in, tokens_out = sum(r["prompt_tokens"] for r in records), sum(r["output_tokens"] for r in records)
    assert (m["completed"], m["failed"], m["total_input_tokens"], m["total_output_tokens"]) == \
        (10, 1, tokens_in, tokens_out)
    assert m["request_throughput"] == pytest.approx(10 / duration)
    assert m["output_throughput"] == pytest.approx(tokens_out / duration)
    assert m["total_token_throughput"] == pytest.approx((tokens_in + tokens_out) / duration)
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        ms = [1e3 * v for v in values]
        assert m[f"mean_{name}_ms"] == pytest.approx(statistics.fmean(ms))
        assert m[f"median_{name}_ms"] == pytest.approx(statistics.median(ms))
        for q in (50, 90, 99.5):
            assert m[f"p{q:g}_{name}_ms"] == pytest.approx(interpolated(ms, q))
    assert m["request_goodput"] is None  # no SLO given: no goodput, as vLLM reports none


def test_goodput_counts_exactly_the_requests_meeting_every_slo(run):
    """SLOs midway between observed values, chosen so that each alone admits a request the pair turns away."""
    records, duration, _ = run
    ttft = [1e3 * (r["chunk_times"][0] - r["start"]) for r in records]
    tpot = [1e3 * (r["chunk_times"][-1] - r["chunk_times"][0]) / (r["output_tokens"] - 1) for r in records]

    def midpoints(values):
        v = sorted(values)
        return [(a + b) / 2 for a, b in zip(v, v[1:])]

    def meeting(ttft_slo, tpot_slo):
        return sum(t <= ttft_slo and p <= tpot_slo for t, p in zip(ttft, tpot))

    pairs = [(a, b, meeting(a, b)) for a in midpoints(ttft) for b in midpoints(tpot)
             if 0 < meeting(a, b) < min(meeting(a, math.inf), meeting(math.inf, b))]
    assert pairs, "the observed TTFTs and TPOTs rank every request alike: no SLO pair tells them apart"
    ttft_slo, tpot_slo, good = pairs[len(pairs) // 2]
    m = load_metrics.calculate_metrics(records, duration, goodput={"ttft": ttft_slo, "tpot": tpot_slo})
    assert m["request_goodput"] * duration == pytest.approx(good)
    for slos, want in (({"ttft": ttft_slo}, meeting(ttft_slo, math.inf)),
                       ({"tpot": tpot_slo}, meeting(math.inf, tpot_slo)),
                       ({"e2el": 0.0}, 0), ({"e2el": 1e9, "ttft": 1e9, "tpot": 1e9}, 10)):
        assert load_metrics.calculate_metrics(records, duration, goodput=slos)["request_goodput"] * duration \
            == pytest.approx(want)


def test_max_concurrency_is_never_exceeded_inside_the_server(run):
    records, _, server_peak = run
    assert 1 <= server_peak <= 3
    assert load_metrics.peak_concurrency(records) <= 3


def test_rate_inf_without_a_cap_sends_every_request_at_once(server):
    server.app.peak = 0
    s = load.LoadSettings("tiny", num_requests=10, max_tokens=24, max_concurrency=None, ignore_eos=True)
    records, _ = asyncio.run(load.run_clients(server.url, s))
    assert max(r["start"] for r in records) < min(r["chunk_times"][-1] for r in records)  # all in flight together
    assert len({r["arrival_time"] for r in records}) == 1
    assert server.app.peak > 3  # the counter sees past the cap the capped run kept to
    assert all(r["output_tokens"] == 24 for r in records)  # ignore_eos reached the server


def test_poisson_arrivals_are_kept_by_the_clients(server):
    s = load.LoadSettings("tiny", num_requests=8, max_tokens=4, max_concurrency=None, request_rate=40.0, seed=3)
    records, duration = asyncio.run(load.run_clients(server.url, s))
    gaps = load.arrival_times(8, 40.0, 3)
    arrivals = [r["arrival_time"] for r in records]
    assert [b - a for a, b in zip(arrivals, arrivals[1:])] == pytest.approx([b - a for a, b in zip(gaps, gaps[1:])])
    assert all(r["start"] >= r["arrival_time"] for r in records)  # never sent early
    assert duration >= gaps[-1]


def test_arrival_times_are_a_seeded_poisson_process():
    n, rate = 20000, 8.0
    times = load.arrival_times(n, rate, seed=1)
    assert times == load.arrival_times(n, rate, seed=1) != load.arrival_times(n, rate, seed=2)
    gaps = [b - a for a, b in zip([0.0] + times, times)]
    assert all(g > 0 for g in gaps)
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.03)
    assert statistics.stdev(gaps) == pytest.approx(1 / rate, rel=0.05)  # exponential: as wide as its mean
    assert sum(g > 1 / rate for g in gaps) / n == pytest.approx(math.exp(-1), abs=0.012)  # P(gap > mean) = 1/e
    assert load.arrival_times(5, math.inf) == [0.0] * 5


def test_a_request_the_server_refuses_is_counted_as_failed():
    """The warm-up fits the context, the timed requests do not (400): they are failures, not an exception."""
    with Server(streaming.LLM("tiny", max_num_seqs=2, max_model_len=96), "tiny") as s:
        settings = load.LoadSettings("tiny", num_requests=3, max_tokens=200, max_concurrency=2)
        records, duration = asyncio.run(load.run_clients(s.url, settings))
    assert [r["success"] for r in records] == [False] * 3 and all("400" in r["error"] for r in records)
    m = load_metrics.calculate_metrics(records, duration)
    assert (m["completed"], m["failed"], m["mean_ttft_ms"]) == (0, 3, None)


@pytest.mark.parametrize("argv, message", [
    (["--goodput", "ttft:abc"], "'abc' is not a number of milliseconds"),
    (["--goodput", "latency:5"], "'latency' is not one of ttft, tpot, e2el"),
    (["--goodput", "ttft"], "give METRIC:MILLISECONDS"),
    (["--goodput", "tpot:-1"], "non-negative"),
    (["--request-rate", "-2"], "a request rate is positive"),
    (["--request-rate", "fast"], "not a number of requests per second"),
    (["--max-concurrency", "0"], "0 is not positive"),
    (["--metric-percentiles", "50,101"], "each percentile is in (0, 100]"),
])
def test_bad_load_options_fail_with_a_clear_message(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--model", "tiny", *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_clients_and_max_concurrency_are_one_setting():
    with pytest.raises(SystemExit, match="one setting under two names"):
        main(["--model", "tiny", "--clients", "4", "--max-concurrency", "8"])
    args = argparse_for(["--clients", "4"])
    assert load_args.settings_from(args).max_concurrency == 4
    assert load_args.settings_from(argparse_for([])).max_concurrency == 16  # today's closed loop of 16
    assert load_args.settings_from(argparse_for(["--request-rate", "2"])).max_concurrency is None


def test_a_missing_aiperf_is_named_before_anything_runs(tmp_path):
    with pytest.raises(SystemExit, match="no aiperf at .*make aiperf"):
        main(["--model", "tiny", "--aiperf", str(tmp_path / "aiperf")])


def argparse_for(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--api-key", default=None)
    load_args.add_load_arguments(ap)
    return ap.parse_args(argv)


def test_aiperf_is_told_what_load_sent(tmp_path):
    s = load.LoadSettings("smol", num_requests=5, max_tokens=33, max_concurrency=4, ignore_eos=True,
                          goodput={"ttft": 500.0, "tpot": 40.0})
    aiperf.write_inputs(tmp_path / "in.jsonl", s)
    lines = [json.loads(line) for line in (tmp_path / "in.jsonl").read_text().splitlines()]
    assert lines == [{"text": q, "output_length": 33} for q in s.prompts()]
    cmd = aiperf.aiperf_command("aiperf", "http://h:1", s, "/tok", tmp_path / "in.jsonl", tmp_path / "out")
    flags = " ".join(cmd)
    for part in ("--model smol", "--url http://h:1", "--streaming", "--request-count 5", "--concurrency 4",
                 "--tokenizer /tok", "--use-server-token-count", "--extra-inputs temperature:0",
                 "--extra-inputs ignore_eos:true", "--dataset-sampling-strategy sequential"):
        assert part in flags
    assert cmd[cmd.index("--goodput") + 1] == "time_to_first_token:500 inter_token_latency:40"
    assert "--request-rate" not in cmd
    poisson = aiperf.aiperf_command("aiperf", "http://h:1", load.LoadSettings("smol", request_rate=2.5, seed=7,
                                                                              max_concurrency=None),
                                    "/tok", tmp_path / "in.jsonl", tmp_path / "out")
    assert " ".join(poisson).endswith("--request-rate 2.5 --arrival-pattern poisson --random-seed 7")
