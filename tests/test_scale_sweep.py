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
        assert r["decode tok/s"] > 0 and 0 < r["of ceiling"] and r["weight bytes"] > 0
    assert (tmp_path / "s.json").exists() and (tmp_path / "s.png").exists() and (tmp_path / "s-context.png").exists()


def test_bad_input_is_refused(models_dir):
    with pytest.raises(FileNotFoundError, match="make it with"):
        scale.main(["--models-dir", str(models_dir), "--models", "llama-3.2-3b", "--dry-run"])
    with pytest.raises(ValueError, match="unknown engine 'tgi'"):
        scale.main(["--models-dir", str(models_dir), "--models", "q05", "--engines", "tgi", "--dry-run"])
