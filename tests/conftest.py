import os
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import settings

# Triton kernels run interpreted (NumPy) on a machine without CUDA. Triton reads this when a
# kernel is decorated, so it must be set before any kernel module is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.paths import DEFAULT_MODEL  # noqa: E402
from common.prepare import resolve_model  # noqa: E402
from workloads import PROFILES, examples, profile  # noqa: E402

# The test profiles (tests/workloads.py says what each runs): `make test` quick, `make test-deep` and CI deep. A
# property test without its own count runs hypothesis's 100 examples, scaled by the profile like every other.
for _name in PROFILES:
    settings.register_profile(_name, max_examples=examples(100, _name), deadline=None)
settings.load_profile(profile())


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
    share_cores()


def share_cores() -> None:
    """Under `make test`'s workers (pytest-xdist sets PYTEST_XDIST_WORKER_COUNT) each worker's torch takes its share
    of the cores, and the commands its tests start inherit it (OMP_NUM_THREADS). torch's default, a thread per
    core in every process, gives two workers two threads per core, and an OpenMP team waits on its slowest thread:
    with one other process busy on one of two cores, the real model through the reference and five stages took
    15-17 s on one thread and 114-148 s on two (docs/measuring.md, round 4). A thread count the user set is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        threads = max(1, len(os.sched_getaffinity(0)) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook; a run without xdist never calls it
def pytest_xdist_make_scheduler(config, log):
    """`make test`'s `--dist loadfile`, with test_arm64.py's two long tests on both workers (tests/parallel.py)."""
    if config.getoption("dist", None) == "loadfile":
        from parallel import scheduler
        return scheduler(config, log)
    return None


def pytest_collection_modifyitems(config, items):
    """The slowest files first (tests/parallel.py): under `make test`'s two workers no worker waits at the end on
    one long file; in a plain run the order changes nothing but when each file runs."""
    from parallel import slow_first
    slow_first(items)


def pytest_terminal_summary(terminalreporter, config):
    """With --durations (`make test-profile`): each file's total too, the slowest 20, since `make test`'s two
    workers take files whole (tests/parallel.py)."""
    if config.getoption("durations", None) is None or hasattr(config, "workerinput"):
        return
    from parallel import file_seconds
    reports = [r for key in ("passed", "failed", "skipped", "error", "") for r in terminalreporter.stats.get(key, [])
               if hasattr(r, "nodeid") and hasattr(r, "duration")]
    terminalreporter.write_sep("=", "slowest 20 files (their tests' set-up, call and tear-down, summed)")
    for name, seconds in file_seconds(reports)[:20]:
        terminalreporter.write_line(f"{seconds:8.2f}s  {name}")
