"""Stage 05's engine: streamed pieces add up to the reference's text; stop strings; cancellation; latency metrics."""
import importlib
import threading
import time
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import torch

from common.paths import DEFAULT_MODEL
from common import ReferenceLLM, SamplingParams, Sequence
from workloads import examples, finish_problems, wait_until, workloads

streaming = importlib.import_module("stages.05_streaming")
streams = importlib.import_module("stages.streaming.streams")


@pytest.fixture(scope="module")
def reference():
    return ReferenceLLM("tiny", dtype="bfloat16")


@pytest.fixture(scope="module")
def llm():
    llm = streaming.LLM("tiny", max_num_seqs=4)
    yield llm
    llm.shutdown()



@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=workloads(max_requests=4, max_prompt=60), data=st.data())
def test_stream_equals_generate_equals_reference(reference, llm, workload, data):
    prompts, params = workload
    for p, prompt in zip(params, prompts):
        text = reference.generate([prompt], p)[0].text
        kind = data.draw(st.sampled_from(["none", "in the text", "absent"]))
        absent = st.text("qzjx#", min_size=2, max_size=5).filter(lambda s: s not in text)  # noqa: B023
        if kind == "in the text" and text.strip():  # taken from the text the request will produce: ends with "stop"
            i = data.draw(st.integers(0, len(text) - 1))
            # Sometimes next to one that never matches, of another length: the hold-back follows the longest.
            p.stop = [text[i:i + data.draw(st.integers(1, 4))]] + data.draw(st.lists(absent, max_size=1))
        elif kind == "absent":  # never matches: the request ends by length or EOS, with its held-back tail flushed
            p.stop = [data.draw(absent)]
    expected = reference.generate(prompts, params)
    results = [None] * len(prompts)

    def read(i):
        chunks = list(llm.stream(prompts[i], params[i]))
        results[i] = chunks

    threads = [threading.Thread(target=read, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    got = llm.generate(prompts, params)
    for e, g, chunks, p in zip(expected, got, results, params):
        streamed_text = "".join(c.text for c in chunks)
        streamed_ids = [t for c in chunks for t in c.token_ids]
        assert (streamed_ids, chunks[-1].finish_reason) == (e.token_ids, e.finish_reason), \
            (chunks[-1].error, p, [c.finish_reason for c in chunks])
        assert streamed_text == g.text == e.text
        assert g.token_ids == e.token_ids
        assert all(c.finish_reason is None for c in chunks[:-1])
        assert not any(s in streamed_text for s in p.stop)
        # Not through the reference (it runs the same Sequence code): how the request ended, from its own output.
        assert not (problems := finish_problems(g, p, reference.config.eos_token_id)), (problems, p)
        full = reference.tokenizer.decode(g.token_ids)
        if p.stop and g.finish_reason == "stop" and full != g.text:  # cut: the text ends where a stop string starts
            assert full.startswith(g.text) and any(full.startswith(s, len(g.text)) for s in p.stop), (full, g.text, p)
    assert wait_until(lambda: llm.engine.scheduler.block_manager.num_used_blocks == 0)


def test_stop_string_spanning_tokens_is_not_emitted(reference, llm):
    prompt, base = [40, 41, 42], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    full = reference.generate([prompt], base)[0]
    pieces = [reference.tokenizer.decode([t]) for t in full.token_ids]
    # A stop string made of the end of token 3 and the start of token 4.
    k = next(i for i in range(2, len(pieces) - 1) if pieces[i] and pieces[i + 1])
    stop = pieces[k][-1:] + pieces[k + 1][:1]
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop])
    chunks = list(llm.stream(prompt, params))
    text = "".join(c.text for c in chunks)
    expected = reference.generate([prompt], params)[0]
    assert text == expected.text == full.text[:full.text.find(stop)]
    assert chunks[-1].finish_reason == "stop" and stop not in text


def running(text: str, stop: list[str]) -> Sequence:
    seq = Sequence([5, 6], SamplingParams(max_tokens=50, stop=stop), 2, torch.device("cpu"))
    seq.output_text = text
    return seq


