"""Stage 07: a grammar decides which tokens may come next.

The oracles: xgrammar's masks for the hand-written backend, a brute-force walk of every token for the trie walk,
the one-request-at-a-time reference with the same constraint attached for every stage's tokens, and a fresh matcher
fed the kept tokens for the state after rejected drafts. Tiny model (its vocabulary is SmolLM2's first 1,024 tokens,
a real byte-level BPE, so JSON is spelled as in the real model); outputs of the random model are checked where
they finish, and tokens are checked everywhere.
"""
import importlib
import json
import random

import numpy as np
import pytest

from common import ReferenceLLM, SamplingParams
from common.sampling import StructuredOutputsParams
from common.validate import InvalidParam
from stages import paged_kv
from test_multi_token_steps import Checked, DraftingLLM, DraftingScheduler, answers
from test_parallel_sampling import TINY_BYTES_PER_TOKEN
from test_stage_06_adaptive import Curve, Jitter
from workloads import TINY_VOCAB

xgr = pytest.importorskip("xgrammar")
structured = importlib.import_module("stages.07_structured")
backends = importlib.import_module("stages.structured.backends")
fsm = importlib.import_module("stages.structured.fsm")
suite = importlib.import_module("stages.structured.suite")
kernels, streaming = importlib.import_module("stages.04_kernels"), importlib.import_module("stages.05_streaming")
structured_engine, cost_model = (importlib.import_module(f"stages.{m}") for m in ("structured.engine",
                                                                                   "speculative.cost_model"))

EOS = (2,)


def priced_llm(cost, monkeypatch, **options):
    """Stage 07's LLM whose policy (stage 06's AdaptiveDrafts, where the stage builds one) is constructed with the step
    cost ``cost``, as test_stage_06_adaptive's adaptive_llm does: rows free or dear whatever this machine measures."""
    real = importlib.import_module("stages.speculative").speculative_policy  # stage 06's, never a patched one
    monkeypatch.setattr(structured_engine, "speculative_policy",
                        lambda config, forced=False: real(config, forced) and cost_model.AdaptiveDrafts(cost))
    return structured.LLM("tiny", dtype="bfloat16", **options)
COMPACT = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                            "b": {"enum": ["red", "green"]}}, "required": ["a", "b"],
           "additionalProperties": False}
CONSTRAINTS = [{"choice": ["yes", "no", "maybe so"]}, {"regex": r"\d{2,3}-[a-z]{2,4}"},
               {"json": COMPACT, "disable_any_whitespace": True}, {"regex": r"(ab|c[^x]){1,3}"}]
PATTERNS = [{"choice": ["yes", "no", "maybe so", "Paris, France"]}, {"choice": ["héllo", "日本", "a"]},
            {"regex": r"\d{3}-[a-z]{2,4}"}, {"regex": r"[A-Z][a-z]+ [A-Z][a-z]+"}, {"regex": r"-?\d+(\.\d+)?"},
            {"regex": r'[^"]{0,10}'}, {"regex": r"a.b"}, {"regex": r"\w+@\w+\.com"}, {"regex": r"[α-ω]+"},
            {"regex": r"\s*x"}, {"regex": r"(ab|cd)*e?"}, {"regex": r"[^a-z]+"}, {"regex": r"\S\W\D"},
            {"regex": r"\u00e9+"}, {"regex": r"^(true|false)$"}]


@pytest.fixture(scope="module")
def grammars(tiny_folder):
    return backends.grammars_for(str(tiny_folder), TINY_VOCAB, EOS)


def bits(words: np.ndarray) -> np.ndarray:
    return np.unpackbits(words.view(np.uint8), bitorder="little")[:TINY_VOCAB]


@pytest.mark.parametrize("so", PATTERNS, ids=lambda so: repr(so)[:40])
def test_the_hand_written_masks_equal_xgrammars(grammars, so):
    """Random walks through each pattern: at every position both backends allow the same tokens. Tokens with the
    byte 0xED are not walked: xgrammar lets it lead into UTF-8 encodings of surrogates, which are not UTF-8."""
    params, rng = StructuredOutputsParams(**so), random.Random(0)
    for _ in range(15):
        mine, theirs = grammars.compile(params, "fsm").matcher(), grammars.compile(params, "xgrammar").matcher()
        assert grammars.compile(params, "fsm").backend == "fsm"
        for _ in range(12):
            a, b = bits(mine.fill()), bits(theirs.fill())
            assert np.array_equal(a, b), (so, np.flatnonzero(a != b)[:8])
            allowed = [t for t in np.flatnonzero(a) if not (grammars.vocab[t] and 0xED in grammars.vocab[t])]
            if not allowed:
                break
            token = int(rng.choice(allowed))
            assert mine.accept(token) and theirs.accept(token)
            if mine.is_terminated():
                assert theirs.is_terminated()
                break


