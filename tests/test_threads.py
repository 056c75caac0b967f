"""The kernels' bits do not depend on how many threads split the work.

`make test` gives each pytest worker one thread (conftest.share_cores: two workers with torch's default of a thread
per core ran the real model ten times slower), and the commands its tests start inherit that. So that the suite
still runs the kernels' parallel paths (OpenMP's teams, common/numerics/native/parallel.h's own threads), this runs
stage 04 on the tiny model in every precision with two threads and with one, in processes of their own, and asks
for the same tokens, greedy and seeded, the same log-probabilities and the same logits, to the bit."""
import sys

from cross_build import PRECISIONS, generate


def test_stage_04_gives_the_same_bits_on_two_threads_as_on_one():
    one = generate([sys.executable], {"OMP_NUM_THREADS": "1"})
    two = generate([sys.executable], {"OMP_NUM_THREADS": "2"})
    assert one["kernels"] == two["kernels"]
    for dtype, quant in PRECISIONS:
        key = f"{dtype} {quant}"
        assert "fused CPU kernels" in two[f"{key} path"], two[f"{key} path"]
        for part in ("", " logits", " logprobs"):
            assert two[key + part] == one[key + part], key + part