def test_the_hold_back_is_as_long_as_the_longest_stop_string():
    """Hold-back as long as the longest stop string (less one character): "t@@" could still grow into "t@@@", so
    none of it is shown, though "qz" is only two characters long."""
    seq = running("xyt@@", ["t@@@", "qz"])
    assert streams.stable_text_len(seq) == 2  # "xy"
    assert streams.stable_text_len(running("xyt@@", ["qz", "t@@@"])) == 2  # whatever the order listed
    assert streams.stable_text_len(running("abcdq", ["t@@@", "qz"])) == 2  # the last 3 held back, whatever they are
    seq.finish("length")
    assert streams.stable_text_len(seq) == len("xyt@@")  # a finished request holds nothing back


@settings(max_examples=examples(200), deadline=None)
@given(text=st.text("ab@", max_size=12), stop=st.lists(st.text("ab@", min_size=1, max_size=5), min_size=1, max_size=3))
def test_no_shown_text_can_become_part_of_a_stop_string(text, stop):
    """Whatever a stream shows while its request runs is final: no stop string can still start in it (as a stop
    string's head at the end of the text, to be completed by later tokens)."""
    stable = streams.stable_text_len(running(text, stop))
    for s in stop:
        for k in range(1, len(s)):
            if text.endswith(s[:k]):
                assert len(text) - k >= stable, (s, k)


@pytest.mark.parametrize("params, ending", [
    (SamplingParams(temperature=0, max_tokens=20, ignore_eos=True), "length"),
    (SamplingParams(temperature=1.0, seed=1146, max_tokens=40), "eos"),  # seed found by search: EOS at token 6
])
def test_stop_strings_that_never_match_hold_nothing_back_at_the_end(reference, llm, params, ending):
    """While a request runs, the tail that could still grow into a stop string is held back; a request that ends
    by length or EOS must flush it, streamed or not."""
    prompt = [40, 41, 42]
    full = reference.generate([prompt], params)[0]  # no stop strings: nothing is held back
    assert full.finish_reason == ("length" if ending == "length" else "stop") and len(full.text) >= 4
    assert ending == "length" or full.token_ids[-1] == reference.config.eos_token_id
    params = replace(params, stop=["qzqz", "#x"])  # holds back the last 3 characters while running
    assert not any(s in full.text for s in params.stop)
    chunks = list(llm.stream(prompt, params))
    assert "".join(c.text for c in chunks) == full.text
    assert [t for c in chunks for t in c.token_ids] == full.token_ids
    assert chunks[-1].finish_reason == full.finish_reason
    assert [(o.text, o.token_ids, o.finish_reason) for o in llm.generate([prompt], params)] == \
        [(full.text, full.token_ids, full.finish_reason)]


@pytest.mark.real_model
def test_utf8_and_leading_spaces_survive_streaming():
    llm = streaming.LLM(DEFAULT_MODEL, max_num_seqs=2)
    try:
        prompt = llm.tokenizer.apply_chat_template([{"role": "user", "content": "Say 'café crème' and 'naïve' "
                                                     "and write one word in Japanese."}])
        params = SamplingParams(temperature=0, max_tokens=40)
        chunks = list(llm.stream(prompt, params))
        text = "".join(c.text for c in chunks)
        assert text == llm.tokenizer.decode([t for c in chunks for t in c.token_ids])
        # No chunk splits a character; only a request that ends mid-character flushes a U+FFFD, at its end.
        assert not any("\ufffd" in c.text for c in chunks[:-1])
        assert ("\ufffd" in chunks[-1].text) == text.endswith("\ufffd")
        assert any(c.text.startswith(" ") for c in chunks)  # byte-level BPE folds spaces into tokens
        assert text == ReferenceLLM(DEFAULT_MODEL).generate([prompt], params)[0].text
    finally:
        llm.shutdown()


