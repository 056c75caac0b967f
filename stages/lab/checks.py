"""The graders of stages 01-03 (each task's property against the one-request-at-a-time reference), and
``CHECKS``, every task's grader.

A check gets a ``Variant`` (the stage's source with the learner's body of that task spliced in) and raises on the
first thing wrong, saying which request, what the reference produced and what the learner's stage did. Each one
runs a fixed scenario built to exercise its task first (a fast, readable failure), then a few hypothesis examples,
derandomized so that the verdict is the same on every run; hypothesis shrinks a failure to its smallest example.
"""
from __future__ import annotations


from hypothesis import given, strategies as st

from common import SamplingParams
from stages import paged_kv
from stages.workloads import TOY_LENGTHS, continuous_steps, static_steps, toy

from .checks_server import check_05_3
from .checks_spec import check_06_1, check_06_2
from .checks_structured import check_07_1
from .checks_text import check_04_1, check_05_1, check_05_2
from .examples import hypothesis, reference
from .xray import watch

BLOCK = 4  # stage 03's block size in the checks: small, so that short prompts span several blocks


def describe_params(p: SamplingParams) -> str:
    how = "greedy" if p.temperature == 0 else f"temperature {p.temperature}, seed {p.seed}"
    return f"max_tokens={p.max_tokens}, {how}" + (", ignore_eos" if p.ignore_eos else "")


def same_tokens(outs, prompts, params) -> list:
    """Assert each output is the reference's; return the reference's outputs."""
    expected = reference().generate(prompts, params)
    for i, (prompt, p, e, g) in enumerate(zip(prompts, params, expected, outs)):
        if (g.token_ids, g.finish_reason) != (e.token_ids, e.finish_reason):
            k = next((k for k, (a, b) in enumerate(zip(e.token_ids, g.token_ids)) if a != b),
                     min(len(e.token_ids), len(g.token_ids)))
            raise AssertionError(
                f"request {i} of {len(prompts)} (prompt {clip(prompt)}, {describe_params(p)}): output tokens differ "
                f"from token {k} on: expected {clip(e.token_ids[k:])} ({len(e.token_ids)} tokens, {e.finish_reason}), "
                f"produced {clip(g.token_ids[k:])} ({len(g.token_ids)} tokens, {g.finish_reason}"
                f"{': ' + g.error if g.error else ''})")
    return expected


def clip(tokens: list[int], n: int = 12) -> str:
    return str(tokens) if len(tokens) <= n else f"[{', '.join(map(str, tokens[:n]))}, ... (+{len(tokens) - n})]"


@st.composite
def workload(draw, max_requests=6, max_prompt=20, max_tokens=12, system=None):
    sys_prompt, n = draw(system) if system is not None else [], draw(st.integers(1, max_requests))
    prompts = [sys_prompt + draw(st.lists(st.integers(3, 1023), min_size=1, max_size=max_prompt)) for _ in range(n)]
    params = []
    for _ in range(n):
        greedy = draw(st.booleans())
        params.append(SamplingParams(max_tokens=draw(st.integers(1, max_tokens)), ignore_eos=draw(st.booleans()),
                                     temperature=0.0 if greedy else 0.8,
                                     seed=None if greedy else draw(st.integers(0, 2**31))))
    return prompts, params


# ---- stages 01 and 02: scheduling -----------------------------------------------------------------------------
def scheduling(v, want_toy: int, oracle, name: str) -> None:
    LLM = v.module("engine").LLM
    prompts, params = toy()
    llm = watch(LLM("tiny", dtype="bfloat16", max_num_seqs=4))
    same_tokens(llm.generate(prompts, params), prompts, params)
    assert llm.stats.steps == want_toy, (f"the toy run (output lengths {TOY_LENGTHS}, 4 slots) took "
                                         f"{llm.stats.steps} steps; {name} takes {want_toy}")

    @hypothesis(6)
    @given(workload=workload(), max_num_seqs=st.integers(1, 4))
    def same_tokens_and_steps(workload, max_num_seqs):
        prompts, params = workload
        llm = watch(LLM("tiny", dtype="bfloat16", max_num_seqs=max_num_seqs))
        expected = same_tokens(llm.generate(prompts, params), prompts, params)
        lengths = [len(e.token_ids) for e in expected]
        want = oracle(lengths, max_num_seqs)
        assert llm.stats.steps == want, (f"{len(prompts)} requests with output lengths {lengths} in {max_num_seqs} "
                                         f"slots took {llm.stats.steps} steps; {name} takes {want}")

    same_tokens_and_steps()


def check_01_1(v) -> None:
    scheduling(v, 160, static_steps, "static batching")


def check_02_1(v) -> None:
    scheduling(v, 112, continuous_steps, "continuous batching")


