"""stages/bench/edge.py: the per-precision measurement runs in a fresh process and reports figures that add up."""
import pytest

from common.numerics import native
from common.numerics.quant import precision_bytes
from stages.bench import machine
from stages.bench import edge, edge_measure


def test_read_bandwidth_is_positive_and_finite():
    assert 1e8 < machine.measure_read_bandwidth(mb=16, repeats=2) < 1e13


@pytest.mark.parametrize("quantization", ["int4"])
def test_a_fresh_process_measures_one_precision(tiny_folder, quantization):
    from safetensors import safe_open

    row = edge.in_fresh_process(["--child", quantization, "--model", "tiny", "--tokens", "4"])
    with safe_open(tiny_folder / "model.safetensors", "pt") as f:
        shapes = {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}
    assert row["weight MB"] == pytest.approx(precision_bytes(shapes, quantization) / 1e6)
    assert row["peak MB at load"] >= row["resident MB after load"] > row["load MB over bare process"] > 0
    assert row["ms per token"] > 0 and row["ms per token, stage 04"] > 0
    # Both prompt lengths are timed; which is faster is a timing on a shared machine, never a test (CI saw the short
    # prompt's first token take 70.6 ms and the 512-token one 51.0 ms on the tiny model).
    ttfts = [v for k, v in row.items() if k.startswith("TTFT")]
    assert len(ttfts) == 2 and min(ttfts) > 0
    assert row["linear calls per token"] == 4 * 2 + 1  # the tiny model: qkv, o, gate_up, down per layer, LM head
    # The linears are timed call by call in a run of their own: on a loaded machine they can exceed the step's
    # own time, so only their sign is a fact here; the rest of the step is defined as the difference.
    assert row["linears ms per token, stage 04"] > 0
    assert row["rest of the step ms, stage 04"] == pytest.approx(
        row["ms per token, stage 04"] - row["linears ms per token, stage 04"])


def test_time_per_call_fit_recovers_a_fixed_cost_and_a_bandwidth():
    """The fit against made-up calls: 7 µs each plus their bytes at 25 GB/s."""
    samples = [(b, 7e-6 + b / 25e9) for b in (331_776, 552_960, 1_769_472, 884_736, 28_311_552)]
    fixed, bandwidth = edge_measure.time_per_call_fit(samples)
    assert fixed == pytest.approx(7e-6, rel=1e-6) and bandwidth == pytest.approx(25e9, rel=1e-6)


def test_speed_ratios_are_taken_round_by_round():
    """Each ratio divides two times of the same round: a slow round slows both sides and cancels."""
    def row(reference, stage_04):
        return {"ms per token": reference, "ms per token, stage 04": stage_04}

    by_round = [{"bfloat16": row(20, 10), "int8": row(16, 5), "int4": row(12, 4), "llama.cpp Q4_1": row(12, 99)},
                {"bfloat16": row(40, 30), "int8": row(32, 15), "int4": row(24, 12), "llama.cpp Q4_1": row(24, 99)}]
    ratios = edge.speed_ratios(by_round)
    assert ratios["int8 / bfloat16, stage 04"] == [2.0, 2.0]
    assert ratios["int8 / bfloat16, reference"] == [1.25, 1.25]
    assert ratios["int4 / llama.cpp, stage 04"] == [3.0, 2.0]  # llama.cpp's one path against each of ours
    assert ratios["int4 / llama.cpp, reference"] == [1.0, 1.0]
    assert "int4 / llama.cpp, stage 04" not in edge.speed_ratios([{k: v for k, v in r.items() if "llama" not in k}
                                                                  for r in by_round])
    assert not any(k.startswith("w4a8") for k in ratios)  # a precision that did not run has no ratio
    for r, w4a8 in zip(by_round, (row(10, 2), row(30, 6))):
        r["w4a8"] = w4a8
    ratios = edge.speed_ratios(by_round)
    assert ratios["w4a8 / bfloat16, stage 04"] == [5.0, 5.0] and ratios["w4a8 / llama.cpp, stage 04"] == [6.0, 4.0]


def test_side_by_side_decodes_every_precision_in_turns_in_one_process(tiny_folder):
    times = edge.in_fresh_process(["--child", "side-by-side", "--model", "tiny", "--tokens", "4",
                                   "--side-by-side", "3"])
    assert sorted(times) == sorted(["bfloat16", "int4", "int8"] + (["w4a8"] if native.w4a8_kernel() else []))
    assert all(len(t) == 3 and min(t) > 0 for t in times.values())


def test_side_by_side_ratios_divide_times_of_the_same_turn():
    times = {"bfloat16": [10.0, 30.0], "int8": [5.0, 20.0], "int4": [4.0, 10.0]}
    assert edge.side_by_side_ratios(times) == {"int8 / bfloat16, stage 04": [2.0, 1.5],
                                               "int4 / bfloat16, stage 04": [2.5, 3.0]}
    assert list(edge.side_by_side_ratios({"bfloat16": [1.0], "int8": [0.5]})) == ["int8 / bfloat16, stage 04"]
