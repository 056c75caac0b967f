"""Stage 06: speculative decoding keeps exactly the reference's tokens, whatever is drafted and by whom.

The oracle is the one-request-at-a-time reference (tokens, finish reasons, logprobs); the proposers are stage 06's
own (n-gram lookup, predicted outputs, the int4 draft model), run through its scheduler's caps. After every step the
block audit holds, no rejected slot is left in a block table or the prefix cache, and no draft ever caused a
preemption; the n-gram lookup is held against a brute-force search, the draft model's guesses against the int4
model's own greedy answer (its KV cache rolled back right), and the KV bytes against plain decoding's.
"""
import importlib

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from common import ReferenceLLM, SamplingParams
from common.paths import DEFAULT_MODEL
from common.validate import InvalidParam
from test_parallel_sampling import TINY_BYTES_PER_TOKEN, penalized_params
from workloads import examples

spec = importlib.import_module("stages.06_speculative")
proposers = importlib.import_module("stages.speculative.proposers")
paged_scheduler = importlib.import_module("stages.paged_kv.scheduler")
streaming = importlib.import_module("stages.05_streaming")

# Tests that need drafts fed turn the adaptive policy off (it may find rows too dear on a loaded machine);
# tests/test_stage_06_adaptive.py holds the policy itself to its arithmetic and to the reference's tokens.
ALWAYS = {"enable_adaptive_verification": False}
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3, **ALWAYS}


@pytest.fixture(scope="module")
def reference():
    return ReferenceLLM("tiny", dtype="bfloat16")


def spec_llm(config=NGRAM, block_size=4, blocks=80, max_num_seqs=4, budget=32, **kw):
    llm = spec.LLM("tiny", dtype="bfloat16", speculative_config=config, block_size=block_size,
                   kv_cache_memory=blocks * block_size * TINY_BYTES_PER_TOKEN, max_num_seqs=max_num_seqs,
                   max_num_batched_tokens=budget, **kw)
    return llm, llm.add_observer(Checked(llm.engine))


class Checked:
    """After every step: the block audit; a running request holds blocks for its computed tokens only (its rejected
    drafts' slots given back); every block the prefix cache knows holds exactly the tokens of whoever holds it."""

    def __init__(self, engine):
        self.engine, self.verify_steps, self.rejections = engine, 0, 0

    def on_step(self, event):
        bm, pc = self.engine.scheduler.block_manager, self.engine.scheduler.prefix_cache
        bm.audit(self.engine.scheduler.running)
        for seq in self.engine.scheduler.running:
            assert len(bm.table(seq)) == bm.blocks_for(seq.num_cached_tokens)
            assert seq.num_cached_tokens <= len(seq) - 1 and not seq.spec_token_ids
            for i, block in enumerate(bm.table(seq)):
                if pc is not None and block in pc.of_block and (i + 1) * bm.block_size <= seq.num_cached_tokens:
                    assert pc.of_block[block][1] == seq.token_ids[i * bm.block_size:(i + 1) * bm.block_size]
        self.verify_steps += sum(s.drafted > 0 for s in event.seqs)
        self.rejections += sum(s.accepted < s.drafted for s in event.seqs)


class Recorder:
    """Every sequence's part in every step (`SeqStep`), in order."""

    def __init__(self):
        self.seqs = []

    def on_step(self, event):
        self.seqs.extend(event.seqs)


@pytest.fixture(autouse=True)
def drafts_never_preempt(monkeypatch):
    """A request with drafts must fit without evicting anyone (the scheduler drops drafts first)."""
    make_room = paged_scheduler.make_room

    def checked(seq, n, running, waiting, bm):
        assert not seq.spec_token_ids or bm.can_append(seq, n), "drafts made the scheduler preempt"
        return make_room(seq, n, running, waiting, bm)

    monkeypatch.setattr(paged_scheduler, "make_room", checked)


def same_outputs(got, expected):
    for g, e in zip(got, expected):
        assert [(o.token_ids, o.finish_reason, o.text) for o in g.outputs] == \
            [(o.token_ids, o.finish_reason, o.text) for o in e.outputs]
        assert [o.logprobs for o in g.outputs] == [o.logprobs for o in e.outputs]


