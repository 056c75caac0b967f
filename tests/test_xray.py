"""The X-ray's recording (stages/xray): replayed from its JSON, it gives exactly the engine's own counters after
every step (steps, tokens, preemptions, prefix hits, blocks in use, the slot timeline) and every request's tokens
and text; the block pool it shows passes the audit at every step; bad trace files get a clear error; the flags on
the command line and LLM(trace=...) write the files; the Chrome trace holds the same steps."""
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from common import SamplingParams
from stages.workloads import toy
from stages.xray import Recorder, TraceError, audit, load, replay, save
from stages.xray import chrome, page
from workloads import TINY_VOCAB, examples, sampling_params

ROOT = Path(__file__).resolve().parents[1]
stages = {n: importlib.import_module(f"stages.{n}") for n in ("01_static_batch", "02_continuous_batch", "03_paged_kv")}
TINY_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 2  # layers x KV heads x head size x bf16, keys and values


class Counters:
    """The engine's counters after every step, read from the step events by an observer of its own."""

    def __init__(self, engine):
        self.engine, self.used, self.rows, self.tables = engine, [], [], []

    def on_step(self, event):
        blocks = event.state.blocks
        self.used.append(None if blocks is None else blocks.num_used)
        self.tables.append(None if blocks is None else {k: list(t) for k, t in blocks.tables.items()})
        if blocks is not None:
            s = self.engine.scheduler
            s.block_manager.audit(s.running)  # stages.paged_kv.BlockAudit's check


def record(llm, prompts, params, tmp_path):
    """Run with a recorder and a counter attached; return the outputs, the counters and the trace read back."""
    rec, counters = Recorder("run"), Counters(llm.engine)
    llm.add_observer(rec)
    llm.add_observer(counters)
    outs = llm.generate(prompts, params)
    rec.end_run()
    save(rec.trace(), tmp_path / "run.json")
    return outs, counters, load(tmp_path / "run.json")


def check_replay(llm, outs, counters, trace):
    """The replayed recording against the engine's counters, step by step and in total."""
    stats = llm.stats
    (run,) = trace["runs"]
    frames = []
    for i, frame in enumerate(replay(run)):
        assert not audit(frame), (i, audit(frame))
        if counters.used[i] is not None:
            assert frame.blocks_used == counters.used[i]
            assert frame.tables == counters.tables[i]
        row = [None] * max(frame.step["slots"], len(frame.step["seqs"]))
        for k, s in enumerate(frame.step["seqs"]):
            row[s.get("slot", k)] = frame.requests[s["seq"]]["index"]
        assert row == stats.timeline[i]
        frames.append(frame.step)
    t = frame.totals
    assert len(frames) == stats.steps
    assert (t.prefill_tokens, t.decode_tokens, t.output_tokens) == (stats.prefill_tokens, stats.decode_tokens,
                                                                    stats.output_tokens)
    assert (t.preemptions, t.prefix_hit_tokens, t.prefix_query_tokens) == (stats.preemptions, stats.prefix_hit_tokens,
                                                                           stats.prefix_query_tokens)
    # Every sequence's tokens and text as they grew, step by step, end as the outputs (samples in order).
    samples = [(o, s) for o in outs if o.finish_reason != "error" for s in o.outputs]
    recorded = sorted(frame.requests.values(), key=lambda r: r["index"])
    assert len(recorded) == len(samples)
    for got, (out, sample) in zip(recorded, samples):
        assert (got["tokens"], got["text"], got.get("finish")) == (sample.token_ids, sample.text, sample.finish_reason)
        assert got["prompt_tokens"] == len(out.prompt_token_ids)


@st.composite
def shared_workloads(draw, max_requests=6):
    """Prompts that often share a head (prefix hits), some requests with n=2 (shared blocks, copy-on-write)."""
    tokens = st.integers(3, TINY_VOCAB - 1)
    head = draw(st.lists(tokens, max_size=40))
    n = draw(st.integers(1, max_requests))
    prompts = [head + draw(st.lists(tokens, min_size=1, max_size=30)) for _ in range(n)]
    params = []
    for _ in prompts:
        p = draw(sampling_params(max_tokens=st.integers(1, 24)))
        p.n = draw(st.sampled_from([1, 1, 2]))
        params.append(p)
    return prompts, params


