"""Parallel sampling (SamplingParams.n), penalties and constraints: every sample equals the reference's request
for its seed (vLLM's rule, seed + i), whatever the stage, batch, preemption or prefix hits; stage 03's samples
share the prompt's blocks (copy-on-write of the partial one) and give every block back; the penalties are
vLLM's arithmetic, row by row; every new field's bad value names the field."""
import importlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.stateful import precondition, rule

from common import ReferenceLLM, SamplingParams, Sequence
from common.processors import apply_processors, build_processors
from common.sampler import sample_batch
from test_block_manager import BLOCK_SIZE, BlockManagerMachine
from workloads import TINY_VOCAB, checked_steps, examples, sampling_params

paged = importlib.import_module("stages.03_paged_kv")
streaming = importlib.import_module("stages.05_streaming")
TINY_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 2  # layers x KV heads x head size x bf16, keys and values


@pytest.fixture(scope="module")
def reference():
    return ReferenceLLM("tiny", dtype="bfloat16")


def expected_samples(reference, prompt, params):
    """The oracle: each sample as a request of its own, run one at a time by the reference, with seed + i."""
    return [reference.generate([prompt], params.for_sample(i))[0].token_ids for i in range(params.n)]


@st.composite
def penalized_params(draw):
    """The shared sampling strategy, with n and the new penalties and constraints mixed in."""
    p = draw(sampling_params(max_tokens=st.integers(1, 10)))
    p.n = draw(st.sampled_from([1, 2, 3]))
    p.repetition_penalty = draw(st.sampled_from([1.0, 1.3, 0.8]))
    p.frequency_penalty = draw(st.sampled_from([0.0, 0.5, -0.5]))
    p.presence_penalty = draw(st.sampled_from([0.0, 1.0]))
    p.min_p = draw(st.sampled_from([0.0, 0.05]))
    p.min_tokens = draw(st.integers(0, p.max_tokens))
    p.logit_bias = draw(st.sampled_from([None, {5: 3.0, 9: -100.0}]))
    p.allowed_token_ids = draw(st.sampled_from([None, None, list(range(3, 200))]))
    p.logprobs = draw(st.sampled_from([None, 0, 2]))
    p.prompt_logprobs = draw(st.sampled_from([None, None, 1]))  # then nothing is shared: every row is computed
    p.validate(TINY_VOCAB)
    return p


@st.composite
def forking_workloads(draw):
    """A few prompts, often sharing a head (prefix hits), each request with its own n and penalties."""
    tokens = st.integers(3, TINY_VOCAB - 1)
    head = draw(st.lists(tokens, max_size=20))
    prompts = [head + draw(st.lists(tokens, min_size=1, max_size=12)) for _ in range(draw(st.integers(1, 2)))]
    return prompts, [draw(penalized_params()) for _ in prompts]


@settings(max_examples=examples(6), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=forking_workloads(), block_size=st.sampled_from([1, 4, 16]), spare_blocks=st.integers(0, 12),
       max_num_seqs=st.integers(1, 6), token_budget=st.integers(0, 24), prefix_caching=st.booleans())
