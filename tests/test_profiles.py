"""The test profiles (tests/workloads.py): `make test` runs quick, `make test-deep` and CI (.ci/run) deep. The oracle
is the rule the profiles are documented by: deep = each property test's own count; quick = 40% of it, at least 10,
never more than the count; $STEPWISE_EXAMPLES_SCALE multiplies either."""
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import settings

from workloads import examples, profile

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("n, quick", [(1, 1), (8, 8), (10, 10), (12, 10), (25, 10), (30, 12), (40, 16), (100, 40),
                                      (150, 60), (300, 120)])
def test_quick_runs_a_share_of_each_count_and_deep_all_of_it(monkeypatch, n, quick):
    monkeypatch.delenv("STEPWISE_EXAMPLES_SCALE", raising=False)
    assert examples(n, "deep") == n
    assert examples(n, "quick") == quick
    monkeypatch.setenv("STEPWISE_EXAMPLES_SCALE", "0.5")
    assert examples(n, "deep") == max(1, round(n / 2))
    assert examples(n, "quick") == max(1, round(quick / 2))


def test_the_profile_comes_from_the_environment_and_an_unknown_one_is_refused(monkeypatch):
    monkeypatch.delenv("STEPWISE_TEST_PROFILE", raising=False)
    assert profile() == "quick"
    monkeypatch.setenv("STEPWISE_TEST_PROFILE", "deep")
    assert profile() == "deep" and examples(40) == 40
    monkeypatch.setenv("STEPWISE_TEST_PROFILE", "thorough")
    with pytest.raises(ValueError, match="quick, deep"):
        profile()


def test_hypothesis_runs_the_profile_in_force():
    """conftest.py loads the profile named by the environment: a test without its own count runs its share of 100."""
    assert settings.default.max_examples == examples(100)
    assert settings.get_profile(profile()).max_examples == examples(100)


def fake_make(tmp_path) -> dict:
    """A `make` on PATH that prints the profile it was called with and its arguments, instead of running them."""
    (tmp_path / "make").write_text('#!/bin/sh\necho "profile=${STEPWISE_TEST_PROFILE:-unset} $*"\n')
    (tmp_path / "make").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "STEPWISE_TEST_PROFILE"}
    return {**env, "PATH": f"{tmp_path}:{env['PATH']}"}


def test_ci_runs_make_test_with_the_deep_profile(tmp_path):
    out = subprocess.run(["bash", str(ROOT / ".ci" / "run")], env=fake_make(tmp_path), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["profile=deep", "test"]


@pytest.mark.parametrize("target, expected", [("test", "quick"), ("test-deep", "deep")])
def test_make_hands_the_profile_to_the_suite(target, expected):
    """The recipe's first command stands in for the set-up: it prints the profile its environment has."""
    env = {k: v for k, v in os.environ.items() if k not in ("STEPWISE_TEST_PROFILE", "MAKEFLAGS", "MAKELEVEL")}
    out = subprocess.run(["make", "-s", "--no-print-directory", target, "PYTHON=printenv STEPWISE_TEST_PROFILE #",
                          "BIN=/nonexistent"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.stdout.splitlines()[:1] == [expected], (out.stdout, out.stderr)
