"""What every grader shares: the one-request-at-a-time reference, and how many hypothesis examples it runs, and
how: derandomized, so a source has one verdict on every run."""
from __future__ import annotations

import functools
import os

from hypothesis import HealthCheck, settings


def examples(n: int) -> int:
    """``n`` examples, times $STEPWISE_EXAMPLES_SCALE (as the test suite's property tests)."""
    return max(1, round(n * float(os.environ.get("STEPWISE_EXAMPLES_SCALE", "1"))))


def hypothesis(n: int):
    return settings(max_examples=examples(n), deadline=None, derandomize=True, database=None, print_blob=False,
                    suppress_health_check=list(HealthCheck))


@functools.cache
def reference():
    from common import ReferenceLLM
    return ReferenceLLM("tiny", dtype="bfloat16")