@pytest.mark.parametrize("pattern", [r"\d{2}[a-c]+", r'"[^"]*"', r"(yes|no|nope)", r".{0,3}z"])
def test_the_trie_walk_is_the_brute_force_walk_of_every_token(grammars, pattern):
    """`allowed_tokens` (the lab's task) against its definition: a token is allowed when each of its bytes, read in
    turn from the state, keeps the automaton alive."""
    dfa = fsm.DFA(fsm.NFA(backends.parse(pattern)))
    states, seen = [dfa.start], set()
    while states and len(seen) < 12:
        s = states.pop()
        if s in seen:
            continue
        seen.add(s)
        brute = sorted(t for t, data in enumerate(grammars.vocab) if data and dfa.walk(s, data) >= 0)
        assert sorted(fsm.allowed_tokens(dfa, s, grammars.trie)) == brute
        states += [n for n in set(dfa.row(s)) if n >= 0]


def with_grammar(base):
    return type(f"Structured{base.__name__}", (structured.StructuredOutputs, base), {})


@pytest.fixture(scope="module")
def structured_reference():
    return with_grammar(ReferenceLLM)("tiny", dtype="bfloat16")


def requests():
    prompts = [[5, 6, 7], [9, 10], [300, 301, 302, 303], [44] * 9]
    params = [SamplingParams(temperature=0, max_tokens=24, structured_outputs=CONSTRAINTS[0]),
              SamplingParams(temperature=1.0, seed=3, max_tokens=24, structured_outputs=CONSTRAINTS[1], n=2),
              SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=30, structured_outputs=CONSTRAINTS[2],
                             logprobs=2),
              SamplingParams(temperature=0, max_tokens=20, structured_outputs=CONSTRAINTS[3], ignore_eos=True)]
    return prompts, params


@pytest.mark.parametrize("stage", ["paged_kv", "kernels", "streaming", "structured"])
def test_every_stage_gives_the_references_masked_tokens(structured_reference, stage, monkeypatch):
    """The mask is part of the arithmetic every stage applies: the same constraint attached to the reference and to
    stages 03-05 (and stage 07's own, which also feeds forced tokens as drafts) gives the same tokens."""
    base = {"paged_kv": paged_kv, "kernels": kernels, "streaming": streaming, "structured": structured}[stage]
    free = Curve(1.0, 0.0)  # stage 07: rows free for stage 06's policy, so every forced token is fed
    llm = (priced_llm(free, monkeypatch, max_num_seqs=4) if stage == "structured"
           else with_grammar(base.LLM)("tiny", dtype="bfloat16", max_num_seqs=4))
    prompts, params = requests()
    expected, got = structured_reference.generate(prompts, params), llm.generate(prompts, params)
    assert [(o.token_ids, o.finish_reason) for r in got for o in r.outputs] == \
        [(o.token_ids, o.finish_reason) for r in expected for o in r.outputs]
    for r, p in zip(expected, params):
        for o in r.outputs:
            if o.finish_reason == "stop":
                assert suite.check(o.text, {k: v for k, v in p.structured_outputs.__dict__.items()
                                            if k != "disable_any_whitespace" and v is not None}) is None, o.text
    if stage == "structured":
        assert llm.stats.accepted_tokens > 0  # forced tokens were fed as drafts, and kept


