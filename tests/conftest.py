import os
import sys
from pathlib import Path

import pytest
import torch

# Triton kernels run interpreted (NumPy) on a machine without CUDA. Triton reads this when a
# kernel is decorated, so it must be set before any kernel module is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.paths import DEFAULT_MODEL  # noqa: E402
from common.prepare import resolve_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_folder():
    return resolve_model("tiny")


@pytest.fixture(scope="session")
def real_folder():
    return resolve_model(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def tiny_reference(tiny_folder):
    from common import ReferenceLLM
    return ReferenceLLM(str(tiny_folder), dtype="bfloat16")


def pytest_configure(config):
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config, items):
    """The slowest files first (tests/parallel.py): under `make test`'s two workers no worker waits at the end on
    one long file; in a plain run the order changes nothing but when each file runs."""
    from parallel import slow_first
    slow_first(items)