@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=shared_workloads(), block_size=st.sampled_from([1, 4, 16]), spare_blocks=st.integers(0, 12),
       max_num_seqs=st.integers(1, 5), token_budget=st.integers(0, 48))
def test_paged_recording_replays_to_the_engines_counters(tmp_path_factory, workload, block_size, spare_blocks,
                                                         max_num_seqs, token_budget):
    prompts, params = workload
    need = max(-(-(len(p) + sp.max_tokens) // block_size) for p, sp in zip(prompts, params))
    llm = stages["03_paged_kv"].LLM("tiny", block_size=block_size, max_num_seqs=max_num_seqs,
                                    kv_cache_memory=(need + spare_blocks) * block_size * TINY_BYTES_PER_TOKEN,
                                    max_num_batched_tokens=max_num_seqs + token_budget)
    outs, counters, trace = record(llm, prompts, params, tmp_path_factory.mktemp("xray"))
    check_replay(llm, outs, counters, trace)


@settings(max_examples=examples(6), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stage=st.sampled_from(["01_static_batch", "02_continuous_batch"]), workload=shared_workloads(),
       max_num_seqs=st.integers(1, 4))
def test_slot_recording_replays_to_the_engines_counters(tmp_path_factory, stage, workload, max_num_seqs):
    llm = stages[stage].LLM("tiny", max_num_seqs=max_num_seqs)
    outs, counters, trace = record(llm, *workload, tmp_path_factory.mktemp("xray"))
    check_replay(llm, outs, counters, trace)


def test_a_budget_that_preempts_is_recorded_with_its_preemptions(tmp_path):
    prompts = [[11 + i] * 30 for i in range(6)]
    params = SamplingParams(temperature=0.9, seed=3, max_tokens=40, ignore_eos=True)
    llm = stages["03_paged_kv"].LLM("tiny", block_size=4, kv_cache_memory=24 * 4 * TINY_BYTES_PER_TOKEN, max_num_seqs=6)
    outs, counters, trace = record(llm, prompts, params, tmp_path)
    assert llm.stats.preemptions > 0
    check_replay(llm, outs, counters, trace)
    steps = trace["runs"][0]["steps"]
    assert sum(len(s["preempted"]) for s in steps) == llm.stats.preemptions
    assert max(s["blocks"]["num_blocks"] - s["blocks"]["free"] for s in steps) == 24  # the pool filled


def test_the_toy_runs_record_160_and_112_steps(tmp_path):
    """The article's picture: static batching's idle slots against continuous batching's refills."""
    rec = Recorder()
    for name, want in (("01_static_batch", 160), ("02_continuous_batch", 112)):
        llm = stages[name].LLM("tiny", max_num_seqs=4)
        llm.add_observer(rec)
        rec.begin_run(name)
        llm.generate(*toy())
        rec.end_run(write=False)
        steps = rec.runs[-1].steps
        assert len(steps) == llm.stats.steps == want
        idle = sum(s["slots"] - len(s["seqs"]) for s in steps)
        assert idle == llm.stats.slot_steps_available - llm.stats.slot_steps_used
    html = page.render(rec.trace())
    assert "<script src" not in html and "http://" not in html.split("__")[0] and "https://" not in html
    data = json.loads(html.split('<script type="application/json" id="xray-data">')[1].split("</script>")[0])
    assert [len(r["steps"]) for r in data["trace"]["runs"]] == [160, 112]


def test_llm_trace_keyword_writes_after_each_generate(tmp_path):
    path = tmp_path / "run.json"
    llm = stages["03_paged_kv"].LLM("tiny", trace=path)
    llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, ignore_eos=True))
    assert [len(r["steps"]) for r in load(path)["runs"]] == [llm.stats.steps]
    llm.generate([[8, 9]], SamplingParams(max_tokens=2, ignore_eos=True))
    runs = load(path)["runs"]
    assert len(runs) == 2 and runs[0]["label"] == "03_paged_kv" and len(runs[1]["steps"]) == llm.stats.steps
    html = tmp_path / "run.html"  # the page is drawn from the recording by stages.xray's command
    subprocess.run([sys.executable, "-m", "stages.xray", str(path), str(html)], check=True, cwd=ROOT)
    assert html.read_text().startswith("<!doctype html>")
    with pytest.raises(ValueError, match="python -m stages.xray"):
        stages["02_continuous_batch"].LLM("tiny", trace=html)
    with pytest.raises(ValueError, match="trace=.*does not exist"):
        stages["02_continuous_batch"].LLM("tiny", trace=tmp_path / "no" / "such.json")


