"""Stage 05 past one machine: engine replicas on Ray Serve behind the same OpenAI server (`cluster`).

One local Ray instance (loopback only) serves the whole module. The real model's replicas
check tokens against the reference, errors against the single-process server, and a replica
killed mid-load; the tiny model's check autoscaling. Every wait is bounded.
"""
import asyncio
import importlib
import importlib.util
import json
import os
import signal
import threading
import time

import httpx
import pytest

from common.paths import DEFAULT_MODEL
from common import ReferenceLLM, SamplingParams
from workloads import Server

calibrate = importlib.import_module("stages.streaming.cluster.calibrate")
cluster = importlib.import_module("stages.streaming.cluster.deploy")
streaming = importlib.import_module("stages.05_streaming")
needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="Ray Serve is not installed (pip install -e '.[cluster]')")
REAL = DEFAULT_MODEL
# A replica starts in seconds on an idle machine, in minutes on one busy core shared with other work.
STARTUP_BOUND = float(os.environ.get("STEPWISE_CLUSTER_STARTUP_BOUND", 240))


# ---- the batch limit from a latency target (no Ray) ----------------------------------------------------------------
def test_a_tighter_latency_target_picks_a_smaller_batch_limit():
    step_ms = {1: 20.0, 2: 22.0, 4: 26.0, 8: 35.0, 16: 55.0, 32: 95.0, 64: 180.0}
    picks = [calibrate.choose_max_num_seqs(step_ms, target) for target in (200, 100, 60, 30, 21, 10)]
    assert picks == [64, 32, 16, 4, 1, 1]  # none meets 10 ms: the smallest batch, never zero
    noisy = {1: 20.0, 2: 31.0, 4: 28.0, 8: 40.0}  # 4 measured faster than 2: noise, not a reason to pick 4
    assert calibrate.choose_max_num_seqs(noisy, 30) == 1
    with pytest.raises(ValueError):
        calibrate.choose_max_num_seqs({}, 50)


def test_calibration_measures_decode_steps_on_the_tiny_model():
    result = calibrate.calibrate("tiny", tpot_target_ms=1e6, batch_sizes=(1, 2))
    assert set(result.step_ms) == {1, 2} and all(0 < ms < 5_000 for ms in result.step_ms.values())
    assert result.max_num_seqs == 2 and "<- chosen" in result.table()
    tight = calibrate.calibrate("tiny", tpot_target_ms=1e-6, batch_sizes=(1, 2))
    assert tight.max_num_seqs == 1 and set(tight.step_ms) == {1}  # stops at the first batch over the target


def test_cluster_without_ray_says_how_to_get_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(SystemExit, match=r"pip install -e '\.\[cluster\]'"):
        cluster.require_ray()


# ---- one Ray instance for the module ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_instance():
    cluster.connect(None, num_cpus=4)
    try:
        yield
    finally:
        cluster.teardown("", local=True)


@pytest.fixture(scope="module")
def two(ray_instance):
    """Two replicas of the real model behind the gateway; each takes 5 requests at most, the rest wait at the router."""
    config = cluster.ClusterConfig(model=REAL, replicas=2, max_num_seqs=4, max_waiting=64, app_name="two",
                                   health_check_period_s=1.0)
    engine, _ = cluster.deploy(config)
    with Server(engine, REAL) as s:
        yield s


@pytest.fixture(scope="module")
def real_ref():
    return ReferenceLLM(REAL)


