"""Issue 59: a slow compile never stalls the engine, and one past its budget fails its request alone.

A compile is made slow on purpose (the backend's build waits on an event the test holds), so nothing here depends
on timing: while request A's grammar is still compiling, request B runs to its end on the engine, and its tokens are
the one-request-at-a-time reference's (the oracle); A, past its budget, fails with the reason and B is untouched;
once A's compile ends, the same constraint is served from the grammar cache without compiling again."""
import importlib
import threading

import pytest

from common import ReferenceLLM, SamplingParams
from common.validate import InvalidParam

pytest.importorskip("llguidance")
structured = importlib.import_module("stages.07_structured")
backends = importlib.import_module("stages.structured.backends")
suite = importlib.import_module("stages.structured.suite")

EOS = (2,)
SLOW = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"],
        "additionalProperties": False}
OTHER = SamplingParams(temperature=0, max_tokens=12, structured_outputs={"regex": r"[a-z]{3,8}"})


@pytest.fixture(scope="module")
def reference():
    """The one-request-at-a-time reference with stage 07's constraints applied (its own grammar cache)."""
    return type("StructuredReference", (structured.StructuredOutputs, ReferenceLLM), {})("tiny", dtype="bfloat16")


def held_llm(monkeypatch, budget_s: float, cache_mb: float):
    """A tiny LLM whose compiles of SLOW wait until the returned event is set (their count in ``calls``). Its own
    cache bound gives it a `Grammars` of its own, so no other test shares the held build."""
    llm = structured.LLM("tiny", dtype="bfloat16", max_num_seqs=4, grammar_cache_mb=cache_mb,
                         grammar_compile_budget_s=budget_s)
    grammars = backends.grammars_for(str(llm.folder), llm.config.vocab_size, EOS,
                                     llm.engine_config.structured_outputs.grammar_cache_bytes)
    release, calls, build = threading.Event(), [], grammars.build

    def slow_build(so, backend="auto"):
        if so.kind == "json" and so.schema == SLOW:
            calls.append(so)
            assert release.wait(60), "the test never released the compile"
        return build(so, backend)

    monkeypatch.setattr(grammars, "build", slow_build)
    return llm, grammars, release, calls


def test_a_request_whose_grammar_is_compiling_does_not_delay_the_others(monkeypatch, reference):
    llm, _, release, calls = held_llm(monkeypatch, budget_s=60, cache_mb=7)
    slow = SamplingParams(temperature=0, max_tokens=16, structured_outputs={"json": SLOW})
    streams = []
    preparing = threading.Thread(target=lambda: streams.append(llm.add_request([5, 6], slow)))
    preparing.start()  # as the server does: on a worker thread, which waits for the compile
    try:
        while not calls:
            assert preparing.is_alive()
            threading.Event().wait(0.01)
        got = llm.generate([[7, 8]], OTHER)[0]
        assert preparing.is_alive() and not streams  # B ran to its end while A's grammar was still compiling
        assert got.token_ids == reference.generate([[7, 8]], OTHER)[0].outputs[0].token_ids
    finally:
        release.set()
        preparing.join(60)
    chunks = list(llm.read(streams[0]))
    assert chunks[-1].finish_reason in ("stop", "length")
    assert [t for c in chunks for t in c.token_ids] == reference.generate([[5, 6]], slow)[0].outputs[0].token_ids


def test_a_compile_past_its_budget_fails_its_request_alone_and_is_then_served_from_the_cache(monkeypatch,
                                                                                             reference):
    llm, grammars, release, calls = held_llm(monkeypatch, budget_s=0.2, cache_mb=9)
    slow = SamplingParams(temperature=0, max_tokens=16, structured_outputs={"json": SLOW})
    refused, other = llm.generate([[5, 6], [7, 8]], [slow, OTHER])
    assert refused.finish_reason == "error" and "too complex to compile in 0.2 s" in refused.error
    assert other.token_ids == reference.generate([[7, 8]], OTHER)[0].outputs[0].token_ids
    release.set()  # the abandoned compile ends and its grammar enters the cache
    for _ in range(600):
        if not grammars.budget.pending:
            break
        threading.Event().wait(0.01)
    served = llm.generate([[5, 6]], slow)[0]
    assert served.finish_reason in ("stop", "length") and len(calls) == 1  # compiled once, served from the cache
    assert served.token_ids == reference.generate([[5, 6]], slow)[0].outputs[0].token_ids
    if served.finish_reason == "stop":
        assert suite.check(served.text, {"json": SLOW}) is None


@pytest.mark.parametrize("budget", [0, -1, True, "2", 10_000])
def test_a_compile_budget_that_does_not_read_is_refused_naming_it(budget):
    with pytest.raises(InvalidParam, match="grammar_compile_budget_s"):
        structured.LLM("tiny", grammar_compile_budget_s=budget)


def test_through_the_server_a_compile_past_its_budget_is_a_400_and_a_request_beside_it_is_served(monkeypatch,
                                                                                               reference):
    import httpx
    from workloads import Server
    llm, _, release, _ = held_llm(monkeypatch, budget_s=0.2, cache_mb=11)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "JSON"}], "max_tokens": 12, "temperature": 0}
    try:
        with Server(llm, "tiny") as s, httpx.Client(timeout=60) as http:
            r = http.post(s.url + "/v1/chat/completions", json={**body, "structured_outputs": {"json": SLOW}})
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["param"] == "structured_outputs" and "too complex to compile in 0.2 s" in err["message"]
            ok = http.post(s.url + "/v1/chat/completions", json={**body, "structured_outputs": {"regex": "[a-z]{3,8}"}})
            assert ok.status_code == 200, ok.text
            prompt = llm.tokenizer.encode_chat(body["messages"])
            assert ok.json()["choices"][0]["message"]["content"] == reference.generate(
                [prompt], SamplingParams(temperature=0, max_tokens=12, structured_outputs={"regex": "[a-z]{3,8}"}))[
                0].outputs[0].text
    finally:
        release.set()


def test_compiles_left_running_past_their_budget_are_bounded_and_a_new_one_meanwhile_is_a_retry_later():
    """With ``max_overtime`` compiles running on past their budget, a constraint not yet compiling is turned away
    (QueueFull: a 503 through the server) instead of starting another compile nobody waits for; one already
    compiling is still waited for; once they end, a new one compiles again."""
    from stages.streaming import QueueFull
    budget = importlib.import_module("stages.structured.schema.compile_budget").CompileBudget(max_overtime=1)
    release = threading.Event()

    def held():
        release.wait(30)
        return "grammar"

    with pytest.raises(InvalidParam, match="too complex to compile in 0.05 s"):
        budget.run("a", held, 0.05, "json")
    with pytest.raises(QueueFull, match="still compiling past their budget"):
        budget.run("b", lambda: "other", 1.0, "json")
    with pytest.raises(InvalidParam, match="too complex"):  # the same constraint waits on its own compile
        budget.run("a", held, 0.05, "json")
    release.set()
    for _ in range(600):
        if not budget.running_over:
            break
        threading.Event().wait(0.01)
    assert budget.run("b", lambda: "other", 1.0, "json") == "other" and budget.overtime == 2