def test_recording_off_attaches_nothing():
    llm = stages["03_paged_kv"].LLM("tiny")
    assert llm.trace is None and llm.observers == []


def test_bad_trace_files_get_a_clear_error(tmp_path):
    llm = stages["03_paged_kv"].LLM("tiny", trace=tmp_path / "good.json")
    llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, ignore_eos=True))
    text = (tmp_path / "good.json").read_text()
    for cut in (len(text) // 2, len(text) // 3, len(text) - 1, 40):  # inside a string, a number, a list...
        (tmp_path / "cut.json").write_text(text[:cut])
        with pytest.raises(TraceError, match="ends early"):
            load(tmp_path / "cut.json")
    (tmp_path / "bad.json").write_text(text.replace('"seqs":', '"seqs"', 1))
    with pytest.raises(TraceError, match="invalid JSON at line 1 column"):
        load(tmp_path / "bad.json")
    other = json.loads(text) | {"version": 99}
    (tmp_path / "v99.json").write_text(json.dumps(other))
    with pytest.raises(TraceError, match="version 99 of the X-ray format; this stepwise reads version 1"):
        load(tmp_path / "v99.json")
    (tmp_path / "other.json").write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(TraceError, match="not a stepwise X-ray trace"):
        load(tmp_path / "other.json")
    broken = json.loads(text)
    del broken["runs"][0]["steps"][1]["waiting"]
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    with pytest.raises(TraceError, match="step 1 has no waiting"):
        load(tmp_path / "broken.json")
    with pytest.raises(TraceError, match="cannot read"):
        load(tmp_path / "missing.json")


def test_chrome_trace_has_a_slice_per_sequence_step_and_the_counters(tmp_path):
    llm = stages["02_continuous_batch"].LLM("tiny", max_num_seqs=4)
    rec = llm.add_observer(Recorder("02"))
    llm.generate(*toy())
    rec.end_run()
    chrome.write(rec.trace(), tmp_path / "run.perfetto.json")
    events = json.loads((tmp_path / "run.perfetto.json").read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X" and e["tid"] != 0]
    assert len(slices) == llm.stats.slot_steps_used
    assert {e["tid"] for e in slices} == {1, 2, 3, 4}  # one track per slot
    queue = [e for e in events if e["ph"] == "C" and e["name"] == "queue"]
    assert len(queue) == llm.stats.steps
    assert all(e["ts"] >= 0 and e["dur"] > 0 for e in slices)


def test_command_line_flags_write_the_three_files(tmp_path):
    from rich.console import Console
    from stages.cli import parser, run
    files = {"--trace": tmp_path / "run.json", "--xray": tmp_path / "run.html",
             "--chrome-trace": tmp_path / "run.perfetto.json"}
    args = parser("test").parse_args(["--model", "tiny", "--workload", "random", "--num-requests", "3",
                                      "--max-tokens", "8", "--max-num-seqs", "2"]
                                     + [str(x) for kv in files.items() for x in kv])
    console = Console(record=True, width=200)
    rows = run(["stages.02_continuous_batch", "stages.03_paged_kv"], args, console)
    trace = load(files["--trace"])
    assert [r["label"] for r in trace["runs"]] == list(rows)
    assert [len(r["steps"]) for r in trace["runs"]] == [row["steps"] for row in rows.values()]
    assert page_data(files["--xray"].read_text()) == trace
    assert json.loads(files["--chrome-trace"].read_text())["traceEvents"]
    assert f"wrote the recording {files['--trace']}" in console.export_text().replace("\n", "")
    bad = parser("test").parse_args(["--model", "tiny", "--xray", str(tmp_path / "no" / "run.html")])
    with pytest.raises(SystemExit, match="--xray=.*the folder .* does not exist"):
        run(["stages.02_continuous_batch"], bad, console)


def page_data(html: str) -> dict:
    return json.loads(html.split('<script type="application/json" id="xray-data">')[1].split("</script>")[0])["trace"]