# ---- stage 03: paging, prefix caching, preemption ---------------------------------------------------------------
def paged_llm(v, num_blocks: int, max_num_seqs: int, token_budget: int = 64):
    per_block = BLOCK * reference().config.kv_bytes_per_token(2)  # bfloat16
    llm = v.module("engine").LLM("tiny", dtype="bfloat16", max_num_seqs=max_num_seqs, block_size=BLOCK,
                                 kv_cache_memory_bytes=num_blocks * per_block, max_num_batched_tokens=token_budget)
    llm.add_observer(paged_kv.BlockAudit(llm.engine))
    return watch(llm)


def paged_run(llm, prompts, params, outs=None) -> list:
    outs = llm.generate(prompts, params) if outs is None else outs
    bm = llm.engine.scheduler.block_manager
    assert not bm.tables and bm.num_free_blocks == bm.num_blocks, (
        f"after every request finished, {bm.num_blocks - bm.num_free_blocks} of {bm.num_blocks} blocks are still "
        f"held (block tables: {dict(bm.tables)})")
    return same_tokens(outs, prompts, params)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


SYSTEM = [101, 102, 103, 104, 105, 106, 107, 108, 109]  # two full blocks and one token


def paging(v) -> None:
    """Shared prompts (in use and revived from the free list), multi-block prefills, then preemption; then
    hypothesis workloads under a tight pool."""
    llm = paged_llm(v, 40, 2)
    tails = [[7], [8, 9, 10, 11, 12], [13, 14], [15, 16, 17, 18, 19, 20, 21], [22], [23, 24, 25]]
    lengths = [6, 2, 9, 3, 5, 4]
    prompts = [SYSTEM + t for t in tails]
    paged_run(llm, prompts, [greedy(n) for n in lengths])
    paged_run(llm, [SYSTEM + [30, 31]], [greedy(3)])  # revives cached blocks
    llm = paged_llm(v, 10, 3)
    prompts, params = [[40 + i] * 6 for i in range(3)], [greedy(14)] * 3
    paged_run(llm, prompts, params)
    assert llm.stats.preemptions > 0, "3 requests of 20 tokens in a pool of 40 must preempt"

    @hypothesis(5)
    @given(workload=workload(system=st.sampled_from([[], SYSTEM])), num_blocks=st.integers(12, 24),
           max_num_seqs=st.integers(1, 4))
    def same_tokens_and_accounting(workload, num_blocks, max_num_seqs):
        paged_run(paged_llm(v, num_blocks, max_num_seqs), *workload)

    same_tokens_and_accounting()


def expected_hit_tokens(prompt: list[int], history: list[list[int]]) -> int:
    """Prompt tokens an earlier request's cached blocks hold: the full blocks at the start of ``prompt`` equal to
    those of an earlier request's computed tokens (all but its last), at most all but the prompt's last token."""
    best, limit = 0, (len(prompt) - 1) // BLOCK
    for q in history:
        k, n = 0, min(limit, (len(q) - 1) // BLOCK)
        while k < n and prompt[k * BLOCK:(k + 1) * BLOCK] == q[k * BLOCK:(k + 1) * BLOCK]:
            k += 1
        best = max(best, k)
    return best * BLOCK


A, B, C = [11, 12, 13, 14], [21, 22, 23, 24], [31, 32, 33, 34]


def prefix_hits(v, prompts, max_tokens) -> None:
    """One request at a time into one engine (a pool that never evicts): hits must be what the prompts share."""
    llm, history = paged_llm(v, 96, 2), []
    cache = llm.engine.scheduler.prefix_cache
    for i, (prompt, n) in enumerate(zip(prompts, max_tokens)):
        before = cache.hit_tokens
        outs = llm.generate([prompt], [greedy(n)])
        want, got = expected_hit_tokens(prompt, history), cache.hit_tokens - before
        assert got == want, (f"request {i} (prompt {prompt}) found {got} prompt tokens in the prefix cache; after "
                             f"the requests {history} it shares {want}")
        out = paged_run(llm, [prompt], [greedy(n)], outs)[0]
        history.append(prompt + out.token_ids)


def check_03_4(v) -> None:
    prefix_hits(v, [A + B + [5], B + A + [6], A + B + C + [7], A + C + [8], C + [9]], [2, 3, 2, 2, 2])

    @hypothesis(5)
    @given(st.lists(st.tuples(st.lists(st.sampled_from([A, B, C]), max_size=3),
                              st.lists(st.integers(3, 1023), min_size=1, max_size=3), st.integers(1, 5)),
                    min_size=2, max_size=5))
    def hits_match_shared_prefixes(requests):
        prefix_hits(v, [sum(blocks, []) + tail for blocks, tail, _ in requests], [n for *_, n in requests])

    hits_match_shared_prefixes()


CHECKS = {"01.1": check_01_1, "02.1": check_02_1, "03.1": paging, "03.2": paging, "03.3": paging,
          "03.4": check_03_4, "03.5": paging, "04.1": check_04_1, "05.1": check_05_1, "05.2": check_05_2,
          "05.3": check_05_3, "06.1": check_06_1, "06.2": check_06_2, "07.1": check_07_1}
