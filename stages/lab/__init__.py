"""Labs with an autograder: ``python -m stages.lab list | start NN | check NN | hint NN TASK | solution NN |
diff NN | reset NN``.

A lab's tasks are marked in the stage's real source (``markers.py``); ``start`` writes the learner's copy, each
marked body a stub, into ``labs/NN/`` with a task sheet; ``check`` grades each task alone against the reference
(``grade.py``, ``checks.py``) and prints a rubric. The labs and their planted wrong answers are in ``catalog.py``.
"""
from .catalog import LABS
from .grade import grade, rubric
from .workspace import DEFAULT_WORKSPACE, reset, start

__all__ = ["LABS", "grade", "rubric", "start", "reset", "DEFAULT_WORKSPACE"]
