"""Steps that feed draft tokens and keep some of them give exactly one-at-a-time decoding.

The engine under test is stage 03's with a scheduler that, before every step, hands each decoding request a
few draft tokens taken from the reference's own answer with some of them corrupted (the oracle is the
reference: its tokens, finish reasons and logprobs). The runner samples every position of the run, the sampled
tokens are kept up to the first that differs from the draft, and the rejected drafts' KV slots go back
(`BlockManager.truncate`). Whatever was drafted, the tokens must be the reference's, the block audit must hold
after every step, and a running request must hold exactly the blocks its computed tokens need.
"""
import importlib
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from common import ReferenceLLM, SamplingParams, Sequence
from common.engine import LLMEngine
from common.model import Llama
from common.runner import ModelRunner
from common.processors import LogitsProcessor
from test_parallel_sampling import TINY_BYTES_PER_TOKEN, penalized_params
from workloads import TINY_VOCAB, examples

paged = importlib.import_module("stages.03_paged_kv")


class DraftingScheduler(paged.Scheduler):
    """Before each step: drafts for every decoding request, from the oracle's tokens, some of them wrong."""
    oracle: dict[int, list[int]] = {}
    rng = random.Random(0)
    max_drafts, wrong = 4, 0.3

    def schedule(self):
        room = self.max_num_batched_tokens
        for seq in self.running:
            seq.spec_token_ids = []
            if seq.num_new_tokens == 1 and room > 1:
                left = min(seq.params.max_tokens, seq.max_len - seq.num_prompt_tokens) - len(seq.output_token_ids)
                k = min(self.rng.randint(0, self.max_drafts), room - 1, left - 1)
                truth = self.oracle[seq.index][len(seq.output_token_ids):]
                seq.spec_token_ids = [truth[i] if i < len(truth) and self.rng.random() > self.wrong
                                      else self.rng.randrange(3, TINY_VOCAB) for i in range(max(k, 0))]
            room -= seq.num_new_tokens
        return super().schedule()


class Checked:
    """An observer: the audit, and no block held past what a running request's computed tokens need."""

    def __init__(self, engine):
        self.engine, self.steps_with_rejections = engine, 0

    def on_step(self, event):
        bm = self.engine.scheduler.block_manager
        bm.audit(self.engine.scheduler.running)
        for seq in self.engine.scheduler.running:
            assert len(bm.table(seq)) == bm.blocks_for(seq.num_cached_tokens), (seq.num_cached_tokens, bm.table(seq))
            assert seq.num_cached_tokens <= len(seq) - 1  # no draft token left in the cache
        self.steps_with_rejections += any(s.accepted < s.drafted for s in event.seqs)


def drafting_build(config, tokenizer=None):
    """Stage 03's engine with the drafting scheduler."""
    model = config.model.load(Llama)
    blocks = paged.kv_blocks(config, model)
    cache = paged.PagedKVCache(model.config, blocks.num_blocks, blocks.block_size, model.dtype, model.device)
    return LLMEngine(model, DraftingScheduler(config.scheduler, blocks), cache, ModelRunner(model))


class DraftingLLM(paged.LLM):
    build = staticmethod(drafting_build)


def with_rule(base, rule):
    """``base`` with ``rule()`` appended to every request's processors (each sample its own)."""
    class WithRule(base):
        def make_processors(self, params, seq):
            return super().make_processors(params, seq) + [rule()]
    return WithRule


def drafted_llm(oracle, seed, block_size=4, blocks=60, max_num_seqs=4, budget=24, rule=None):
    cls = DraftingLLM if rule is None else with_rule(DraftingLLM, rule)
    llm = cls("tiny", dtype="bfloat16", block_size=block_size, kv_cache_memory=blocks * block_size *
              TINY_BYTES_PER_TOKEN, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget)
    DraftingScheduler.oracle, DraftingScheduler.rng = oracle, random.Random(seed)
    return llm, llm.add_observer(Checked(llm.engine))


def answers(outputs):
    """Every sample's tokens, in the order `generate` numbers its sequences (``seq.index``)."""
    return [o.token_ids for out in outputs for o in out.outputs]


@pytest.fixture(scope="module")
def reference():
    return ReferenceLLM("tiny", dtype="bfloat16")


@st.composite
def drafted_workloads(draw):
    tokens = st.integers(3, TINY_VOCAB - 1)
    prompts = [draw(st.lists(tokens, min_size=1, max_size=30)) for _ in range(draw(st.integers(1, 4)))]
    params = [draw(penalized_params()) for _ in prompts]
    for p in params:
        p.max_tokens = draw(st.integers(1, 24))
        p.min_tokens = min(p.min_tokens, p.max_tokens)
    return prompts, params


