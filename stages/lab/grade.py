"""Grading: each task alone, the learner's body spliced into the solution, loaded under a fresh package name.

For task 03.2 the grader copies stage 03's real source into a temporary folder, puts the learner's body of 03.2
(and only that) between its markers, and imports the copy as a package of its own (``_lab_03_2_…``): relative
imports (``.block_manager``) find the copy, absolute ones (``common``, ``from stages import paged_kv``) the real
tree, which is never written. So a task passes or fails on its own code, with every other task correct: a wrong
03.1 cannot fail 03.3. The checks are deterministic (hypothesis derandomized), so one spliced source has one
verdict, remembered for the process.
"""
from __future__ import annotations

import hashlib
import importlib
import itertools
import os
import shutil
import sys
import tempfile
import time
import traceback
import types
from dataclasses import dataclass
from pathlib import Path

from . import markers
from .catalog import LABS, Lab, Task

ROOT = Path(__file__).resolve().parents[2]
_names = itertools.count()
_verdicts: dict[tuple, "Result"] = {}


def workspace_path(lab: Lab, workspace: Path, repo_path: str) -> Path:
    """Where the learner's copy of ``repo_path`` lives: the stage's own files flat in labs/NN/, others (common/...)
    under their repository path."""
    stage = f"stages/{lab.stage}/"
    return workspace / lab.number / (repo_path[len(stage):] if repo_path.startswith(stage) else repo_path)


class Variant:
    """The stage's real source with one file replaced, importable as a package of its own."""

    def __init__(self, lab: Lab, repo_path: str, source: str, folder: Path):
        stage = ROOT / "stages" / lab.stage
        for f in stage.rglob("*"):  # its subpackages too (stage 05's server)
            if f.suffix in (".py", ".cpp") and "__pycache__" not in f.parts:
                (folder / f.relative_to(stage)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(f, folder / f.relative_to(stage))
        target = workspace_path(lab, folder.parent, repo_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source, encoding="utf-8")
        self.name = f"_lab_{lab.number}_{next(_names)}"
        package = types.ModuleType(self.name)
        package.__path__ = [str(folder)]  # the stage's __init__ is not run: only the modules a check asks for
        sys.modules[self.name] = package

    def module(self, path: str) -> types.ModuleType:
        """A module of the copy: "engine", "server/app", or "common/tokenizer" for a marked file outside."""
        return importlib.import_module(f"{self.name}.{path.removesuffix('.py').replace('/', '.')}")

    def close(self) -> None:
        for name in [n for n in sys.modules if n == self.name or n.startswith(self.name + ".")]:
            del sys.modules[name]


@dataclass
class Result:
    task: Task
    passed: bool
    detail: str = ""  # for a failure: what went wrong and the smallest failing example found
    seconds: float = 0.0


def describe(error: BaseException) -> str:
    """An assertion's message and hypothesis's falsifying example; for an exception, where the learner's code raised."""
    while type(error).__name__ == "InterpreterError" and isinstance(error.__cause__ or error.__context__, Exception):
        error = error.__cause__ or error.__context__  # Triton's interpreter wraps what the kernel raised
    notes = "\n".join(n for n in getattr(error, "__notes__", []) if "Falsifying" in n or "=" in n)
    if isinstance(error, AssertionError):
        text = str(error) or "assertion failed"
    else:
        frames = [f for f in traceback.extract_tb(error.__traceback__) if "/stepwise-lab-" in f.filename]
        where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
        text = f"{type(error).__name__}: {error}{where}"
    return text + (f"\n{notes}" if notes else "")


def grade_task(lab: Lab, task: Task, learner: str, xray: Path | None = None) -> Result:
    """Grade one task; with ``xray`` (a folder), a failing example that ran an engine is written there as a page."""
    from . import checks
    from .xray import capturing
    solution = (ROOT / task.file).read_text(encoding="utf-8")
    try:
        spliced = markers.splice(solution, learner, task.id, task.file)
    except markers.MarkerError as e:
        return Result(task, False, str(e))
    key = (task.id, hashlib.sha256(spliced.encode()).hexdigest(), os.environ.get("STEPWISE_EXAMPLES_SCALE"), xray)
    if key in _verdicts:
        return _verdicts[key]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="stepwise-lab-") as tmp:
        folder = Path(tmp) / lab.number
        folder.mkdir()
        variant = Variant(lab, task.file, spliced, folder)
        with capturing(xray, task.id) as capture:
            try:
                checks.CHECKS[task.id](variant)
                result = Result(task, True)
            except Exception as e:  # the learner's code may raise anything; the rubric says what and where
                result = Result(task, False, describe(e) + (capture.write() if capture else ""))
            finally:
                variant.close()
    result.seconds = time.perf_counter() - start
    _verdicts[key] = result
    return result


def grade(number: str, workspace: Path | None = None, sources: dict[str, str] | None = None,
          xray: Path | None = None) -> list[Result]:
    """Grade lab ``number``: every task, from the learner's files in ``workspace`` (or ``sources``: repository path
    -> the learner's text, which the tests use to grade the solution, the stubs and planted bugs)."""
    lab = LABS[number]
    results = []
    for task in lab.tasks:
        if sources is not None:
            learner = sources[task.file]
        else:
            path = workspace_path(lab, workspace, task.file)
            if not path.exists():
                results.append(Result(task, False, f"{path} is missing: run `python -m stages.lab start {number}`"))
                continue
            learner = path.read_text(encoding="utf-8")
        results.append(grade_task(lab, task, learner, xray))
    return results


def rubric(results: list[Result]) -> str:
    lines = []
    for r in results:
        mark = "pass" if r.passed else "FAIL"
        lines.append(f"  {r.task.id} {r.task.title:<40} {mark}  ({r.seconds:.1f} s)")
        if not r.passed:
            lines += ["        " + line for line in r.detail.splitlines()]
    passed = sum(r.passed for r in results)
    lines.append(f"  {passed} of {len(results)} tasks pass")
    return "\n".join(lines)
