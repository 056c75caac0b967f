"""One machine, two builds of every native kernel, the same tokens, logits and log-probabilities.

tests/test_native_linear.py checks one linear's bits per kernel, and `make native-check` hashes the kernels alone on
three ISAs; this checks the whole engine the way a learner's laptop would run it (tests/test_arm64.py: an ARM one).
Stage 04 (our linears, the attention, the fused element-wise kernels) generates on the tiny model in every precision
twice, each in a fresh process (tests/cross_build.py): once built natively, once built by the same compiler for a
narrower instruction set (AVX2 + FMA, a laptop's, where this CPU has AVX-512; the scalar path where it has only AVX2).
Both must give the same tokens, greedy and sampled, the same logits and the same log-probabilities to the bit: on
this random model a token rarely turns on a last bit, a log-probability always shows it (the AVX-512 BF16 kernel's
differ from the FMA kernel's here). Where this CPU has the AVX-512 kernels, the native run takes "AVX-512 FMA" (the
kernel the portable one reproduces); "AVX-512 BF16" and AMX sum in another order by design. w4a8 sums its integer
products with another instruction in each build (VPDPBUSD or VPMADDUBSW natively, VPMADDUBSW or plain C++ narrowed):
the same integers, so the same tokens. torch's own kernels (the log-softmax among them) run the same code both times.
"""
import os
import platform
import sys
from pathlib import Path

import pytest

from common.numerics import native
from common.paths import home as engine_home
from cross_build import generate, here

pytestmark = [pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or not native.load(native.LINEAR_SOURCE),
                                 reason="x86 with a compiler that builds linear.cpp"),
              pytest.mark.skipif(bool(os.environ.get("STEPWISE_MARCH")),
                                 reason="STEPWISE_MARCH is set: this test picks both of its builds itself")]
AVX512 = native.load(native.LINEAR_SOURCE) and native.kernels(native.LINEAR_SOURCE).avx512_ready()
NARROWER = "haswell" if AVX512 else "x86-64"  # STEPWISE_MARCH: AVX2 + FMA + F16C, else SSE2 (the scalar path)


def test_a_build_for_a_narrower_instruction_set_gives_the_same_tokens_and_logprobs(tiny_folder):
    # Its own home: the narrower builds stay there between runs (a build is keyed by its source, flags, compiler,
    # torch and CPU, so a cached one is exactly what would be compiled again), and the suite's tiny checkpoint.
    home = engine_home() / "isa" / NARROWER
    home.mkdir(parents=True, exist_ok=True)
    link = home / Path(tiny_folder).name
    if not link.exists():
        link.symlink_to(tiny_folder)
    ours = here()
    theirs = generate([sys.executable],
                      {"STEPWISE_MARCH": NARROWER, "STEPWISE_HOME": str(home), "STEPWISE_LINEAR": "auto"})
    isa = "AVX2" if AVX512 else "scalar"
    assert theirs["kernels"] == [f"portable {isa}"] * 3 + [f"W4A8 {isa}"], theirs["kernels"]
    assert ours["kernels"][3] != theirs["kernels"][3]  # w4a8 sums its integers with another instruction
    assert ours["kernels"][0] == ("AVX-512 FMA" if AVX512 else "portable AVX2")
    for key in ours:
        if key.endswith("path"):
            assert "fused CPU kernels" in ours[key] and "fused CPU kernels" in theirs[key], (ours[key], theirs[key])
        elif key not in ("kernels", "flags", "row tiles"):
            assert ours[key] == theirs[key], key
