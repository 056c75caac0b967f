"""Issue 56, finding 3: the compiled-grammar cache is bounded in bytes, least recently used out first, and its size
is in /metrics. xgrammar is the backend here (its grammars report their size). The oracle for a grammar's bytes
is xgrammar's own ``memory_size_bytes`` (times the documented factor); for the order, the requests' own order of use."""
import importlib
import re

import httpx
import pytest

from common.sampling import StructuredOutputsParams
from workloads import Server

openai = pytest.importorskip("openai")
pytest.importorskip("xgrammar")
structured = importlib.import_module("stages.07_structured")
backends = importlib.import_module("stages.structured.backends")
cache_module = importlib.import_module("stages.structured.grammar_cache")


def schema(i: int) -> dict:
    return {"type": "object", "properties": {f"k{i}_{j}": {"enum": [f"v{i}_{j}_{x}" for x in range(6)]}
                                             for j in range(12)}, "required": [f"k{i}_0"]}


def test_the_cache_keeps_the_most_recently_used_grammars_within_its_bytes(tiny_folder):
    probe = backends.Grammars(str(tiny_folder), 1024, (2,), cache_bytes=2**40)
    one = int(cache_module.XGRAMMAR_FACTOR * probe.compile(StructuredOutputsParams(json=schema(0)), "xgrammar").compiled
              .memory_size_bytes)
    bound = int(3.5 * one)  # three grammars of this size fit, four do not
    g = backends.Grammars(str(tiny_folder), 1024, (2,), cache_bytes=bound)
    for i in range(3):
        g.compile(StructuredOutputsParams(json=schema(i)), "xgrammar")
    g.compile(StructuredOutputsParams(json=schema(0)), "xgrammar")  # used again: now the most recent
    for i in range(3, 6):
        g.compile(StructuredOutputsParams(json=schema(i)), "xgrammar")
        kept = [k[1] for k in g.cache.entries]
        held = sum(int(cache_module.XGRAMMAR_FACTOR * x.compiled.memory_size_bytes) for x in g.cache.entries.values())
        assert g.cache.nbytes() == held <= bound and len(kept) == 3
    assert [re.search(r'"k(\d+)_0"', k).group(1) for k in kept] == ["3", "4", "5"]
    assert g.cache.evictions == 3 and g.cache.hits == 1


def metric(text: str, name: str) -> float:
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


def test_more_distinct_schemas_than_fit_keep_the_servers_cache_under_its_bound(tiny_folder):
    """Through the openai client: ten distinct schemas into a cache that holds about three; /metrics reports the
    bytes, which stay under the bound, and the evictions; every answer is still constrained."""
    probe = backends.Grammars(str(tiny_folder), 1024, (2,), cache_bytes=2**40)
    one = int(cache_module.XGRAMMAR_FACTOR * probe.compile(StructuredOutputsParams(json=schema(0)), "xgrammar").compiled
              .memory_size_bytes)
    mb = 3.5 * one / 2**20
    llm = structured.LLM("tiny", max_num_seqs=4, grammar_cache_mb=mb,
                         structured_outputs_config={"backend": "xgrammar"})
    with Server(llm, "tiny") as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        for i in range(10):
            out = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "JSON"}], max_tokens=24,
                                            response_format={"type": "json_schema", "json_schema": {
                                                "name": f"s{i}", "schema": schema(i)}})
            assert out.choices[0].message.content.startswith("{")
            text = httpx.get(s.url + "/metrics").text
            assert metric(text, "stepwise_grammar_cache_bytes") <= metric(text, "stepwise_grammar_cache_max_bytes")
        assert metric(text, "stepwise_grammar_cache_max_bytes") == int(mb * 2**20)
        assert metric(text, "stepwise_grammar_cache_entries") == 3
        assert metric(text, "stepwise_grammar_cache_evictions") == 7


def test_xgrammars_own_cache_is_off(tiny_folder):
    g = backends.Grammars(str(tiny_folder), 1024, (2,))
    g.compile(StructuredOutputsParams(json=schema(1)))
    assert g.compiler.get_cache_size_bytes() == 0
