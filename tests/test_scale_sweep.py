"""`python -m stages.bench.scale` end to end on a reduced shape (two points, each in its own child), its plan's
skips, and its bad input."""
import pytest

from common import ReferenceLLM, SamplingParams
from stages.bench import scale, scale_plan
from stages.bench.make_model import make_model
from stages.bench.scale_run import prompts_for
from stages.bench.shapes import get_shape, reduced


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory, real_folder):
    root = tmp_path_factory.mktemp("scale-models")
    make_model(reduced(get_shape("qwen2.5-0.5b"), 7, 2), root / "q05", "bfloat16", quiet=True)
    return root


def test_the_plan_skips_what_does_not_fit_and_says_why(models_dir, monkeypatch):
    # 50 MB available: the weights (14 MB) fit, 2,000 requests of 48 tokens' KV (512 bytes a token) do not
    monkeypatch.setattr(scale, "available_bytes", lambda: 50_000_000)
    got = scale.main(["--models-dir", str(models_dir), "--models", "q05", "--prompts", "16,100000", "--in-flight",
                      "1,2000", "--engines", "04-bf16,llama.cpp-q4_1", "--dry-run"])
    assert [(p["prompt"], p["in_flight"]) for p in got["points"]] == [(16, 1)]
    assert any("x 2000 in flight: needs 0.1 GB" in s for s in got["skips"])
    assert any("no model-q4_1.gguf" in s for s in got["skips"])
    assert any("past the model's context" in s for s in got["skips"])  # 100,000 > 32,768 positions


def test_scale_runs_end_to_end_and_stages_give_the_reference_tokens(models_dir, tmp_path):
    report = scale.main(["--models-dir", str(models_dir), "--models", "q05", "--prompts", "16", "--in-flight", "2",
                         "--engines", "04-bf16,05-bf16", "--out-tokens", "3", "--json", str(tmp_path / "s.json"),
                         "--plot", str(tmp_path / "s.png")])
    assert [r["engine"] for r in report["results"]] == ["04-bf16", "05-bf16"], report["skips"]
    point = scale_plan.Point("q05", str(models_dir / "q05"), "04-bf16", 16, 2, 3)
    expected = [o.token_ids for o in ReferenceLLM(point.folder, dtype="bfloat16").generate(
        prompts_for(point), SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))]
    for r in report["results"]:
        assert r["tokens"] == expected, r["engine"]
        assert 0 < r["of ceiling"] and r["weight bytes"] > 0
        # Both 16-token prompts fit the first step, so every step after it decodes both: the window holds each
        # request's two later tokens, whole steps (each token at its step's end).
        assert r["steady tokens"] == 2 * 2 and r["steady decode tok/s"] > 0, r["engine"]
    assert (tmp_path / "s.json").exists() and (tmp_path / "s.png").exists() and (tmp_path / "s-context.png").exists()


def test_bad_input_is_refused(models_dir):
    with pytest.raises(FileNotFoundError, match="make it with"):
        scale.main(["--models-dir", str(models_dir), "--models", "llama-3.2-3b", "--dry-run"])
    with pytest.raises(ValueError, match="unknown engine 'tgi'"):
        scale.main(["--models-dir", str(models_dir), "--models", "q05", "--engines", "tgi", "--dry-run"])


def test_a_vllm_point_runs_through_the_peer_with_the_points_context(tmp_path, monkeypatch):
    """The vLLM engine of the sweep: the point's prompts through the peer's runner (a stand-in here: vLLM is not in
    the test venv), told the point's context and to ignore EOS; the figures from each token's time."""
    from stages.bench import peer_vllm, scale_run

    monkeypatch.setenv("STEPWISE_HOME", str(tmp_path / "home"))
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"x" * 1000)
    seen = {}

    def fake_run(settings):
        seen.update(settings)
        # Request 1: its first token at 0.5 s, 4 more 0.1 s apart (the 0.5-1.0 gap a stall); request 2 at 1.0 s,
        # then 0.25 s apart: tokens at 0.5, 1.0, 1.1, 1.2, 1.3 and 1.0, 1.25, 1.5, 1.75, 2.0.
        times = [[0.5, 1.0, 1.1, 1.2, 1.3], [1.0, 1.25, 1.5, 1.75, 2.0]]
        return {"wall_s": 2.0, "requests": [{"first_token_s": t[0], "last_token_s": t[-1], "token_s": t,
                                             "token_ids": [7] * 5} for t in times]}

    monkeypatch.setattr(peer_vllm, "run_vllm", fake_run)
    point = scale_plan.Point("m", str(folder), "vllm-bf16", 16, 2, 5)
    got = scale_run.run_point(point)
    assert seen["max_model_len"] >= 16 + 5 and seen["ignore_eos"] and seen["max_num_seqs"] == 2
    assert seen["max_num_batched_tokens"] == scale_run.budget(point) == 512  # the stages' budget
    assert seen["prompts"] == prompts_for(point) and seen["max_tokens"] == [5, 5]
    assert got["TTFT p50 s"] == pytest.approx(0.75) and got["prefill tok/s"] == pytest.approx(32 / 1.0)
    # TPOT: (1.3 - 0.5) / 4 = 0.2 s and (2.0 - 1.0) / 4 = 0.25 s, median 0.225 s.
    assert got["TPOT p50 ms"] == pytest.approx(225.0) and got["in flight / TPOT p50 tok/s"] == pytest.approx(2 / .225)
    # Window (1.0, 1.3]: request 1's 1.1, 1.2, 1.3 and request 2's 1.25 = 4 tokens in 0.3 s.
    assert got["steady tokens"] == 4 and got["steady decode tok/s"] == pytest.approx(4 / 0.3)
    assert got["output tok/s"] == pytest.approx(10 / 2.0) and got["weight bytes"] == 1000


def test_a_vllm_result_without_per_token_times_is_refused(tmp_path, monkeypatch):
    from stages.bench import peer_vllm, scale_run

    monkeypatch.setenv("STEPWISE_HOME", str(tmp_path / "home"))
    (tmp_path / "model.safetensors").write_bytes(b"x")
    monkeypatch.setattr(peer_vllm, "run_vllm", lambda settings: {"wall_s": 1.0, "requests": [
        {"first_token_s": 0.5, "last_token_s": 0.9, "token_ids": [7, 7]}]})
    with pytest.raises(RuntimeError, match="no time for some token"):
        scale_run.run_point(scale_plan.Point("m", str(tmp_path), "vllm-bf16", 16, 1, 2))
