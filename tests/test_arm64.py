"""The engine on ARM, from an x86 machine: stage 04 under qemu-aarch64 gives x86's tokens, logits and log-probabilities.

`make native-check` runs the kernels' standalone tests under qemu; this runs the whole engine there, the way an ARM
laptop (Linux) would: Debian's aarch64 Python with PyPI's aarch64 torch (`make arm64`, tests/arm64/prepare.sh), our
three native libraries cross-built for it, stage 04 on the tiny model in every precision (tests/cross_build.py),
against the same script run natively here (the "AVX-512 FMA" kernel where this CPU has AVX-512: the bits the
portable kernels reproduce). Built twice: by GCC with OpenMP for generic ARMv8 ("portable NEON", "W4A8 NEON"), and by
clang as a Mac's compiler builds, for an Apple M1 ("W4A8 NEON dotprod": SDOT) with no libomp, so the kernels split
their work on threads of their own (common/numerics/native/parallel.h).

Equal to the bit, in every precision: the tokens, greedy and sampled, every logit and every log-probability. Every
operation from the embedding to the head is ours or exact, or (the RoPE tables, the log-softmax) torch's in float64
rounded once to float32, where torch's own float32 cos, sin and log-softmax are other code on ARM than on x86 and
differ in last bits. Seeded sampling's probabilities are torch's float32 softmax: equal tokens there mean no draw
fell within that rounding (torch is 2.10 on ARM, prepare.sh says why).

The load-time row-tile check (common/numerics/invariant.py: every linear shape's rows in calls of up to 256 rows
against each row alone) is most of a fresh build's loading under qemu, about 12 s a precision, 60 s a build: the
quick profile pins the tile it finds for our kernels everywhere (256) in the emulated run, the deep one (`make
test-deep`, .ci/run) runs the check there as an ARM laptop would. The pin skips no comparison with x86 (every
token, logit and log-probability is still compared); rows' independence on aarch64 is also checked directly by
`make native-check` (linear_test.cpp under qemu: every row alone and in every call of 1 to 40 rows, each kind).
"""
import os
import platform
from pathlib import Path

import pytest

from common.paths import home
from cross_build import PRECISIONS, ROOT, generate, here, script
from workloads import profile

PINNED_TILE = 256  # what the check finds for our kernels on every machine it ran on, x86 and aarch64
ARM64 = Path(os.environ.get("STEPWISE_ARM64") or home() / "arm64")  # where prepare.sh put it
pytestmark = [pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="run from an x86 machine"),
              pytest.mark.skipif(not (ARM64 / "ready").exists(),
                                 reason="no aarch64 Python here: `make arm64` prepares one (tests/arm64/prepare.sh)")]


@pytest.mark.parametrize("compiler, w4a8, openmp", [("cxx", "W4A8 NEON", True), ("clang", "W4A8 NEON dotprod", False)])
def test_stage_04_on_aarch64_gives_the_tokens_logits_and_logprobs_of_x86(tiny_folder, compiler, w4a8, openmp):
    engine_home = ARM64 / "home"  # the cross-built kernels stay here between runs (keyed by source and compiler)
    engine_home.mkdir(exist_ok=True)
    link = engine_home / Path(tiny_folder).name
    if not link.exists():
        link.symlink_to(tiny_folder)
    x86 = here()
    arm = generate([str(ROOT / "tests" / "arm64" / "python")],
                   {"STEPWISE_ARM64": str(ARM64), "STEPWISE_ARM64_CXX": str(ARM64 / compiler),
                    "STEPWISE_HOME": str(engine_home), "STEPWISE_LINEAR": "auto",
                    "OMP_NUM_THREADS": "2"}, timeout=1800,  # the threaded split, as an ARM laptop runs it
                   program=script(pinned_tile=PINNED_TILE if profile() == "quick" else None))
    assert arm["kernels"] == ["portable NEON"] * 3 + [w4a8], arm["kernels"]
    assert ("-fopenmp" in arm["flags"]) == openmp, arm["flags"]
    pinned = ["pinned without the load-time check" in note for note in arm["row tiles"]]  # deep: checked, as ever
    assert pinned == [profile() == "quick"] * len(PRECISIONS), arm["row tiles"]
    for dtype, quant in PRECISIONS:
        key = f"{dtype} {quant}"
        assert "fused CPU kernels" in arm[f"{key} path"], arm[f"{key} path"]
        for part in ("", " logits", " logprobs"):
            assert arm[key + part] == x86[key + part], key + part
