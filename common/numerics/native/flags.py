"""The C++ compiler's flags for the native kernels: what this compiler on this machine accepts, probed once and kept
in ``$STEPWISE_HOME/native/flags-<key>.json`` (keyed by the compiler, its version and the CPU).

Why probe rather than fix one command line: compilers differ where it matters. ``-march=native`` is GCC's and
x86 clang's spelling, and older Apple clang refuses it (``-mcpu=native`` is the ARM one). Apple clang has no
``-fopenmp`` (it takes ``-Xpreprocessor -fopenmp`` with a libomp it does not ship), nor does a Linux clang
without libomp-dev; there the kernels split their work on threads of their own (``parallel.h``), with the same
bits. And macOS's linker must be told to leave Python's symbols to the interpreter (``-undefined dynamic_lookup``,
as torch's own ``cpp_extension`` adds there).

``$STEPWISE_MARCH`` names a CPU to build for instead of this one (``-march=haswell``, ``-march=znver1``): the
kernels an AVX2 laptop would run, built and timed on a bigger machine (docs/measuring.md says what that shows and
what it cannot).

Each probe compiles and links a few lines into a shared library; ``choose_flags`` takes the compiler's answers
as a function, so a test can fake them.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path

# No fast-math and no contraction of a multiply and an add into one rounding: every path the compiler generates
# for a loop (vector body, scalar remainder, any ISA) then rounds the same way.
BASE = ["-O3", "-ffp-contract=off", "-std=c++17", "-shared", "-fPIC"]
ARCH_CANDIDATES = [["-march=native"], ["-mcpu=native"], []]
PLAIN = "int stepwise_probe(int x) { return x + 1; }\n"
OPENMP = "#include <omp.h>\nint stepwise_probe() { return omp_get_max_threads(); }\n"


def compiler() -> str:
    """The C++ compiler the kernels are built with: ``$CXX``, else ``c++``."""
    return os.environ.get("CXX", "c++")


@cache
def compiler_version(cxx: str) -> str:
    """The first line of ``cxx --version`` (part of every build's key), or why the compiler did not answer."""
    try:
        result = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
        return (result.stdout or result.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError) as e:
        return f"no compiler {cxx!r} ({type(e).__name__})"


def openmp_homes() -> list[Path]:
    """Where a libomp for Apple clang may be: ``$OMP_PREFIX``, Homebrew's (Apple silicon, Intel), conda's."""
    found = [os.environ.get("OMP_PREFIX"), "/opt/homebrew/opt/libomp", "/usr/local/opt/libomp",
             os.environ.get("CONDA_PREFIX")]
    return [Path(p) for p in found if p and (Path(p) / "include" / "omp.h").exists()]


def choose_flags(works: Callable[[list[str], str], bool], system: str, homes: list[Path],
                 torch_lib: Path | None, march: str | None = None) -> dict:
    """The flags this compiler takes, from its answers: ``works(flags, source)`` says whether ``source`` compiles
    and links into a shared library with ``flags``; ``march``: a CPU to build for instead of this one (a compiler
    that refuses it is an error, not a silent native build). Returns {"arch", "openmp", "link": flags; "notes":
    why}."""
    if not works([], PLAIN):
        raise RuntimeError(f"{compiler()} cannot build a shared library here: install a C++ compiler (macOS: "
                           "xcode-select --install; Debian or Ubuntu: apt install g++) or name one in CXX")
    notes = []
    if march:
        arch = [f"-march={march}"]
        if not works(arch, PLAIN):
            raise RuntimeError(f"STEPWISE_MARCH={march}: {compiler()} refuses {arch[0]}; name a CPU it knows "
                               "(GCC: haswell, znver1, skylake-avx512, ...) or unset STEPWISE_MARCH")
        notes.append(f"built for {march} (STEPWISE_MARCH), not for this CPU")
    else:
        arch = next(a for a in ARCH_CANDIDATES if works(a, PLAIN))
    if not arch:
        notes.append("no -march=native or -mcpu=native: generic code for this CPU's family")
    link = ["-undefined", "dynamic_lookup"] if system == "Darwin" else []
    openmp = []
    if works(arch + link + ["-fopenmp"], OPENMP):
        openmp = ["-fopenmp"]
    elif system == "Darwin":
        # Apple clang: OpenMP through the preprocessor, omp.h from a libomp install; linked against torch's own
        # libomp where the wheel ships one, so the process holds one OpenMP runtime, not two.
        for home in homes:
            lib = torch_lib if torch_lib is not None and (torch_lib / "libomp.dylib").exists() else home / "lib"
            candidate = ["-Xpreprocessor", "-fopenmp", f"-I{home / 'include'}", f"-L{lib}", "-lomp"]
            if works(arch + link + candidate, OPENMP):
                openmp = candidate
                break
    if not openmp:
        notes.append("no OpenMP: the kernels split their work on threads of their own (same bits)")
    return {"arch": arch, "openmp": openmp, "link": link, "notes": notes}


def _works(cxx: str, folder: Path) -> Callable[[list[str], str], bool]:
    def works(flags: list[str], source: str) -> bool:
        src, out = folder / "probe.cpp", folder / "probe.so"
        src.write_text(source)
        try:
            result = subprocess.run([cxx, *BASE, *flags, str(src), "-o", str(out)], capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            return False
        return result.returncode == 0
    return works


def probed(home: Path, cpu: str, torch_lib: Path | None) -> dict:
    """``choose_flags`` for this compiler and machine, probed on first use and then read from ``home``."""
    cxx, march = compiler(), os.environ.get("STEPWISE_MARCH") or None
    omp = torch_lib is not None and (torch_lib / "libomp.dylib").exists()  # what the macOS link would take
    raw = f"{shutil.which(cxx) or cxx}|{compiler_version(cxx)}|{platform.system()}|{platform.machine()}|{cpu}|{omp}"
    raw += f"|{march}" if march else ""  # the native probe's key unchanged
    path = home / f"flags-{hashlib.sha256(raw.encode()).hexdigest()[:16]}.json"
    if path.exists():
        return json.loads(path.read_text())
    home.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=home) as tmp:
        chosen = choose_flags(_works(cxx, Path(tmp)), platform.system(), openmp_homes(), torch_lib, march)
    chosen["compiler"] = compiler_version(cxx)
    tmp_path = path.with_suffix(f".{os.getpid()}.tmp")
    tmp_path.write_text(json.dumps(chosen, indent=1))
    os.replace(tmp_path, path)  # atomic: a concurrent probe never leaves half a file
    return chosen