def test_every_sample_equals_the_reference_on_shared_blocks(reference, workload, block_size, spare_blocks,
                                                           max_num_seqs, token_budget, prefix_caching):
    prompts, params = workload
    need = max(-(-(len(p) + sp.max_tokens) // block_size) for p, sp in zip(prompts, params))
    llm = paged.LLM("tiny", block_size=block_size, kv_cache_memory=(need + spare_blocks) * block_size *
                    TINY_BYTES_PER_TOKEN, max_num_seqs=max_num_seqs,
                    max_num_batched_tokens=max_num_seqs + token_budget, enable_prefix_caching=prefix_caching)
    expected = [[reference.generate([prompt], p.for_sample(i))[0] for i in range(p.n)]
                for prompt, p in zip(prompts, params)]
    for _ in range(2):  # the second run on a warm prefix cache
        with checked_steps() as violations:
            got = llm.generate(prompts, params)
        assert not violations, violations[:3]
        for p, out, samples in zip(params, got, expected):
            assert [c.index for c in out.outputs] == list(range(p.n))
            assert [(c.token_ids, c.logprobs) for c in out.outputs] == [(e.token_ids, e.outputs[0].logprobs)
                                                                         for e in samples]
            assert out.prompt_logprobs == samples[0].prompt_logprobs
        bm = llm.engine.scheduler.block_manager
        assert bm.num_free_blocks == bm.num_blocks and all(b.ref_count == 0 for b in bm.blocks)


def test_the_samples_share_the_prompt_blocks(reference):
    """n = 4 of a 37-token prompt in blocks of 16: the samples hold its two full blocks once; the partial third is
    copied on each sample's first write, so 4 x 3 table entries are 2 + 4 blocks (and the tokens are the
    reference's, preemption-free)."""
    prompt = list(range(100, 137))
    params = SamplingParams(temperature=1.0, seed=9, n=4, max_tokens=3, ignore_eos=True)
    llm = paged.LLM("tiny", max_num_seqs=4)
    out = llm.generate([prompt], params)[0]
    assert [c.token_ids for c in out.outputs] == expected_samples(reference, prompt, params)
    assert (llm.stats.peak_blocks, llm.stats.peak_table_blocks) == (2 + 4, 4 * 3)
    assert llm.stats.prefill_tokens == 37 + 3  # the prompt once, then each other sample's last prompt token
    alone = paged.LLM("tiny", max_num_seqs=4)
    alone.generate([prompt] * 4, [params.for_sample(i) for i in range(4)])  # four separate requests
    assert alone.stats.peak_blocks == 4 * 3 and alone.stats.prefill_tokens == 4 * 37


@pytest.mark.parametrize("stage", ["stages.01_static_batch", "stages.02_continuous_batch"])
def test_stages_01_02_run_the_samples_apart(reference, stage):
    llm = importlib.import_module(stage).LLM("tiny", dtype="bfloat16", max_num_seqs=3)
    prompts = [[5, 6, 7, 8], [9, 10]]
    params = [SamplingParams(temperature=0.9, seed=4, n=3, max_tokens=6, frequency_penalty=0.7),
              SamplingParams(temperature=0, n=2, max_tokens=5, repetition_penalty=1.4)]
    got = llm.generate(prompts, params)
    assert [[c.token_ids for c in o.outputs] for o in got] == [expected_samples(reference, pr, p)
                                                                for pr, p in zip(prompts, params)]


def test_aborting_one_sample_or_all_leaves_no_block(reference):
    llm = streaming.LLM("tiny", max_num_seqs=4)
    try:
        params = SamplingParams(temperature=1.0, seed=2, n=3, max_tokens=12, ignore_eos=True)
        prompt = list(range(40, 61))
        streams = llm.add_samples(prompt, params)
        for _ in range(4):
            llm.loop.run_step()
        llm.abort(streams[1].request_id)  # one sample goes; its siblings run on to the reference's tokens
        got = [[t for c in llm.read(s) for t in c.token_ids] for s in (streams[0], streams[2])]
        expect = expected_samples(reference, prompt, params)
        assert got == [expect[0], expect[2]] and streams[1].seq.finish_reason == "abort"
        assert llm.engine.scheduler.block_manager.num_used_blocks == 0
        streams = llm.add_samples(prompt, params)
        llm.loop.run_step(), llm.loop.run_step()
        for s in streams:  # all of them
            llm.abort(s.request_id)
        llm.loop.run_step()
        assert not llm.engine.scheduler.running and llm.engine.scheduler.block_manager.num_used_blocks == 0
        with pytest.raises(ValueError, match="add_samples"):
            llm.add_request(prompt, params)
    finally:
        llm.shutdown()


class ForkingMachine(BlockManagerMachine):
    """The block manager's state machine with forks: a sample shares a running sibling's prompt blocks and its
    writes copy a shared partial block first; the shadow copy follows the copies, and every sequence still reads
    its own tokens."""

    def write(self, seq, n):
        self.bm.append_slots(seq, n)
        for src, dst in self.bm.take_copies():  # what the cache does before the step writes
            for off in range(BLOCK_SIZE):
                if (src, off) in self.written:
                    self.written[dst, off] = self.written[src, off]
        for p in range(seq.num_cached_tokens, seq.num_cached_tokens + n):
            self.written[self.bm.table(seq)[p // BLOCK_SIZE], p % BLOCK_SIZE] = seq.token_ids[p]
        seq.num_cached_tokens += n
        self.cache.commit(seq, self.bm.table(seq))

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def fork_a_sample(self, data):
        parent = data.draw(st.sampled_from(self.running))
        child = Sequence(parent.prompt_token_ids, SamplingParams(max_tokens=99), 0, torch.device("cpu"))
        parent.group.append(child)  # one list, shared by the siblings
        child.group = parent.group
        shared, cached = self.bm.fork_source(child)
        if not cached or not self.bm.can_allocate(len(child) - cached, shared, cached):
            return
        self.bm.allocate(child, shared, cached)
        self.write(child, len(child) - cached)
        self.running.append(child)

    def sharing_is_through_full_cached_blocks(self):
        """Not so here: a fork shares its sibling's partial last block (copied on its first write)."""


ForkingMachine.TestCase.settings = settings(max_examples=examples(80), stateful_step_count=40, deadline=None)
TestForkingBlockManager = ForkingMachine.TestCase


def penalized_by_hand(logits, p, prompt, output, eos):
    """vLLM's definitions, one token at a time in plain Python: the oracle for the built-in logits processors."""
    out = [float(x) for x in logits]
    for t, b in (p.logit_bias or {}).items():
        out[t] += b
    for t in range(len(out)):
        if p.allowed_token_ids is not None and t not in p.allowed_token_ids:
            out[t] = float("-inf")
        if len(output) < p.min_tokens and (t in p.stop_token_ids or (t == eos and not p.ignore_eos)):
            out[t] = float("-inf")
        if t in prompt or t in output:
            out[t] = out[t] / p.repetition_penalty if out[t] > 0 else out[t] * p.repetition_penalty
        out[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty * (t in output)
    return torch.tensor(out)


@settings(max_examples=examples(60), deadline=None)
@given(p=penalized_params(), seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 5), data=st.data())
def test_penalties_are_vllms_arithmetic_row_by_row(p, seed, rows, data):
    """Each row is the hand-computed oracle's, and a row's token never depends on the rows batched with it."""
    vocab = 64
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * 3
    p.logit_bias = {t: b for t, b in (p.logit_bias or {}).items() if t < vocab}
    p.allowed_token_ids = None if p.allowed_token_ids is None else [t for t in p.allowed_token_ids if t < vocab]
    p.stop_token_ids = [t for t in p.stop_token_ids if t < vocab]
    histories = [(data.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=8)),
                  data.draw(st.lists(st.integers(0, vocab - 1), max_size=8))) for _ in range(rows)]
    adjusted = torch.stack([apply_processors(build_processors(p, histories[i][0], frozenset([2])), logits[i],
                                             histories[i][1]) for i in range(rows)])
    for i in range(rows):
        torch.testing.assert_close(adjusted[i], penalized_by_hand(logits[i], p, *histories[i], 2), rtol=1e-6,
                                   atol=1e-5)
    one = p.for_sample(0)
    batched = sample_batch(adjusted, [one] * rows, [torch.Generator().manual_seed(seed) for _ in range(rows)])
    alone = [sample_batch(adjusted[i:i + 1], [one], [torch.Generator().manual_seed(seed)])[0] for i in range(rows)]
    assert batched == alone


def test_a_penalty_breaks_the_greedy_loop(reference):
    """The tiny model repeats one token greedily; a repetition penalty makes it move on (and the stages agree)."""
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    penalized = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, repetition_penalty=2.0)
    loop = reference.generate([[3, 4, 5]], greedy)[0].token_ids
    moved = reference.generate([[3, 4, 5]], penalized)[0].token_ids
    assert len(set(moved)) > len(set(loop))
    assert paged.LLM("tiny").generate([[3, 4, 5]], penalized)[0].token_ids == moved


def test_min_tokens_holds_back_eos_and_stop_ids(reference):
    """With EOS (then a stop id) biased to win every draw, min_tokens alone keeps it out of the first tokens."""
    eos = reference.config.eos_token_id
    for stop, p in ((eos, SamplingParams(temperature=0, max_tokens=9, min_tokens=4, logit_bias={eos: 100.0})),
                    (77, SamplingParams(temperature=0.7, seed=1, max_tokens=9, min_tokens=3, stop_token_ids=[77],
                                        logit_bias={77: 100.0}))):
        out = reference.generate([[3, 4, 5]], p)[0]
        assert out.token_ids[:p.min_tokens].count(stop) == 0
        assert (out.token_ids[p.min_tokens:], out.finish_reason) == ([stop], "stop")


@pytest.mark.parametrize("kwargs,field", [
    ({"n": 0}, "n"), ({"n": 1.5}, "n"), ({"n": True}, "n"), ({"seed": 2**64 - 1, "n": 2}, "seed"),
    ({"presence_penalty": 2.5}, "presence_penalty"), ({"presence_penalty": "1"}, "presence_penalty"),
    ({"frequency_penalty": -2.1}, "frequency_penalty"), ({"frequency_penalty": float("nan")}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"repetition_penalty": float("inf")}, "repetition_penalty"),
    ({"min_p": 1.5}, "min_p"), ({"min_p": -0.1}, "min_p"), ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 20, "max_tokens": 5}, "min_tokens"), ({"logit_bias": {5: 101}}, "logit_bias"),
    ({"logit_bias": {-1: 1.0}}, "logit_bias"), ({"logit_bias": [1, 2]}, "logit_bias"),
    ({"logit_bias": {"5": 1.0}}, "logit_bias"), ({"allowed_token_ids": []}, "allowed_token_ids"),
    ({"allowed_token_ids": [1, -2]}, "allowed_token_ids"), ({"allowed_token_ids": 5}, "allowed_token_ids"),
])
def test_new_fields_name_themselves_when_wrong(kwargs, field):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field}\b"):
        SamplingParams(**kwargs)