# ---- the n-gram lookup, against a brute-force search --------------------------------------------------------------
def brute_force_lookup(tokens, min_n, max_n, k, factor=None):
    """vLLM's rule, spelled out: the longest n in [min_n, max_n] whose last-n tokens occur earlier (ending before
    the last token); the first such occurrence; the k tokens after it (with a factor: at most floor(factor x n))."""
    for n in range(max_n, min_n - 1, -1):
        for start in range(len(tokens) - n):
            if n <= len(tokens) - 1 and tokens[start:start + n] == tokens[len(tokens) - n:]:
                return tokens[start + n:start + n + (k if factor is None else min(k, int(factor * n + 1e-6)))]
    return []


def test_ngram_lookup_follows_vllms_example():
    assert proposers.ngram_lookup([1, 2, 3, 4, 2, 3], 2, 3, 4) == [4, 2, 3]
    assert proposers.ngram_lookup([1, 2, 3, 4, 5], 1, 3, 4) == []  # nothing recurs: nothing proposed


@settings(max_examples=examples(300), deadline=None)
@given(tokens=st.lists(st.integers(0, 3), min_size=1, max_size=30), lo=st.integers(1, 4), span=st.integers(0, 3),
       k=st.integers(1, 6))
def test_ngram_lookup_equals_the_brute_force_search(tokens, lo, span, k):
    assert proposers.ngram_lookup(tokens, lo, lo + span, k) == brute_force_lookup(tokens, lo, lo + span, k)


@settings(max_examples=examples(300), deadline=None)
@given(tokens=st.lists(st.integers(0, 3), min_size=1, max_size=40), lo=st.integers(1, 3), span=st.integers(0, 12),
       k=st.integers(1, 16), factor=st.sampled_from([0.5, 1, 1.5, 2.0, 4]))
def test_ngram_drafts_grow_with_the_match_as_the_brute_force_search_says(tokens, lo, span, k, factor):
    """prompt_lookup_spec_factor: a match of n tokens drafts at most factor x n of what vLLM's rule proposes."""
    got = proposers.ngram_lookup(tokens, lo, lo + span, k, factor)
    assert got == brute_force_lookup(tokens, lo, lo + span, k, factor)


def test_a_long_match_drafts_long_and_a_short_one_short():
    quote = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    tokens = quote + [0] + quote[:4]
    assert proposers.ngram_lookup(tokens, 1, 16, 16, 2.0) == tokens[4:12]  # 4 matched: 8
    assert proposers.ngram_lookup(tokens, 1, 16, 16) == tokens[4:]  # vLLM's rule: up to k, whatever the match
    assert proposers.ngram_lookup(quote + [0, 7], 1, 16, 16, 2.0) == [8, 9]  # 1 matched: 2


def test_prediction_proposer_realigns_after_an_edit():
    """The output departs from the prediction (a word replaced): no draft until its last tokens are found again,
    then the prediction's continuation from there, not from an earlier repeat."""
    p = proposers.PredictionProposer(tokenizer=None, k=4)
    ids = np.asarray([10, 11, 12, 13, 14, 10, 11, 15, 16])
    assert p.realign(ids, [10, 11], 0) == 2
    assert p.realign(ids, [10, 11], 3) == 7  # the repeat after where the output stood
    assert p.realign(ids, [99, 14], 0) == 5
    assert p.realign(ids, [99], 0) is None


