"""Stage 07's masks off the critical path (masks.py, forced.py's budget): the same masks, the same tokens.

The oracles: each request's own per-row mask (its matcher's ``fill``, as constraint.py computes it) for the batched
fill of every backend; the per-row apply (``apply_bitmask``) for the one batched apply; the one-request-at-a-time
reference with the same constraint for the tokens, with constrained, unconstrained and drafting requests in one
batch; jsonschema (suite.check) for the outputs. Tiny model (SmolLM2's first 1,024 tokens).
"""
import importlib
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from common import ReferenceLLM, SamplingParams
from common.sampling import StructuredOutputsParams
from common.validate import InvalidParam
from workloads import TINY_VOCAB

pytest.importorskip("xgrammar")
pytest.importorskip("llguidance")
structured = importlib.import_module("stages.07_structured")
backends = importlib.import_module("stages.structured.backends")
constraint = importlib.import_module("stages.structured.constraint")
masks = importlib.import_module("stages.structured.masks")
forced = importlib.import_module("stages.structured.forced")
suite = importlib.import_module("stages.structured.suite")

EOS = (2,)
COMPACT = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                            "b": {"enum": ["red", "green"]}}, "required": ["a", "b"],
           "additionalProperties": False}
UNIQUE = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 3,
          "uniqueItems": True}  # checked on the finished output: its matcher wraps the backend's (schema/checked.py)
# (constraint, backend): every backend, the hand-written automaton among them, and a checked matcher
MIX = [({"choice": ["yes", "no", "maybe so"]}, "fsm"), ({"regex": r"\d{2,3}-[a-z]{2,4}"}, "fsm"),
       ({"json": COMPACT, "disable_any_whitespace": True}, "xgrammar"), ({"json": COMPACT}, "guidance"),
       ({"json": suite.SCHEMAS["sentiment"]}, "xgrammar"), ({"json": suite.SCHEMAS["nested"]}, "guidance"),
       ({"regex": r"(ab|c[^x]){1,3}"}, "xgrammar"), ({"json": UNIQUE}, "guidance"), ({"json": UNIQUE}, "xgrammar")]


@pytest.fixture(scope="module")
def grammars(tiny_folder):
    return backends.grammars_for(str(tiny_folder), TINY_VOCAB, EOS)


def rule_for(grammars, so, backend):
    grammar = grammars.compile(StructuredOutputsParams(**so), backend)
    return constraint.GrammarConstraint(grammar.matcher(), list(EOS), TINY_VOCAB)


def bits(words: np.ndarray) -> np.ndarray:
    return np.unpackbits(np.ascontiguousarray(words).view(np.uint8), bitorder="little")[:TINY_VOCAB]


@pytest.mark.parametrize("seed", range(4))
def test_the_batched_fill_gives_each_request_its_own_per_row_mask(grammars, seed):
    """Pairs of constraints walked along the same random tokens (each a random depth, some to EOS): one of each
    pair fills its mask alone, the other with all the others in one `BatchMasks.fill` (xgrammar, llguidance and the
    automaton interleaved in one array); every mask is the same, bit for bit."""
    rng = random.Random(seed)
    pairs = [(rule_for(grammars, so, b), rule_for(grammars, so, b)) for so, b in MIX for _ in range(2)]
    for alone, batched in pairs:
        for _ in range(rng.randrange(0, 12)):
            allowed = np.flatnonzero(bits(alone.mask()))
            if alone.is_terminated() or not len(allowed):
                break
            token = int(rng.choice(allowed))
            alone.accept(token)
            batched.accept(token)
    assert sum(b.pending() is not None for _, b in pairs) > len(pairs) // 2
    masks.BatchMasks(TINY_VOCAB).fill([b for _, b in pairs])  # the batch, not each request's own fill, gives these
    assert all(b.pending() is None for _, b in pairs)
    for (alone, batched), (so, backend) in zip(pairs, [m for m in MIX for _ in range(2)]):
        assert np.array_equal(bits(batched.mask()), bits(alone.mask())), (so, backend, alone.pos)


def test_the_one_batched_apply_is_the_per_row_apply(grammars):
    """Masks applied to some rows of a [rows, vocab] logits tensor in one call: those rows are what the per-row
    apply gives, the others untouched."""
    rules = [rule_for(grammars, so, b) for so, b in MIX]
    logits = torch.randn(12, TINY_VOCAB, generator=torch.Generator().manual_seed(0))
    rows = [0, 3, 4, 5, 7, 8, 9, 10, 11]
    expected = logits.clone()
    for row, rule in zip(rows, rules):
        constraint.apply_bitmask(expected[row], rule.mask())
    masks.apply_masks(logits, rows, [r.mask() for r in rules])
    assert torch.equal(logits, expected)
    assert torch.isinf(logits[rows]).any() and not torch.isinf(logits[[1, 2, 6]]).any()


