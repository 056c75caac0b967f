"""A lab and its tasks, as the catalog (catalog.py) lists them: where each task is marked in the source, what to build,
the idea it implements, a hint, and a planted wrong answer the grader must catch in that task and no other."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    id: str  # "02.1": lab 02, task 1
    title: str
    file: str  # the repository path whose marked region(s) hold the solution
    build: str  # what to build
    idea: str  # the sentence of the paper (or the rule) the task implements, with its source
    hint: str
    planted: tuple[str, ...]  # a wrong body per marked region, written flush left
    planted_bug: str  # what the planted body gets wrong


@dataclass(frozen=True)
class Lab:
    number: str  # "02"
    stage: str  # the stage's folder under stages/
    readme: str  # the README section that teaches it
    tasks: tuple[Task, ...]

    @property
    def files(self) -> list[str]:
        return list(dict.fromkeys(t.file for t in self.tasks))


S01, S02, S03 = "stages/01_static_batch", "stages/02_continuous_batch", "stages/03_paged_kv"
S04, S05, S06, S07 = "stages/04_kernels", "stages/05_streaming", "stages/06_speculative", "stages/07_structured"
