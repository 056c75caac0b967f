"""The OpenAI-compatible server on loopback: the official `openai` client and plain HTTP."""
import asyncio
import importlib
import json
import threading
import time

import httpx
import pytest

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


def test_chat_on_the_real_model():
    with Server(streaming.LLM("smollm2-135m", max_num_seqs=2), "smollm2-135m") as s:
        c = client(s)
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        full = c.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=24, temperature=0)
        stream = c.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=24, temperature=0,
                                           stream=True, stream_options={"include_usage": True})
        chunks = list(stream)
        ref = ReferenceLLM("smollm2-135m")
        prompt = ref.tokenizer.apply_chat_template(messages)
        expected = ref.generate([prompt], SamplingParams(temperature=0, max_tokens=24))[0]
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == full.choices[0].message.content \
            == expected.text
        assert "Paris" in expected.text
        assert chunks[-1].usage.completion_tokens == len(expected.token_ids)


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
    assert wait_until(lambda: tiny_server.llm.block_manager.num_used_blocks == 0)


def test_client_disconnect_frees_blocks(tiny_server):
    body = {"model": "tiny", "prompt": [[8, 9, 10] * 10], "max_tokens": 500, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", tiny_server.url + "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            for line in lines:
                if line.startswith("data: {"):  # the first token exists: the request is running
                    break
            assert tiny_server.llm.block_manager.num_used_blocks > 0
    # the connection is closed: the request must be aborted at the next step
    assert wait_until(lambda: tiny_server.llm.block_manager.num_used_blocks == 0
                      and not tiny_server.llm.scheduler.running)


BAD = [
    (b"{not json", 400, None), (b"[1, 2]", 400, None),
    (json.dumps({"model": "gpt-4", "prompt": "hi"}).encode(), 404, "model"),
    (json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": -3}).encode(), 400, "max_tokens"),
    (json.dumps({"model": "tiny", "prompt": "hi", "temperature": -1}).encode(), 400, "temperature"),
    (json.dumps({"model": "tiny", "prompt": "hi", "top_p": 7}).encode(), 400, "top_p"),
    (json.dumps({"model": "tiny", "prompt": [5] * 5000}).encode(), 400, "prompt"),
    (json.dumps({"model": "tiny", "prompt": 12}).encode(), 400, "prompt"),
    (json.dumps({"model": "tiny", "prompt": "hi", "n": 3}).encode(), 400, "n"),
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
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line and line[0] != "#"}
    llm = tiny_server.llm
    assert values["stepwise_kv_blocks_used"] + values["stepwise_kv_blocks_free"] == llm.block_manager.num_blocks
    for name in ["stepwise_requests_waiting", "stepwise_requests_running", "stepwise_prefix_cache_hit_rate"]:
        assert name in values
    count = values["stepwise_time_to_first_token_seconds_count"]
    assert count >= 1 and values['stepwise_time_to_first_token_seconds_bucket{le="+Inf"}'] == count
    assert "# TYPE stepwise_inter_token_latency_seconds histogram" in text


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