def test_forced_tokens_take_fewer_steps_and_give_the_same_tokens(monkeypatch):
    so = {"json": COMPACT, "disable_any_whitespace": True}
    prompts = [[5, 6, 7], [9, 10, 11]]
    params = [SamplingParams(temperature=0, max_tokens=40, structured_outputs=so),
              SamplingParams(temperature=0.7, seed=5, max_tokens=40, structured_outputs={"choice": ["alpha beta"]})]
    runs = {}
    for forced in (0, 16):
        llm = priced_llm(Curve(1.0, 0.0), monkeypatch, num_forced_tokens=forced)  # rows free: every forced token fed
        if not forced:  # (measured, the policy decides: the test below)
            assert llm.engine.scheduler.policy is None  # nothing drafts: nothing to price
        outs = llm.generate(prompts, params)
        runs[forced] = ([o.token_ids for o in outs], llm.num_steps, llm.stats.accepted_tokens)
    assert runs[0][0] == runs[16][0] and runs[0][2] == 0
    assert runs[16][1] < runs[0][1] and runs[16][2] > 0


def test_forced_tokens_are_fed_where_rows_are_free_and_never_where_a_row_costs_a_token(structured_reference,
                                                                                        monkeypatch):
    """Without a speculative_config, forced tokens are still drafts that stage 06's policy prices by the step cost.
    A forced row costs what a decode row costs, so where a step's time grows by a token's worth per row (compute-bound:
    64 in flight on a CPU) a draft that may miss (forced text as the tokenizer spells it) never pays: none is fed;
    where rows are free (one request: the step reads the weights once), every forced token is. Tokens: the reference's,
    whatever is fed (a cost that changes at random on every reading feeds arbitrary parts)."""
    prompts, params = requests()
    expected = [(o.token_ids, o.finish_reason) for r in structured_reference.generate(prompts, params)
                for o in r.outputs]
    counts = {}
    for name, cost in (("dear", Curve(0.0, 1.0)), ("free", Curve(1.0, 0.0)), ("jitter", Jitter(7))):
        llm = priced_llm(cost, monkeypatch, max_num_seqs=4)
        policy = llm.engine.scheduler.policy
        got = llm.generate(prompts, params)
        assert [(o.token_ids, o.finish_reason) for r in got for o in r.outputs] == expected
        counts[name] = (policy.counts["proposed"], policy.counts["fed"], llm.stats.drafted_tokens,
                        llm.stats.accepted_tokens)
    assert counts["dear"][0] > 0 and counts["dear"][1:] == (0, 0, 0)  # proposed (exploring), never fed
    assert counts["free"][0] == counts["free"][1] == counts["free"][2] > 0 and counts["free"][3] > 0  # all fed, kept


def test_forced_tokens_come_back_after_a_dear_line_read_at_a_noisy_moment(structured_reference):
    """Stage 07 learns its step cost from its own steps only. A line fitted at a noisy moment (4.5 ms a row where the
    tiny model's rows cost microseconds) says no forced draft pays, and a step without drafts cannot refit it: stage
    06's cost model halves a line that has decided alone for ``stale`` steps, so forced tokens are fed again (a probe
    refits the line). The tokens: the reference's."""
    llm = structured.LLM("tiny", dtype="bfloat16", max_num_seqs=1)
    cost = llm.engine.scheduler.policy.cost
    cost.observe(1, 1, 0.002)
    cost.observe(1, 5, 0.020)
    assert cost_model.best_drafts([cost_model.ALPHA_MAX], [4], 1, 1, cost) == [0]
    prompts = [[5, 6, 7]]
    params = SamplingParams(temperature=0, max_tokens=300, structured_outputs={"regex": r"([0-9]-abcdef-){16}"})
    expected = [o.token_ids for r in structured_reference.generate(prompts, params) for o in r.outputs]
    assert [o.token_ids for r in llm.generate(prompts, params) for o in r.outputs] == expected
    assert llm.stats.drafted_tokens > 0 and llm.stats.accepted_tokens > 0


class SameState:
    """After every step: each running request's constraint allows exactly what a fresh matcher fed its kept tokens
    allows (and has accepted as many tokens)."""

    def __init__(self, engine, grammars):
        self.engine, self.grammars, self.checked = engine, grammars, 0

    def on_step(self, event):
        for seq in self.engine.scheduler.running:
            rule = next(r for r in seq.processors if isinstance(r, structured.engine.GrammarConstraint))
            fresh = self.grammars.compile(seq.params.structured_outputs).matcher()
            for t in seq.output_token_ids:
                assert fresh.accept(t)
            assert rule.pos == rule.live == len(seq.output_token_ids)
            assert np.array_equal(rule.mask(), fresh.fill())
            self.checked += 1


