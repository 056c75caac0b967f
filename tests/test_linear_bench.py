"""stages/04_kernels/linear_bench.py (`python -m stages.04_kernels --kernels`, the linears' table): each precision shown
as the torch float32 reference, the old path and ours; ours gives the portable kernel's definition's bits, checked by
the table against common/numerics/linear_reference.py; and the roofline columns are the lesson's arithmetic on the
table's own times (weight bytes over the 1-row time, two flops per weight per row over the 64-row time)."""
import importlib

import pytest
import torch

from common.numerics import native

bench = importlib.import_module("stages.kernels.linear_bench")

SHAPES = [(48, 64), (32, 96)]  # small, in whole blocks of 16 outputs and groups of 32 inputs (as int kernels need)


@pytest.mark.parametrize("kind", ["bfloat16", "int8", "int4", "w4a8"])
def test_each_version_is_checked_and_placed_on_the_roofline(kind):
    if kind == "w4a8" and not native.w4a8_kernel():
        pytest.skip("w4a8 runs on our kernels only, and linear.cpp did not build here")
    rows = bench.measure_op(kind, SHAPES, 2, torch.Generator().manual_seed(0))
    second = "int4's kernel" if kind == "w4a8" else "old path"  # w4a8 has no torch path: the kernel it stands beside
    assert [r["version"].split(":")[0] for r in rows] == ["reference", second, "ours"]
    weights = sum(o * i for o, i in SHAPES)
    for r in rows:
        assert r["µs, 1 row"] > 0 and r["µs, 64 rows"] > 0
        assert r["GFLOP/s, 64 rows"] == pytest.approx(2 * weights * 64 / r["µs, 64 rows"] / 1e3)
        if r["version"].startswith("reference"):
            assert r["GB/s, 1 row"] is None  # one copy, from cache: no memory figure
        else:
            assert r["GB/s, 1 row"] == pytest.approx(weights * bench.BYTES_PER_WEIGHT[kind] / r["µs, 1 row"] / 1e3)
    ours = rows[-1]
    if native.linear_kernel() is not None:  # ours built here: the definition's bits, alone and in a call
        assert ours["definition's bits"] and ours["alone = in a call"]
    assert ours["max |diff|"] < 0.05
