"""The set-up steps as a graph, run with overlap: a step starts the moment every step it needs has finished, so the
downloads (pip, apt) and the CPU work (the model's preparation, the kernel builds, native-check) run side by side
instead of one after another. Each step first checks whether its work is already done and still valid (a real
check of what it would produce, not a stamp), and skips it if so. Standard library only: it runs before any venv.
"""
from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Callable


class StepFailed(Exception):
    """A step's command failed; the message says which and how."""


@dataclass(frozen=True)
class Step:
    """One set-up step. ``check`` returns None when the work is done and valid, else why it must run; ``run``
    does the work through the ``Shell`` it is given (output prefixed with the step's name)."""
    name: str
    why: str
    run: Callable[["Shell"], None]
    check: Callable[[], str | None] = field(default=lambda: "runs every time")
    needs: tuple[str, ...] = ()


@dataclass
class Outcome:
    name: str
    state: str  # "ran", "done" (already done and valid), "failed", "not run"
    seconds: float = 0.0
    note: str = ""


class Shell:
    """Runs a step's commands, each line of their output printed with the step's name in front (steps overlap, so
    their lines interleave; the prefix says whose each is). rich's tables get 120 columns, not a pipe's 80."""

    def __init__(self, name: str, lock: threading.Lock, root: str):
        self.name, self.lock, self.root = name, lock, root

    def say(self, text: str) -> None:
        with self.lock:
            for line in text.rstrip("\n").splitlines() or [""]:
                print(f"{self.name:>12} | {line}", flush=True)

    def __call__(self, *argv: str, env: dict | None = None) -> None:
        proc = subprocess.Popen(argv, cwd=self.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={"COLUMNS": "120", **os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
        tail: list[str] = []
        for line in proc.stdout:
            self.say(line)
            tail = (tail + [line.rstrip()])[-5:]
        if proc.wait() != 0:
            raise StepFailed(f"`{' '.join(argv)}` exited {proc.returncode}: {' / '.join(tail)[-400:]}")


def closure(steps: dict[str, Step], wanted: list[str]) -> list[str]:
    """``wanted`` and every step they need, in the order ``steps`` lists them."""
    unknown = [w for w in wanted if w not in steps]
    if unknown:
        raise SystemExit(f"no step {', '.join(unknown)}: the steps are {', '.join(steps)}")
    chosen, todo = set(), list(wanted)
    while todo:
        name = todo.pop()
        if name not in chosen:
            chosen.add(name)
            todo += steps[name].needs
    return [n for n in steps if n in chosen]


def run_graph(steps: dict[str, Step], names: list[str], root: str, force: frozenset = frozenset()) -> list[Outcome]:
    """Run ``names`` (a closure under ``needs``), each as soon as its needs have finished; a step whose need
    failed is not run. ``force``: steps run even where their check says they are done."""
    lock, done = threading.Lock(), threading.Condition()
    outcomes: dict[str, Outcome] = {}

    def one(step: Step) -> None:
        start = time.monotonic()
        shell = Shell(step.name, lock, root)
        failed = [n for n in step.needs if outcomes[n].state in ("failed", "not run")]
        if failed:
            outcome = Outcome(step.name, "not run", note=f"needs {', '.join(failed)}")
        else:
            try:
                reason = "forced" if step.name in force else step.check()
                if reason is None:
                    outcome = Outcome(step.name, "done", note="already done and valid")
                else:
                    shell.say(f"starting ({reason})")
                    step.run(shell)
                    outcome = Outcome(step.name, "ran")
            except Exception as e:  # a bug in a step is its failure, not the whole graph's
                outcome = Outcome(step.name, "failed", note=str(e) or type(e).__name__)
        outcome.seconds = time.monotonic() - start
        shell.say(f"{outcome.state} in {outcome.seconds:.1f} s{': ' + outcome.note if outcome.note else ''}")
        with done:
            outcomes[step.name] = outcome
            done.notify_all()

    started: set[str] = set()
    with done:
        while len(outcomes) < len(names):
            for name in names:
                if name not in started and all(n in outcomes for n in steps[name].needs):
                    started.add(name)
                    threading.Thread(target=one, args=(steps[name],), daemon=True).start()
            done.wait()
    return [outcomes[n] for n in names]
