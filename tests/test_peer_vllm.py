"""vLLM's CPU backend as a peer: the JSON hand-off to its venv, the row built from what it returns, the one-line
reasons it cannot run and, where .venv-vllm exists, its greedy tokens against the reference's."""
import os
import sys
import textwrap

import pytest

from stages.report import percentile
from stages.bench import peer_vllm

# What the runner would print: request 0 stops on EOS (vLLM keeps it), 1 runs to max_tokens, 2 stops on EOS with the
# stop token left out of token_ids (so counted from stop_reason), 3 gives one token, so it has no TPOT.
CANNED = {"vllm": "0.32.0", "start_s": 41.0, "warm_s": 1.5, "wall_s": 2.0, "requests": [
    {"token_ids": [5, 6, 2], "finish_reason": "stop", "stop_reason": 2, "first_token_s": 0.5, "last_token_s": 0.9},
    {"token_ids": [7, 8, 9, 10], "finish_reason": "length", "stop_reason": None, "first_token_s": 0.3,
     "last_token_s": 0.6},
    {"token_ids": [4], "finish_reason": "stop", "stop_reason": 2, "first_token_s": 0.2, "last_token_s": 0.4},
    {"token_ids": [3], "finish_reason": "length", "stop_reason": None, "first_token_s": 0.1, "last_token_s": 0.1},
]}
PROMPTS = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]]


def fake_runner(tmp_path, body: str):
    path = tmp_path / "runner.py"
    path.write_text(textwrap.dedent(body))
    return path


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPWISE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(peer_vllm, "VENV", tmp_path / "no-venv")  # no libiomp5 to preload, no vLLM