def test_a_reader_that_stops_aborts_its_request_and_frees_its_blocks(reference, llm):
    long = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
    other_params = SamplingParams(temperature=0, max_tokens=25, ignore_eos=True)
    finished = dict(llm.metrics.finished)
    other = llm.add_request([9, 8, 7], other_params)
    it = llm.stream([5] * 40, long)
    got = [next(it) for _ in range(3)]
    assert all(c.finish_reason is None for c in got)
    aborted = llm.loop.streams[next(r for r, s in llm.loop.streams.items() if s.seq.num_prompt_tokens == 40)].seq
    aborts_before = llm.metrics.finished.get("abort", 0)
    it.close()  # the client goes away
    llm.loop.run_step()  # the next step applies the abort: the request is gone, its blocks are back
    assert aborted.finish_reason == "abort" and aborted not in llm.engine.scheduler.running
    bm = llm.engine.scheduler.block_manager
    assert not bm.table(aborted) and llm.metrics.finished.get("abort", 0) == aborts_before + 1
    other_chunks = list(llm.read(other))  # reading the other request steps the engine on
    assert [t for c in other_chunks for t in c.token_ids] == reference.generate([[9, 8, 7]], other_params)[0].token_ids
    # The long request was aborted (not run to its 400 tokens); the other ran to its length; every block is back.
    assert llm.metrics.finished.get("abort", 0) == finished.get("abort", 0) + 1
    assert llm.metrics.finished.get("length", 0) == finished.get("length", 0) + 1
    assert not llm.engine.scheduler.running and llm.engine.scheduler.block_manager.num_used_blocks == 0


def test_a_request_aborted_while_queued_never_runs(reference):
    llm = streaming.LLM("tiny", max_num_seqs=1)
    try:
        long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
        first = llm.add_request([9, 8, 7], long)
        queued = llm.add_request([5, 6], SamplingParams(temperature=0, max_tokens=5))
        llm.loop.run_step()  # the first runs; the second waits for the only slot
        assert llm.engine.scheduler.running and len(llm.engine.scheduler.waiting) == 1
        llm.abort(queued.request_id)  # the client gives up while its request waits for a slot
        llm.loop.run_step()
        assert queued.done.is_set()
        chunks = list(llm.read(queued))
        assert chunks[-1].finish_reason == "abort" and not any(c.token_ids for c in chunks)
        assert [t for c in llm.read(first) for t in c.token_ids] == reference.generate([[9, 8, 7]], long)[0].token_ids
        assert llm.metrics.finished == {"abort": 1, "length": 1}
    finally:
        llm.shutdown()