def test_the_apply_a_few_rows_at_a_time_is_the_unpacked_apply_for_any_rows():
    """More rows than one lookup takes (masks.ROWS_AT_ONCE), in any order, on logits narrower than the masks (a
    vocabulary not a multiple of 32): each listed row is what the spelled-out apply (a byte per token, a masked
    fill) gives, so nothing of one lookup reaches another row; the other rows untouched."""
    rng = np.random.default_rng(1)
    width, n = TINY_VOCAB - 7, 3 * masks.ROWS_AT_ONCE + 5
    words = [rng.integers(-2**31, 2**31, TINY_VOCAB // 32, dtype=np.int64).astype(np.int32) for _ in range(n)]
    for w in words[::3]:  # some all-allowed and all-banned words, as inside a string and at a brace
        w[rng.integers(0, len(w), 10)] = rng.choice([0, -1], 10)
    logits = torch.randn(n + 9, width, generator=torch.Generator().manual_seed(2))
    rows = [int(r) for r in rng.permutation(n + 9)[:n]]
    expected = logits.clone()
    for row, w in zip(rows, words):
        constraint.apply_bitmask_unpacked(expected[row], w)
    masks.apply_masks(logits, rows, words)
    assert torch.equal(logits, expected)


class CountingMatcher:
    """A matcher that counts the tokens it is given (to show a kept mask is reused, not recomputed)."""

    def __init__(self, inner):
        self.inner, self.accepted = inner, 0

    def accept(self, token):
        self.accepted += 1
        return self.inner.accept(token)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("so, backend", MIX, ids=[b for _, b in MIX])
def test_the_masks_along_a_looked_ahead_run_are_kept_and_equal_a_fresh_walk(grammars, so, backend):
    """A run looked ahead (as forced.py does) and taken back: the runner's masks after each prefix of it
    (``mask_after``) come from what the look-ahead kept, without stepping the matcher, and each equals the mask of a
    fresh constraint walked along that prefix (the oracle); a prefix off the run is walked and still equals it."""
    rng = random.Random(len(str(so)))
    rule = rule_for(grammars, so, backend)
    rule.matcher = CountingMatcher(rule.matcher)
    run = []
    while len(run) < 8 and not rule.is_terminated() and (allowed := np.flatnonzero(bits(rule.mask()))).size:
        run.append(int(rng.choice(allowed)))
        rule.accept(run[-1])
    rule.mask()  # the mask after the whole run, as the look-ahead computes it
    rule.rollback(len(run))
    stepped = rule.matcher.accepted
    for j in range(len(run) + 1):
        fresh = rule_for(grammars, so, backend)
        for token in run[:j]:
            fresh.accept(token)
        assert np.array_equal(bits(rule.mask_after(run[:j])), bits(fresh.mask())), (so, j)
    assert rule.matcher.accepted == stepped  # every mask was kept: the matcher was not stepped again
    if run:
        other = next(t for t in range(TINY_VOCAB) if t != run[0] and t not in EOS)
        fresh = rule_for(grammars, so, backend)
        fresh.accept(other)
        assert np.array_equal(bits(rule.mask_after([other])), bits(fresh.mask()))
        assert rule.matcher.accepted == stepped + 1


def mixed_requests():
    """Constrained (greedy, seeded, n=2, one with min_tokens beside its grammar: the per-row path) and unconstrained
    requests (repetitive prompts, so stage 06's n-gram proposer drafts for them)."""
    rep = [11, 12, 13, 14] * 4
    prompts = [[5, 6, 7], [9, 10], [300, 301, 302], rep, rep[1:], [44] * 9, [70, 71, 72, 73]]
    so_json = {"json": COMPACT, "disable_any_whitespace": True}
    params = [SamplingParams(temperature=0, max_tokens=30, structured_outputs=so_json),
              SamplingParams(temperature=0.9, seed=3, max_tokens=24, structured_outputs=MIX[1][0], n=2),
              SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=30, logprobs=2,
                             structured_outputs={"json": suite.SCHEMAS["weather"]}),
              SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
              SamplingParams(temperature=0.7, seed=5, max_tokens=24, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=20, min_tokens=3, structured_outputs=MIX[6][0]),
              SamplingParams(temperature=0, max_tokens=20, structured_outputs={"choice": ["alpha beta", "gamma"]})]
    return prompts, params


def outcomes(results):
    return [(o.token_ids, o.finish_reason) for r in results for o in r.outputs]


@pytest.fixture(scope="module")
def structured_reference():
    return type("StructuredReference", (structured.StructuredOutputs, ReferenceLLM), {})("tiny", dtype="bfloat16")


def make_llm(**options):
    return structured.LLM("tiny", dtype="bfloat16", max_num_seqs=8, speculative_config={
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4,
        "enable_adaptive_verification": False}, **options)


def test_a_mixed_batch_gives_the_references_tokens(structured_reference):
    """Constrained rows masked together, beside drafting unconstrained rows and a constrained row on the per-row
    path: every request's tokens and finish are the reference's, and its log-probabilities those of the same engine
    masking row by row."""
    prompts, params = mixed_requests()
    llm, per_row = make_llm(), make_llm()
    per_row.engine.runner.process_rows = lambda *args: set()  # the runner's default: every row alone
    got, expected = llm.generate(prompts, params), structured_reference.generate(prompts, params)
    assert outcomes(got) == outcomes(expected)
    assert [o.logprobs for r in got for o in r.outputs] == \
        [o.logprobs for r in per_row.generate(prompts, params) for o in r.outputs]
    runner = llm.engine.runner
    assert runner.mask_steps > 0 and runner.masks.seconds > 0  # the batched path ran
    assert llm.stats.accepted_tokens > 0  # drafts (forced and n-gram) were fed and kept


def test_the_look_ahead_keeps_to_its_budget_and_every_request_gets_its_turn(grammars):
    """A clock that advances 100 µs at each reading and a budget of 250 µs: two requests' look-aheads start each
    step (at 100 and 200 µs spent, not at 300), the next step starts where the last stopped, and each look-ahead is
    what the request's own constraint forces (an independent copy asked alone: "q", then EOS)."""
    so, k = {"regex": "q"}, 8
    now = [0.0]

    def clock():
        now[0] += 1e-4
        return now[0]

    seqs = [SimpleNamespace(processors=[rule_for(grammars, so, "xgrammar")]) for _ in range(5)]
    own = rule_for(grammars, so, "xgrammar").forced_tokens(k)[0]
    assert len(own) == 2
    proposer = forced.ForcedTokens(k, budget_us=250, masks=masks.BatchMasks(TINY_VOCAB), clock=clock)
    served = []
    for _ in range(3):
        runs = proposer.propose(seqs, [k] * 5)
        assert proposer.served == 2 and sum(bool(r) for r in runs) == 2
        assert all(r in ([], own) for r in runs)
        served.append([i for i, r in enumerate(runs) if r])
    assert served == [[0, 1], [2, 3], [0, 4]]
    assert forced.ForcedTokens(k, budget_us=0, clock=clock).propose(seqs, [k] * 5) == [[]] * 5
    assert forced.ForcedTokens(k, clock=clock).propose(seqs, [k] * 5) == [own] * 5


@pytest.mark.parametrize("budget_us", [0, 1e9])
def test_the_tokens_are_the_same_with_any_look_ahead_budget(structured_reference, budget_us):
    """No look-ahead (nothing forced) or an unbounded one: the reference's tokens either way."""
    prompts, params = mixed_requests()
    llm = structured.LLM("tiny", dtype="bfloat16", max_num_seqs=8, forced_budget_us=budget_us)
    assert outcomes(llm.generate(prompts, params)) == outcomes(structured_reference.generate(prompts, params))
    assert (llm.engine.scheduler.proposers[0].forced > 0) == (budget_us > 0)


@pytest.mark.parametrize("compact", [False, True])
def test_the_schema_suite_gives_the_references_tokens_and_every_output_that_ends_validates(
        structured_reference, compact):
    """The 30 cases of the schema suite in one batch, greedy and seeded: the reference's tokens, and every output
    that ends by itself parses and matches (the random tiny model ends some; the real model's run is the stage's
    command)."""
    llm = structured.LLM("tiny", dtype="bfloat16", max_num_seqs=64)
    prompts, params = [], []
    for i, (_, _, so) in enumerate(suite.CASES):
        so = dict(so, disable_any_whitespace=True) if compact and "json" in so else so
        prompts.append([5, 6, 7 + i])
        params.append(SamplingParams(temperature=0.0 if i % 2 else 0.8, seed=i, max_tokens=60, structured_outputs=so))
    got, expected = llm.generate(prompts, params), structured_reference.generate(prompts, params)
    assert outcomes(got) == outcomes(expected)
    ended = [(o.text, case[2]) for o, case in zip(got, suite.CASES) if o.finish_reason == "stop"]
    assert ended and all(suite.check(text, so) is None for text, so in ended)


@pytest.mark.parametrize("key, value", [("forced_budget_us", -1), ("forced_budget_us", "fast")])
def test_a_bad_option_is_refused_by_its_name(key, value):
    with pytest.raises(InvalidParam, match=key):
        structured.LLM("tiny", **{key: value})
