"""Predicted outputs through the real `openai` client, against stage 06's engine behind stage 05's server: the
answer is the reference's, and usage.completion_tokens_details' accepted and rejected prediction tokens add up to
the tokens the engine drafted from the prediction (`BySource`: each step's drafts by who made them), streamed or
not. A prediction that is not text is a 400 naming
the field."""
import importlib

import httpx
import pytest

from common import ReferenceLLM, SamplingParams
from test_stage_06_speculative import BySource
from workloads import Server

openai = pytest.importorskip("openai")
spec = importlib.import_module("stages.06_speculative")

PROMPT = [{"role": "user", "content": "Copy this: the quick brown fox jumps over the lazy dog."}]


@pytest.fixture(scope="module")
def reference():
    return ReferenceLLM("tiny", dtype="bfloat16")


@pytest.fixture(scope="module")
def server():
    llm = spec.LLM("tiny", dtype="bfloat16", max_num_seqs=4, speculative_config={
        "method": "ngram", "num_speculative_tokens": 5, "enable_adaptive_verification": False})  # every draft fed
    with Server(llm, "tiny") as s:
        yield s


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def expected(reference):
    ids = reference.tokenizer.encode_chat(PROMPT)
    free = reference.generate([ids], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0]
    return ids, free


@pytest.mark.parametrize("stream", [False, True])
def test_predicted_outputs_keep_the_tokens_and_count_what_was_drafted(server, expected, stream, monkeypatch):
    ids, free = expected
    prediction = free.text[:len(free.text) // 2] + " something else entirely " + free.text[len(free.text) // 2:]
    llm, source = server.llm, server.llm.add_observer(BySource(monkeypatch))
    args = dict(model="tiny", messages=PROMPT, max_tokens=40, temperature=0, extra_body={"ignore_eos": True},
                prediction={"type": "content", "content": prediction})
    if stream:
        chunks = list(client(server).chat.completions.create(**args, stream=True,
                                                             stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        usage = chunks[-1].usage
    else:
        answer = client(server).chat.completions.create(**args)
        text, usage = answer.choices[0].message.content, answer.usage
    assert text == free.text and usage.completion_tokens == len(free.token_ids)
    details, (drafted, kept) = usage.completion_tokens_details, source.counts[True]
    llm.remove_observer(source)
    assert details.accepted_prediction_tokens == kept > 0
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens == drafted
    assert details.rejected_prediction_tokens > 0  # the inserted words were drafted and rejected
    assert llm.engine.scheduler.block_manager.num_free_blocks == llm.engine.scheduler.block_manager.num_blocks


def test_without_a_prediction_no_details_are_invented(server, expected):
    answer = client(server).chat.completions.create(model="tiny", messages=PROMPT, max_tokens=8, temperature=0)
    assert answer.usage.completion_tokens_details is None


@pytest.mark.parametrize("prediction, param", [
    ({"type": "content", "content": 7}, "prediction.content"),
    ({"type": "content", "content": [{"type": "image_url", "image_url": "x"}]}, "prediction.content"),
    ({"type": "image", "content": "x"}, "prediction.type"),
    ("just text", "prediction"),
])
def test_a_prediction_that_is_not_text_is_a_400_naming_the_field(server, prediction, param):
    body = {"model": "tiny", "messages": PROMPT, "max_tokens": 4, "prediction": prediction}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_completions_take_no_prediction(server):
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 4, "prediction": {"type": "content", "content": "x"}}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prediction", r.text
