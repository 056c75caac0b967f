"""Stage 03 against the reference: same tokens under small KV budgets (preemption), shared prefixes
(prefix caching) and chunked prefill; KV accounting; bad input."""
import importlib
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from common import ReferenceLLM, SamplingParams
from workloads import TINY_VOCAB, checked_steps, examples, finish_problems, sampling_params

paged = importlib.import_module("stages.03_paged_kv")
TINY_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 2  # layers x KV heads x head size x bf16, keys and values


@pytest.fixture(scope="module")
def reference():
    return ReferenceLLM("tiny", dtype="bfloat16")


@st.composite
def shared_prefix_workloads(draw, max_requests=8):
    """Prompts that often start with one of two shared prefixes (a system prompt, a few-shot header)."""
    tokens = st.integers(3, TINY_VOCAB - 1)
    prefixes = [draw(st.lists(tokens, min_size=0, max_size=70)) for _ in range(2)]
    n = draw(st.integers(1, max_requests))
    prompts = []
    for _ in range(n):
        head = draw(st.sampled_from(prefixes + [[]]))
        tail = draw(st.lists(tokens, min_size=0 if head else 1, max_size=60))
        prompts.append(head + tail if head + tail else [7])
    if draw(st.booleans()) and n > 1:
        prompts[-1] = list(prompts[0])  # the same prompt twice: fully cached the second time
    return prompts, [draw(sampling_params()) for _ in range(n)]


@settings(max_examples=examples(35), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=shared_prefix_workloads(), block_size=st.sampled_from([1, 4, 16]),
       spare_blocks=st.integers(0, 30), max_num_seqs=st.integers(1, 6), token_budget=st.integers(0, 64),
       prefix_caching=st.booleans())