def test_gauges_follow_an_abort_that_leaves_nothing_to_run():
    """The last request aborted: no step follows, yet the gauges a server reports must show it gone."""
    llm = streaming.LLM("tiny", max_num_seqs=2)
    try:
        stream = llm.add_request([9, 8, 7] * 10, SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
        llm.loop.run_step()
        g = llm.gauges()
        bm = llm.engine.scheduler.block_manager
        assert (g["running"], g["kv_blocks_used"]) == (1, bm.num_used_blocks) and g["running"]
        llm.abort(stream.request_id)
        assert llm.loop.run_step() is False  # the abort applied, nothing left to step
        g = llm.gauges()
        assert (g["running"], g["waiting"], g["kv_blocks_used"]) == (0, 0, 0)
        assert g["kv_blocks_free"] == g["kv_blocks"] == llm.engine.scheduler.block_manager.num_blocks
    finally:
        llm.shutdown()


def test_latency_metrics(reference, llm):
    params = SamplingParams(temperature=0.9, seed=1, max_tokens=12, ignore_eos=True)
    chunks = list(llm.stream([3, 4, 5], params))
    assert [t for c in chunks for t in c.token_ids] == reference.generate([[3, 4, 5]], params)[0].token_ids
    m = chunks[-1].metrics
    assert len(m.token_times) == 12
    assert 0 < m.time_to_first_token <= m.e2e_latency
    gaps = [b - a for a, b in zip(m.token_times, m.token_times[1:])]
    assert all(g >= 0 for g in gaps)
    assert m.time_per_output_token == pytest.approx(sum(gaps) / len(gaps))
    assert m.first_token_time == m.token_times[0] and m.finished_time >= m.token_times[-1]


def test_requests_join_while_others_run(reference, llm):
    prompts = [[11 + i] * (3 + 5 * i) for i in range(5)]
    params = SamplingParams(temperature=0.8, seed=7, max_tokens=20, ignore_eos=True)
    outputs = [None] * 5

    def client(i):
        time.sleep(0.05 * i)  # arrive one after another, mid-run
        outputs[i] = [t for c in llm.stream(prompts[i], params) for t in c.token_ids]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert outputs == [e.token_ids for e in reference.generate(prompts, params)]


def test_bad_request_fails_alone_at_submission(reference, llm):
    with pytest.raises(ValueError, match="temperature"):
        llm.add_request([5, 6], {"temperature": -2})
    with pytest.raises(ValueError, match="max_model_len"):
        llm.add_request([5] * 5000, SamplingParams())
    params = SamplingParams(temperature=1.0, seed=2, max_tokens=3, ignore_eos=True)
    chunks = list(llm.stream([5, 6], params))
    assert [t for c in chunks for t in c.token_ids] == reference.generate([[5, 6]], params)[0].token_ids


def test_concurrent_readers_step_the_engine_one_at_a_time(reference):
    """Several synchronous readers at once on a fresh engine: each steps it while it waits for tokens, never two at
    a time (a second stepper would drive the scheduler from two threads), and no background thread starts."""
    llm = streaming.LLM("tiny", max_num_seqs=4)
    barrier, outputs = threading.Barrier(8), [None] * 8
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    inside, overlaps, step = [0], [0], llm.loop.run_step

    def watched_step():
        inside[0] += 1
        overlaps[0] += inside[0] > 1
        time.sleep(0.001)  # widen the window a second stepper would need
        try:
            return step()
        finally:
            inside[0] -= 1

    llm.loop.run_step = watched_step

    def client(i):
        barrier.wait()
        outputs[i] = [t for c in llm.stream([20 + i, 7], params) for t in c.token_ids]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert overlaps[0] == 0 and llm.loop.loops_started == 0
    assert outputs == [e.token_ids for e in reference.generate([[20 + i, 7] for i in range(8)], params)]


def test_concurrent_async_first_requests_start_one_background_loop(reference):
    """Asynchronous readers (the server's) cannot step the engine: the first starts one background loop, however
    many arrive at once."""
    import asyncio
    llm = streaming.LLM("tiny", max_num_seqs=4)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)

    async def main():
        loop = asyncio.get_running_loop()
        streams = await asyncio.gather(*(asyncio.to_thread(llm.add_request, [20 + i, 7], params, loop)
                                         for i in range(8)))
        return [[t for c in [c async for c in s] for t in c.token_ids] for s in streams]

    outputs = asyncio.run(main())
    assert llm.loop.loops_started == 1
    assert outputs == [e.token_ids for e in reference.generate([[20 + i, 7] for i in range(8)], params)]
    llm.shutdown()


def test_async_readers_get_one_step_in_one_hand_off(reference):
    """A step's chunks for every asynchronous reader reach their event loop in one call, in order: one wake-up of
    the server's loop per step, not one per streamed token."""
    import asyncio
    llm = streaming.LLM("tiny", max_num_seqs=4)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    steps, hand_offs = [0], [0]
    engine_step = llm.engine.step

    def counted_step():
        steps[0] += 1
        return engine_step()

    llm.engine.step = counted_step

    async def main():
        loop = asyncio.get_running_loop()
        call_soon_threadsafe = loop.call_soon_threadsafe

        def counted(*args):
            hand_offs[0] += 1
            return call_soon_threadsafe(*args)

        loop.call_soon_threadsafe = counted
        streams = [llm.add_request([20 + i, 7], params, loop) for i in range(8)]
        return [[t for c in [c async for c in s] for t in c.token_ids] for s in streams]

    outputs = asyncio.run(main())
    llm.shutdown()
    assert outputs == [e.token_ids for e in reference.generate([[20 + i, 7] for i in range(8)], params)]
    assert 0 < hand_offs[0] <= steps[0] < 8 * 6  # one per step; one per token would be 48


