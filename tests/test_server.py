"""The OpenAI-compatible server on loopback: the official `openai` client and plain HTTP."""
import asyncio
import importlib
import json
import threading

import httpx
import pytest

from common.paths import DEFAULT_MODEL
from common import ReferenceLLM, SamplingParams
from workloads import Server, wait_until

openai = pytest.importorskip("openai")
streaming = importlib.import_module("stages.05_streaming")


@pytest.fixture(scope="module")
def tiny_server():
    with Server(streaming.LLM("tiny", max_num_seqs=8, max_waiting=64), "tiny") as s:
        yield s


@pytest.fixture(scope="module")
def tiny_ref():
    return ReferenceLLM("tiny")


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_completions_streamed_equals_non_streamed_equals_reference(tiny_server, tiny_ref):
    c = client(tiny_server)
    args = dict(model="tiny", prompt=[[17, 99, 5, 301]], max_tokens=20, temperature=0)
    full = c.completions.create(**args)
    pieces = [chunk.choices[0].text for chunk in c.completions.create(**args, stream=True)]
    expected = tiny_ref.generate([[17, 99, 5, 301]], SamplingParams(temperature=0, max_tokens=20))[0]
    assert full.choices[0].text == "".join(pieces) == expected.text
    assert full.usage.completion_tokens == len(expected.token_ids) and full.usage.prompt_tokens == 4
    assert full.choices[0].finish_reason == expected.finish_reason


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("sampling, ending", [
    ({"temperature": 0, "max_tokens": 20, "ignore_eos": True}, "length"),
    ({"temperature": 1.0, "seed": 1146, "max_tokens": 40}, "stop"),  # ends with EOS at token 6 (found by search)
])
def test_stop_strings_that_never_match_lose_no_text(tiny_server, tiny_ref, sampling, ending, stream):
    """A request with stop strings that ends by length or EOS returns all its text: the tail held back while it
    ran (it might have grown into a stop string) is flushed at the end."""
    prompt = [40, 41, 42]
    expected = tiny_ref.generate([prompt], SamplingParams(**sampling))[0]
    assert expected.finish_reason == ending and len(expected.text) >= 4
    body = {"model": "tiny", "prompt": [prompt], "stop": ["qzqz", "#x"], "stream": stream, **sampling}
    with httpx.Client(timeout=30) as http:
        if stream:
            events = [json.loads(line[6:]) for line in http.post(tiny_server.url + "/v1/completions", json=body)
                      .text.splitlines() if line.startswith("data: {")]
            text = "".join(e["choices"][0]["text"] for e in events)
            finish = events[-1]["choices"][0]["finish_reason"]
        else:
            choice = http.post(tiny_server.url + "/v1/completions", json=body).json()["choices"][0]
            text, finish = choice["text"], choice["finish_reason"]
    assert (text, finish) == (expected.text, ending)


@pytest.mark.real_model
def test_chat_on_the_real_model():
    # float32: in bfloat16 the first token's two best logits ("The", "L") round to the same value on some CPUs'
    # kernels (25.5 and 25.5; float32 gives 25.33 and 25.24), and the tie goes to "L'Étoile", so no "Paris"
    with Server(streaming.LLM(DEFAULT_MODEL, max_num_seqs=2, dtype="float32"), DEFAULT_MODEL) as s:
        c = client(s)
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        full = c.chat.completions.create(model=DEFAULT_MODEL, messages=messages, max_tokens=24, temperature=0)
        stream = c.chat.completions.create(model=DEFAULT_MODEL, messages=messages, max_tokens=24, temperature=0,
                                           stream=True, stream_options={"include_usage": True})
        chunks = list(stream)
        ref = ReferenceLLM(DEFAULT_MODEL, dtype="float32")
        prompt = ref.tokenizer.apply_chat_template(messages)
        expected = ref.generate([prompt], SamplingParams(temperature=0, max_tokens=24))[0]
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks[:-1]) == full.choices[0].message.content \
            == expected.text
        assert "Paris" in expected.text
        # OpenAI's include_usage: one more chunk, its choices empty, carries the request's usage
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(expected.token_ids)