def test_settings_and_environment_reach_the_runner_and_its_json_comes_back(tmp_path, isolated, monkeypatch):
    runner = fake_runner(tmp_path, f"""
        import json, os, sys
        settings = json.load(open(sys.argv[1]))
        env = {{k: os.environ.get(k) for k in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU",
                                             "VLLM_CPU_KVCACHE_SPACE", "OMP_NUM_THREADS", "LD_PRELOAD")}}
        json.dump(dict({CANNED!r}, received=settings, env=env), open(sys.argv[2], "w"))
    """)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")  # the user's setting wins
    monkeypatch.setenv("LD_PRELOAD", "/some/lib.so")
    folder = tmp_path / "ckpt"
    folder.mkdir()
    settings, eos = peer_vllm.settings_for(folder, PROMPTS, [3, 4, 5, 1], 2, 4, "float32")
    result = peer_vllm.run_vllm(settings, python=sys.executable, runner=runner)
    assert result["received"] == settings and eos == [2]
    assert (settings["stop_token_ids"], settings["ignore_eos"], settings["max_num_seqs"]) == ([2], False, 4)
    cpus = sorted(os.sched_getaffinity(0))
    assert result["env"]["VLLM_CPU_OMP_THREADS_BIND"].split(",") == [str(c) for c in cpus]
    assert result["env"]["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0" and result["env"]["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert result["env"]["OMP_NUM_THREADS"] is None
    assert result["env"]["LD_PRELOAD"].split(":")[-1] == "/some/lib.so"


def test_row_counts_tokens_like_the_stages_and_times_from_the_metrics():
    r = peer_vllm.to_row("vLLM", PROMPTS, CANNED, [2])
    # Recomputed by hand from CANNED: tokens up to and including EOS, the dropped stop token counted back.
    tokens = [[5, 6, 2], [7, 8, 9, 10], [4, 2], [3]]
    assert r["tokens"] == tokens
    assert r["output tokens"] == 3 + 4 + 2 + 1 and r["prompt tokens"] == 3 + 2 + 1 + 4 and r["requests"] == 4
    assert r["output tok/s"] == pytest.approx(10 / 2.0) and r["wall s"] == 2.0
    ttft = [0.5, 0.3, 0.2, 0.1]
    tpot = [(0.9 - 0.5) / 2, (0.6 - 0.3) / 3, (0.4 - 0.2) / 1]  # request 3's single token has no gap
    assert r["TTFT p50 s"] == percentile(ttft, 50) and r["TTFT p99 s"] == 0.5
    assert r["TPOT p50 ms"] == pytest.approx(1e3 * percentile(tpot, 50))
    assert r["start s"] == 42.5  # start and warm request, never in the throughput


def test_tokens_are_cut_at_the_first_eos_of_any_id_and_kept_whole_without_eos():
    stop = {"token_ids": [9, 3, 8, 2], "finish_reason": "stop", "stop_reason": None}
    assert peer_vllm.tokens_like_ours(stop, [2, 3]) == [9, 3]
    assert peer_vllm.tokens_like_ours(stop, []) == [9, 3, 8, 2]  # ignore_eos: every token counts


def test_missing_metrics_fail_in_one_line():
    result = dict(CANNED, requests=[dict(CANNED["requests"][0], first_token_s=None)])
    with pytest.raises(RuntimeError, match="no per-request metrics"):
        peer_vllm.to_row("vLLM", PROMPTS[:1], result, [2])


def test_without_the_venv_every_entry_point_says_why_in_one_line(tmp_path, isolated):
    reason = peer_vllm.vllm_available()
    assert reason is not None and "\n" not in reason and "make vllm-venv" in reason
    for call in (lambda: peer_vllm.vllm_cpu(tmp_path, PROMPTS, [3, 4, 5, 1], [2], 4, "bfloat16"),
                 lambda: peer_vllm.vllm_cpu_single(tmp_path, [1, 2], 8, "bfloat16")):
        with pytest.raises(RuntimeError) as e:
            call()
        assert str(e.value) == reason


def test_a_venv_without_vllm_or_with_another_version_is_named(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(0o755)
    assert "no vllm-cpu package" in peer_vllm.vllm_available(venv)
    python.write_text("#!/bin/sh\necho 0.31.0\n")
    assert "holds vllm-cpu 0.31.0, not 0.32.0" in peer_vllm.vllm_available(venv)


def test_a_failing_runner_gives_its_error_in_one_line(tmp_path, isolated):
    runner = fake_runner(tmp_path, """
        print("INFO loading")
        raise ValueError("KV cache space 0 GiB is too small")
    """)
    with pytest.raises(RuntimeError) as e:
        peer_vllm.run_vllm({}, python=sys.executable, runner=runner)
    assert "\n" not in str(e.value) and "ValueError: KV cache space 0 GiB is too small" in str(e.value)
    assert "exit 1" in str(e.value)


def test_the_dense_folder_links_everything_but_the_q4_1_blocks(tmp_path, isolated):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    for name in ("config.json", "model.safetensors", "q4_1.safetensors", "tokenizer.json", "generation_config.json"):
        (folder / name).write_text(name)
    dense = peer_vllm.dense_folder(folder)
    assert sorted(p.name for p in dense.iterdir()) == ["config.json", "generation_config.json", "model.safetensors",
                                                       "tokenizer.json"]
    assert all(p.resolve() == folder / p.name for p in dense.iterdir())
    (folder / "generation_config.json").unlink()
    assert "generation_config.json" not in {p.name for p in peer_vllm.dense_folder(folder).iterdir()}  # rebuilt


@pytest.mark.parametrize("bad", [dict(max_tokens=[3]), dict(dtype="float16"), dict(max_num_seqs=0),
                                 dict(prompts=[[1], []], max_tokens=[2, 2])])
def test_bad_input_fails_alone_with_a_clear_message(tmp_path, isolated, bad):
    args = dict(prompts=[[1], [2]], max_tokens=[2, 2], eos=[2], max_num_seqs=2, dtype="bfloat16") | bad
    with pytest.raises(ValueError, match="vLLM peer"):
        peer_vllm.settings_for(tmp_path, **args)


@pytest.mark.real_model
@pytest.mark.skipif(not (peer_vllm.VENV / ".stamp-vllm").exists(), reason="no .venv-vllm (make vllm-venv)")
def test_vllm_greedy_tokens_equal_the_reference_in_float32(real_folder):
    """Three chat prompts to EOS: vLLM's float32 tokens were found identical to the reference's, every one."""
    from common import ReferenceLLM, SamplingParams
    from stages import workloads

    ref = ReferenceLLM(str(real_folder), dtype="float32")
    prompts = [ref.tokenizer.encode(text) for text in workloads.chat(ref.tokenizer, 3)[0]]
    expected = [o.token_ids for o in ref.generate(prompts, SamplingParams(temperature=0, max_tokens=96))]
    r = peer_vllm.vllm_cpu(real_folder, prompts, [96] * 3, list(ref.config.eos_token_ids), 3, "float32")
    assert r["tokens"] == expected
    assert r["output tokens"] == sum(map(len, expected)) and r["start s"] > 0


def test_agreement_names_identical_requests_and_where_the_others_part():
    from stages.bench.vllm_check import agreement

    assert agreement([[1, 2, 3], [4, 5], [6, 7]], [[1, 2, 3], [4, 9], [6, 7, 8]]) == (
        "1 of 3 requests identical; the others first differ at token 1, 2")
