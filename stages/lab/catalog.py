"""The labs: for each stage, its tasks (where they are marked, what to build, the idea they implement, a hint)
and, for each task, a planted wrong answer: the mistake a learner is likely to make, which the grader must catch
in that task and no other (tests/test_labs.py proves it)."""
from __future__ import annotations

from .labs_01_03 import LABS_01_03
from .labs_04_07 import LABS_04_07
from .task import Lab, Task

LABS = {lab.number: lab for lab in [*LABS_01_03, *LABS_04_07]}
__all__ = ["LABS", "Lab", "Task"]
