"""The benchmark ladder runs end to end (tiny model, CPU) and its baselines count tokens like the stages."""
import json
import os
import subprocess
import sys
from pathlib import Path

from common import ReferenceLLM, SamplingParams
from common.paths import resolve_model

ROOT = Path(__file__).resolve().parents[1]


def test_ladder_runs_and_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "stages", "--model", "tiny", "--workload", "random", "--num-requests", "6",
           "--max-tokens", "12", "--prompt-range", "4,40", "--max-num-seqs", "4", "--stages", "01,02,03,05",
           "--no-hf", "--no-llama-cpp", "--json", str(out)]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    engines = result["engines"]
    assert list(engines) == ["01 static", "02 continuous", "03 paged", "05 streaming"]
    assert all(result["same_tokens"].values())
    assert len({e["output tokens"] for e in engines.values()}) == 1
    first = engines["01 static"]["output tok/s"]
    for e in engines.values():
        assert abs(e["x stage 01"] - e["output tok/s"] / first) < 1e-9
        assert 0 < e["bandwidth use"] and 0 < e["compute use"]
    assert "same tokens as first stage" in run.stdout


def test_hf_baseline_counts_the_reference_tokens():
    import torch

    from stages.bench import baselines
    prompts = [[5, 6, 7, 8], [300, 301], [40, 41, 42, 43, 44, 45]]
    limits = [6, 9, 4]
    row = baselines.hf_generate(resolve_model("tiny"), prompts, limits, eos=2, batch_size=2, dtype=torch.float32)
    ref = ReferenceLLM("tiny", dtype="float32").generate(prompts, [SamplingParams(temperature=0, max_tokens=n)
                                                                   for n in limits])
    assert row["output tokens"] == sum(len(r.token_ids) for r in ref)
    assert row["requests"] == 3 and row["prompt tokens"] == 12 and row["steps"] == 9 + 4
