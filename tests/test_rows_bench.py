"""stages/04_kernels/rows_bench.py (`python -m stages.04_kernels --kernels`, the linears at 1, 2, 5 and 8 rows): each
precision timed at every row count on the kernel this machine runs, named as the engine names it, with the check that
a row's bits alone equal its bits in the call; the check itself catches a linear whose rows' sums meet."""
import pytest
import torch

from common.numerics import native
from stages.kernels import rows_bench as bench


@pytest.mark.parametrize("kind", bench.PRECISIONS)
def test_each_precision_is_timed_at_every_row_count_and_checked(monkeypatch, kind):
    if kind == "w4a8" and not native.w4a8_kernel():
        pytest.skip("w4a8 runs on our kernels only, and linear.cpp did not build here")
    monkeypatch.setattr(bench, "LAYER", [(48, 64), (32, 96)])  # whole blocks of 16 outputs, groups of 32 inputs
    monkeypatch.setattr(bench, "COPIES", 2)
    monkeypatch.setattr(bench, "PASSES", 2)
    result = bench.measure(kind, torch.Generator().manual_seed(0))
    assert set(result["us"]) == set(bench.ROWS) and all(t > 0 for t in result["us"].values())
    expected = {"float32": native.float32_kernel(), "int4": native.int4_kernel(),
                "w4a8": native.w4a8_kernel()}.get(kind, native.linear_kernel())
    if expected is not None:  # int8's and int4's names add the precision: "AVX-512 BF16 Int8"
        assert result["kernel"] == expected or result["kernel"].startswith(f"{expected} Int")
    if native.linear_kernel() is not None:
        assert result["same"]


class SharedSum:
    """A linear whose rows meet: each output adds the call's mean row, as a batched reduction would."""

    def matmul(self, x):
        return x.float() + x.float().mean(0)


def test_the_bits_check_catches_rows_that_meet():
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    assert not bench.alone_equals_together([SharedSum()], [x])
    assert bench.alone_equals_together([SharedSum()], [x[:1]])