def test_32_concurrent_streaming_clients(tiny_server, tiny_ref):
    prompts = [[20 + i, 30 + i, 40 + i] for i in range(32)]
    params = [SamplingParams(temperature=0.7, seed=i, max_tokens=8 + i % 9) for i in range(32)]
    expected = [o.text for o in tiny_ref.generate(prompts, params)]

    async def one(c, i):
        stream = await c.completions.create(model="tiny", prompt=[prompts[i]], max_tokens=params[i].max_tokens,
                                            temperature=0.7, seed=i, stream=True)
        return "".join([chunk.choices[0].text async for chunk in stream])

    async def main():
        c = openai.AsyncOpenAI(base_url=tiny_server.url + "/v1", api_key="unused", max_retries=0)
        return await asyncio.gather(*(one(c, i) for i in range(32)))

    assert asyncio.run(main()) == expected
    assert wait_until(lambda: tiny_server.llm.engine.scheduler.block_manager.num_used_blocks == 0)


def test_the_load_runs_reader_counts_what_the_server_streams(tiny_ref):
    """`load`'s bare HTTP/1.1 reader (chunked transfer, SSE events) takes each request's token counts from the
    server's usage (the reference's tokens), times its chunks, sends the API key, and says why a refused request
    failed: a refused warm-up stops the run."""
    load = importlib.import_module("stages.bench.load.client")
    settings = load.LoadSettings("tiny", num_requests=6, max_tokens=12, max_concurrency=3, api_key="s3cret")
    questions = settings.prompts()
    want = tiny_ref.generate([tiny_ref.tokenizer.apply_chat_template([{"role": "user", "content": q}])
                              for q in questions], SamplingParams(temperature=0, max_tokens=12))
    with Server(streaming.LLM("tiny", max_num_seqs=4), "tiny", api_key="s3cret") as s:
        results, wall = asyncio.run(load.run_clients(s.url, settings))
        with pytest.raises(RuntimeError, match="warm-up request failed.*401"):
            asyncio.run(load.run_clients(s.url, load.LoadSettings("tiny", num_requests=1, max_tokens=4)))
    assert sorted(r["request"] for r in results) == list(range(6))
    for r in results:
        assert r["success"] and r["output_tokens"] == len(want[r["request"]].token_ids)
        assert 0 < r["chunk_times"][0] - r["start"] <= r["chunk_times"][-1] - r["start"] <= wall
    with pytest.raises(ValueError, match="http://"):
        asyncio.run(load.run_clients("https://127.0.0.1:1", settings))


