"""python -m stages tour --quick, end to end on the tiny model: every section is there, and its figures are the
engines' own counters and the roofline arithmetic, recomputed here independently."""
import importlib
import io
import math

from rich.console import Console

from common import ReferenceLLM
from stages import workloads
from common.config import kv_bytes
from stages.tour import tour


def test_tour_quick_every_section_and_its_figures():
    out = io.StringIO()
    f = tour(quick=True, console=Console(file=out, width=120))
    text = out.getvalue()
    for header in ("1. Prepare", "2. Schedule", "3. Cache", "4. Kernels and streaming", "Staff-level answer",
                   "Common mistakes", "Variants"):
        assert header in text
    for q, label in ((None, "bfloat16"), ("int8", "int8"), ("int4", "int4")):
        assert f["prepare"][label]["weight bytes"] == ReferenceLLM("tiny", quantization=q).model.weight_bytes
        assert math.isfinite(f["prepare"][label]["perplexity"]) and f["prepare"][label]["perplexity"] > 1
    prompts, params = workloads.toy()
    for name in ("01_static_batch", "02_continuous_batch"):
        llm = importlib.import_module(f"stages.{name}").LLM("tiny", max_num_seqs=4)
        llm.generate(prompts, params)
        assert f["schedule"][name] == llm.stats.steps
    assert (f["schedule"]["01_static_batch"], f["schedule"]["02_continuous_batch"]) == (160, 112)
    assert "from 160 to 112 steps" in text.replace("\n", " ")
    per_token = kv_bytes(40, 40, 128, 2)
    assert f["cache"]["article reserving"] == int(46e9 // (2048 * per_token)) == 27
    assert f["cache"]["article paged"] == int(46e9 // (400 * per_token)) == 140
    growth = f["cache"]["block table growth"]
    assert [len(blocks) for _, blocks in growth] == [-(-tokens // 16) for tokens, _ in growth]
    assert len(growth) >= 2 and all(a[1] == b[1][:len(a[1])] for a, b in zip(growth, growth[1:]))  # it only grows
    k = f["kernels"]
    assert k["tokens"] == 32 and k["TTFT s"] > 0 and k["TPOT ms"] > 0
    assert math.isclose(k["achieved tok/s"], 1e3 / k["TPOT ms"])
    assert math.isclose(k["fraction of ceiling"], k["achieved tok/s"] / k["ceiling tok/s"])
    assert f["same tokens"] == {"requests": 4, "identical": 4}
    assert "4 of 4 requests gave identical tokens" in text.replace("\n", " ")