def test_token_ids_outside_the_vocabulary_are_refused():
    for kwargs, field in (({"logit_bias": {5000: 1.0}}, "logit_bias"), ({"allowed_token_ids": [5000]},
                                                                          "allowed_token_ids")):
        with pytest.raises(ValueError, match=field):
            SamplingParams(**kwargs).validate(vocab_size=TINY_VOCAB)


@pytest.fixture(scope="module")
def server():
    from workloads import Server
    with Server(streaming.LLM("tiny", max_num_seqs=8, max_waiting=64), "tiny") as s:
        yield s


@pytest.mark.parametrize("stream", [False, True])
def test_the_openai_client_reads_n_choices_with_penalties(server, reference, stream):
    """n choices through the real `openai` client, chat and completions, each the reference's request for its seed;
    the penalties arrive as OpenAI's fields (and vLLM's through extra_body)."""
    openai = pytest.importorskip("openai")
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    fields = dict(temperature=0.9, seed=7, max_tokens=8, frequency_penalty=0.5, presence_penalty=0.3,
                  logit_bias={"5": 2.0})
    extra = {"repetition_penalty": 1.2, "min_p": 0.05, "min_tokens": 2}
    params = SamplingParams(n=3, temperature=0.9, seed=7, max_tokens=8, frequency_penalty=0.5, presence_penalty=0.3,
                            logit_bias={5: 2.0}, **extra)
    messages = [{"role": "user", "content": "Hi there"}]
    chat_ids = reference.tokenizer.encode_chat(messages)
    for create, prompt, key in ((c.completions.create, {"prompt": [[17, 99, 5, 301]]}, "text"),
                                (c.chat.completions.create, {"messages": messages}, "content")):
        ids = prompt["prompt"][0] if "prompt" in prompt else chat_ids
        expected = [reference.generate([ids], params.for_sample(i))[0].text for i in range(3)]
        texts = [""] * 3
        if stream:
            for chunk in create(model="tiny", n=3, stream=True, extra_body=extra, **prompt, **fields):
                for ch in chunk.choices:
                    texts[ch.index] += (ch.text if key == "text" else ch.delta.content or "")
        else:
            for ch in create(model="tiny", n=3, extra_body=extra, **prompt, **fields).choices:
                texts[ch.index] = ch.text if key == "text" else ch.message.content
        assert texts == expected
    assert wait_until_idle(server)


