"""stages/04_kernels/kernel_bench.py (`python -m stages.04_kernels --kernels`): every fused op appears as the reference,
the textbook torch version and the fused kernel; the fused kernel's bits are the reference's, checked independently
here against common/numerics/ops.py, and the textbook version is reported as it is (not assumed equal)."""
import importlib

import torch

from common.numerics import ops

bench = importlib.import_module("stages.kernels.kernel_bench")


def test_each_op_is_shown_three_ways_and_the_fused_kernel_keeps_the_reference_bits():
    rows = bench.measure(torch.bfloat16, "cpu", rows=(1, 4))
    by_op = {}
    for r in rows:
        by_op.setdefault(r["op"], {})[r["version"]] = r
    assert set(by_op) == {"add + RMSNorm", "RoPE on q and k", "SwiGLU"}
    for op, versions in by_op.items():
        assert list(versions)[:2] == ["reference", "textbook torch"], op
        fused = [v for name, v in versions.items() if name.startswith("fused")]
        assert len(fused) == 1, versions
        assert versions["reference"]["same bits"] and fused[0]["same bits"], op
        assert all(v["µs, 1 row"] > 0 and v["µs, 4 rows"] > 0 for v in versions.values())


def test_the_textbook_rms_norm_is_judged_against_the_reference_not_assumed():
    """The textbook RMSNorm (float32 rsqrt, one mean) rounds differently from ops.py on some rows: the table's
    'same bits' column must say what torch.equal says, row data drawn here."""
    a = bench.inputs(2048, torch.bfloat16, "cpu", seed=1)
    expected = ops.add_rms_norm(a["x"], a["residual"], a["weight"], bench.EPS)
    textbook = bench.textbook_add_rms_norm(a["x"], a["residual"], a["weight"], bench.EPS)
    equal, diff = bench.same_bits(textbook, expected)
    assert equal == all(torch.equal(x, y) for x, y in zip(textbook, expected))
    assert (diff == 0) == equal
