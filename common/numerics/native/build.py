"""Compile a kernel source once per machine: the flags this compiler takes (flags.py), the key a build is cached
under (the source, the headers beside it, the flags, the compiler, torch, the CPU), and the build itself, against
torch's headers, into ``$STEPWISE_HOME/native``. ``common.numerics.native`` loads what this builds."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch

from common.numerics.native import flags as probe
from common.paths import cpu_identity, home

HERE = Path(__file__).parent  # attention.cpp, and bf16.h, which every kernel source may include
FLAGS = probe.BASE  # every build's; compile_flags() adds what this compiler takes (flags.py)


def module_name(source: Path) -> str:
    return f"stepwise_{source.stem}"  # the name each source's PYBIND11_MODULE is compiled under


def source_key(source: Path = HERE / "attention.cpp") -> str:
    """What a build of ``source`` depends on (its text and the headers beside it, flags, torch, the CPU), hashed:
    the name of its library, and part of the key of anything cached from that library's results."""
    return _key(source)


def compile_flags() -> list[str]:
    """FLAGS and what this machine's compiler takes (flags.py: probed once per machine, then read from the cache)."""
    chosen = probe.probed(home() / "native", cpu_identity(), _torch_lib())
    return [*FLAGS, *chosen["arch"], *chosen["openmp"], *chosen["link"]]


def _torch_lib() -> Path:
    from torch.utils.cpp_extension import library_paths
    return Path(library_paths()[0])


def _key(source: Path) -> str:
    headers = b"".join(h.read_bytes() for h in sorted(HERE.glob("*.h")))
    compiler = f"{probe.compiler()}|{probe.compiler_version(probe.compiler())}"
    raw = (f"{source.read_bytes()!r}|{headers!r}|{compile_flags()}|{compiler}|{torch.__version__}|{cpu_identity()}|"
           f"{sys.version_info[:2]}")
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def library(source: Path) -> Path:
    """Where the build of ``source`` for this machine lives (whether or not it exists yet)."""
    return home() / "native" / f"{source.stem}-{_key(source)}{sysconfig.get_config_var('EXT_SUFFIX')}"


def prebuild(sources: list[str], check: bool = False) -> int:
    """`make test`'s set-up (tests/bootstrap): build ``sources`` now, side by side, rather than in the first test
    that loads each; with ``check``, only say which are not built yet. The exit status: 0 when all are built."""
    from concurrent.futures import ThreadPoolExecutor

    missing = [Path(s) for s in sources if not library(Path(s)).exists()]
    if check or not missing:
        print(" ".join(f"{s.name} not built" for s in missing))
        return int(bool(missing))
    with ThreadPoolExecutor(max(1, min(len(missing), os.cpu_count() or 1))) as pool:
        for source, (_, seconds) in zip(missing, pool.map(_build, missing)):
            print(f"{source.name}: compiled in {seconds:.0f} s")
    return 0


def _build(source: Path) -> tuple[Path, float]:
    """The shared library for this machine: compiled now (seconds taken) or found (0)."""
    target = library(source)
    folder = target.parent
    folder.mkdir(parents=True, exist_ok=True)
    if target.exists():
        return target, 0.0
    from torch.utils.cpp_extension import include_paths

    start = time.perf_counter()
    lib = _torch_lib()
    abi = int(torch.compiled_with_cxx11_abi())
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        out = Path(tmp) / target.name
        cmd = [probe.compiler(), *compile_flags(), f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
               f"-DSTEPWISE_MODULE={module_name(source)}",
               f"-I{HERE}", *[f"-I{p}" for p in include_paths()], f"-I{sysconfig.get_paths()['include']}", str(source),
               "-o", str(out), f"-L{lib}", "-lc10", "-ltorch_cpu", "-ltorch",
               "-ltorch_python", f"-Wl,-rpath,{lib}"]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:  # the first error names the cause; the last line is often only "terminated"
            lines = result.stderr.strip().splitlines() or ["no output"]
            raise RuntimeError(f"{cmd[0]} failed: {next((x for x in lines if 'error' in x), lines[-1]).strip()}")
        os.replace(out, target)  # atomic: a concurrent build never leaves half a file
    return target, time.perf_counter() - start