def poll(condition, timeout: float, period: float = 0.5) -> bool:
    """Like `wait_until`, at a pace that leaves the Serve controller (each check asks it) time to work."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(period)
    return False


def metrics(s) -> dict[str, float]:
    text = httpx.get(s.url + "/metrics", timeout=30).text
    samples = [line.rsplit(" ", 1) for line in text.splitlines() if line and line[0] != "#"]
    return {name: float(value) for name, value in samples}


def prompt(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Name a colour, then count to {i + 2}."}]


async def stream_chat(http, url: str, messages, **fields) -> tuple[int, str, list[dict], str | None]:
    """(status, replica, data events, the text); the events end with [DONE] (a string) when the stream closed."""
    body = {"model": REAL, "messages": messages, "stream": True} | fields
    async with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            return r.status_code, None, [json.loads(await r.aread())], None
        events = [line[6:] for line in [x async for x in r.aiter_lines()] if line.startswith("data: ")]
    data = [json.loads(e) if e != "[DONE]" else e for e in events]
    text = "".join(d["choices"][0]["delta"].get("content", "") for d in data
                   if isinstance(d, dict) and d.get("choices"))  # the usage chunk's choices are empty
    return r.status_code, r.headers.get("x-stepwise-replica"), data, text


@needs_ray
@pytest.mark.cluster
def test_16_streaming_clients_over_two_replicas_get_the_reference_tokens(two, real_ref):
    params = [SamplingParams(max_tokens=8, temperature=0.8 if i % 2 else 0, seed=i) for i in range(16)]
    expected = [o for o in real_ref.generate([real_ref.tokenizer.apply_chat_template(prompt(i)) for i in range(16)],
                                             params)]

    async def main():
        async with httpx.AsyncClient(timeout=120) as http:
            return await asyncio.gather(*(stream_chat(http, two.url, prompt(i), max_tokens=8, temperature=p.temperature,
                                                      seed=i, stream_options={"include_usage": True})
                                          for i, p in enumerate(params)))

    results = asyncio.run(main())
    for (status, _, data, text), want in zip(results, expected):
        assert status == 200 and data[-1] == "[DONE]"
        assert text == want.text and data[-2]["choices"] == [] and data[-2]["usage"]["completion_tokens"] == len(
            want.token_ids)
    served = {replica for _, replica, _, _ in results}
    m = metrics(two)
    assert len(served) == 2, served  # Ray Serve's router spread the load over both replicas
    assert sum(m[f'stepwise_replica_requests_total{{replica="{r}"}}'] for r in served) >= 16
    assert all(m[f'stepwise_time_to_first_token_seconds_count{{replica="{r}"}}'] >= 1 for r in served)
    assert m['stepwise_replicas{state="RUNNING"}'] == 2 and m["stepwise_queue_depth"] == 0
    assert httpx.get(two.url + "/health").json() == {"status": "ok", "deployment": "HEALTHY",
                                                     "replicas": {"RUNNING": 2}}


BAD = [  # (path, body, headers): each must get the single-process server's answer, byte for byte
    ("/v1/completions", b"{not json", {}), ("/v1/completions", b"[1, 2]", {}),
    ("/v1/completions", {"model": "gpt-4", "prompt": "hi"}, {}),
    ("/v1/completions", {"model": REAL, "prompt": "hi", "max_tokens": 0}, {}),
    ("/v1/completions", {"model": REAL, "prompt": "hi", "max_tokens": 5000}, {}),
    ("/v1/completions", {"model": REAL, "prompt": [5] * 3000}, {}),
    ("/v1/completions", {"model": REAL, "prompt": [5, 10**6]}, {}),  # checked in the replica: its vocabulary
    ("/v1/completions", {"model": REAL, "prompt": "hi", "stop_token_ids": [70000]}, {}),  # in the replica too
    ("/v1/completions", {"model": REAL, "prompt": "hi", "temperature": -1}, {}),
    ("/v1/completions", {"model": REAL, "prompt": "hi", "best_of": 2}, {}),  # refused by name in both
    ("/v1/completions", {"model": REAL, "prompt": "hi", "max_token": 3}, {}),
    ("/v1/completions", {"model": REAL, "prompt": "x" * 2_000_000}, {}),
    ("/v1/completions", b'{"prompt": "hi"}', {"Content-Type": "text/plain"}),
    ("/v1/chat/completions", {"model": REAL, "messages": [{"role": "tool", "content": "x"}]}, {}),
    ("/v1/chat/completions", {"model": REAL, "messages": []}, {}),
    ("/v1/nothing", {}, {}),
]


@needs_ray
@pytest.mark.cluster
def test_bad_input_gets_the_same_errors_as_the_single_process_server(two):
    def answers(url):
        with httpx.Client(timeout=30) as http:
            return [(r.status_code, r.json()) for r in (
                http.post(url + path, content=body, headers={"Content-Type": "application/json"} | headers)
                if isinstance(body, bytes) else http.post(url + path, json=body, headers=headers)
                for path, body, headers in BAD)]

    with Server(streaming.LLM(REAL, max_num_seqs=2), REAL) as local:
        expected = answers(local.url)
    got = answers(two.url)
    assert [status for status, _ in expected] == [400, 400, 404, 400, 400, 400, 400, 400, 400, 400, 400, 413, 415,
                                                   400, 400, 404]
    assert got == expected
    assert expected[6][1]["error"]["param"] == "prompt" and "vocabulary" in expected[6][1]["error"]["message"]


@needs_ray
@pytest.mark.cluster
def test_a_client_that_leaves_mid_stream_frees_its_replicas_blocks(two):
    body = {"model": REAL, "messages": prompt(0), "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", two.url + "/v1/chat/completions", json=body) as r:
            replica, lines = r.headers["x-stepwise-replica"], r.iter_lines()  # (a dropped iterator closes r)
            next(line for line in lines if line.startswith("data: {"))  # running: 2,000 tokens to go
            assert metrics(two)[f'stepwise_replica_requests_running{{replica="{replica}"}}'] == 1
    # the connection is closed: the gateway cancels the call, the replica aborts the request at its next step
    handle, states = two.llm.unary_handle, {}

    def replica_idle():
        state = handle.engine_state.remote().result()  # the router picks a replica: ask until both answered
        states[state.pop("replica")] = state
        return states.get(replica) == {"waiting": 0, "running": 0, "kv_blocks_used": 0}

    assert poll(replica_idle, 15, period=0.2), states
    assert metrics(two)[f'stepwise_replica_requests_running{{replica="{replica}"}}'] == 0


@needs_ray
@pytest.mark.cluster
def test_a_shutdown_ends_open_streams_with_an_error_event_and_frees_their_blocks(two):
    """The gateway's graceful shutdown (SIGTERM in `cluster`) at its deadline aborts what still runs on replicas."""
    with Server(two.llm, REAL) as gateway, httpx.Client(timeout=60) as http:
        body = {"model": REAL, "messages": prompt(1), "max_tokens": 2000, "ignore_eos": True, "stream": True}
        with http.stream("POST", gateway.url + "/v1/chat/completions", json=body) as r:
            replica, lines = r.headers["x-stepwise-replica"], r.iter_lines()
            next(line for line in lines if line.startswith("data: {"))
            gateway.server.config.app.state.drain.begin(0.0)  # what the first SIGTERM does, with no grace
            rest = [line[6:] for line in lines if line.startswith("data: ")]
        assert rest[-1] == "[DONE]" and json.loads(rest[-2])["error"]["message"].startswith("the server is shutting")
        assert http.post(gateway.url + "/v1/chat/completions", json=body | {"stream": False}).status_code == 503
    handle, states = two.llm.unary_handle, {}

    def replica_idle():
        state = handle.engine_state.remote().result()
        states[state.pop("replica")] = state
        return states.get(replica) == {"waiting": 0, "running": 0, "kv_blocks_used": 0}

    assert poll(replica_idle, 15, period=0.2), states


