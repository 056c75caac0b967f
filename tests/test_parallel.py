"""`make test`'s two workers (tests/parallel.py): a file goes whole to one worker, but SPLIT's files test by test.
The oracle is where each test of a small suite ran, each test writing down its worker (PYTEST_XDIST_WORKER)."""
import subprocess
import sys
from pathlib import Path

from parallel import SPLIT, file_seconds

TESTS = Path(__file__).resolve().parent

CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
import pytest

@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from parallel import scheduler
    return scheduler(config, log)
"""

BODY = """
import os, time
from pathlib import Path

def _note(name):
    time.sleep(1.0)  # long enough that one worker cannot take both before the other starts
    Path(os.environ["NOTES"], name).write_text(os.environ["PYTEST_XDIST_WORKER"])

def test_one():
    _note(__name__ + ".one")

def test_two():
    _note(__name__ + ".two")
"""


def test_a_split_files_tests_run_on_both_workers_and_another_files_on_one(tmp_path):
    suite, notes = tmp_path / "suite", tmp_path / "notes"
    suite.mkdir()
    notes.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    (suite / SPLIT[0]).write_text(BODY)
    (suite / "test_whole.py").write_text(BODY)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist",
                          "loadfile", "--no-loadscope-reorder", str(suite)], cwd=suite, capture_output=True,
                         text=True, env={"NOTES": str(notes), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert "4 passed" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    where = {p.name: p.read_text() for p in notes.iterdir()}
    split = SPLIT[0].removesuffix(".py")
    assert where[f"{split}.one"] != where[f"{split}.two"], where
    assert where["test_whole.one"] == where["test_whole.two"], where


class Report:
    def __init__(self, nodeid, duration):
        self.nodeid, self.duration = nodeid, duration


def test_file_seconds_sums_each_files_phases_slowest_first():
    reports = [Report("tests/a.py::t1", 1.0), Report("tests/b.py::t", 2.5), Report("tests/a.py::t2[x]", 2.0),
               Report("tests/a.py::t2[x]", 0.25)]
    assert file_seconds(reports) == [("tests/a.py", 3.25), ("tests/b.py", 2.5)]