@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=drafted_workloads(), seed=st.integers(0, 1000), blocks=st.integers(20, 60))
def test_drafted_steps_keep_exactly_the_references_tokens_and_logprobs(reference, workload, seed, blocks):
    prompts, params = workload
    expected = reference.generate(prompts, params)
    llm, checked = drafted_llm(answers(expected), seed, blocks=blocks)
    got = llm.generate(prompts, params)
    for e, g in zip(expected, got):
        assert [(o.token_ids, o.finish_reason) for o in g.outputs] == [(o.token_ids, o.finish_reason)
                                                                        for o in e.outputs]
        assert [o.logprobs for o in g.outputs] == [o.logprobs for o in e.outputs]
        assert g.prompt_logprobs == e.prompt_logprobs
    bm = llm.engine.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_stops_inside_a_draft_end_the_request_where_one_token_at_a_time_would(reference):
    """A stop string, EOS and max_tokens reached inside a drafted run: the run is cut at that token."""
    prompt = [5, 6, 7, 8]
    free = reference.generate([prompt], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0]
    word = reference.tokenizer.decode(free.token_ids[6:8])
    cases = [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=[word]) if word.strip() else None,
             SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[free.token_ids[5]]),
             SamplingParams(temperature=0, max_tokens=7, ignore_eos=True)]
    for params in filter(None, cases):
        expected = reference.generate([prompt], params)
        llm, checked = drafted_llm(answers(expected), 1)
        DraftingScheduler.wrong = 0.0  # every draft right: the whole run would be kept but for the stop
        try:
            got = llm.generate([prompt], params)[0]
        finally:
            DraftingScheduler.wrong = 0.3
        assert (got.token_ids, got.finish_reason, got.text) == (expected[0].token_ids, expected[0].finish_reason,
                                                                 expected[0].text)
        assert llm.stats.accepted_tokens > 0 or len(got.token_ids) < 3


class NoRepeatOfLast(LogitsProcessor):
    """A rule with state, for the test: ban the token kept two positions back (a history it keeps itself)."""

    def __init__(self):
        self.kept: list[int] = []

    def apply(self, logits, output_ids):
        assert output_ids[len(output_ids) - len(self.kept):] == self.kept or not self.kept, "state out of step"
        if len(self.kept) >= 2:
            logits[self.kept[-2]] = float("-inf")

    def accept(self, token):
        self.kept.append(token)

    def rollback(self, num_tokens):
        del self.kept[len(self.kept) - num_tokens:]


def test_a_rule_with_state_is_rolled_back_after_a_rejected_draft(reference):
    """The rule's state follows the kept tokens alone: the drafted engine gives the reference's tokens with it,
    for greedy and seeded sampling, while drafts are rejected."""
    rule_ref = with_rule(ReferenceLLM, NoRepeatOfLast)("tiny", dtype="bfloat16")
    prompts = [[3, 4, 5], [9] * 12, [20, 21]]
    params = [SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
              SamplingParams(temperature=1.0, seed=7, max_tokens=16, ignore_eos=True, n=2),
              SamplingParams(temperature=0.8, top_k=50, seed=3, max_tokens=12)]
    expected = rule_ref.generate(prompts, params)
    llm, checked = drafted_llm(answers(expected), 5, rule=NoRepeatOfLast)
    got = llm.generate(prompts, params)
    assert answers(got) == answers(expected)
    assert checked.steps_with_rejections > 0 and llm.stats.accepted_tokens > 0


def test_truncate_gives_back_slots_and_never_leaves_a_cached_block_to_be_overwritten():
    bm = paged.BlockManager(8, 4, paged.PrefixCache(4))
    seq = Sequence(list(range(10, 20)), SamplingParams(max_tokens=20), 0, torch.device("cpu"))
    bm.allocate(seq, [])
    bm.append_slots(seq, 10)
    seq.num_cached_tokens = 10
    bm.prefix_cache.commit(seq, bm.table(seq))  # blocks 0 and 1 are full: cached
    bm.append_slots(seq, 5)  # a draft run: up to 15 tokens, four blocks
    assert len(bm.table(seq)) == 4 and bm.num_free_blocks == 4
    bm.truncate(seq, 11)  # two tokens of the run kept
    assert len(bm.table(seq)) == 3 and bm.num_free_blocks == 5 and seq.num_cached_tokens == 10
    bm.audit([seq])
    second = bm.table(seq)[1]
    bm.truncate(seq, 6)  # back inside the second, cached block: it is written again, so it is forgotten
    assert second not in bm.prefix_cache.of_block and len(bm.table(seq)) == 2 and seq.num_cached_tokens == 6
    bm.audit([seq])
    bm.free_sequence(seq)
    assert bm.num_free_blocks == 8
    bm.audit([])
