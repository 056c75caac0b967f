"""python -m stages.lab list | start NN | check NN | hint NN TASK | solution NN | diff NN | reset NN"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from .catalog import LABS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stages.lab", description="labs with an autograder, one per stage")
    ap.add_argument("--workspace", type=Path, default=None, help="where learners' copies live (default: labs/)")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the labs and their tasks")
    for name, text in [("start", "write your copy of the stage, each task a stub, and its task sheet"),
                       ("check", "grade every task of your copy against the reference"),
                       ("solution", "print the solution of each task"), ("diff", "your copy against the solution"),
                       ("reset", "start the lab over (deletes your answers)")]:
        command = sub.add_parser(name, help=text)
        command.add_argument("lab", choices=sorted(LABS))
        if name == "check":
            command.add_argument("--xray", type=Path, default=None, metavar="DIR",
                                 help="write each failing example that ran an engine (labs 01-03) as an X-ray page "
                                      "in DIR: the run step by step")
    hint = sub.add_parser("hint", help="a hint for one task")
    hint.add_argument("lab", choices=sorted(LABS))
    hint.add_argument("task", help="e.g. 03.2, or just 2")
    args = ap.parse_args(argv)
    from . import workspace as ws
    root = args.workspace or ws.DEFAULT_WORKSPACE
    if args.command == "list":
        for lab in LABS.values():
            print(f"lab {lab.number}  stages/{lab.stage}")
            for t in lab.tasks:
                print(f"  {t.id}  {t.title}  ({t.file})")
    elif args.command in ("start", "reset"):
        try:
            folder = (ws.start if args.command == "start" else ws.reset)(args.lab, root)
        except FileExistsError as e:
            print(e, file=sys.stderr)
            return 1
        print(f"lab {args.lab}: your copy is in {folder}; the tasks are in {folder / 'TASKS.md'}")
    elif args.command == "hint":
        task = args.task if "." in args.task else f"{args.lab}.{args.task}"
        found = [t for t in LABS[args.lab].tasks if t.id == task]
        if not found:
            tasks = ", ".join(t.id for t in LABS[args.lab].tasks)
            print(f"lab {args.lab} has no task {task}: {tasks}", file=sys.stderr)
            return 2
        print(f"{task} {found[0].title}: {found[0].hint}")
    elif args.command == "solution":
        print(ws.solution(args.lab))
    elif args.command == "diff":
        print(ws.diff(args.lab, root) or "no difference: your copy is the solution")
    elif args.command == "check":
        import torch
        if not torch.cuda.is_available():
            os.environ.setdefault("TRITON_INTERPRET", "1")  # lab 04's kernel runs in Triton's interpreter on CPU
        from .grade import grade, rubric
        start = time.perf_counter()
        results = grade(args.lab, root, xray=args.xray)
        print(f"lab {args.lab} ({time.perf_counter() - start:.1f} s):\n{rubric(results)}")
        return 0 if all(r.passed for r in results) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
