"""Build (once per machine) and load the project's C++ kernels: the CPU attention
(``kernels(SOURCE).attention``) and the linears (``kernels(LINEAR_SOURCE)``, see ``linear.cpp``: AMX, AVX-512
where there is no AMX, the portable kernel elsewhere); stage 04 builds its fused element-wise kernels the same way.

Why a compiled kernel on CPU: the same attention written with tensor operations costs
about 25 of them per layer, each a few microseconds of dispatch on tiny tensors, plus a
copy of every key and value it gathers; a decode step of one request spent a quarter of
its time there. The kernel (``attention.cpp``) reads keys and values in place through the
chunk table and fixes every reduction's order by construction (see its header).

It is compiled with the machine's C++ compiler against torch's headers into
``$STEPWISE_HOME/native`` (keyed by the source, torch and the CPU, so a cached build is never
used on another machine: build.py) and imported as a Python module. Each kernel is bound to Python directly
(pybind11, as torch's own C++ extensions are) rather than registered as a ``torch.ops`` operator:
a step calls these kernels a few hundred times, and the dispatcher's boxed call from Python costs
several times the direct binding's (docs/native-kernels.md). Like a ``torch.ops`` call, the binding
lets go of the interpreter lock while the kernel runs. Set
``STEPWISE_NATIVE_ATTENTION=0`` to use the tensor-op attention instead. The compiler's flags are probed once per
machine (``flags.py``: ``-march=native`` or ``-mcpu=native``, OpenMP where the compiler has it, macOS's linker
flag); where a kernel still does not build, what runs instead is torch code, and ``load`` says so once, at load,
with what that costs (``FALLBACKS``); ``describe()`` says it again in the engine's banner.
"""
from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

import torch

from common.numerics.native import flags as probe  # noqa: F401 - the probe the tests stand in for
from common.numerics.native.build import FLAGS, HERE, _build, compile_flags, module_name, source_key  # noqa: F401
from common.paths import cpu_identity

SOURCE = HERE / "attention.cpp"
LINEAR_SOURCE = HERE / "linear.cpp"
_state: dict[Path, dict] = {}  # per source: ok, path, seconds to build (0: cached), error
log = logging.getLogger("stepwise.native")
# What runs where a source does not build, and what that costs (docs/native-kernels.md measures it): load() says
# it once per process, at load, in one sentence.
FALLBACKS = {
    "attention": ("attention", "the tensor-op attention", "about 14x slower attention: on a 2-core AVX2 EPYC, "
                  "+18 ms per decode step of one request at 160 tokens of context, +0.6 s at 32 requests"),
    "cpu_kernels": ("stage 04's fused element-wise kernels", "stage 03's unfused torch operations",
                    "about 4-7x slower for those operations: on a 2-core AVX2 EPYC, +15 ms per decode step of one "
                    "request, +27 ms at 32"),
    "linear": ("our linears", "torch's linears", "slower wherever ours would run"),
}


def enabled(device: torch.device) -> bool:
    """Whether attention on ``device`` runs the compiled kernel (building it on first use)."""
    if device.type != "cpu" or os.environ.get("STEPWISE_NATIVE_ATTENTION", "1") == "0":
        return False
    return load()


# Our linear kernels, by the name the engine shows, and the `kernel` argument of linear.cpp's `linear` for each.
LINEAR_KERNELS = {"AMX": "amx", "AVX-512 BF16": "dot", "AVX-512 FMA": "fma", "portable AVX2": "portable",
                  "portable NEON": "portable", "portable scalar": "portable"}


def linear_kernel() -> str | None:
    """Which of our linear kernels (``linear.cpp``) this CPU runs: "AMX" where the CPU has AMX-BF16 and Linux
    granted the tile state; else, with AVX-512 BF16 (``linear_avx512.h``), "AVX-512 BF16" (VDPBF16PS, one
    instruction per input pair) on AMD's CPUs and "AVX-512 FMA" (float32 multiply-adds) on Intel's, the faster of
    the two on each where measured (``linear_avx512.h``); else the portable kernel (``linear_portable.h``: "portable
    AVX2", "portable NEON" or "portable scalar", whichever the build targets), which also takes float32 weights and
    gives the AVX-512 FMA kernel's bits; None where linear.cpp did not build: torch's linears run. The choice
    follows from the CPU alone, so one machine always gives the same bits. ``STEPWISE_LINEAR=dot``, ``fma``,
    ``portable`` or ``torch`` overrides it (dot and fma only where the CPU has AVX-512 BF16, else torch's run)."""
    choice = os.environ.get("STEPWISE_LINEAR", "auto")
    if choice not in ("auto", "dot", "fma", "portable", "torch"):
        raise ValueError(f"STEPWISE_LINEAR={choice!r}: use auto, dot, fma, portable or torch")
    if choice == "torch" or not load(LINEAR_SOURCE):
        return None
    module = kernels(LINEAR_SOURCE)
    if choice == "auto" and module.ready():
        return "AMX"
    if choice != "portable" and module.avx512_ready():
        if choice == "auto":
            choice = "dot" if "AMD" in cpu_identity().splitlines()[0] else "fma"
        return "AVX-512 BF16" if choice == "dot" else "AVX-512 FMA"
    if choice in ("dot", "fma"):
        return None
    return f"portable {module.portable_isa()}"


