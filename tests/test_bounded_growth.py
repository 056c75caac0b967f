"""Issue 56: what grows per step or per request for a server's life is bounded: `serve`'s X-ray recording is a
ring of its latest steps (each kept window starting at a keyframe, so it replays on its own), the recorder's
encoder forgets requests that ended without a finishing step (aborted), and a server's statistics keep 1,000 steps
of timeline. The oracle for the ring is the same run recorded whole: the ring's steps are its last ones."""
import argparse
import importlib

from common import SamplingParams

streaming = importlib.import_module("stages.05_streaming")
xray_cli = importlib.import_module("stages.xray.cli")
trace = importlib.import_module("common.trace")


def test_the_servers_recording_is_a_ring_that_replays_from_a_keyframe():
    llm = streaming.LLM("tiny", max_num_seqs=4)
    whole, ring = trace.Recorder("whole"), xray_cli.recorder(argparse.Namespace(trace="x.json", xray=None,
                                                                                chrome_trace=None), window=8)
    llm.add_observer(whole)
    llm.add_observer(ring)
    llm.generate([[5, 6, 7]] * 6, [SamplingParams(max_tokens=12 + i, temperature=0) for i in range(6)])
    full, kept = whole.trace()["runs"][0], ring.trace()["runs"][0]
    assert len(full["steps"]) > 8 and kept["meta"]["window"] == 8
    assert 1 <= len(kept["steps"]) <= 8 and kept["steps"][0].get("key")
    assert [s["index"] for s in kept["steps"]] == [s["index"] for s in full["steps"]][-len(kept["steps"]):]
    trace.check(ring.trace())
    list(importlib.import_module("stages.xray.replay").replay(kept))  # every kept step rebuilds


def test_the_encoder_forgets_aborted_requests():
    llm = streaming.LLM("tiny", max_num_seqs=4)
    rec = llm.add_observer(trace.Recorder("r"))
    for _ in range(300):
        stream = llm.add_request([5, 6, 7], SamplingParams(max_tokens=50, temperature=0))
        next(iter(llm.read(stream)))  # one step, then the caller goes away
        llm.abort(stream.request_id)
    llm.generate([[5, 6]], SamplingParams(max_tokens=2))
    assert len(rec.encoder.live) <= 257


def test_a_servers_statistics_keep_a_bounded_timeline():
    import threading
    llm = streaming.LLM("tiny", max_num_seqs=2)
    stop = threading.Event()
    thread = threading.Thread(target=llm.run_forever, args=(stop,))
    thread.start()
    for _ in range(2):  # one after the other: 1,400 steps
        stream = llm.add_request([5, 6], SamplingParams(max_tokens=700, ignore_eos=True, temperature=0))
        stream.done.wait(300)
    stop.set()
    thread.join(30)
    assert llm.stats.steps >= 1400 and len(llm.stats.timeline) == streaming.engine.SERVER_HISTORY
