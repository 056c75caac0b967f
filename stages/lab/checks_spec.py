"""The graders of stage 06: the n-gram lookup against a brute-force search of vLLM's rule, the draft caps against
the lesson's arithmetic at every step, and both inside the stage's engine against the reference's tokens (the
block audit after every step, and no preemption caused by a draft)."""
from __future__ import annotations

import importlib
import types

from hypothesis import given, strategies as st

from common import SamplingParams
from common.llm import LLM as FrontEnd
from stages import paged_kv

from .examples import hypothesis, reference

BLOCK = 4


def brute_force_lookup(tokens: list[int], min_n: int, max_n: int, k: int, factor: float | None = None) -> list[int]:
    """vLLM's rule spelled out: the longest n in [min_n, max_n] whose last n tokens occur earlier, ending before the
    last token; the first such occurrence; the (up to) k tokens after it, and with ``factor`` at most factor x n."""
    for n in range(max_n, min_n - 1, -1):
        for start in range(len(tokens) - n):
            if tokens[start:start + n] == tokens[len(tokens) - n:]:
                most = k if factor is None else min(k, int(factor * n + 1e-6))
                return tokens[start + n:start + n + most]
    return []


def check_lookup(lookup, tokens, min_n, max_n, k, factor=None) -> None:
    want, got = brute_force_lookup(tokens, min_n, max_n, k, factor), list(lookup(tokens, min_n, max_n, k, factor))
    assert got == want, (f"ngram_lookup({tokens}, min_n={min_n}, max_n={max_n}, k={k}, factor={factor}) returned "
                         f"{got}; vLLM's rule (the longest recurring suffix, its first occurrence; with a factor, at "
                         f"most factor x its length) proposes {want}")


def spec_llm(v, num_blocks: int, max_num_seqs: int, budget: int, k: int = 4):
    per_block = BLOCK * reference().config.kv_bytes_per_token(2)
    config = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
              "enable_adaptive_verification": False}  # every draft fed: the caps are what is graded
    llm = v.module("engine").LLM("tiny", dtype="bfloat16", max_num_seqs=max_num_seqs, block_size=BLOCK,
                                 kv_cache_memory_bytes=num_blocks * per_block, max_num_batched_tokens=budget,
                                 speculative_config=config)
    llm.add_observer(paged_kv.BlockAudit(llm.engine))
    return llm


def same_tokens(llm, prompts, params) -> None:
    expected = reference().generate(prompts, params)
    # Stepped by the shared front end's loop: stage 05's streaming loop would turn an exception into an "error" output.
    llm.front._run = types.MethodType(FrontEnd._run, llm.front)  # stage 06's LLM holds stage 05's (front.py)
    for i, (e, g) in enumerate(zip(expected, llm.generate(prompts, params))):
        assert (g.token_ids, g.finish_reason) == (e.token_ids, e.finish_reason), (
            f"request {i} (prompt {prompts[i]}, max_tokens={params[i].max_tokens}): with speculation the tokens are "
            f"{g.token_ids} ({g.finish_reason}); the reference gives {e.token_ids} ({e.finish_reason})")


REPEATS = [[5, 6, 7, 8] * 4, [9, 10] * 6, [11, 12, 13] * 3 + [11]]


def check_06_1(v) -> None:
    lookup = v.module("proposers").ngram_lookup
    for case in [([1, 2, 3, 4, 2, 3], 2, 3, 4), ([1, 2, 3, 9, 2, 3, 7, 3], 1, 2, 3), ([5, 6, 1, 5, 6, 2, 6], 1, 3, 2),
                 ([1, 2, 3, 4, 5], 1, 3, 4), ([7, 7, 7, 7], 2, 2, 5), ([4], 1, 2, 3)]:
        check_lookup(lookup, *case)

    for case in [([1, 2, 3, 9, 1, 2, 3, 4, 5, 6, 1, 2, 3], 1, 3, 8, 2.0), ([1, 5, 6, 7, 1], 1, 2, 3, 2.0),
                 ([1, 5, 6, 7, 1], 1, 2, 3, 0.5)]:  # a 3-token match drafts 6 of 8; a 1-token one 2; 0.5 x 1: none
        check_lookup(lookup, *case)

    @hypothesis(60)
    @given(tokens=st.lists(st.integers(0, 3), min_size=1, max_size=16), min_n=st.integers(1, 3),
           span=st.integers(0, 2), k=st.integers(1, 5), factor=st.sampled_from([None, 0.5, 1.0, 1.5, 2.0]))
    def matches_the_rule(tokens, min_n, span, k, factor):
        check_lookup(lookup, tokens, min_n, min_n + span, k, factor)

    matches_the_rule()
    llm = spec_llm(v, 60, 3, 32)
    same_tokens(llm, REPEATS, [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)] * 3)
    assert llm.spec_stats.accepted > 0, "repetitive prompts, greedy: some n-gram draft must be kept"