def wait_until_idle(server):
    from workloads import wait_until
    return wait_until(lambda: server.llm.engine.scheduler.block_manager.num_used_blocks == 0)


def test_copies_run_in_the_order_recorded():
    """A sample forked in the same step from a sample's fresh copy copies that copy: block 0 -> 1 -> 2 in order
    (a single gather-then-scatter would give block 2 block 1's stale contents); then block 0 is reused."""
    from common.config import ModelConfig
    from common.prepare import resolve_model
    cache = paged.PagedKVCache(ModelConfig.from_folder(resolve_model("tiny")), 4, 4, torch.float32,
                               torch.device("cpu"))
    for b in range(4):
        cache.k[:, b], cache.v[:, b] = float(b), -float(b)
    cache.copy_blocks([(0, 1), (1, 2), (3, 0)])
    assert [float(cache.k[0, b].mean()) for b in range(4)] == [3.0, 0.0, 0.0, 3.0]
    assert float(cache.v[:, 2].abs().max()) == 0.0 and float(cache.v[:, 0].mean()) == -3.0


def test_logprobs_are_the_models_own_whatever_the_batch(reference):
    """Each sampled token's log-probability and top-k are the model's raw distribution: the same in a batch of
    stage 03 forks as in the reference, and equal to log_softmax over one direct forward of the whole text."""
    from stages.bench.quality import window_logits
    prompt = list(range(200, 223))
    params = SamplingParams(temperature=1.0, seed=3, n=3, max_tokens=6, logprobs=4, repetition_penalty=1.3)
    got = paged.LLM("tiny", dtype="bfloat16", block_size=4).generate([prompt, [7, 8, 9]], [params, params])[0]
    for c in got.outputs:
        alone = reference.generate([prompt], params.for_sample(c.index))[0].outputs[0]
        assert (c.token_ids, c.logprobs) == (alone.token_ids, alone.logprobs)
        direct = torch.log_softmax(window_logits(reference, prompt + c.token_ids).float(), -1)
        for j, (token, (lp, top)) in enumerate(zip(c.token_ids, c.logprobs)):
            row = direct[len(prompt) - 1 + j]
            assert lp == pytest.approx(float(row[token]), abs=1e-4)
            assert [t for t, _ in top] == row.topk(4).indices.tolist() and len(top) == 4
    with pytest.raises(ValueError, match=r"SamplingParams\.logprobs\b"):
        SamplingParams(logprobs=21)


