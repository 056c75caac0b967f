"""The live X-ray in stage 05's server: /xray/events streams every step while concurrent requests run (a small
`load`), and what it streamed replays to the server's own counters (/metrics and an observer in the engine
thread); behind --api-key when one is set; off with xray=False; a client that falls behind is resynchronised
from a keyframe, and the engine never waits for it."""
import asyncio
import importlib
import json
import threading

import httpx
import pytest

from common import SamplingParams
from stages.xray import audit, live, replay
from test_server import metric_values
from workloads import Server, wait_until

streaming = importlib.import_module("stages.05_streaming")
TINY_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 2


class Gauges:
    """The engine's counters after every step, seen from the engine thread."""

    def __init__(self):
        self.by_index = {}

    def on_step(self, event):
        b = event.state.blocks
        self.by_index[event.index] = (event.state.num_running, event.state.num_waiting, b.num_used, b.num_free)


class EventReader(threading.Thread):
    """Reads /xray/events into a list of (event type, data) in a thread of its own."""

    def __init__(self, url, headers=None):
        super().__init__(daemon=True)
        self.url, self.headers, self.events, self.status = url, headers or {}, [], None
        self.hello = threading.Event()
        self.stop = False

    def run(self):
        with httpx.Client(timeout=None) as http, http.stream("GET", self.url, headers=self.headers) as r:
            self.status = r.status_code
            kind = None
            for line in r.iter_lines():
                if line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:"):
                    self.events.append((kind, json.loads(line[5:])))
                    if kind == "hello":
                        self.hello.set()
                if self.stop:
                    return

    def steps(self):
        return [data for kind, data in self.events if kind == "step"]


def small_pool_llm():
    """Stage 05 with a pool of 20 blocks of 4 tokens: six 30-token requests must preempt."""
    return streaming.LLM("tiny", max_num_seqs=6, block_size=4, kv_cache_memory=20 * 4 * TINY_BYTES_PER_TOKEN)


def test_live_events_follow_a_load_run_and_match_the_servers_counters():
    llm = small_pool_llm()
    gauges = llm.add_observer(Gauges())
    with Server(llm, "tiny") as s, httpx.Client(timeout=60) as http:
        reader = EventReader(s.url + "/xray/events")
        reader.start()
        assert reader.hello.wait(30) and reader.status == 200

        def one(i):
            r = http.post(s.url + "/v1/completions", json={"model": "tiny", "prompt": [[11 + i] * 14],
                                                           "max_tokens": 30, "ignore_eos": True, "temperature": 0})
            assert r.status_code == 200, r.text

        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert wait_until(lambda: llm.gauges()["running"] == 0 and len(reader.steps()) == llm.num_steps)
        values = metric_values(http.get(s.url + "/metrics").text)
        reader.stop = True
    steps = reader.steps()
    assert [s["index"] for s in steps] == list(range(llm.num_steps))  # every step, in order, none lost
    assert steps[0].get("key") and not any(kind == "resync" for kind, _ in reader.events)
    frames = []
    for frame in replay({"label": "live", "steps": steps}):
        assert not audit(frame)
        st = frame.step
        assert (st["running"], st["waiting"], frame.blocks_used, frame.free) == gauges.by_index[st["index"]]
        frames.append(frame)
    t = frames[-1].totals
    assert t.output_tokens == values["stepwise_output_tokens_total"] == 6 * 30
    assert t.preemptions == values["stepwise_preemptions"] > 0
    assert frames[-1].blocks_used == values["stepwise_kv_blocks_used"]
    assert sum(len(s["finished"]) for s in steps) == values['stepwise_requests_finished_total{finish_reason="length"}']
    assert all(r["tokens"] and len(r["tokens"]) == 30 for r in frames[-1].requests.values())


def test_live_events_need_the_api_key_and_can_be_switched_off():
    with Server(streaming.LLM("tiny", max_num_seqs=2), "tiny", api_key="s3cret") as s, httpx.Client() as http:
        assert http.get(s.url + "/xray/events").status_code == 401
        page = http.get(s.url + "/xray")
        assert page.status_code == 200 and '"api_key":true' in page.text and "s3cret" not in page.text
        reader = EventReader(s.url + "/xray/events", {"Authorization": "Bearer s3cret"})
        reader.start()
        assert reader.hello.wait(30) and reader.status == 200
        reader.stop = True
    with Server(streaming.LLM("tiny", max_num_seqs=2), "tiny", xray=False) as s, httpx.Client() as http:
        assert http.get(s.url + "/xray").status_code == 404
        assert http.get(s.url + "/xray/events").status_code == 404


def test_a_client_that_falls_behind_is_resynced_from_a_keyframe(monkeypatch):
    """Steps beyond a client's queue are dropped, it gets a "resync", and the engine's next step is a keyframe
    that holds the whole state again; the engine thread never waits."""
    llm = streaming.LLM("tiny", max_num_seqs=4, block_size=4)
    events = []
    llm.add_observer(type("Keep", (), {"on_step": lambda self, e: events.append(e)})())
    llm.generate([[5 + i] * 9 for i in range(4)], SamplingParams(max_tokens=12, ignore_eos=True))
    monkeypatch.setattr(live, "QUEUE", 3)

    async def scenario():
        hub = live.LiveXray()
        client = hub.connect()
        for e in events[:8]:  # nobody reads: the queue overflows
            hub.on_step(e)
        await asyncio.sleep(0)
        queued = [client.queue.get_nowait() for _ in range(client.queue.qsize())]
        assert queued == ["event: resync\ndata: {}\n\n"] and client.needs_key and hub.want_key
        hub.on_step(events[8])  # the engine's next step is a keyframe
        await asyncio.sleep(0)
        step = json.loads(client.queue.get_nowait().split("data: ", 1)[1])
        assert step["key"] and step["index"] == events[8].index and not client.needs_key
        tables = {str(k): t for k, t in events[8].state.blocks.tables.items()}
        assert step["blocks"]["tables"] == tables  # the whole state, not a change
        hub.disconnect(client)
        assert not hub.active
        hub.on_step(events[9])  # no client: nothing encoded, nothing queued
        assert not hub.pending and hub.encoder.need_key

    asyncio.run(scenario())


@pytest.mark.parametrize("flag", [["--no-xray"], []])
def test_the_load_benchmark_passes_the_xray_flags_to_its_server(monkeypatch, flag):
    load = importlib.import_module("stages.bench.load.__main__")
    captured = {}
    monkeypatch.setattr(load, "run_load", lambda args, console: captured.update(args=args))
    load.main(["--model", "tiny", "--xray", "run.html", "--trace", "run.json"] + flag)
    out = load.options.serve_arguments(captured["args"])
    assert out[out.index("--xray") + 1] == "run.html" and out[out.index("--trace") + 1] == "run.json"
    assert ("--no-xray" in out) == bool(flag)