def is_portable(kernel: str | None) -> bool:
    """Whether ``kernel`` (a name from ``linear_kernel``) is the portable one: its own packed layout, and float32
    weights besides bfloat16, int8 and int4."""
    return LINEAR_KERNELS.get(kernel) == "portable"


def block_interleave(kernel_arg: str | None, out_features: int) -> int:
    """How ``pack`` lays a weight out for linear.cpp's kernel ``kernel_arg``: for the AVX-512 kernels, groups of 4
    (else 2) blocks of 16 outputs with their 64-byte lines alternating, where the blocks divide into such groups;
    else 1, block after block (the layout AMX's tiles read). A task of four blocks then reads one run of memory
    instead of four (docs/native-kernels.md times it). The layout changes no sum."""
    if kernel_arg not in ("dot", "fma"):
        return 1
    blocks = -(-out_features // 16)
    return 4 if blocks % 4 == 0 else 2 if blocks % 2 == 0 else 1


def int4_kernel() -> str | None:
    """Which of our kernels runs int4 (Q4_1 groups): "AMX", else "AVX-512 BF16" wherever our AVX-512 linears run
    (one int4 kernel there, VDPBF16PS, whichever kernel the bfloat16 linears take), else the portable kernel (its
    sums in the order of the AVX-512 one), else None: torch's."""
    kernel = linear_kernel()
    return kernel if kernel in (None, "AMX") or is_portable(kernel) else "AVX-512 BF16"


def float32_kernel() -> str | None:
    """Which of our kernels runs float32 weights: the portable one wherever linear.cpp built, whichever kernel the
    16-bit linears take (AMX and the AVX-512 kernels read bfloat16 only, and float32 would otherwise fall to
    ``torch.mm`` padded to a row tile), else None: torch's. ``STEPWISE_LINEAR=torch`` keeps it torch's."""
    kernel = linear_kernel()
    if kernel is None or is_portable(kernel):
        return kernel
    return f"portable {kernels(LINEAR_SOURCE).portable_isa()}"


def w4a8_kernel() -> str | None:
    """Which of our kernels runs w4a8 (int4 records, int8 activations): the portable one wherever linear.cpp built,
    named with the instruction that sums its integer products ("W4A8 AVX-512 VNNI", "W4A8 AVX2", "W4A8 NEON
    dotprod", ...; the bits are the same on each); else None: w4a8 has no torch kernel and is refused.
    ``STEPWISE_LINEAR`` does not move it (no other kernel computes w4a8)."""
    if not load(LINEAR_SOURCE):
        return None
    return f"W4A8 {kernels(LINEAR_SOURCE).w4a8_isa()}"


def amx_linear_ready() -> bool:
    """Whether linears run on the AMX kernel (the only one of ours that takes int4)."""
    return linear_kernel() == "AMX"


def kernels(source: Path = SOURCE):
    """The Python module of ``source``'s kernels (built and loaded on first use)."""
    module = loaded(source)
    if module is None:
        if not load(source):
            raise RuntimeError(f"the kernels of {source.name} {build_note(source)}")
        module = _state[source]["module"]
    return module


def loaded(source: Path = SOURCE):
    """The module of ``source``'s kernels if it is loaded already, else None (never builds)."""
    return _state.get(source, {}).get("module")


def load(source: Path = SOURCE) -> bool:
    """Build (or find) and load the library of ``source``; False, with the reason kept, where that fails."""
    state = _state.setdefault(source, {})
    if "ok" not in state:
        try:
            path, built = _build(source)
            spec = importlib.util.spec_from_file_location(module_name(source), path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            state.update(ok=True, path=path, built=built, module=module)
        except Exception as e:  # no compiler, no headers: the tensor-op version runs instead
            state.update(ok=False, error=f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}")
            log.warning(fallback_note(source))
    return state["ok"]


def fallback_note(source: Path) -> str:
    """The sentence ``load`` prints once where ``source`` did not build: what runs instead, and its cost."""
    what, instead, cost = FALLBACKS.get(source.stem, (source.name, "torch code", "slower"))
    return (f"{what}: the C++ kernel {source.name} did not build ({_state[source]['error']}); running {instead} "
            f"instead, {cost} (docs/native-kernels.md)")


def build_note(source: Path = SOURCE) -> str:
    """How the library of ``source`` was had: '(compiled in 16 s)', '(cached build)' or why it failed."""
    if not load(source):
        return f"did not build: {_state[source]['error']}"
    built = _state[source]["built"]
    return f"compiled in {built:.0f} s, now cached" if built else "cached build"


def describe() -> str:
    if os.environ.get("STEPWISE_NATIVE_ATTENTION", "1") == "0":
        return "attention: tensor ops (STEPWISE_NATIVE_ATTENTION=0)"
    if not load():
        return f"attention: tensor ops (the CPU kernel {build_note()})"
    return f"attention: compiled CPU kernel ({build_note()})"
