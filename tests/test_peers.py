"""The ladder's peers: each verdict is the best stage over that peer, from the run's own rows; a peer that is missing
or fails costs one note and the ladder goes on; llama.cpp batched gives one-at-a-time llama.cpp's tokens."""
import copy
import importlib
import json
import sys

import pytest

from common.paths import DEFAULT_MODEL
from common import ReferenceLLM
from stages import workloads
from stages.workloads import continuous_steps
from stages.bench import peers, verdict

ladder = importlib.import_module("stages.__main__")
ARGS = ["--model", "tiny", "--workload", "random", "--num-requests", "6", "--max-tokens", "12", "--prompt-range",
        "4,40", "--max-num-seqs", "4", "--stages", "01,03", "--no-plain", "--no-llama-cpp"]


def stage_rows(*rates, plain=None):
    rows = {name: {"output tok/s": r} for name, r in zip(verdict.STAGE_ORDER, rates)}
    if plain is not None:  # stage 03 on plain math: a lesson, not a rung, so never "the best stage"
        rows["03 paged, plain math"] = {"output tok/s": plain}
    return rows


def test_each_peer_verdict_is_the_best_stage_over_that_peer_at_its_limit_and_alone():
    stages = {32: stage_rows(100.0, 130.0, 250.0, 240.0), 64: stage_rows(120.0, 170.0, 300.0, 330.0, plain=900.0)}
    at = {32: {"vllm": {"output tok/s": 200.0}}, 64: {"vllm": {"output tok/s": 220.0},
                                                     "llama-cpp": {"output tok/s": 60.0}}}
    got = verdict.peer_verdicts(stages, at, ("04 kernels", 90.0), {"llama-cpp": 72.0, "hf-generate": 30.0},
                                 peers.PEERS, peers.ALONE)
    want = []
    for n, rows in at.items():
        best = max((name for name in stages[n] if "plain" not in name), key=lambda k: stages[n][k]["output tok/s"])
        want += [(p, n, best, stages[n][best]["output tok/s"] / r["output tok/s"]) for p, r in rows.items()]
    want += [(p, 1, "04 kernels", 90.0 / rate) for p, rate in (("llama-cpp", 72.0), ("hf-generate", 30.0))]
    assert [(v["peer"], v["in flight"], v["stage"], v["ratio"]) for v in got] == want
    assert got[0]["text"] == "vs vLLM CPU at 32 in flight: 03 paged 250.0 / 200.0 output tok/s = 1.25x"
    assert got[-2]["text"] == "vs llama.cpp, one request alone: 04 kernels 90.0 / 72.0 decode tok/s = 1.25x"
    # no stage ran: no verdict
    assert verdict.peer_verdicts({32: {}}, at, None, {"llama-cpp": 1.0}, peers.PEERS, peers.ALONE) == []


def test_token_agreement_counts_identical_requests_and_the_median_first_difference():
    reference = [[1, 2, 3, 4], [5, 6, 7], [8, 9], [1, 1, 1, 1, 1]]
    tokens = [[1, 2, 3, 4], [5, 0, 7], [8, 9, 2], [1, 1, 1, 0, 1]]  # the same; at 1; longer, so at 2; at 3
    assert peers.agreement(tokens, reference) == ("1 of 4 requests give the first stage's tokens; the others first "
                                                  "differ at token 2 (median)")
    assert peers.agreement(reference, reference) == "4 of 4 requests give the first stage's tokens"


@pytest.mark.parametrize("text", ["vllm,sglang", "", "llama.cpp"])
def test_an_unknown_peer_is_refused_with_the_names_it_could_be(text, capsys):
    with pytest.raises(SystemExit):
        importlib.import_module("stages.bench.ladder").build_parser().parse_args(["--peers", text])
    assert "vllm, llama-cpp, hf-cb" in capsys.readouterr().err


def test_the_peer_flags_and_the_baselines_flags_choose_together():
    parse = importlib.import_module("stages.bench.ladder").build_parser().parse_args
    assert peers.chosen(parse([])) == list(peers.PEERS)
    assert peers.chosen(parse(["--peers", "none"])) == []
    assert peers.chosen(parse(["--no-hf", "--no-vllm"])) == ["llama-cpp"]
    assert peers.chosen(parse(["--peers", "hf-cb,vllm", "--no-llama-cpp"])) == ["hf-cb", "vllm"]