def test_a_used_up_prediction_gives_the_request_back_to_the_method():
    """While the output follows the prediction, the prediction claims the request and drafts its continuation; once
    the output has reached the prediction's end it no longer claims it (the method's proposer drafts the rest)."""
    from common.sequence import Sequence
    p = proposers.PredictionProposer(tokenizer=None, k=4)
    seq = Sequence([1, 2], SamplingParams(temperature=0, max_tokens=9, prediction="x"), 0, torch.device("cpu"),
                   prediction_ids=[10, 11, 12])
    assert p.claims(seq)
    for token in (10, 11):
        seq.append_token(token)
    assert p.claims(seq) and p.propose([seq], [4]) == [[12]]
    seq.append_token(12)
    assert not p.claims(seq)
    from common.sequence import SequenceStatus  # a request claims follows but propose never asks: forgotten once
    seq.status = SequenceStatus.FINISHED  # it finishes, when the next request is followed (the state stays bounded)
    later = Sequence([1, 2], SamplingParams(temperature=0, max_tokens=9, prediction="x"), 0, torch.device("cpu"),
                     prediction_ids=[10, 11, 12])
    assert p.claims(later) and list(p.state) == [later.seq_id]


# ---- identical tokens ----------------------------------------------------------------------------------------------
@st.composite
def repetitive_workloads(draw):
    """Prompts over a few tokens, so the n-gram lookup finds matches and drafts (right and wrong ones)."""
    alphabet = draw(st.lists(st.integers(3, 1023), min_size=2, max_size=6, unique=True))
    prompts = [draw(st.lists(st.sampled_from(alphabet), min_size=1, max_size=30))
               for _ in range(draw(st.integers(1, 4)))]
    params = [draw(penalized_params()) for _ in prompts]
    for p in params:
        p.max_tokens = draw(st.integers(1, 24))
        p.min_tokens = min(p.min_tokens, p.max_tokens)
    return prompts, params


@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=repetitive_workloads(), k=st.integers(1, 6), lo=st.integers(1, 3), blocks=st.integers(24, 80),
       budget=st.integers(8, 40), max_num_seqs=st.integers(1, 4), prefix=st.booleans(), adaptive=st.booleans())
def test_ngram_speculation_keeps_the_references_tokens_and_logprobs(reference, workload, k, lo, blocks, budget,
                                                                     max_num_seqs, prefix, adaptive):
    """Greedy and seeded sampling (temperature, top-p, top-k, min-p), penalties, logit_bias, allowed ids,
    min_tokens, stop ids, n > 1 (forked blocks), prompt logprobs, a KV pool that preempts, a small step budget;
    every draft fed, or the adaptive policy's choice (measured on this machine, as it runs by default)."""
    prompts, params = workload
    expected = reference.generate(prompts, params)
    config = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": lo, "prompt_lookup_max": lo + 2,
              "enable_adaptive_verification": adaptive, "prompt_lookup_spec_factor": [None, 1, 2.0][k % 3]}
    llm, checked = spec_llm(config, blocks=blocks, budget=max(budget, max_num_seqs, k + 1),
                            max_num_seqs=max_num_seqs, enable_prefix_caching=prefix)
    same_outputs(llm.generate(prompts, params), expected)
    bm = llm.engine.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks and llm.stats.drafted_tokens == llm.spec_stats.drafted


def test_speculation_drafts_accepts_and_rejects_on_a_repetitive_workload(reference):
    """The property test above must be about speculation: here drafts are kept and rejected, with n > 1, seeded
    sampling, penalties and preemption in the same run."""
    prompts = [[5, 6, 7, 8] * 5, [9, 10] * 8, [11, 12, 13] * 4]
    params = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
              SamplingParams(temperature=0.8, top_p=0.9, seed=4, max_tokens=30, n=2, repetition_penalty=1.2),
              SamplingParams(temperature=1.0, top_k=5, min_p=0.05, seed=9, max_tokens=30, logit_bias={5: 4.0})]
    expected = reference.generate(prompts, params)
    llm, checked = spec_llm(blocks=30)
    same_outputs(llm.generate(prompts, params), expected)
    assert llm.spec_stats.accepted > 0 and checked.rejections > 0 and llm.stats.preemptions > 0
    assert max(llm.spec_stats.tokens_per_step().values()) > 1.0


@pytest.mark.parametrize("drafts", [{"num_speculative_tokens": 6},
                                    {"num_speculative_tokens": 2, "prediction_num_speculative_tokens": 16}])
def test_stops_inside_a_draft_end_the_request_where_one_token_at_a_time_would(reference, drafts):
    """The prediction is the reference's free-running answer, so whole drafts are right; a stop string, a stop id
    or max_tokens inside one cuts the kept run at that token. And EOS sampled where a draft goes on (the
    prediction continues past the answer's end) ends the request there. Drafts of 6, and of up to 16 (a
    prediction's own limit, past the method's 2)."""
    prompt = [5, 6, 7, 8]
    free = reference.generate([prompt], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
    ids = free.token_ids
    late = next(i for i, t in enumerate(ids) if i >= 4 and t not in ids[:i])  # a token first sampled late
    word = reference.tokenizer.decode([ids[late]])
    assert word.strip() and word not in reference.tokenizer.decode(ids[:late])
    cases = [(prompt, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[word]), free.text),
             (prompt, SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[ids[late]]), free.text),
             (prompt, SamplingParams(temperature=0, max_tokens=11, ignore_eos=True), free.text)]
    eos = SamplingParams(temperature=1.0, seed=1146, max_tokens=40)  # EOS at token 6 (found by search)
    ended = reference.generate([[40, 41, 42]], eos)[0]
    assert ended.token_ids[-1] == reference.config.eos_token_id and ended.finish_reason == "stop"
    cases.append(([40, 41, 42], eos, ended.text + " and then some more words"))
    for prompt, params, prediction in cases:
        params.prediction = prediction
        expected = reference.generate([prompt], params)
        llm, checked = spec_llm({"method": "ngram", **drafts, **ALWAYS})
        steps = llm.add_observer(Recorder())
        same_outputs(llm.generate([prompt], params), expected)
        finishing = [s for s in steps.seqs if s.finish_reason]
        assert llm.spec_stats.accepted > 0
        assert finishing and finishing[0].drafted > 0, "the request should end in a verify step"
    if "prediction_num_speculative_tokens" in drafts:  # the long drafts were fed, not only the method's 2
        assert max(s.drafted for s in steps.seqs) > 2


@settings(max_examples=examples(10), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), k=st.integers(3, 16), blocks=st.integers(24, 80), budget=st.integers(8, 40),
       max_num_seqs=st.integers(1, 3), prefix=st.booleans(), adaptive=st.booleans())
def test_long_prediction_drafts_keep_the_references_tokens(reference, data, k, blocks, budget, max_num_seqs, prefix,
                                                           adaptive):
    """Predictions drafting up to ``prediction_num_speculative_tokens`` (past the method's 2): each prediction is
    the reference's own answer with text inserted at a random place and more after its end, so long drafts are
    kept whole, cut at the edit, and cut by stops, EOS and max_tokens inside them; greedy and seeded sampling,
    penalties, n > 1, a small step budget, a KV pool that preempts, prefix hits; every draft fed, or the policy's."""
    head = data.draw(st.lists(st.integers(3, 1023), max_size=8))
    prompts = [head + data.draw(st.lists(st.integers(3, 1023), min_size=1, max_size=10))
               for _ in range(data.draw(st.integers(1, 3)))]
    params = [data.draw(penalized_params()) for _ in prompts]
    for p in params:
        p.max_tokens = data.draw(st.integers(1, 40))
        p.min_tokens = min(p.min_tokens, p.max_tokens)
    for p, free in zip(params, reference.generate(prompts, params)):
        text, at = free.outputs[0].text, data.draw(st.floats(0, 1))
        p.prediction = text[:int(at * len(text))] + data.draw(st.sampled_from(["", " so", "#"])) + \
            text[int(at * len(text)):] + " and then some more words"
        ids = free.outputs[0].token_ids
        if ids and data.draw(st.booleans()):  # a stop id where the answer has it: inside a draft
            p.stop_token_ids = [ids[data.draw(st.integers(0, len(ids) - 1))]]
    expected = reference.generate(prompts, params)
    config = {"method": "ngram", "num_speculative_tokens": 2, "prediction_num_speculative_tokens": k,
              "enable_adaptive_verification": adaptive}
    llm, checked = spec_llm(config, blocks=blocks, budget=max(budget, max_num_seqs, 3), max_num_seqs=max_num_seqs,
                            enable_prefix_caching=prefix)
    same_outputs(llm.generate(prompts, params), expected)
    bm = llm.engine.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks and llm.stats.drafted_tokens == llm.spec_stats.drafted


# ---- bad input --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("config, key", [
    ({"method": "eagle", "num_speculative_tokens": 2}, "speculative_config.method"),
    ({"method": "ngram"}, "speculative_config.num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "speculative_config.num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 17}, "speculative_config.num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": True}, "speculative_config.num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
     "speculative_config.prompt_lookup_min"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 0}, "speculative_config.prompt_lookup_min"),
    ({"method": "draft_model", "num_speculative_tokens": 2, "prompt_lookup_min": 2},
     "speculative_config.prompt_lookup_min"),
    ({"method": "ngram", "num_speculative_tokens": 2, "quantization": "int4"}, "speculative_config.quantization"),
    ({"method": "ngram", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 1},
     "speculative_config.draft_tensor_parallel_size"),
    ({"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 0},
     "speculative_config.disable_by_batch_size"),
    *(({"method": "ngram", "num_speculative_tokens": 2, "prediction_num_speculative_tokens": bad},
       "speculative_config.prediction_num_speculative_tokens") for bad in (0, 17, "8", True)),
    *(({"method": method, "num_speculative_tokens": 2, "prompt_lookup_spec_factor": bad},
       "speculative_config.prompt_lookup_spec_factor") for method, bad in (("ngram", 0), ("ngram", -1),
                                                                               ("ngram", 65), ("ngram", "2"),
                                                                               ("ngram", True), ("suffix", 2.0))),
    ("{not json", "speculative_config"), (["ngram"], "speculative_config"),
])
def test_a_bad_speculative_config_is_refused_naming_the_key(config, key):
    with pytest.raises(InvalidParam) as e:
        spec.LLM("tiny", dtype="bfloat16", speculative_config=config)
    assert e.value.param == key and key.split(".")[-1] in str(e.value)


def test_drafts_must_fit_a_step():
    with pytest.raises(InvalidParam, match="max_num_batched_tokens=4") as e:
        spec.LLM("tiny", dtype="bfloat16", max_num_seqs=4, max_num_batched_tokens=4,
                 speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    assert e.value.param == "speculative_config.num_speculative_tokens"


def test_a_prediction_that_is_not_text_is_refused():
    with pytest.raises(InvalidParam, match="prediction") as e:
        SamplingParams(prediction=["a", "b"])
    assert e.value.param == "prediction"


def test_predictions_keep_the_tokens_for_every_sample_and_count_what_they_drafted(reference, monkeypatch):
    """n = 2 seeded samples share one prediction (sample 0's answer with a word changed): each sample's tokens are
    the reference's, and each counts its own drafted and kept prediction tokens (`BySource`: the prediction's)."""
    prompt = [30, 31, 32, 33, 34]
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=11, max_tokens=30, n=2, presence_penalty=0.5)
    free = reference.generate([prompt], params)[0]
    params.prediction = free.outputs[0].text.replace(" ", "  ", 1)
    expected = reference.generate([prompt], params)
    llm, checked = spec_llm()
    source, steps = llm.add_observer(BySource(monkeypatch)), llm.add_observer(Recorder())
    same_outputs(llm.generate([prompt], params), expected)
    samples = list({s.seq_id: s.seq for s in steps.seqs}.values())
    assert len(samples) == 2 and samples[0].num_accepted_tokens > 0
    assert sum(s.num_drafted_tokens for s in samples) == source.counts[True][0]
    assert sum(s.num_accepted_tokens for s in samples) == source.counts[True][1]


def test_a_prediction_the_output_has_left_yields_to_the_methods_proposer(reference):
    """A prediction sharing no token with the answer drafts nothing; the n-gram lookup drafts for the request
    instead (the answer repeats its prompt), and the tokens are the reference's."""
    prompt, params = [5, 6, 7, 8] * 5, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    answer = reference.generate([prompt], params)[0].token_ids
    tok = reference.tokenizer
    params.prediction = next(text for text in (tok.decode([t]) * 20 for t in range(300, 1024))
                             if not set(tok.encode(text)) & set(answer))  # no token of it in the answer
    llm, checked = spec_llm()
    same_outputs(llm.generate([prompt], params), reference.generate([prompt], params))
    assert llm.spec_stats.drafted > 0


class BySource:
    """Each step's drafted and kept tokens, by who drafted them: the prediction (its `propose` gave the request a
    guess this step) or the method's proposer (every other verify step)."""

    def __init__(self, monkeypatch):
        self.predicted, self.counts = set(), {True: [0, 0], False: [0, 0]}  # from the prediction? -> drafted, kept
        propose = proposers.PredictionProposer.propose

        def recorded(proposer, seqs, ks):
            guesses = propose(proposer, seqs, ks)
            self.predicted |= {s.seq_id for s, g in zip(seqs, guesses) if len(g)}
            return guesses

        monkeypatch.setattr(proposers.PredictionProposer, "propose", recorded)

    def on_step(self, event):
        for s in event.seqs:
            counts = self.counts[s.seq_id in self.predicted]
            counts[0], counts[1] = counts[0] + s.drafted, counts[1] + s.accepted
        self.predicted = set()


def test_prediction_counts_leave_out_the_methods_drafts(reference, monkeypatch):
    """A prediction that holds for the answer's first tokens, then is wrong and lost: the n-gram lookup drafts on.
    OpenAI's accepted and rejected prediction tokens count the prediction's drafts alone, as recorded step by step."""
    prompt, params = [5, 6, 7, 8] * 5, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    answer = reference.generate([prompt], params)[0].token_ids
    tok = reference.tokenizer  # the prediction: the answer's first 4 tokens, then a token the answer lacks, 8 times
    params.prediction = next(tok.decode(ids) for ids in (answer[:4] + [t] * 8 for t in range(300, 1024))
                             if tok.encode(tok.decode(ids)) == ids and ids[-1] not in answer)
    llm, checked = spec_llm()
    source = llm.add_observer(BySource(monkeypatch))
    steps = llm.add_observer(Recorder())
    same_outputs(llm.generate([prompt], params), reference.generate([prompt], params))
    seq = steps.seqs[-1].seq
    (drafted, kept), (method_drafted, _) = source.counts[True], source.counts[False]
    assert drafted > kept > 0 and method_drafted > 0  # the prediction drafted and was rejected, then the method drafted
    assert (seq.num_drafted_tokens, seq.num_accepted_tokens) == (drafted, kept)


def test_prefix_hits_share_only_kept_tokens(reference):
    """Requests that share a head hit the prefix cache, across generate calls, while drafts are rejected; every
    cached block holds kept tokens (checked after every step) and the tokens are the reference's."""
    head = [7, 8, 9, 10, 7, 8, 9, 10, 11]
    prompts = [head + [12, 7, 8], head + [13], head + [7, 8, 9]]
    params = [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
              SamplingParams(temperature=0.7, seed=2, max_tokens=16),
              SamplingParams(temperature=0, max_tokens=18, frequency_penalty=0.4)]
    expected = reference.generate(prompts, params)
    llm, checked = spec_llm()
    same_outputs(llm.generate(prompts[:1], params[:1]), expected[:1])
    same_outputs(llm.generate(prompts, params), expected)
    assert llm.stats.prefix_hit_tokens > 0 and checked.rejections > 0


def kv_of(engine, seq):
    """The keys and values the target's cache holds for ``seq``'s computed tokens, in position order."""
    bs = engine.scheduler.block_manager.block_size
    pos = torch.arange(seq.num_cached_tokens)
    blocks = torch.tensor(engine.scheduler.block_manager.table(seq), dtype=torch.long)[pos // bs]
    return torch.cat([engine.cache.k[:, blocks, :, pos % bs], engine.cache.v[:, blocks, :, pos % bs]])


class KVSnapshots:
    def __init__(self, engine):
        self.engine, self.kv, self.after_rejection = engine, {}, set()

    def on_step(self, event):
        rejected = {s.seq_id for s in event.seqs if s.accepted < s.drafted}
        for seq in self.engine.scheduler.running:
            self.kv[(seq.index, seq.num_cached_tokens)] = kv_of(self.engine, seq).clone()
            if seq.seq_id in rejected:
                self.after_rejection.add((seq.index, seq.num_cached_tokens))


def test_the_kv_bytes_after_a_rejected_draft_are_plain_decodings():
    """After every step, what the cache holds for each request's computed tokens is bit for bit what stage 05
    (one token a step) holds at the same point, right after rejected drafts included (the slots they wrote are
    given back and written again by the tokens kept later)."""
    prompts = [[5, 6, 7, 8] * 3, [40, 41, 40, 42, 40]]
    params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
              SamplingParams(temperature=1.0, seed=5, max_tokens=20, ignore_eos=True)]
    base = streaming.LLM("tiny", dtype="bfloat16", block_size=4, max_num_seqs=2)
    plain = base.add_observer(KVSnapshots(base.engine))
    base.generate(prompts, params)
    llm, _ = spec_llm(max_num_seqs=2)
    drafted = llm.add_observer(KVSnapshots(llm.engine))
    llm.generate(prompts, params)
    assert drafted.after_rejection, "the test needs rejected drafts"
    for key, kv in drafted.kv.items():
        assert torch.equal(kv, plain.kv[key]), f"request {key[0]} at {key[1]} tokens"


def test_a_w4a8_draft_keeps_the_tokens(reference):
    """The draft's precision changes only what is proposed: a w4a8 copy (int4 weights, int8 activations) drafts
    and the target keeps the reference's tokens, greedy and sampled."""
    prompts = [[5, 6, 7, 8, 9], [100, 200, 300], [17, 99, 5, 301, 2]]
    params = [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
              SamplingParams(temperature=0.8, seed=3, max_tokens=16, n=2),
              SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)]
    llm, checked = spec_llm({"method": "draft_model", "num_speculative_tokens": 3, "quantization": "w4a8", **ALWAYS},
                            blocks=16)
    assert llm.engine.scheduler.proposers[-1].model.quantization == "w4a8"
    same_outputs(llm.generate(prompts, params), reference.generate(prompts, params))
    assert checked.verify_steps > 0


def test_the_draft_model_keeps_the_tokens_and_drafts_the_int4_models_own_greedy_answer(reference):
    """The int4 copy drafts greedily from its own paged KV cache, catching up on the kept tokens and rolling back
    its rejected drafts: each draft must be exactly the int4 model's one-request-at-a-time greedy continuation
    of the request's tokens (a stale or misplaced draft KV would change it). The target's tokens are the
    reference's, under preemption, with n = 2 and seeded sampling."""
    int4 = ReferenceLLM("tiny", dtype="bfloat16", quantization="int4")
    llm, checked, checked_drafts = drafts_checked_against(
        int4, reference, {"method": "draft_model", "num_speculative_tokens": 3, **ALWAYS})
    assert sum(checked_drafts) > 20 and llm.spec_stats.accepted > 0 and checked.rejections > 0
    assert llm.stats.preemptions > 0


def drafts_checked_against(oracle, reference, config):
    """Stage 06 with ``config`` (a draft model) on three requests (greedy, seeded n = 2, a penalty) in a 16-block
    pool that preempts: every draft must be ``oracle``'s one-request greedy continuation of the request's tokens,
    the draft's pool must audit clean after each pass, and the tokens must be ``reference``'s. Returns the engine,
    its verify checker and the draft lengths checked."""
    prompts = [[5, 6, 7, 8, 9], [100, 200, 300], [17, 99, 5, 301, 2]]
    params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
              SamplingParams(temperature=0.8, seed=3, max_tokens=16, n=2),
              SamplingParams(temperature=0, max_tokens=20, repetition_penalty=1.3)]
    expected = reference.generate(prompts, params)
    llm, checked = spec_llm(config, blocks=16)
    proposer = llm.engine.scheduler.proposers[-1]
    propose, checked_drafts = proposer.propose, []

    def oracle_checked(seqs, ks):
        drafts = propose(seqs, ks)
        for seq, k, draft in zip(seqs, ks, drafts):
            want = oracle.generate([seq.token_ids], SamplingParams(temperature=0, max_tokens=k, ignore_eos=True))[0]
            assert draft == want.token_ids[:len(draft)], (seq.token_ids, draft, want.token_ids)
            checked_drafts.append(len(draft))
        proposer.block_manager.audit([state for _, state in proposer.states.values()])
        return drafts

    proposer.propose = oracle_checked
    same_outputs(llm.generate(prompts, params), expected)
    return llm, checked, checked_drafts


