"""The native kernels' build on machines we cannot run: the compiler flags chosen from a compiler's answers
(common/numerics/native/flags.py), the CPU named from arm64 and macOS answers (common/paths.py), and the one
sentence a machine gets where a kernel does not build (common/numerics/native: load)."""
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common import paths
from common.numerics import native
from common.numerics.native import flags

X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu vme de pse tsc msr pae avx avx2 fma
bogomips\t: 4890.85

processor\t: 1
model name\t: AMD EPYC
flags\t\t: fpu vme de pse tsc msr pae avx avx2 fma
"""
GRAVITON2 = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1

processor\t: 1
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1
"""
GRAVITON3 = GRAVITON2.replace("0xd0c", "0xd40").replace("asimddp ssbs", "asimddp ssbs sve bf16 i8mm")
RASPBERRY_PI = """processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm crc32 cpuid
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x0
CPU part\t: 0xd08
CPU revision\t: 3

Hardware\t: BCM2835
Revision\t: c03111
Serial\t\t: 10000000abcdef01
Model\t\t: Raspberry Pi 4 Model B Rev 1.1
"""
BIG_LITTLE = RASPBERRY_PI.replace("0xd08", "0xd05", 1) + RASPBERRY_PI.split("\n\n")[0].replace("0xd08", "0xd0b") + "\n"


def test_x86_cpuinfo_is_named_as_before():
    assert paths.identity_from_cpuinfo(X86) == ("model name\t: AMD EPYC\n"
                                                "flags\t\t: fpu vme de pse tsc msr pae avx avx2 fma\n")


def test_each_arm_cpu_gets_its_own_identity():
    """arm64's /proc/cpuinfo has no model name or flags: the cores are named by implementer and part, the flags
    are its Features; each CPU below must get an identity of its own, and the device's serial number no part."""
    ids = {name: paths.identity_from_cpuinfo(text) for name, text in
           [("graviton2", GRAVITON2), ("graviton3", GRAVITON3), ("pi", RASPBERRY_PI), ("big.LITTLE", BIG_LITTLE)]}
    assert len(set(ids.values())) == 4
    first = {name: i.splitlines()[0] for name, i in ids.items()}
    assert first["graviton2"] == "model name\t: Neoverse-N1 (implementer 0x41, part 0xd0c, variant 0x3, revision 1)"
    assert "Neoverse-V1" in first["graviton3"] and "bf16" in ids["graviton3"].split()
    assert "Cortex-A72" in first["pi"] and "10000000abcdef01" not in ids["pi"]
    assert "Cortex-A55" in first["big.LITTLE"] and "Cortex-A76" in first["big.LITTLE"]
    assert ids["pi"].splitlines()[1] == "flags\t\t: fp asimd evtstrm crc32 cpuid"
    assert paths.identity_from_cpuinfo("") is None


def fake_sysctl(answers: dict):
    return lambda args: answers.get(" ".join(args))


