import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.paths import resolve_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_folder():
    return resolve_model("tiny")


@pytest.fixture(scope="session")
def real_folder():
    return resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def tiny_reference(tiny_folder):
    from common import ReferenceLLM
    return ReferenceLLM(str(tiny_folder), dtype="bfloat16")


def pytest_configure(config):
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