def test_a_closed_event_loop_stops_its_requests_and_the_engine_serves_on(reference):
    """An async program that ends without reading its streams leaves them to a closed event loop: their requests
    are aborted (their blocks return), and the engine keeps serving everyone else."""
    import asyncio
    llm = streaming.LLM("tiny", max_num_seqs=4)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)

    async def submit_and_leave():
        loop = asyncio.get_running_loop()
        return [llm.add_request([20 + i, 7], params, loop) for i in range(3)]

    orphans = asyncio.run(submit_and_leave())  # the loop closes with its requests in flight
    assert wait_until(lambda: all(s.done.is_set() for s in orphans))
    assert llm.is_alive()
    short = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    assert llm.generate([[5, 6, 7]], short)[0].token_ids == reference.generate([[5, 6, 7]], short)[0].token_ids
    assert all(s.seq.finish_reason == "abort" for s in orphans)
    assert llm.gauges()["running"] == 0 and llm.gauges()["kv_blocks_used"] == 0
    llm.shutdown()


def test_shutdown_waits_for_the_loop_and_a_later_request_starts_a_new_one(reference):
    llm = streaming.LLM("tiny", max_num_seqs=2)
    params = SamplingParams(temperature=0.7, seed=4, max_tokens=8, ignore_eos=True)
    expected = reference.generate([[4, 5]], params)[0].token_ids
    for loop in (1, 2):
        llm.loop.start_background_loop()  # what a server's async readers get; nobody else steps here
        stream = llm.add_request([4, 5], params)
        assert stream.done.wait(30) and [t for c in llm.read(stream) for t in c.token_ids] == expected
        thread = llm.loop.thread
        llm.shutdown()
        assert not thread.is_alive() and llm.loop.loops_started == loop


def test_shutdown_ends_the_requests_in_flight(reference):
    """A reader waiting on a request when the engine shuts down gets a final "abort" chunk saying why, instead of
    waiting forever for tokens nobody will compute; every block goes back."""
    llm = streaming.LLM("tiny", max_num_seqs=2)
    llm.loop.start_background_loop()
    stream = llm.add_request([4, 5], SamplingParams(temperature=0, max_tokens=2000, ignore_eos=True))
    first = next(llm.read(stream))
    assert first.finish_reason is None
    llm.shutdown()
    rest = list(llm.read(stream))
    assert rest[-1].finish_reason == "abort" and "shut down" in rest[-1].error
    # The final chunk adds nothing to the text, carries the request's own metrics, and the request is counted once,
    # as aborted (the server's usage and /metrics read these).
    assert (rest[-1].text, rest[-1].token_ids) == ("", []) and rest[-1].metrics is stream.seq.metrics
    assert stream.seq.finish_reason == "abort" and llm.metrics.finished == {"abort": 1}
    assert len([t for c in [first, *rest] for t in c.token_ids]) < 2000
    assert llm.engine.scheduler.block_manager.num_used_blocks == 0 and not llm.engine.has_work()


def test_an_error_while_applying_the_inbox_fails_in_flight_requests_and_the_loop_goes_on(reference, monkeypatch):
    llm = streaming.LLM("tiny", max_num_seqs=2)
    add = llm.engine.add
    monkeypatch.setattr(llm.engine, "add", lambda seq: (_ for _ in ()).throw(RuntimeError("boom")))
    chunks = list(llm.stream([4, 5], SamplingParams(temperature=0, max_tokens=5)))
    assert chunks[-1].finish_reason == "error" and "boom" in chunks[-1].error
    monkeypatch.setattr(llm.engine, "add", add)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    assert [o.token_ids for o in llm.generate([[4, 5]], params)] == \
        [o.token_ids for o in reference.generate([[4, 5]], params)]
    llm.shutdown()