def test_macos_is_named_by_sysctl(monkeypatch):
    m2 = {"-n machdep.cpu.brand_string": "Apple M2 Pro\n",
          "hw.optional": "hw.optional.arm.FEAT_BF16: 1\nhw.optional.arm.FEAT_SME: 0\nhw.optional.neon: 1\n"}
    intel = {"-n machdep.cpu.brand_string": "Intel(R) Core(TM) i9-9880H CPU @ 2.30GHz\n",
             "hw.optional": "hw.optional.avx2_0: 1\nhw.optional.avx512f: 0\n",
             "-n machdep.cpu.features": "FPU VME SSE4.2 AVX1.0", "-n machdep.cpu.leaf7_features": "AVX2 BMI2"}
    apple = paths.identity_from_sysctl(fake_sysctl(m2))
    assert apple == "model name\t: Apple M2 Pro\nflags\t\t: arm.FEAT_BF16 neon\n"
    mac_intel = paths.identity_from_sysctl(fake_sysctl(intel))
    assert mac_intel.startswith("model name\t: Intel(R) Core(TM) i9-9880H") and "avx2" in mac_intel.split()
    assert paths.identity_from_sysctl(fake_sysctl({})) is None
    monkeypatch.setattr(paths.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(paths, "_sysctl", fake_sysctl(m2))
    paths._darwin_identity.cache_clear()
    try:
        assert paths.cpu_identity() == apple
    finally:
        paths._darwin_identity.cache_clear()


class FakeCompiler:
    """Answers as a compiler would: it refuses any flag not in `takes` (but passes what follows -Xpreprocessor to
    the preprocessor); it finds omp.h where it takes -fopenmp itself, or through -Xpreprocessor with an -I to one
    of `omp_dirs`. Records every probe."""

    def __init__(self, takes: set[str], omp_dirs: tuple[str, ...] = ()):
        self.takes, self.omp_dirs, self.calls = takes, omp_dirs, []

    def __call__(self, given: list[str], source: str) -> bool:
        self.calls.append((list(given), source))
        passed = {given[i + 1] for i, f in enumerate(given[:-1]) if f == "-Xpreprocessor"}
        if any(f.startswith("-") and not f.startswith(("-I", "-L", "-l")) and f not in self.takes | passed
               for f in given):
            return False
        if "omp.h" in source:
            if "-Xpreprocessor" in given:
                return any(f"-I{d}" in given for d in self.omp_dirs)
            return "-fopenmp" in given
        return True


def test_gcc_on_linux_takes_native_code_and_openmp():
    gcc = FakeCompiler({"-march=native", "-mcpu=native", "-fopenmp"})
    chosen = flags.choose_flags(gcc, "Linux", [], None)
    assert (chosen["arch"], chosen["openmp"], chosen["link"], chosen["notes"]) == (["-march=native"], ["-fopenmp"],
                                                                                  [], [])
    assert (["-march=native", "-fopenmp"], flags.OPENMP) in gcc.calls  # OpenMP probed with the arch flags, linked


def test_clang_without_libomp_builds_without_openmp():
    """A Linux clang without libomp-dev: -fopenmp is refused, so the kernels split work on their own threads."""
    chosen = flags.choose_flags(FakeCompiler({"-march=native"}), "Linux", [], None)
    assert chosen["arch"] == ["-march=native"] and chosen["openmp"] == [] and chosen["link"] == []
    assert any("no OpenMP" in n for n in chosen["notes"])


def test_apple_clang_gets_mcpu_the_lookup_flag_and_torchs_libomp(tmp_path):
    """Older Apple clang refuses -march=native, takes -mcpu=native; -fopenmp only through the preprocessor with a
    libomp's omp.h, linked against the libomp torch ships (one OpenMP runtime in the process) where it ships one."""
    brew, torch_lib = tmp_path / "libomp", tmp_path / "torch_lib"
    torch_lib.mkdir()
    apple = FakeCompiler({"-mcpu=native", "-Xpreprocessor", "-undefined"},
                         omp_dirs=(str(brew / "include"),))
    chosen = flags.choose_flags(apple, "Darwin", [brew], torch_lib)
    assert chosen["arch"] == ["-mcpu=native"] and chosen["link"] == ["-undefined", "dynamic_lookup"]
    assert chosen["openmp"] == ["-Xpreprocessor", "-fopenmp", f"-I{brew / 'include'}", f"-L{brew / 'lib'}", "-lomp"]
    (torch_lib / "libomp.dylib").touch()
    assert f"-L{torch_lib}" in flags.choose_flags(apple, "Darwin", [brew], torch_lib)["openmp"]
    no_libomp = flags.choose_flags(apple, "Darwin", [], torch_lib)
    assert no_libomp["openmp"] == [] and no_libomp["arch"] == ["-mcpu=native"]
    assert flags.choose_flags(FakeCompiler(set()), "Linux", [], None)["arch"] == []


def test_stepwise_march_builds_for_the_named_cpu_or_says_why_not(tmp_path, monkeypatch):
    """STEPWISE_MARCH=haswell: an AVX2 laptop's kernels built here; a CPU the compiler does not know is refused,
    never quietly replaced by a native build. The probe is kept apart from the native one."""
    monkeypatch.delenv("STEPWISE_MARCH", raising=False)  # a suite run as an AVX2 laptop sets it
    gcc = FakeCompiler({"-march=native", "-march=haswell", "-fopenmp"})
    chosen = flags.choose_flags(gcc, "Linux", [], None, march="haswell")
    assert chosen["arch"] == ["-march=haswell"] and chosen["openmp"] == ["-fopenmp"]
    assert (["-march=native"], flags.PLAIN) not in gcc.calls and "haswell" in chosen["notes"][0]
    with pytest.raises(RuntimeError, match="STEPWISE_MARCH=znver9: .* refuses -march=znver9"):
        flags.choose_flags(gcc, "Linux", [], None, march="znver9")
    monkeypatch.setattr(flags, "_works", lambda cxx, folder: FakeCompiler({"-march=native", "-march=haswell"}))
    native_probe = flags.probed(tmp_path, "cpu", None)
    monkeypatch.setenv("STEPWISE_MARCH", "haswell")
    assert flags.probed(tmp_path, "cpu", None)["arch"] == ["-march=haswell"]
    monkeypatch.delenv("STEPWISE_MARCH")
    assert flags.probed(tmp_path, "cpu", None) == native_probe and native_probe["arch"] == ["-march=native"]


def test_a_compiler_that_builds_nothing_is_an_error():
    with pytest.raises(RuntimeError, match="cannot build a shared library"):
        flags.choose_flags(lambda given, source: False, "Linux", [], None)


def test_flags_are_probed_once_per_compiler_and_change_the_build_key(tmp_path, monkeypatch):
    probes = []

    def works_for(cxx, folder):
        def works(given, source):
            probes.append(cxx)
            return "-fopenmp" not in given or cxx == "g++"
        return works

    monkeypatch.setattr(flags, "_works", works_for)
    monkeypatch.setenv("CXX", "g++")
    first = flags.probed(tmp_path, "cpu", None)
    count = len(probes)
    assert count > 0 and flags.probed(tmp_path, "cpu", None) == first and len(probes) == count  # cached on disk
    monkeypatch.setenv("CXX", "clang++")
    assert flags.probed(tmp_path, "cpu", None)["openmp"] == [] and len(probes) > count  # another compiler: probed
    assert first["openmp"] == ["-fopenmp"]
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("STEPWISE_HOME", str(tmp_path / "home"))  # the key's own probe, away from the real cache
    key = native.source_key()
    monkeypatch.setattr(native.probe, "probed", lambda *a: {"arch": [], "openmp": [], "link": []})
    assert native.source_key() != key


def test_a_kernel_that_does_not_build_is_reported_once_with_what_runs_instead(tmp_path, monkeypatch, caplog):
    source = tmp_path / "attention.cpp"
    source.write_text("// a kernel whose build fails\n")

    def fail(path):
        raise RuntimeError("clang++ failed: clang++: error: unsupported option '-fopenmp'")

    monkeypatch.setattr(native, "_build", fail)
    with caplog.at_level(logging.WARNING, logger="stepwise.native"):
        assert not native.load(source) and not native.load(source)
    native._state.pop(source)
    messages = [r.getMessage() for r in caplog.records if r.name == "stepwise.native"]
    assert len(messages) == 1
    assert messages[0].startswith("attention: the C++ kernel attention.cpp did not build (RuntimeError: clang++ "
                                  "failed: clang++: error: unsupported option '-fopenmp'); running the tensor-op "
                                  "attention instead, about ")
    assert messages[0].endswith("(docs/native-kernels.md)")


def test_a_machine_without_a_working_compiler_says_so_once_and_runs(tmp_path):
    """The whole path in a fresh process: CXX names a compiler that fails, so nothing builds; the one sentence
    comes once on stderr, attention still runs (the tensor-op version) and describe() names why."""
    root = Path(__file__).resolve().parents[1]
    code = ("import numpy as np, torch\n"
            "from common.numerics import native\n"
            "from common.numerics.attention import AttentionMetadata, attention\n"
            "assert not native.enabled(torch.device('cpu'))\n"
            "meta = AttentionMetadata.build([3], [3], 2, 1, np.zeros((1, 1), dtype=np.int64), 4, 1, head_dim=8,\n"
            "                              kv_dtype=torch.float32)\n"
            "assert meta.native is None and attention(torch.ones(3, 2, 8), torch.ones(1, 4, 8), torch.ones(1, 4, 8),\n"
            "                                         meta).shape == (3, 2, 8)\n"
            "print(native.describe())")
    env = {**os.environ, "CXX": "false", "STEPWISE_HOME": str(tmp_path), "PYTHONPATH": str(root)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("running the tensor-op attention instead") == 1, result.stderr
    assert "false cannot build a shared library here" in result.stderr
    assert result.stdout.startswith("attention: tensor ops (the CPU kernel did not build")
