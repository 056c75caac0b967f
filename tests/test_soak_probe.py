"""The probe (python -m stages.bench.soak probe) on the tiny model: every hostile case answered as a user expects
and the server healthy after each. The oracles are the cases' own: jsonschema for a served schema, a 400 naming
structured_outputs for what no output satisfies, the KV block count from /metrics and a canary request for
health. And the probe must be able to fail: a server that serves a lookahead pattern, or holds a block after a
disconnect, is reported."""
import importlib

import pytest

from workloads import Server

pytest.importorskip("xgrammar")
structured = importlib.import_module("stages.07_structured")
hostile = importlib.import_module("stages.bench.soak.hostile")
spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}


@pytest.fixture(scope="module")
def server():
    with Server(structured.LLM("tiny", max_num_seqs=8, speculative_config=spec), "tiny") as s:
        yield s


def test_every_case_is_answered_as_expected_and_the_server_stays_healthy(server):
    rows = hostile.probe(server.url, "tiny")
    assert len(rows) == len(hostile.cases(None, server.url, "tiny")) == 11
    bad = [r for r in rows if not (r[1] and r[3])]
    assert not bad, bad
    bm = server.llm.engine.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_a_refusal_that_is_not_a_400_is_reported():
    ok, why = hostile.refused(lambda: "served", "structured_outputs")
    assert not ok and "200" in why


def test_a_held_block_fails_the_health_check(server, monkeypatch):
    """A KV block held after a case (the metric says 1) must fail health, whatever the canary says."""
    real_get = hostile.httpx.Client.get

    def get(self, path, **kw):
        r = real_get(self, path, **kw)
        if path == "/metrics":
            text = r.text.replace("stepwise_kv_blocks_used 0", "stepwise_kv_blocks_used 1")
            return hostile.httpx.Response(200, text=text)
        return r

    monkeypatch.setattr(hostile.httpx.Client, "get", get)
    monkeypatch.setattr(hostile.time, "monotonic", iter(range(0, 10**6, 5)).__next__)  # 3 tries, no 20 s wait
    c = hostile.openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    ok, why = hostile.health(c, server.url, "tiny")
    assert not ok and "1 KV blocks held" in why, why