@pytest.mark.parametrize("stream", [False, True])
def test_the_openai_client_reads_logprobs(server, reference, stream):
    """Chat's logprobs/top_logprobs and completions' logprobs, in OpenAI's shapes, read by the real client: each
    token's figure is the reference's, for every one of n choices."""
    openai = pytest.importorskip("openai")
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    params = SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=6, ignore_eos=True, logprobs=3)
    messages = [{"role": "user", "content": "Hello"}]
    cases = ((c.chat.completions.create, {"messages": messages, "logprobs": True, "top_logprobs": 3},
              reference.tokenizer.encode_chat(messages)),
             (c.completions.create, {"prompt": [[17, 99, 5]], "logprobs": 3}, [17, 99, 5]))
    for create, fields, ids in cases:
        expected = [reference.generate([ids], params.for_sample(i))[0].outputs[0] for i in range(2)]
        got = [[], []]  # per choice: (logprob, top ids' log-probabilities sorted) per token
        common = dict(model="tiny", n=2, temperature=1.0, seed=5, max_tokens=6, extra_body={"ignore_eos": True})
        responses = create(stream=True, **common, **fields) if stream else [create(**common, **fields)]
        for r in responses:
            for ch in r.choices:
                if ch.logprobs is None:
                    continue
                if "messages" in fields:
                    got[ch.index] += [(t.logprob, sorted(x.logprob for x in t.top_logprobs))
                                      for t in ch.logprobs.content]
                else:  # the legacy top_logprobs are keyed by token text, which two ids may share: values only
                    assert all(0 < len(top) <= 3 for top in ch.logprobs.top_logprobs)
                    got[ch.index] += [(lp, None) for lp in ch.logprobs.token_logprobs]
        chat = "messages" in fields
        assert got == [[(lp, sorted(v for _, v in top) if chat else None) for lp, top in e.logprobs]
                       for e in expected]