def test_same_tokens_as_reference(reference, workload, block_size, spare_blocks, max_num_seqs, token_budget,
                                  prefix_caching):
    prompts, params = workload
    # The pool always fits the largest single request, and often little more: preemption.
    need = max(-(-(len(p) + sp.max_tokens) // block_size) for p, sp in zip(prompts, params))
    llm = paged.LLM("tiny", block_size=block_size, kv_cache_memory=(need + spare_blocks) * block_size *
                    TINY_BYTES_PER_TOKEN, max_num_seqs=max_num_seqs,
                    max_num_batched_tokens=max_num_seqs + token_budget, enable_prefix_caching=prefix_caching)
    llm.add_observer(paged.BlockAudit(llm.engine))  # the block accounting after every step
    expected = reference.generate(prompts, params)
    with checked_steps() as violations:
        got = llm.generate(prompts, params)
    assert not violations, violations[:3]
    for e, g, p in zip(expected, got, params):
        assert (g.token_ids, g.finish_reason) == (e.token_ids, e.finish_reason)
        assert not (problems := finish_problems(g, p, reference.config.eos_token_id)), (problems, p)
    bm = llm.engine.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks  # every block back in the pool
    bm.audit([])
    # Run again on the warm cache: prefix hits must not change a token either.
    with checked_steps() as violations:
        again = llm.generate(prompts, params)
    assert not violations, violations[:3]
    assert [g.token_ids for g in again] == [e.token_ids for e in expected]
    assert bm.num_free_blocks == bm.num_blocks


def test_preemption_happens_and_is_recomputed_exactly(reference):
    prompts = [[11 + i] * 30 for i in range(6)]
    params = SamplingParams(temperature=0.9, seed=3, max_tokens=40, ignore_eos=True)
    llm = paged.LLM("tiny", block_size=4, kv_cache_memory=24 * 4 * TINY_BYTES_PER_TOKEN, max_num_seqs=6)
    got = llm.generate(prompts, params)
    assert llm.stats.preemptions > 0
    assert [g.token_ids for g in got] == [e.token_ids for e in reference.generate(prompts, params)]


def test_shared_system_prompt_hits_the_cache(reference):
    system = list(range(100, 180))  # 80 tokens: five full blocks of 16
    prompts = [system + [300 + i, 400 + i] for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=5)
    llm = paged.LLM("tiny", max_num_seqs=2)
    got = llm.generate(prompts, params)
    assert [g.token_ids for g in got] == [e.token_ids for e in reference.generate(prompts, params)]
    # The first two are admitted together and compute the prefix; the other four reuse it.
    assert llm.stats.prefix_hit_tokens == 4 * 80
    assert llm.stats.prefix_query_tokens == 6 * 82
    assert llm.stats.prefill_tokens == 2 * 82 + 4 * 2


def test_fully_cached_prompt_still_computes_its_last_token(reference):
    prompt = list(range(200, 232))  # exactly two blocks
    params = SamplingParams(temperature=0, max_tokens=4)
    llm = paged.LLM("tiny")
    first = llm.generate([prompt], params)[0]
    second = llm.generate([prompt], params)[0]
    assert llm.stats.prefix_hit_tokens == 16  # one block: the second holds the last token, recomputed
    assert llm.stats.prefill_tokens == 16
    assert first.token_ids == second.token_ids == reference.generate([prompt], params)[0].token_ids


def test_evicted_blocks_are_not_hit_again(reference):
    """Stale hash entries: once a free cached block is reused, its old prefix must miss."""
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    a, b = list(range(10, 42)), list(range(500, 532))
    llm = paged.LLM("tiny", block_size=16, kv_cache_memory=3 * 16 * TINY_BYTES_PER_TOKEN, max_num_seqs=1)
    llm.generate([a], params)
    llm.generate([b], params)  # needs all three blocks: evicts a's
    got = llm.generate([a], params)[0]
    assert llm.stats.prefix_hit_tokens == 0
    assert got.token_ids == reference.generate([a], params)[0].token_ids


def test_hash_collisions_are_caught_by_comparing_tokens(reference):
    prompts = [list(range(10, 50)), list(range(60, 100))]  # different first blocks
    params = SamplingParams(temperature=0, max_tokens=4)
    llm = paged.LLM("tiny", max_num_seqs=1)
    llm.engine.scheduler.prefix_cache.hash_fn = lambda parent, tokens: b"same"  # every block collides
    got = llm.generate(prompts, params)
    assert llm.stats.prefix_hit_tokens == 0
    assert [g.token_ids for g in got] == [e.token_ids for e in reference.generate(prompts, params)]


def test_chunked_prefill_interleaves_with_decodes():
    llm = paged.LLM("tiny", max_num_seqs=4, max_num_batched_tokens=8)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    llm.generate([[5, 6], [9] * 100], params)
    # The long prompt needs ceil(100 / 7) chunks next to the first request's decodes, not one 100-token step.
    assert max(len(row) - row.count(None) for row in llm.timeline) == 2
    assert llm.stats.steps >= 100 // 8


def test_kv_waste_is_only_the_last_blocks_tail():
    block_size = 16
    prompts, params = [[5] * n for n in (30, 47, 3, 90)], SamplingParams(temperature=0, max_tokens=25, ignore_eos=True)
    llm = paged.LLM("tiny", block_size=block_size, max_num_seqs=4, max_model_len=512)
    llm.generate(prompts, params)
    st = llm.stats
    assert st.kv_bytes_reserved <= st.kv_bytes_used + st.peak_running * (block_size - 1) * TINY_BYTES_PER_TOKEN
    stage02 = importlib.import_module("stages.02_continuous_batch").LLM("tiny", max_num_seqs=4, max_model_len=512)
    stage02.generate(prompts, params)
    assert stage02.stats.kv_waste > 0.5 > 0.2 > st.kv_waste


def test_more_sequences_in_flight_than_stage_02_under_the_same_budget():
    budget = 2 * 512 * TINY_BYTES_PER_TOKEN  # stage 02 fits two 512-token slots
    prompts, params = [[5 + i] * 20 for i in range(12)], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    llm = paged.LLM("tiny", max_num_seqs=12, max_model_len=512, kv_cache_memory=budget)
    llm.generate(prompts, params)
    assert llm.stats.peak_running == 12
    assert llm.engine.scheduler.kv_capacity_tokens == 1024


def test_bad_requests_fail_alone(reference):
    llm = paged.LLM("tiny", block_size=16, kv_cache_memory=4 * 16 * TINY_BYTES_PER_TOKEN)  # 64 tokens
    good = SamplingParams(temperature=0, max_tokens=8)
    outs = llm.generate([[5] * 10, [6] * 70, [7] * 60, [8] * 12], [good, good, good, {"temperature": -1}])
    assert [o.finish_reason for o in outs] == ["length", "error", "error", "error"]
    assert "whole KV pool holds 64" in outs[1].error and "max_tokens" in outs[2].error
    assert "at most 4 " in outs[2].error and "temperature" in outs[3].error
    assert outs[0].token_ids == reference.generate([[5] * 10], good)[0].token_ids
    assert llm.engine.scheduler.block_manager.num_free_blocks == 4


def test_budget_below_one_block_is_refused():
    with pytest.raises(ValueError, match=r"needs 8,192 bytes"):
        paged.LLM("tiny", block_size=16, kv_cache_memory=1024)
    with pytest.raises(ValueError, match="kv_cache_memory"):
        paged.LLM("tiny", kv_cache_memory="lots")


def test_memory_budget_units():
    from common.loader import parse_memory
    import torch
    cpu = torch.device("cpu")
    assert parse_memory("96MiB", cpu) == 96 * 2**20
    assert parse_memory("2GB", cpu) == 2 * 10**9
    assert parse_memory(4096, cpu) == 4096
    assert 0 < parse_memory("0.5", cpu) < parse_memory("1.0", cpu)


def test_vllm_byte_count_name_sizes_the_same_pool():
    budget = 40 * 16 * TINY_BYTES_PER_TOKEN  # 40 blocks of 16 tokens
    by_bytes = paged.LLM("tiny", max_num_seqs=4, kv_cache_memory_bytes=budget)
    by_text = paged.LLM("tiny", max_num_seqs=4, kv_cache_memory=f"{budget}")
    assert by_bytes.engine.scheduler.block_manager.num_blocks == by_text.engine.scheduler.block_manager.num_blocks == 40
    assert by_bytes.engine_config.cache.kv_cache_memory == budget
    for bad, says in (({"kv_cache_memory_bytes": budget, "kv_cache_memory": "1MiB"}, "not both"),
                      ({"kv_cache_memory_bytes": "1MiB"}, "must be an integer")):
        with pytest.raises(ValueError, match=says) as err:
            paged.LLM("tiny", max_num_seqs=4, **bad)
        assert err.value.param == "kv_cache_memory_bytes"


@pytest.mark.real_model
def test_real_model_shared_system_prompt():
    ref = ReferenceLLM("smollm2-135m", dtype="bfloat16")
    system = ("You are a concise assistant for a cooking website. Answer in one or two sentences, "
              "mention one ingredient by name, and never give medical advice.")
    prompts = [ref.tokenizer.apply_chat_template([{"role": "system", "content": system},
                                                  {"role": "user", "content": q}])
               for q in ["How do I boil an egg?", "What goes well with basil?", "Is rice gluten free?"]]
    params = [SamplingParams(temperature=0, max_tokens=16), SamplingParams(temperature=0.7, seed=2, max_tokens=16),
              SamplingParams(temperature=0, max_tokens=10)]
    llm = paged.LLM("smollm2-135m", max_num_seqs=1, block_size=8, kv_cache_memory=4 * 2**20)
    got = llm.generate(prompts, params)
    ids = [ref.tokenizer.encode(p) for p in prompts]
    shared = next(i for i in range(len(ids[0])) if len({tuple(x[:i + 1]) for x in ids}) > 1)
    assert shared > 30  # the system prompt
    assert llm.stats.prefix_hit_tokens == 2 * (shared // 8 * 8)  # the later two reuse its full blocks
    assert [g.token_ids for g in got] == [e.token_ids for e in ref.generate(prompts, params)]


def test_an_engine_error_mid_run_leaks_no_blocks(reference):
    """A step that raises ends `generate` with the error, but every block goes back: the next call runs normally."""
    llm = paged.LLM("tiny", block_size=4, max_num_seqs=3)
    prompts, params = [[5 + i] * 9 for i in range(3)], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    run, calls = llm.engine.runner.run, []

    def fails_on_the_third_step(*args):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("device lost")
        return run(*args)

    llm.engine.runner.run = fails_on_the_third_step
    with pytest.raises(RuntimeError, match="device lost"):
        llm.generate(prompts, params)
    bm = llm.engine.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    bm.audit([])
    llm.engine.runner.run = run
    assert [g.token_ids for g in llm.generate(prompts, params)] == \
        [e.token_ids for e in reference.generate(prompts, params)]


def test_a_prompt_one_past_a_block_boundary_reuses_every_full_block(reference):
    prompt = list(range(300, 333))  # 33 tokens: two full blocks, and the last token computed again
    params = SamplingParams(temperature=0, max_tokens=3)
    llm = paged.LLM("tiny")
    llm.generate([prompt], params)
    again = llm.generate([prompt], params)[0]
    assert llm.stats.prefix_hit_tokens == 32 and llm.stats.prefill_tokens == 1
    assert again.token_ids == reference.generate([prompt], params)[0].token_ids


def test_a_cached_prefix_in_free_blocks_counts_once_when_revived(reference):
    """A pool of exactly three blocks: the second request revives the first one's two freed cached blocks and takes
    one fresh block, which fits only if each revived block is counted once."""
    first, second = list(range(40, 48)), list(range(40, 48)) + [99]
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    llm = paged.LLM("tiny", block_size=4, kv_cache_memory=3 * 4 * TINY_BYTES_PER_TOKEN)
    llm.generate([first], params)
    got = llm.generate([second], params)[0]
    assert llm.stats.prefix_hit_tokens == 8
    assert got.token_ids == reference.generate([second], params)[0].token_ids


def test_eviction_takes_the_least_recently_freed_block_first(reference):
    """Pool of four blocks: b's two blocks come from the two never used, so a's freed cached blocks survive."""
    a, b = list(range(40, 48)), list(range(60, 68))
    params = SamplingParams(temperature=0, max_tokens=1)
    llm = paged.LLM("tiny", block_size=4, kv_cache_memory=4 * 4 * TINY_BYTES_PER_TOKEN, max_num_seqs=1)
    llm.generate([a], params)
    llm.generate([b], params)
    got = llm.generate([a + [99]], params)[0]
    assert llm.stats.prefix_hit_tokens == 8
    assert got.token_ids == reference.generate([a + [99]], params)[0].token_ids


def test_a_freed_sequence_gives_back_its_tail_before_its_head(reference):
    """Eviction order of a freed sequence's blocks: last to first, so the next allocation evicts a's tail (useless
    alone: a hit needs every block before it) and keeps its head. Pool of four blocks: a holds three, b then needs
    two (the one never used and one of a's); a again with one more token still finds its first two blocks."""
    a, b = list(range(40, 52)), list(range(60, 68))
    params = SamplingParams(temperature=0, max_tokens=1)
    llm = paged.LLM("tiny", block_size=4, kv_cache_memory=4 * 4 * TINY_BYTES_PER_TOKEN, max_num_seqs=1)
    llm.generate([a], params)
    bm = llm.engine.scheduler.block_manager
    assert list(bm.free)[:3] == [3, 2, 1]  # the unused block, then a's blocks from its last to its first
    llm.generate([b], params)
    got = llm.generate([a + [99]], params)[0]
    assert llm.stats.prefix_hit_tokens == 8  # a's first two blocks; its third was evicted
    assert got.token_ids == reference.generate([a + [99]], params)[0].token_ids


def test_a_prefix_is_shared_while_the_request_that_computed_it_still_runs(reference):
    """Prefix blocks are committed the step they are filled, not when their request finishes. The token budget
    (82) lets only the first request prefill in the first step; the second, admitted next to its first decode,
    finds the 80-token prefix in the cache and computes 2 tokens, not 82."""
    system = list(range(100, 180))  # 80 tokens: five full blocks of 16
    prompts = [system + [300, 400], system + [301, 401]]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    llm = paged.LLM("tiny", max_num_seqs=2, max_num_batched_tokens=82)
    with checked_steps() as violations:
        got = llm.generate(prompts, params)
    assert not violations, violations[:3]
    assert llm.stats.prefix_hit_tokens == 80
    assert llm.stats.prefill_tokens == 82 + 2
    assert [g.token_ids for g in got] == [e.token_ids for e in reference.generate(prompts, params)]


@settings(max_examples=examples(10), deadline=None)
@given(workload=shared_prefix_workloads(max_requests=5), max_num_seqs=st.integers(1, 4))
def test_tensor_op_attention_gives_the_reference_tokens_too(workload, max_num_seqs):
    """With the compiled CPU attention switched off (STEPWISE_NATIVE_ATTENTION=0, the path CUDA takes), the
    tensor-op attention is the reference's and stage 03's alike: same tokens, through chunking and caching."""
    prompts, params = workload
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STEPWISE_NATIVE_ATTENTION", "0")
        reference = ReferenceLLM("tiny", dtype="bfloat16")
        llm = paged.LLM("tiny", block_size=4, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_seqs + 8)
        assert reference.model.attention_note.startswith("attention: tensor ops")
        expected, got = reference.generate(prompts, params), llm.generate(prompts, params)
    for e, g in zip(expected, got):
        assert (g.token_ids, g.finish_reason) == (e.token_ids, e.finish_reason)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads resident memory from Linux's /proc")
def test_a_kv_budget_is_not_resident_until_its_blocks_are_written():
    """The KV cache's zeros come from anonymous pages (common.kv_cache.zeroed): a 1 GiB budget costs no resident
    memory when the engine starts (torch.zeros wrote all of it, 1.3 GiB more resident for the demo's budget), reads
    as zeros, and a block written becomes resident alone."""
    from common.kv_cache import zeroed

    def resident() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    before = resident()
    k = zeroed((8, 4096, 4, 16, 128), torch.float32, torch.device("cpu"))  # 1 GiB
    assert k.nbytes == 2**30 and resident() - before < 64 * 2**20
    k[3, 17] = 1.5
    assert resident() - before < 64 * 2**20 and float(k[3, 17].sum()) == 1.5 * 4 * 16 * 128
    assert float(k[:, :32].abs().sum()) == 1.5 * 4 * 16 * 128  # every other position reads as zero
