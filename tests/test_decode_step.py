"""`python -m stages.bench.decode_step` on a reduced 1B shape: it times the decode-only steps by part, tells them from
the steps that prefill, leaves the tokens the reference's, and puts back what it wrapped."""
import pytest

from common import ReferenceLLM, SamplingParams
from common.numerics import attention_native, invariant
from stages.bench import decode_step
from stages.bench.make_model import make_model
from stages.bench.scale_plan import Point
from stages.bench.scale_run import prompts_for
from stages.bench.shapes import get_shape, reduced


@pytest.fixture(scope="module")
def folder(tmp_path_factory, real_folder):
    root = tmp_path_factory.mktemp("decode-step")
    make_model(reduced(get_shape("llama-3.2-1b"), 8, 2), root / "l1", "bfloat16", quiet=True)
    return str(root / "l1")


def test_decode_steps_are_timed_apart_from_prefill_and_tokens_stay_the_references(folder, capsys):
    call, attend = invariant.RowTiled.__call__, attention_native.NativeTable.attention
    r = decode_step.run(folder, "bf16", 3, 16, 5)
    # 3 prompts of 16 tokens fit the 512-token budget: one step prefills them all (and samples each one's first
    # token), then every step feeds each request one token until each has 5.
    assert [tokens for _, tokens in r["mixed"]] == [48] and len(r["walls"]) == 4 and r["fewer"] == []
    expected = [o.token_ids for o in ReferenceLLM(folder, dtype="bfloat16").generate(
        prompts_for(Point("", folder, "04-bf16", 16, 3, 5)), SamplingParams(temperature=0, max_tokens=5,
                                                                            ignore_eos=True))]
    assert r["tokens"] == expected
    parts = r["parts"]
    assert {"linear qkv", "linear o", "linear gate_up", "linear down", "linear lm_head", "norms", "swiglu",
            "scheduler", "block tables"} <= set(parts)
    assert all(v > 0 for v in parts.values()) and sum(parts.values()) < sum(r["walls"]) / len(r["walls"])
    assert set(r["alone"]) == {"qkv", "o", "gate_up", "down", "lm_head"} and r["layers"] == 2
    assert {"linear qkv", "norms"} <= set(r["prefill parts"])
    assert sum(r["prefill parts"].values()) < sum(w for w, _ in r["mixed"])
    assert (invariant.RowTiled.__call__, attention_native.NativeTable.attention) == (call, attend)  # put back
    decode_step.report(r)
    out = capsys.readouterr().out
    assert "decode-only steps of all 3: 4" in out and "the rest" in out and "with prompt tokens, share" in out


def test_steps_after_the_first_requests_finish_are_kept_apart(folder):
    # Two prompts of 300 tokens under a 512-token budget: the first prefills alone and starts decoding while the
    # second's prompt is fed in two steps, so the first finishes its 4 tokens a step before the second.
    r = decode_step.run(folder, "bf16", 2, 300, 4)
    assert [tokens for _, tokens in r["mixed"]] == [512, 89] and len(r["walls"]) == 2
    assert [rows for _, rows in r["fewer"]] == [1]


def test_an_unknown_precision_is_refused(folder):
    with pytest.raises(SystemExit, match="--precision: 'fp8' is not one of bf16, int8, int4"):
        decode_step.main(["--model", folder, "--precision", "fp8"])