@needs_ray
@pytest.mark.cluster
def test_a_replica_killed_mid_load_fails_its_requests_cleanly_and_is_replaced(two, real_ref):
    n, tokens = 6, 24
    want = real_ref.generate([real_ref.tokenizer.apply_chat_template(prompt(i)) for i in range(n)],
                             SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True))
    body = {"model": REAL, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    seen_health, killed = [], {}

    async def first_client_kills_its_replica(http):
        """Client 0 streams; at its first token it kills (SIGKILL) the replica serving it, then reads on."""
        async with http.stream("POST", two.url + "/v1/chat/completions",
                               json=body | {"messages": prompt(0), "stream": True}) as r:
            events = []
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if not killed:
                        replica = r.headers["x-stepwise-replica"]
                        info = next(k for k in metrics(two)
                                    if k.startswith(f'stepwise_replica_info{{replica="{replica}"'))
                        killed.update(replica=replica, pid=int(info.split('pid="')[1].split('"')[0]))
                        os.kill(killed["pid"], signal.SIGKILL)
        data = [json.loads(e) if e != "[DONE]" else e for e in events]
        return 200, r.headers["x-stepwise-replica"], data, "".join(
            d["choices"][0]["delta"].get("content", "") for d in data if isinstance(d, dict) and "choices" in d)

    async def watch_health(http, stop):
        while not stop.is_set():
            seen_health.append((await http.get(two.url + "/health")).json())
            await asyncio.sleep(0.5)

    async def main():
        stop = asyncio.Event()
        async with httpx.AsyncClient(timeout=httpx.Timeout(90, connect=10)) as http:
            watcher = asyncio.ensure_future(watch_health(http, stop))
            clients = [stream_chat(http, two.url, prompt(i), **body) for i in range(1, n - 2)]
            clients += [http.post(two.url + "/v1/chat/completions", json=body | {"messages": prompt(i)})
                        for i in range(n - 2, n)]
            # no client may hang: all of them end within the bound
            results = await asyncio.wait_for(asyncio.gather(first_client_kills_its_replica(http), *clients), 120)
            recovered, killed["ended"] = False, time.monotonic()
            # The controller notices a death at its next health check (seconds), possibly after every client
            # ended: recovered means /health first showed the loss, then two replicas running again.
            deadline = time.monotonic() + STARTUP_BOUND  # for Ray Serve to start the replacement
            while not recovered and time.monotonic() < deadline:
                h = (await http.get(two.url + "/health")).json()
                seen_health.append(h)
                lost = any(s["status"] != "ok" or s["replicas"].get("RUNNING") != 2 for s in seen_health)
                recovered = lost and h["status"] == "ok" and h["replicas"] == {"RUNNING": 2}
                await asyncio.sleep(0.5)
            killed["recovered"] = time.monotonic()
            stop.set()
            await watcher
            return results, recovered

    results, recovered = asyncio.run(main())
    assert "pid" in killed  # client 0 saw a token and killed its replica
    failed = 0
    for i, result in enumerate(results):
        if isinstance(result, httpx.Response):  # the non-streaming clients: the answer, or an OpenAI error object
            answer = result.json()
            if result.status_code == 200:
                assert answer["choices"][0]["message"]["content"] == want[i].text
            else:
                failed += 1
                assert result.status_code in (500, 503) and answer["error"]["type"] in ("server_error",
                                                                                       "server_overloaded")
                assert result.headers.get("x-stepwise-replica") in (None, killed["replica"])
            continue
        status, replica, data, text = result
        assert status == 200 and data[-1] == "[DONE]"  # every stream is terminated, none hangs
        errors = [d for d in data if isinstance(d, dict) and "error" in d]
        if errors:
            failed += 1
            assert replica == killed["replica"] and len(errors) == 1 and data[-2] is errors[0]
            assert errors[0]["error"]["type"] == "server_error" and "replica" in errors[0]["error"]["message"]
        else:  # whole and right: on the other replica, or on the killed one before the kill (24 tokens go fast)
            assert text == want[i].text and data[-2]["choices"][0]["finish_reason"] == "length"
    assert results[0][2][-2]["error"]["type"] == "server_error"  # the killer's own stream was on that replica
    assert failed < len(results)  # the other replica's requests finished
    assert any(h["status"] != "ok" or h["replicas"].get("RUNNING") != 2 for h in seen_health)  # health showed it
    changes = [h for i, h in enumerate(seen_health) if i == 0 or h != seen_health[i - 1]]
    print(f"fault: {failed} of {len(results)} requests failed (on {killed['replica']}); health went {changes}; "
          f"recovered {killed['recovered'] - killed['ended']:.1f} s after the last client ended")
    assert recovered, seen_health[-1]
    r = httpx.post(two.url + "/v1/chat/completions", timeout=60, json=body | {"messages": prompt(1)})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == want[1].text
    assert metrics(two)[f'stepwise_replica_requests_failed_total{{replica="{killed["replica"]}"}}'] == failed


# ---- autoscaling (tiny model) ---------------------------------------------------------------------------------------
@needs_ray
@pytest.mark.cluster
def test_autoscaling_follows_the_queue_up_to_two_replicas_and_back_to_one(ray_instance):
    config = cluster.ClusterConfig(model="tiny", min_replicas=1, max_replicas=2, target_ongoing_requests=1,
                                   max_num_seqs=2, app_name="auto", upscale_delay_s=0.5, downscale_delay_s=2.0,
                                   look_back_period_s=1.0, metrics_interval_s=0.25, health_check_period_s=1.0)
    engine, _ = cluster.deploy(config)
    timeline, stop, most_pending = [], threading.Event(), [0]
    start = time.monotonic()

    def replicas():
        most_pending[0] = max(most_pending[0], engine.gateway_metrics.pending)
        states = engine.replica_states_now()[1]
        if not timeline or timeline[-1][1] != states:
            timeline.append((round(time.monotonic() - start, 1), states))
        return states

    async def client(http, url):
        body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 400, "ignore_eos": True, "stream": True}
        while not stop.is_set():
            try:
                async with http.stream("POST", url + "/v1/completions", json=body) as r:
                    async for _ in r.aiter_lines():
                        if stop.is_set():
                            break
            except httpx.HTTPError:  # a slow machine: keep the load on
                await asyncio.sleep(0.1)

    async def load(url):
        async with httpx.AsyncClient(timeout=httpx.Timeout(30, connect=10)) as http:
            await asyncio.gather(*(client(http, url) for _ in range(6)))

    try:
        with Server(engine, "tiny") as s:
            assert replicas() == {"RUNNING": 1}
            loader = threading.Thread(target=asyncio.run, args=(load(s.url),), daemon=True)
            loader.start()
            grew = poll(lambda: replicas().get("RUNNING") == 2, STARTUP_BOUND)
            stop.set()
            loader.join(60)
            assert not loader.is_alive()
            shrank = poll(lambda: replicas() == {"RUNNING": 1}, STARTUP_BOUND)
    finally:
        from ray import serve
        serve.delete("auto")
    print("autoscaling timeline (s, replicas):", timeline)
    assert grew, timeline
    assert most_pending[0] >= 1  # one replica (3 requests at most) could not take the 6 clients: they queued
    assert shrank, timeline