def test_the_ladder_runs_a_peer_beside_the_stages_and_says_how_far_ahead_the_best_stage_is(tmp_path, monkeypatch,
                                                                                          capsys):
    seen, real = {}, peers.batched

    def keep(peer, work, n):  # the peer's tokens, before the ladder folds them into a note
        row = real(peer, work, n)
        seen[peer] = copy.deepcopy(row)
        return row

    monkeypatch.setattr(peers, "batched", keep)
    out = tmp_path / "bench.json"
    result = ladder.main([*ARGS, "--peers", "hf-cb", "--json", str(out), "--markdown"])
    printed = capsys.readouterr().out
    prompts, params = workloads.random_lengths(6, (4, 40), (8, 12), 1024)
    engines, row = result["engines"], result["engines"]["HF continuous batching"]
    assert list(engines) == ["01 static", "03 paged", "HF continuous batching"] and result["peers"] == [
        "HF continuous batching"]
    # counted as the stages count: this workload ignores EOS, so every request runs to its max_tokens
    assert row["output tokens"] == sum(p.max_tokens for p in params) and row["prompt tokens"] == sum(map(len, prompts))
    assert row["output tok/s"] == pytest.approx(row["output tokens"] / row["wall s"])
    assert 0 < row["TTFT p50 s"] <= row["TTFT p99 s"] <= row["wall s"]
    best = max(["01 static", "03 paged"], key=lambda k: engines[k]["output tok/s"])
    alone = result["single_request"]
    (at4, one) = result["peer_verdicts"]
    assert (at4["peer"], at4["in flight"], at4["stage"]) == ("hf-cb", 4, best)
    assert at4["ratio"] == pytest.approx(engines[best]["output tok/s"] / row["output tok/s"])
    assert (one["peer"], one["in flight"], one["stage"]) == ("hf-generate", 1, alone["best stage"][0])
    assert one["ratio"] == pytest.approx(alone["best stage"][1] / alone["HF batch 1 decode tok/s"])
    assert at4["text"] in " ".join(printed.split()) and f"* {at4['text']}" in printed  # the console and --markdown
    reference = [o.token_ids for o in ReferenceLLM("tiny").generate(prompts, params)]
    note = f"HF continuous batching: {peers.agreement(seen['hf-cb']['tokens'], reference)}"
    assert note in result["notes"] and "tokens" not in row
    saved = json.loads(out.read_text())
    assert saved["peer_verdicts"] == json.loads(json.dumps(result["peer_verdicts"])) and "HF continuous batching" in \
        saved["engines"]


def test_a_missing_or_failing_peer_is_one_note_and_the_ladder_goes_on(monkeypatch):
    from stages.bench import peer_hf_cb

    monkeypatch.setitem(sys.modules, "stages.bench.peer_vllm", None)  # importing it now raises ImportError

    def broken(*args, **kwargs):
        raise RuntimeError("paged cache\nexhausted")

    monkeypatch.setattr(peer_hf_cb, "hf_continuous", broken)
    result = ladder.main([*ARGS, "--peers", "vllm,hf-cb", "--in-flight", "2,4"])
    assert list(result["engines"]) == ["01 static @2", "03 paged @2", "01 static @4", "03 paged @4"]
    vllm = [n for n in result["notes"] if n.startswith("vLLM")]
    assert vllm == ["vLLM CPU peer: not built (make bench-peers) (at 2 in flight)"]  # each once, then dropped
    hf = [n for n in result["notes"] if n.startswith("HF continuous")]
    assert hf == ["HF continuous batching failed: paged cache exhausted (at 2 in flight)"]
    assert result["peers"] == [] and [v["peer"] for v in result["peer_verdicts"]] == ["hf-generate"]


@pytest.mark.real_model
def test_llama_cpp_batched_gives_the_tokens_of_llama_cpp_one_request_at_a_time():
    """The oracle is llama-cpp-python's own high-level `generate`, one request after another, greedy, with
    flash attention on as the batched context has it (llama.cpp's default; with it off, some requests part
    after a few tokens: another attention kernel, not batching)."""
    pytest.importorskip("llama_cpp")
    from llama_cpp import Llama

    from common.paths import smollm2_gguf_path
    from stages.bench import peer_llama_cpp

    ref = ReferenceLLM(DEFAULT_MODEL, dtype="bfloat16")
    texts, _ = workloads.build("chat", ref.tokenizer, 3, 16, ref.config.vocab_size)
    ids = [ref.tokenizer.encode(t) if isinstance(t, str) else t for t in texts]
    limits = [9, 16, 16]
    llm = Llama(model_path=str(smollm2_gguf_path()), n_ctx=512, n_threads=1, flash_attn=True, verbose=False)
    expected = []
    for prompt, limit in zip(ids, limits):
        tokens = []
        for t in llm.generate(prompt, top_k=1, temp=0.0, repeat_penalty=1.0, reset=True):
            tokens.append(t)
            if t in ref.config.eos_token_ids or len(tokens) == limit:
                break
        expected.append(tokens)
    # two sequence ids for three requests: the third takes the slot (and the cleared KV stream) the first leaves
    row = peer_llama_cpp.batched(smollm2_gguf_path(), ids, limits, list(ref.config.eos_token_ids), 2, threads=1)
    assert row["tokens"] == expected
    assert row["output tokens"] == sum(map(len, expected))
    assert row["steps"] == continuous_steps([len(t) for t in expected], 2)
