"""Issue 56, finding 1: a constraint that no output satisfies is a 400 before any token, streamed or not, and a
request whose constraint dies partway (its other rules ban every token the grammar allows) ends as the client's
error (invalid_request_error), never a 500. The oracle for the automaton's pruning is Python's `re` over a small
alphabet: a byte may follow a prefix exactly when some string that starts with prefix + byte matches."""
import importlib
import itertools
import re

import httpx
import pytest

from workloads import Server

openai = pytest.importorskip("openai")
pytest.importorskip("xgrammar")
structured = importlib.import_module("stages.07_structured")
fsm = importlib.import_module("stages.structured.fsm")
regex = importlib.import_module("stages.structured.regex")

MSG = [{"role": "user", "content": "Say something."}]
NEVER = [r"[^\s\S]", r"a{0}[^\s\S]b", r"(a|b)[^\s\S]", r"x(y[^\s\S])+"]


@pytest.fixture(scope="module")
def server():
    with Server(structured.LLM("tiny", max_num_seqs=4, max_waiting=16), "tiny") as s:
        yield s


def client(s):
    return openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.mark.parametrize("pattern, alive", [(r"ab|a[^\s\S]c|b+", {"": "ab", "a": "b", "b": "b", "ab": ""}),
                                            (r"(x[^\s\S])*y", {"": "y", "y": ""})])
def test_the_automaton_drops_dead_ends(pattern, alive):
    """After each prefix, the bytes the DFA lets live are those Python's re says some matching string continues
    with (brute force over strings of up to 4 characters from the pattern's alphabet)."""
    dfa = fsm.DFA(fsm.NFA(regex.parse(pattern)))
    strings = ["".join(p) for n in range(5) for p in itertools.product("abcxy", repeat=n)]
    matching = [s for s in strings if re.fullmatch(pattern, s)]
    for prefix, want in alive.items():
        state = dfa.walk(dfa.start, prefix.encode()) if prefix else dfa.start
        live = {chr(b) for b, nxt in enumerate(dfa.row(state)) if nxt >= 0}
        oracle = {s[len(prefix)] for s in matching if s.startswith(prefix) and len(s) > len(prefix)}
        assert live == oracle == set(want), (prefix, live, oracle)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("pattern", NEVER)
def test_a_regex_no_string_matches_is_a_400_before_any_token(server, pattern, stream):
    c = client(server)
    with pytest.raises(openai.BadRequestError) as caught:
        out = c.chat.completions.create(model="tiny", messages=MSG, max_tokens=8, stream=stream,
                                        extra_body={"structured_outputs": {"regex": pattern}})
        list(out) if stream else out
    err = caught.value.body
    assert err["param"] == "structured_outputs" and "admits no output" in err["message"], err
    assert err["type"] == "invalid_request_error"
    ok = c.chat.completions.create(model="tiny", messages=MSG, max_tokens=8,
                                   extra_body={"structured_outputs": {"regex": "(ab)+"}})
    assert re.fullmatch("(ab)+", ok.choices[0].message.content) or ok.choices[0].finish_reason == "length"
    bm = server.llm.engine.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_a_schema_xgrammar_lets_die_inside_a_string_is_a_400_not_a_500(server):
    """xgrammar does not prune: this schema's grammar lets the output begin ({"a":") and dies at the string's first
    character. The request ends there as the client's error."""
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": r"[^\s\S]"}}, "required": ["a"]}
    with httpx.Client(timeout=60) as http:
        r = http.post(server.url + "/v1/chat/completions", json={
            "model": "tiny", "messages": MSG, "max_tokens": 32,
            "structured_outputs": {"json": schema, "disable_any_whitespace": True}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error" and "structured_outputs" in r.text, r.text


@pytest.mark.parametrize("stream", [False, True])
def test_a_constraint_that_dies_partway_is_the_clients_error_not_a_500(server, stream):
    """The regex needs "b" after "a", but allowed_token_ids holds only "a"'s token: the first token is allowed (the
    check up front passes), the second position has none. Not streamed: a 400; streamed: an error event of type
    invalid_request_error after the tokens already sent, then [DONE]."""
    tok = server.llm.tokenizer
    a = tok.encode("a")
    assert len(a) == 1
    c = client(server)
    args = dict(model="tiny", messages=MSG, max_tokens=8, extra_body={"structured_outputs": {"regex": "ab"},
                                                                       "allowed_token_ids": a})
    with pytest.raises(openai.APIError) as caught:
        out = c.chat.completions.create(**args, stream=stream)
        list(out) if stream else out
    err = caught.value.body
    assert err["type"] == "invalid_request_error" and "no token is allowed at output token 1" in err["message"], err
    if not stream:
        assert caught.value.status_code == 400
    bm = server.llm.engine.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks
