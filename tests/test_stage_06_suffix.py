"""Stage 06's suffix decoding (suffix.py): the tree against a brute-force count of the text's stretches, its drafts
against a brute-force scan of the texts by Arctic's rule, its memory bounded whatever it is fed, its keys checked,
and every token the reference's whatever it drafts."""
import importlib
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from common import ReferenceLLM, SamplingParams
from common.validate import InvalidParam
from test_stage_06_speculative import (  # noqa: F401  (drafts_never_preempt: the autouse fixture, here too)
    drafts_never_preempt, repetitive_workloads, same_outputs, spec_llm)
from workloads import examples

suffix = importlib.import_module("stages.speculative.suffix")
spec = importlib.import_module("stages.06_speculative")
SUFFIX = {"method": "suffix", "num_speculative_tokens": 6, "enable_adaptive_verification": False}


@pytest.fixture(scope="module")
def reference():
    return ReferenceLLM("tiny", dtype="bfloat16")


def paths(tree):
    """Every path from the root (a tuple of tokens) -> its count."""
    found, stack = {}, [((), tree.root)]
    while stack:
        path, node = stack.pop()
        for token, child in node.children.items():
            found[path + (token,)] = child.count
            stack.append((path + (token,), child))
    return found


def brute_force(texts, depth):
    """How many times each stretch of 1 to ``depth`` tokens occurs in the texts."""
    return dict(Counter(tuple(t[i:j]) for t in texts for i in range(len(t))
                        for j in range(i + 1, min(i + depth, len(t)) + 1)))


@settings(max_examples=examples(200), deadline=None)
@given(texts=st.lists(st.lists(st.integers(0, 3), max_size=20), min_size=1, max_size=5), depth=st.integers(2, 6),
       cuts=st.lists(st.integers(0, 20), min_size=5, max_size=5))
def test_the_tree_counts_every_stretch_grown_token_by_token_or_whole(texts, depth, cuts):
    whole = suffix.SuffixTree(depth)
    for text, cut in zip(texts, cuts):
        whole.add(text)
        own = suffix.SuffixTree(depth)  # a request's tree grows as its tokens are kept
        own.extend(text[:min(cut, len(text))], 0)
        own.extend(text, min(cut, len(text)))
        assert paths(own) == brute_force([text], depth)
    assert paths(whole) == brute_force(texts, depth)


def test_a_draft_is_the_best_scoring_over_every_match_length():
    tree = suffix.SuffixTree(4)
    tree.add([1, 2, 3, 1, 2, 4, 1, 2, 3])
    # [2] occurs 3 times: followed by 3 twice (2/3), then [2, 3] by 1 once of its 2 occurrences (2/3 x 1/2): score 1;
    # [1, 2] the same, 1 again: a tie goes to the longer match
    assert tree.speculate([9, 1, 2], 4, 2.0, 0.1) == ([3, 1], pytest.approx(1.0), 2)
    assert tree.speculate([9, 1, 2], 4, 2.0, 0.5) == ([3], pytest.approx(2 / 3), 2)  # 1/3 < min_token_prob
    assert tree.speculate([9, 1, 2], 4, 0.5, 0.1) == ([3], pytest.approx(2 / 3), 2)  # 0.5 x 2 tokens matched
    assert tree.speculate([9, 1, 2], 4, 2.0, 0.7).tokens == []
    assert tree.speculate([7, 7], 4, 2.0, 0.1) == ([], 0.0, 0)  # nothing matches
    text = [1, 2, 4, 6, 1, 2, 5, 7] + [2, 3] * 18 + [1, 2]
    tree = suffix.SuffixTree(4)
    tree.add(text)
    # [1, 2]: 3 times (this one included), then 4 once: 1/3 + 1/3; [2]: 21 times, then 3 18 times: 18/21 wins
    assert tree.speculate(text, 4, 1.0, 0.1) == ([3], pytest.approx(18 / 21), 1)


def occurrences(texts, pattern, depth):
    """Where ``pattern`` (at most ``depth`` tokens) occurs: (text, end) in the order the texts were fed."""
    n = len(pattern)
    return [(t, i + n) for t, text in enumerate(texts) for i in range(len(text) - n + 1)
            if n <= depth and text[i:i + n] == pattern]


def brute_force_speculate(texts, context, depth, k, factor, min_prob):
    """Arctic's rule by scanning the texts: for each match length 1, 2, ... (< the last ``depth`` tokens) while the
    context's suffix occurs, follow the most frequent next token (a tie: the one that occurred first) with
    probability count(path + token) / count(path), keep the best sum of probabilities (a tie: the longer)."""
    context = context[-depth:]
    best = ([], 0.0, 0)
    for n in range(1, len(context)):
        path = list(context[-n:])
        if not occurrences(texts, path, depth):
            break
        draft, prob, score = [], 1.0, 0.0
        while len(draft) < min(k, int(n * factor + 1e-6)):
            nexts = Counter(texts[t][end] for t, end in occurrences(texts, path, depth - 1) if end < len(texts[t]))
            if not nexts:
                break
            token = max(nexts, key=nexts.get)  # Counter keeps first-seen order: the earliest among equals
            prob *= nexts[token] / len(occurrences(texts, path, depth))
            if prob < min_prob:
                break
            draft.append(token)
            score += prob
            path.append(token)
        if score >= best[1]:
            best = (draft, score, n)
    return best


@settings(max_examples=examples(300), deadline=None)
@given(texts=st.lists(st.lists(st.integers(0, 3), max_size=16), min_size=1, max_size=4),
       context=st.lists(st.integers(0, 3), max_size=10), depth=st.integers(2, 7), k=st.integers(0, 8),
       factor=st.sampled_from([0.5, 1.0, 1.5, 3.0]), min_prob=st.sampled_from([0.0, 0.1, 0.3, 0.6]))
def test_speculate_equals_a_brute_force_scan_of_the_texts(texts, context, depth, k, factor, min_prob):
    tree = suffix.SuffixTree(depth)
    for text in texts:
        tree.add(text)
    assert tuple(tree.speculate(context, k, factor, min_prob)) == brute_force_speculate(texts, context, depth, k,
                                                                                        factor, min_prob)


class FakeSeq:
    """What the proposer reads of a request."""

    def __init__(self, seq_id, prompt):
        self.seq_id, self.prompt_token_ids, self.output_token_ids, self.is_finished = seq_id, prompt, [], False

    @property
    def token_ids(self):
        return self.prompt_token_ids + self.output_token_ids


@settings(max_examples=examples(100), deadline=None)
@given(requests=st.lists(st.tuples(st.lists(st.integers(0, 3), max_size=10), st.lists(st.integers(0, 3), max_size=12),
                                   st.integers(1, 4)), min_size=1, max_size=4),
       depth=st.integers(2, 6), k=st.integers(1, 6))
def test_the_proposer_drafts_from_its_own_text_or_every_answer_so_far_whichever_scores_more(requests, depth, k):
    """Requests one after another, their answers growing a few tokens a step: each draft is the better of the
    brute-force draft over the request's prompt and output and over the answers so far, its own included."""
    proposer = suffix.SuffixProposer(k=k, depth=depth, max_cached_requests=10, factor=1.0, min_prob=0.1)
    answers = []
    for seq_id, (prompt, answer, chunk) in enumerate(requests):
        seq = FakeSeq(seq_id, prompt)
        for cut in [*range(0, len(answer), chunk), len(answer)]:
            seq.output_token_ids = answer[:cut]
            mine = brute_force_speculate([seq.token_ids], seq.token_ids, depth, k, 1.0, 0.1)
            earlier = brute_force_speculate(answers + [seq.output_token_ids], seq.token_ids, depth, k, 1.0, 0.1)
            assert proposer.propose([seq], [k]) == [(mine if mine[1] >= earlier[1] else earlier)[0]]
        seq.is_finished = True
        answers.append(answer)
    proposer.propose([], [])
    assert proposer.own == {} and paths(proposer.tree) == brute_force(answers, depth)


def test_the_global_tree_is_bounded_and_holds_exactly_the_latest_answers():
    """Far more answers than the limit, each counted as it grows: the tree holds exactly the last
    ``max_cached_requests`` answers' stretches (the oldest taken back out when a new request comes), so its size
    stays bounded, and no finished request's own tree is kept."""
    proposer = suffix.SuffixProposer(k=4, depth=5, max_cached_requests=3, factor=1.0, min_prob=0.1)
    answers = [[(i * 7 + j * 3) % 50 for j in range(40)] for i in range(200)]
    biggest = 0
    for i, answer in enumerate(answers):
        seq = FakeSeq(i, [1, 2, 3])
        for cut in range(0, 41, 8):
            seq.output_token_ids = answer[:cut]
            proposer.propose([seq], [4])
            biggest = max(biggest, 1 + len(paths(proposer.tree)))  # its nodes, the root among them
        seq.is_finished = True
        assert len(proposer.own) == 1 and len(proposer.cached) <= 3
    proposer.propose([], [])
    assert proposer.own == {} and paths(proposer.tree) == brute_force(answers[-3:], 5)
    assert biggest <= 1 + 3 * 40 * 5  # 3 answers of 40 tokens, 5 nodes per stretch at most


@pytest.mark.parametrize("key, value", [("suffix_decoding_max_tree_depth", 1), ("suffix_decoding_max_tree_depth", 1.5),
                                        ("suffix_decoding_max_cached_requests", -1),
                                        ("suffix_decoding_max_spec_factor", 0),
                                        ("suffix_decoding_max_spec_factor", "2"),
                                        ("suffix_decoding_min_token_prob", 1.5),
                                        ("suffix_decoding_min_token_prob", True)])
def test_an_out_of_range_suffix_key_is_refused_naming_it(key, value):
    with pytest.raises(InvalidParam) as e:
        spec.LLM("tiny", dtype="bfloat16", speculative_config={"method": "suffix", "num_speculative_tokens": 4,
                                                               key: value})
    assert e.value.param == f"speculative_config.{key}" and key in str(e.value)


def test_a_suffix_key_for_another_method_is_refused():
    with pytest.raises(InvalidParam) as e:
        spec.SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 4,
                                      "suffix_decoding_min_token_prob": 0.2})
    assert e.value.param == "speculative_config.suffix_decoding_min_token_prob"


@settings(max_examples=examples(4), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=repetitive_workloads(), k=st.integers(1, 6), blocks=st.integers(24, 80), budget=st.integers(8, 40),
       max_num_seqs=st.integers(1, 4), adaptive=st.booleans(), depth=st.integers(2, 8))
def test_suffix_drafts_keep_the_references_tokens_and_logprobs(reference, workload, k, blocks, budget, max_num_seqs,
                                                                adaptive, depth):
    """Greedy and seeded sampling, penalties, stop ids, n > 1, a pool that preempts; drafts from the request's own
    tree and (across the two generate calls) from the global tree of earlier answers."""
    prompts, params = workload
    expected = reference.generate(prompts, params)
    config = {"method": "suffix", "num_speculative_tokens": k, "enable_adaptive_verification": adaptive,
              "suffix_decoding_max_tree_depth": depth, "suffix_decoding_max_cached_requests": 2}
    llm, _ = spec_llm(config, blocks=blocks, budget=max(budget, max_num_seqs, k + 1), max_num_seqs=max_num_seqs)
    same_outputs(llm.generate(prompts, params), expected)
    same_outputs(llm.generate(prompts, params), expected)
    bm = llm.engine.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_suffix_drafts_are_kept_rejected_and_cut_by_stops_and_eos(reference):
    prompts = [[5, 6, 7, 8] * 5, [9, 10] * 8, [11, 12, 13] * 4]
    params = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
              SamplingParams(temperature=0.8, top_p=0.9, seed=4, max_tokens=30, n=2, repetition_penalty=1.2),
              SamplingParams(temperature=1.0, seed=1146, max_tokens=40)]
    free = reference.generate(prompts[:1], params[:1])[0].token_ids
    params.append(SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[free[9]]))
    prompts.append(prompts[0])
    expected = reference.generate(prompts, params)
    llm, checked = spec_llm(SUFFIX, blocks=30)
    same_outputs(llm.generate(prompts, params), expected)
    assert llm.spec_stats.accepted > 0 and checked.rejections > 0 and llm.stats.preemptions > 0
    again = llm.generate(prompts[:1], params[:1])  # the same request again: its answer is in the global tree
    same_outputs(again, expected[:1])
    assert llm.spec_stats.mean_tokens_per_step > 2.5
