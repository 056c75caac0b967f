"""`python -m stages.lab check NN --xray DIR`: a failing task's example as an X-ray page (stages/xray), so the
learner can watch, step by step, what their scheduler or block manager did with it.

The checks of the tasks that run an engine (01-03) pass each engine they build to `watch`; while a task is being
graded with a folder given, every `generate` of those engines is recorded, and only the last is kept. When the
check fails, that last run is the failing example (hypothesis replays its smallest failing example last) and is
written to DIR/<task>.html.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

from stages.xray import Recorder, page

_active: "Capture | None" = None


class Capture:
    def __init__(self, folder: Path, task_id: str):
        self.folder, self.task_id = folder, task_id
        self.recorder = Recorder(f"lab {task_id}: the failing example", {"workload": f"lab {task_id}"})

    def attach(self, llm) -> None:
        rec, generate = self.recorder, llm.generate
        llm.add_observer(rec)

        def recorded(*args, **kwargs):
            rec.begin_run()
            try:
                return generate(*args, **kwargs)
            finally:
                rec.end_run(write=False)
                del rec.runs[:-1]  # only the latest run: the failing example is the last one checked

        llm.generate = recorded

    def write(self) -> str:
        """Write the page of the last run; the line to add to the task's failure."""
        if not self.recorder.runs:
            return ""
        path = self.folder / f"{self.task_id}.html"
        page.write(self.recorder.trace(), path)
        return f"\nthe failing example, step by step (open it in a browser): {path}"


@contextlib.contextmanager
def capturing(folder: Path | None, task_id: str):
    global _active
    if folder is None:
        yield None
        return
    folder.mkdir(parents=True, exist_ok=True)
    _active = Capture(folder, task_id)
    try:
        yield _active
    finally:
        _active = None


def watch(llm):
    """Record ``llm``'s runs while a task is graded with --xray (a no-op otherwise)."""
    if _active is not None:
        _active.attach(llm)
    return llm
