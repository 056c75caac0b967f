"""Issue 56, finding 4: a request's preparation (its 1 MB prediction tokenized and searched, its prompt tokenized,
its grammar compiled) runs on worker threads, so a short request beside it finishes in about its usual time.
The oracle is the short request alone on the same server, just before; the big one must still be running when the
short one is done (so they did overlap). The bound is loose (3 x + 0.5 s): before the fix the short request waited
for the whole preparation (1.3 s against 0.1 s on SmolLM2)."""
import importlib
import threading
import time

import numpy as np
import pytest

from workloads import Server

openai = pytest.importorskip("openai")
structured = importlib.import_module("stages.07_structured")
spec_defaults = importlib.import_module("stages.speculative").STAGE_DEFAULT
proposers = importlib.import_module("stages.speculative.proposers")


def test_the_numpy_realign_agrees_with_a_plain_search():
    rng = np.random.default_rng(0)
    p = proposers.PredictionProposer(tokenizer=None, k=4)
    for _ in range(300):
        ids = rng.integers(0, 5, size=int(rng.integers(1, 40))).tolist()
        out = rng.integers(0, 5, size=int(rng.integers(1, 10))).tolist()
        floor = int(rng.integers(0, len(ids) + 1))
        want = None
        for n in range(min(8, len(out)), 0, -1):
            ends = [i + n for i in range(len(ids) - n + 1) if ids[i:i + n] == out[-n:]]
            if ends:
                want = next((e for e in ends if e >= floor), ends[0])
                break
        assert p.realign(np.asarray(ids), out, floor) == want


def test_a_1mb_prediction_beside_a_short_request_does_not_delay_it():
    text = open("tests/data/pride_and_prejudice_ch2-3.txt").read()
    big = (text * (1_000_000 // len(text) + 1))[:1_000_000]
    llm = structured.LLM("tiny", max_num_seqs=8, speculative_config=spec_defaults)
    with Server(llm, "tiny") as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)

        def short() -> float:
            start = time.perf_counter()
            c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=8,
                                      temperature=0)
            return time.perf_counter() - start

        alone = sorted(short() for _ in range(3))[1]
        big_done = threading.Event()
        answer = {}

        def predicted():
            answer["out"] = c.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "Repeat the text."}], max_tokens=16,
                temperature=0, prediction={"type": "content", "content": big})
            big_done.set()

        worker = threading.Thread(target=predicted)
        worker.start()
        time.sleep(0.3)  # the big body is read and its preparation under way
        beside = short()
        still_running = not big_done.is_set()
        worker.join(120)
        usage = answer["out"].usage.completion_tokens_details
        assert usage.accepted_prediction_tokens + usage.rejected_prediction_tokens >= 0
        assert still_running, "the big request finished first: nothing overlapped, the test shows nothing"
        assert beside < 3 * alone + 0.5, (beside, alone)