def direct_log_likelihood(reference, ids):
    """The oracle: one forward of the whole text through the model, log_softmax, the log-probability of each token
    after the first given the ones before it."""
    from stages.bench.quality import window_logits
    lp = torch.log_softmax(window_logits(reference, ids).float(), -1)
    return [float(lp[p, ids[p + 1]]) for p in range(len(ids) - 1)]


def test_prompt_logprobs_equal_the_models_whatever_the_chunking(reference):
    """Every prompt token scored (the first None), chunked prefill in 16-token steps beside another request in
    stage 03 as in the reference, and equal to one direct forward; such a request shares no cached block."""
    prompt = list(range(300, 341))
    p = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2)
    expected = reference.generate([prompt], p)[0].prompt_logprobs
    llm = paged.LLM("tiny", dtype="bfloat16", block_size=4, max_num_batched_tokens=16, max_num_seqs=4)
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2))  # its blocks now sit in the prefix cache
    got = llm.generate([prompt, prompt[:30]], [p, SamplingParams(temperature=0, max_tokens=3)])[0].prompt_logprobs
    assert got == expected and got[0] is None and len(got) == len(prompt)
    assert [lp for lp, _ in got[1:]] == pytest.approx(direct_log_likelihood(reference, prompt), abs=1e-4)


@pytest.mark.parametrize("stream", [False, True])
def test_echoed_logprobs_sum_to_the_texts_log_likelihood(server, reference, stream):
    """Completions with echo and logprobs, through the real client: the prompt comes back first, its first token's
    log-probability null as in OpenAI, and the echoed figures sum to the text's log-likelihood from the model."""
    openai = pytest.importorskip("openai")
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    text = "The quick brown fox jumps over the lazy dog"
    ids = reference.tokenizer.encode(text)
    args = dict(model="tiny", prompt=text, echo=True, logprobs=1, max_tokens=1, temperature=0)
    if stream:
        chunks = list(c.completions.create(stream=True, **args))
        out = "".join(ch.choices[0].text for ch in chunks)
        lps = [x for ch in chunks if ch.choices[0].logprobs for x in ch.choices[0].logprobs.token_logprobs]
    else:
        choice = c.completions.create(**args).choices[0]
        out, lps = choice.text, choice.logprobs.token_logprobs
    assert out.startswith(text) and len(lps) == len(ids) + 1 and lps[0] is None
    assert sum(lps[1:len(ids)]) == pytest.approx(sum(direct_log_likelihood(reference, ids)), abs=1e-3)