def test_the_shared_command_line_and_the_ladder_run_stage_06_with_speculation_on(reference):
    from stages.cli import STAGE_NAMES, make_llm, parser
    args = parser("stage 06").parse_args(["--model", "tiny", "--max-num-seqs", "2", "--block-size", "4"])
    llm = make_llm("stages.06_speculative", args)
    assert STAGE_NAMES["stages.06_speculative"] == "06 speculative"
    assert llm.engine_config.speculative == spec.SpeculativeConfig.parse(spec.STAGE_DEFAULT)
    prompts, params = [[5, 6, 7, 5, 6, 7, 5, 6]], [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)]
    same_outputs(llm.generate(prompts, params), reference.generate(prompts, params))
    assert llm.engine.scheduler.policy.counts["proposed"] > 0  # fed or not, as the policy finds rows cost here


@pytest.mark.real_model
@pytest.mark.parametrize("config", [{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2},
                                    {"method": "draft_model", "num_speculative_tokens": 3}],
                         ids=["ngram", "int4 draft"])
def test_on_smollm2_every_proposer_keeps_the_references_tokens(config):
    """SmolLM2-135M in bfloat16: an edit with its original as prediction, an extraction (n-gram), a seeded chat
    answer; the int4 draft model drafts for bfloat16. Drafts are kept, and every token is the reference's."""
    ours = importlib.import_module("stages.speculative.workloads")
    ref = ReferenceLLM(DEFAULT_MODEL, dtype="bfloat16")
    tok, text = ref.tokenizer, ours.TEXTS[0]
    prompts = [ours.request(tok, ours.EDITS[3], text), ours.request(tok, ours.EXTRACTS[0], ours.TEXTS[1]),
               tok.encode_chat([{"role": "user", "content": "Why is the sky blue?"}])]
    params = [SamplingParams(temperature=0, max_tokens=40, prediction=text),
              SamplingParams(temperature=0, max_tokens=40),
              SamplingParams(temperature=0.7, top_p=0.9, seed=1, max_tokens=24)]
    expected = ref.generate(prompts, params)
    llm = spec.LLM(DEFAULT_MODEL, dtype="bfloat16", max_num_seqs=3, speculative_config={**config, **ALWAYS})
    same_outputs(llm.generate(prompts, params), expected)
    assert llm.spec_stats.accepted > 10 and llm.spec_stats.mean_tokens_per_step > 1.2


def test_disable_by_batch_size_drafts_only_while_few_requests_run(reference):
    """vLLM's disable_by_batch_size: while more requests than that run, no step drafts (the crossover, as a knob)."""
    prompts = [[5, 6, 7, 8] * 3, [9, 10] * 6, [11, 12, 13] * 4]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (30, 12, 8)]
    llm, checked = spec_llm({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                             "disable_by_batch_size": 1, **ALWAYS})
    events = llm.add_observer(type("Events", (list,), {"on_step": lambda self, e: self.append(e)})())
    same_outputs(llm.generate(prompts, params), reference.generate(prompts, params))
    drafting = [e for e in events if any(s.drafted for s in e.seqs)]
    assert drafting and llm.spec_stats.drafted > 0
    assert all(e.state.num_in_step - len(e.admitted) <= 1 for e in drafting)  # running before the step: one
    assert any(e.state.num_in_step > 1 for e in events)