def test_client_disconnect_aborts_the_request(tiny_server):
    """The abort itself is checked (its finish reason, counted), not only blocks freed: a request that simply ran
    to its end would free them too."""
    llm = tiny_server.llm
    finished, tokens = dict(llm.metrics.finished), llm.metrics.output_tokens
    body = {"model": "tiny", "prompt": [[8, 9, 10] * 10], "max_tokens": 500, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", tiny_server.url + "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            for line in lines:
                if line.startswith("data: {"):  # the first token exists: the request is running
                    break
            assert llm.engine.scheduler.block_manager.num_used_blocks > 0
    # the connection is closed: the request must be aborted at the next step
    assert wait_until(lambda: sum(llm.metrics.finished.values()) > sum(finished.values()))
    assert llm.metrics.finished.get("abort", 0) == finished.get("abort", 0) + 1
    assert llm.metrics.finished.get("length", 0) == finished.get("length", 0)
    assert llm.metrics.output_tokens - tokens < 500  # it stopped early
    bm = llm.engine.scheduler.block_manager
    assert wait_until(lambda: bm.num_used_blocks == 0 and not llm.engine.scheduler.running)
    with httpx.Client(timeout=30) as http:
        values = metric_values(http.get(tiny_server.url + "/metrics").text)
    assert values['stepwise_requests_finished_total{finish_reason="abort"}'] == finished.get("abort", 0) + 1


def metric_values(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value}."""
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line[:1] not in "#"}


# Every OpenAI field the server accepts, the value a client sends, and what SamplingParams must then hold.
FIELDS = [
    ("max_tokens", 5, {"max_tokens": 5}),
    ("temperature", 0.55, {"temperature": 0.55}),
    ("top_p", 0.8, {"top_p": 0.8}),
    ("top_k", 13, {"top_k": 13}),
    ("seed", 1234, {"seed": 1234}),
    ("stop", "zq", {"stop": ["zq"]}),
    ("stop", ["zq", "jx"], {"stop": ["zq", "jx"]}),
    ("stop_token_ids", [5, 6], {"stop_token_ids": [5, 6]}),
    ("ignore_eos", True, {"ignore_eos": True}),
]


@pytest.mark.parametrize("endpoint, field, value, expected",
                         [("completions", *f) for f in FIELDS] + [("chat/completions", *f) for f in FIELDS]
                         + [("chat/completions", "max_completion_tokens", 4, {"max_tokens": 4})], ids=str)
def test_every_accepted_field_reaches_sampling_params(tiny_server, monkeypatch, endpoint, field, value, expected):
    llm, received = tiny_server.llm, []
    add_request = llm.add_request  # the server's single entry point into the engine

    def spy(prompt, params=None, **kw):
        received.append(params)
        return add_request(prompt, params, **kw)

    monkeypatch.setattr(llm, "add_request", spy)
    body = {"model": "tiny", "max_tokens": 3, field: value}
    body.update({"prompt": [[5, 6, 7]]} if endpoint == "completions" else {"messages": [{"role": "user",
                                                                                       "content": "hi"}]})
    with httpx.Client(timeout=30) as http:
        r = http.post(f"{tiny_server.url}/v1/{endpoint}", json=body)
    assert r.status_code == 200, r.text
    base = {"max_tokens": 3 if field not in ("max_tokens", "max_completion_tokens") else value}
    assert received == [SamplingParams(**{**base, **expected})]


BAD = [
    (b"{not json", 400, None), (b"[1, 2]", 400, None),
    (json.dumps({"model": "gpt-4", "prompt": "hi"}).encode(), 404, "model"),
    (json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": -3}).encode(), 400, "max_tokens"),
    (json.dumps({"model": "tiny", "prompt": "hi", "temperature": -1}).encode(), 400, "temperature"),
    (json.dumps({"model": "tiny", "prompt": "hi", "top_p": 7}).encode(), 400, "top_p"),
    (json.dumps({"model": "tiny", "prompt": [5] * 5000}).encode(), 400, "prompt"),
    (json.dumps({"model": "tiny", "prompt": 12}).encode(), 400, "prompt"),
    (json.dumps({"model": "tiny", "prompt": "hi", "n": 0}).encode(), 400, "n"),
]


def test_malformed_requests_get_openai_errors_and_do_not_disturb_a_stream(tiny_server, tiny_ref):
    expected = tiny_ref.generate([[8, 9, 10]], SamplingParams(temperature=0, max_tokens=60, ignore_eos=True))[0].text
    result = {}

    def good_stream():
        stream = client(tiny_server).completions.create(model="tiny", prompt=[[8, 9, 10]], max_tokens=60,
                                                        temperature=0, stream=True, extra_body={"ignore_eos": True})
        result["text"] = "".join(ch.choices[0].text for ch in stream)

    t = threading.Thread(target=good_stream)
    t.start()
    with httpx.Client(timeout=30) as http:
        for _ in range(3):  # a burst, while the good stream runs
            for body, status, param in BAD:
                r = http.post(tiny_server.url + "/v1/completions", content=body,
                              headers={"Content-Type": "application/json"})
                assert r.status_code == status, (body, r.text)
                err = r.json()["error"]
                assert err["message"] and err["type"]
                if param:
                    assert err["param"] == param, (body, err)
        r = http.post(tiny_server.url + "/v1/chat/completions", json={"model": "tiny", "messages": "hello"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    t.join(60)
    assert result["text"] == expected
    with pytest.raises(openai.BadRequestError):
        client(tiny_server).completions.create(model="tiny", prompt="hi", max_tokens=-1)


def test_models_health_and_metrics(tiny_server):
    with httpx.Client(timeout=30) as http:
        assert http.get(tiny_server.url + "/health").json() == {"status": "ok"}
        assert [m["id"] for m in http.get(tiny_server.url + "/v1/models").json()["data"]] == ["tiny"]
        http.post(tiny_server.url + "/v1/completions", json={"model": "tiny", "prompt": [[3, 4]], "max_tokens": 5})
        text = http.get(tiny_server.url + "/metrics").text
    values = metric_values(text)
    llm = tiny_server.llm
    pool = llm.engine.scheduler.block_manager.num_blocks
    assert values["stepwise_kv_blocks_used"] + values["stepwise_kv_blocks_free"] == pool
    count = values["stepwise_time_to_first_token_seconds_count"]
    assert count >= 1 and values['stepwise_time_to_first_token_seconds_bucket{le="+Inf"}'] == count
    assert "# TYPE stepwise_inter_token_latency_seconds histogram" in text


def test_gauges_add_up_to_the_pool_and_the_requests_in_flight(tiny_ref):
    """Three requests, two slots: the engine is held after a step with two running and one waiting, and every
    gauge is checked against what that state must give (block counts from the token counts)."""
    llm = streaming.LLM("tiny", max_num_seqs=2, block_size=16)
    held, release, run_step = threading.Event(), threading.Event(), llm.loop.run_step

    def step_then_hold():  # after the step is published: the gauges describe this state
        batch = run_step()
        s = llm.engine.scheduler
        if not held.is_set() and len(s.running) == 2 and len(s.waiting) == 1 and all(q.output_token_ids
                                                                                    for q in s.running):
            held.set()
            release.wait(60)
        return batch

    llm.loop.run_step = step_then_hold
    prompts = [list(range(start, start + n)) for start, n in ((100, 20), (300, 35), (500, 50))]  # nothing shared
    # Long enough that the third request arrives while the first two still run, however slowly clients start.
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=120, ignore_eos=True)
    texts = [None] * 3

    def one(i):
        texts[i] = "".join(ch.choices[0].text for ch in client(s).completions.create(
            model="tiny", prompt=[prompts[i]], max_tokens=120, temperature=0.8, seed=3, stream=True,
            extra_body={"ignore_eos": True}))

    with Server(llm, "tiny") as s, httpx.Client(timeout=30) as http:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        try:
            assert held.wait(60)
            values = metric_values(http.get(s.url + "/metrics").text)
            running = list(llm.engine.scheduler.running)
            # A running sequence holds blocks for every token but the last sampled one (not yet fed).
            used = sum(-(-(len(q) - 1) // 16) for q in running)
        finally:
            release.set()
        for t in threads:
            t.join(60)
        pool = llm.engine.scheduler.block_manager.num_blocks
        assert (values["stepwise_requests_running"], values["stepwise_requests_waiting"]) == (2, 1)
        assert values["stepwise_kv_blocks_used"] == used > 0
        assert values["stepwise_kv_blocks_free"] == pool - used
        assert values["stepwise_kv_cache_usage_ratio"] == pytest.approx(used / pool)
        assert values["stepwise_prefix_cache_hit_rate"] == 0 and values["stepwise_preemptions"] == 0
        assert not any(k.startswith("stepwise_requests_finished_total") for k in values)
        assert texts == [o.text for o in tiny_ref.generate(prompts, params)]
        assert wait_until(lambda: llm.engine.scheduler.block_manager.num_used_blocks == 0)
        after = metric_values(http.get(s.url + "/metrics").text)
    assert (after["stepwise_requests_running"], after["stepwise_requests_waiting"]) == (0, 0)
    assert (after["stepwise_kv_blocks_used"], after["stepwise_kv_blocks_free"]) == (0, pool)
    assert after['stepwise_requests_finished_total{finish_reason="length"}'] == 3
    assert after["stepwise_output_tokens_total"] == 3 * 120
    assert after["stepwise_time_to_first_token_seconds_count"] == 3
    assert after["stepwise_inter_token_latency_seconds_count"] == 3 * 119


def test_full_queue_gets_503():
    llm = streaming.LLM("tiny", max_num_seqs=1, max_waiting=2)
    with Server(llm, "tiny") as s:
        body = {"model": "tiny", "prompt": [[5, 6]], "max_tokens": 200, "ignore_eos": True, "temperature": 0}

        async def burst():
            async with httpx.AsyncClient(timeout=60) as http:
                return await asyncio.gather(*(http.post(s.url + "/v1/completions", json=body) for _ in range(8)))

        codes = [r.status_code for r in asyncio.run(burst())]
        assert codes.count(200) >= 1 and codes.count(503) >= 1 and set(codes) <= {200, 503}
        r503 = next(r for r in asyncio.run(burst()) if r.status_code == 503)
        assert "waiting" in r503.json()["error"]["message"]