def test_rollback_after_a_rejected_draft_leaves_the_matcher_where_one_at_a_time_decoding_would(
        structured_reference, grammars):
    """Drafts from the reference's answer, 30% of them wrong, through stage 03's engine with the constraint: the
    tokens are the reference's, and after every step the matcher is where the kept tokens put it."""
    prompts, params = requests()
    expected = structured_reference.generate(prompts, params)
    for seed in (1, 2):
        llm = with_grammar(DraftingLLM)("tiny", dtype="bfloat16", block_size=4, max_num_seqs=4,
                                        kv_cache_memory=60 * 4 * TINY_BYTES_PER_TOKEN, max_num_batched_tokens=24)
        DraftingScheduler.oracle, DraftingScheduler.rng = answers(expected), random.Random(seed)
        checked, state = llm.add_observer(Checked(llm.engine)), llm.add_observer(SameState(llm.engine, grammars))
        got = llm.generate(prompts, params)
        assert answers(got) == answers(expected)
        assert checked.steps_with_rejections > 0 and state.checked > 0
    assert DraftingScheduler.wrong > 0


@pytest.mark.parametrize("so, why", [
    ({"json": '{"type": "object", '}, "not valid JSON"),
    ({"json": {"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 3}}}, "'contains' at #:"),
    ({"json": {"type": "object", "properties": {"a": {"unevaluatedProperties": False}}}},
     "'unevaluatedProperties' at #/properties/a:"),
    ({"json": {"$ref": "https://example.com/schema.json"}}, "nothing is downloaded"),
    ({"json": {"$ref": "#/nowhere"}}, "#/nowhere points to nothing"),
    ({"json": {"type": "bogus"}}, 'Unsupported type "bogus"'),
    ({"json": {"type": "string", "minLength": 3, "maxLength": 1}}, "is greater than maxLength"),
    ({"json": {"type": "string", "enum": [1, 2]}}, "'enum' at #: no listed value meets the keywords beside it"),
    ({"regex": "a(?=b)"}, "Lookahead is not supported"),
    ({"grammar": "root ::= "}, "xgrammar cannot compile it"),
])
def test_what_cannot_be_enforced_is_refused_with_the_reason(so, why):
    llm = structured.LLM("tiny", dtype="bfloat16")
    with pytest.raises(InvalidParam, match=None) as e:
        llm.make_samples([5, 6], SamplingParams(max_tokens=4, structured_outputs=so))
    assert why in str(e.value) and e.value.param == "structured_outputs", str(e.value)


@pytest.mark.parametrize("schema, bad", [
    ({"type": "integer", "minimum": 5}, "3"), ({"type": "integer", "exclusiveMaximum": 5}, "5"),
    ({"type": "number", "maximum": 2.5}, "2.75"), ({"type": "string", "pattern": "^[a-z]+$"}, '"ABC"'),
    ({"type": "string", "format": "date"}, '"2020-13-45x"'), ({"enum": [1, 2]}, "3"), ({"const": "a"}, '"b"'),
    ({"type": "array", "minItems": 2, "items": {"type": "integer"}}, "[1]"),
    ({"type": "array", "maxItems": 1, "items": {"type": "integer"}}, "[1, 2]"),
    ({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]}, "[1, 2]"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, "{}"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}}, '{"a": 1, "z": 2}'),
    ({"type": "object", "maxProperties": 1, "properties": {"a": {}, "b": {}}}, '{"a": 1, "b": 2}'),
    ({"type": "object", "patternProperties": {"^a": {"type": "integer"}}}, '{"a": "x"}'),
    ({"type": "object", "propertyNames": {"pattern": "^[a-z]{1,2}$"}}, '{"abc": 1}'),
    ({"type": "integer", "multipleOf": 3}, "4"), ({"anyOf": [{"type": "integer"}, {"type": "boolean"}]}, '"x"'),
    ({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"}, '"x"'),
])
def test_every_keyword_the_check_lets_through_is_enforced_by_xgrammar(grammars, schema, bad):
    """schema_check.ENFORCED is a claim about xgrammar: for each keyword, a value that breaks it is refused."""
    keys = {k for k in schema if k not in ("type", "items", "properties", "$defs")} or {"type"}
    assert keys <= importlib.import_module("stages.structured.schema.schema_check").ENFORCED
    matcher = grammars.compile(StructuredOutputsParams(json=schema), "xgrammar").matcher().m
    assert not (matcher.accept_string(bad) and matcher.is_completed())


@pytest.mark.parametrize("schema, breaking", [
    ({"type": "string", "maxLength": 3}, '"de\t"'),  # a raw tab: not JSON at all
    ({"type": "string", "format": "email", "maxLength": 8}, '"someone@example.org"'),
    ({"type": "string", "pattern": "^[a-z@.]+$", "maxLength": 8}, '"someone@example.org"'),
    ({"type": "string", "format": "date", "pattern": "^2"}, '"1999-01-01"'),
    ({"type": "integer", "multipleOf": 3, "minimum": 1}, "4"),
    ({"type": "integer", "multipleOf": 2, "exclusiveMinimum": 0}, "3"),
    ({"enum": ["a", "bb"], "minLength": 2}, '"a"'),
    ({"enum": [1, 5], "maximum": 3}, "5"),
    ({"type": "string", "enum": ["a", 1]}, "1"),
])
def test_xgrammar_drops_one_keyword_of_these_pairs_which_is_why_the_check_refuses_or_rewrites_them(grammars,
                                                                                                 schema, breaking):
    """The refusals above rest on this: compiled raw, a value that breaks the schema completes the grammar (the
    8-character bound gone, the pattern, multipleOf, the length or range beside an enum, the type). Through the
    xgrammar backend the schema is either refused or rewritten (an enum filtered by the keywords beside it) so that
    the value is refused. If a newer xgrammar enforces one, its first assertion fails and that refusal can go."""
    m = xgr.GrammarMatcher(grammars.compiler.compile_json_schema(json.dumps(schema)))
    assert m.accept_string(breaking) and m.is_completed()
    try:
        grammar = grammars.build(StructuredOutputsParams(json=schema), "xgrammar")
    except InvalidParam as e:
        assert "xgrammar" in str(e) and " at #" in str(e)
        return
    m = grammar.matcher().m
    assert not (m.accept_string(breaking) and m.is_completed())


def test_other_stages_refuse_a_constraint_rather_than_ignore_it():
    out = streaming.LLM("tiny").generate([[5, 6]], SamplingParams(structured_outputs={"choice": ["a"]}))[0]
    assert out.finish_reason == "error" and "does not apply structured_outputs: use stage 07" in out.error


def test_a_constraint_and_allowed_token_ids_with_nothing_in_common_are_refused_at_submission():
    """The first position is checked at submission; a conflict further on (here the second token of "yes") ends the
    request with an error naming it."""
    llm = structured.LLM("tiny", dtype="bfloat16")
    yes = llm.tokenizer.encode("yes")
    assert len(yes) > 1  # the tiny vocabulary spells it in pieces
    with pytest.raises(InvalidParam, match="no token of allowed_token_ids can begin") as e:
        llm.make_samples([5], SamplingParams(structured_outputs={"choice": ["no"]}, allowed_token_ids=yes))
    assert e.value.param == "allowed_token_ids"
    choice = {"choice": ["yes", "no"]}
    out = llm.generate([[5]], SamplingParams(temperature=0, structured_outputs=choice, allowed_token_ids=yes + [2]))
    assert (out[0].text, out[0].finish_reason) == ("yes", "stop")
    out = llm.generate([[5]], SamplingParams(temperature=0, structured_outputs=choice, allowed_token_ids=yes[:1]))
    assert out[0].finish_reason == "error" and "allowed_token_ids" in out[0].error


def test_a_request_no_token_can_continue_fails_alone_and_the_others_finish():
    """min_tokens bans EOS where the choice is complete: no token is left, so that request ends with an error naming
    the conflict; the request beside it finishes, and every block is back."""
    llm = structured.LLM("tiny", dtype="bfloat16", max_num_seqs=4)
    audit = llm.add_observer(paged_kv.BlockAudit(llm.engine))
    bad = SamplingParams(temperature=0, max_tokens=10, min_tokens=5, structured_outputs={"choice": ["ok"]})
    good = SamplingParams(temperature=0, max_tokens=12, structured_outputs={"regex": r"[a-z]{3,8}"})
    out_bad, out_good = llm.generate([[5, 6], [7, 8]], [bad, good])
    assert out_bad.finish_reason == "error" and "no token is allowed at output token" in out_bad.error
    assert "min_tokens" in out_bad.error and out_bad.text == "ok"
    assert out_good.finish_reason == "stop" and suite.check(out_good.text, {"regex": r"[a-z]{3,8}"}) is None
    bm = llm.engine.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks and audit is not None


def test_a_grammar_that_cannot_finish_in_max_tokens_ends_with_length():
    out = structured.LLM("tiny", dtype="bfloat16").generate(
        [[5, 6]], SamplingParams(temperature=0, max_tokens=6, structured_outputs={"regex": "(abc){20}"}))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 6 and "abcabc".startswith(out.text[:6])


def test_logprobs_are_the_masked_distributions(grammars):
    """Stage 07 reports processed_logprobs: at the first position only the tokens the choice allows have a
    probability, and theirs add up to 1."""
    so = {"choice": ["yes", "no"]}
    out = structured.LLM("tiny", dtype="bfloat16").generate(
        [[5, 6]], SamplingParams(temperature=0, max_tokens=4, logprobs=20, structured_outputs=so))[0].outputs[0]
    allowed = set(np.flatnonzero(bits(grammars.compile(StructuredOutputsParams(**so)).matcher().fill())))
    first, top = out.logprobs[0]
    finite = {t: lp for t, lp in top if lp > float("-inf")}
    assert set(finite) == allowed and 1 < len(allowed) < 20
    assert np.isclose(sum(np.exp(lp) for lp in finite.values()), 1.0, atol=1e-5) and first == finite[out.token_ids[0]]


def test_structured_outputs_params_take_one_constraint():
    for bad in [{}, {"json": {}, "regex": "a"}, {"choice": []}, {"json": "[1"}, {"guided_json": {}},
                {"json_object": False}, {"regex": ""}]:
        with pytest.raises(InvalidParam) as e:
            SamplingParams(structured_outputs=bad)
        assert e.value.param == "structured_outputs"
    assert SamplingParams(structured_outputs={"json": json.dumps(COMPACT)}).structured_outputs.schema == COMPACT


@pytest.mark.parametrize("vocab", [49152, 1000, 33])
def test_the_mask_on_a_row_bans_exactly_the_tokens_whose_bit_is_zero(vocab):
    """apply_bitmask (a table of biases added on the CPU) against its spelled-out form and each bit read alone."""
    import torch
    constraint = importlib.import_module("stages.structured.constraint")
    rng = np.random.default_rng(vocab)
    words = rng.integers(-2**31, 2**31, size=(vocab + 31) // 32, dtype=np.int64).astype(np.int32)
    row = torch.randn(vocab)
    fast, slow = row.clone(), row.clone()
    constraint.apply_bitmask(fast, words)
    constraint.apply_bitmask_unpacked(slow, words)
    allowed = [bool(int(words[t // 32]) >> (t % 32) & 1) for t in range(vocab)]
    assert torch.equal(fast, slow)
    assert [bool(torch.isfinite(fast[t])) for t in range(vocab)] == allowed
    assert torch.equal(fast[torch.tensor(allowed)], row[torch.tensor(allowed)])


def test_the_time_per_token_table_takes_each_rounds_ratio_against_that_rounds_unconstrained_run(capsys, monkeypatch):
    """`--time-only` runs unconstrained, JSON and JSON + forced in turn, --rounds times, each round's ratio against
    its own unconstrained run: the unconstrained row reads +0.0% in every round; --rounds 0 is refused by name."""
    main = importlib.import_module("stages.structured.__main__").main
    monkeypatch.setenv("COLUMNS", "250")  # one line a row
    main(["--time-only", "--model", "tiny", "--in-flight", "1,4", "--rounds", "2", "--max-tokens", "8"])
    rows = [line for line in capsys.readouterr().out.splitlines() if "│" in line]
    assert sum("unconstrained" in r for r in rows) == 2 and sum("JSON + forced" in r for r in rows) == 2
    assert all("+0.0% .. +0.0%" in r for r in rows if "unconstrained" in r)
    with pytest.raises(SystemExit):
        main(["--time-only", "--rounds", "0"])
    assert "--rounds must be at least 1" in capsys.readouterr().err