def oracle_caps(s, k: int) -> dict[int, int]:
    """The lesson's arithmetic for one step of scheduler ``s`` drafting up to ``k`` tokens: per decoding request,
    its draft cap."""
    bm, budget, free, caps = s.block_manager, s.max_num_batched_tokens, s.block_manager.num_free_blocks, {}
    for seq in s.running:
        n = seq.num_new_tokens
        own = n if n <= budget else budget if s.chunked_prefill else 0
        if own == 0:
            break
        drafts = 0
        if n == 1:
            left = min(seq.params.max_tokens - len(seq.output_token_ids), seq.max_len - len(seq))
            drafts = max(0, min(k, budget - 1, left - 1))
            while drafts and bm.blocks_needed(seq, 1 + drafts) > free:
                drafts -= 1
            caps[seq.seq_id] = drafts
        free -= bm.blocks_needed(seq, own + drafts)
        budget -= own + drafts
    return caps


def check_06_2(v) -> None:
    scheduler_class = v.module("scheduler").SpeculativeScheduler
    paged_scheduler = importlib.import_module("stages.paged_kv.scheduler")
    make_room, caps_of = paged_scheduler.make_room, scheduler_class.draft_caps

    def checked_room(seq, n, running, waiting, bm):
        assert not seq.spec_token_ids or bm.can_append(seq, n), (
            f"a request with {len(seq.spec_token_ids)} draft tokens needed {bm.blocks_needed(seq, n)} blocks with "
            f"{bm.num_free_blocks} free: its drafts made the scheduler preempt another request")
        return make_room(seq, n, running, waiting, bm)

    def checked_caps(self):
        k = max(p.k for p in self.proposers)  # the method's num_speculative_tokens
        got, want = caps_of(self), oracle_caps(self, k)
        got = {i: k for i, k in got.items() if k} if isinstance(got, dict) else got
        want = {i: k for i, k in want.items() if k}
        assert got == want, (
            f"draft caps {got} (seq_id: drafts) for the running requests "
            f"{[(s.seq_id, s.num_new_tokens, len(s.output_token_ids), s.params.max_tokens) for s in self.running]} "
            f"(seq_id, tokens to feed, output so far, max_tokens) with budget {self.max_num_batched_tokens}, "
            f"{self.block_manager.num_free_blocks} free blocks, num_speculative_tokens {k}; "
            f"expected {want}")
        return got

    paged_scheduler.make_room, scheduler_class.draft_caps = checked_room, checked_caps
    try:
        llm = spec_llm(v, 60, 3, 32)
        same_tokens(llm, REPEATS, [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (9, 14, 5)])
        llm = spec_llm(v, 14, 3, 8, k=6)  # a tight pool and a small step: the blocks and the budget bind
        same_tokens(llm, REPEATS, [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)] * 3)

        @hypothesis(4)
        @given(lengths=st.lists(st.integers(1, 16), min_size=1, max_size=4), blocks=st.integers(12, 40),
               budget=st.integers(7, 24))
        def caps_hold(lengths, blocks, budget):
            prompts = [REPEATS[i % 3][:4 + i] for i in range(len(lengths))]
            same_tokens(spec_llm(v, blocks, 3, budget), prompts,
                        [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths])

        caps_hold()
    finally:
        paged_scheduler.make_room, scheduler_class.draft_caps = make_room, caps_of
