"""`make test`'s set-up on a fresh machine, as a graph whose independent steps overlap (steps.py lists them):

    python3 tests/bootstrap                 every step; each skipped where already done and valid
    python3 tests/bootstrap venv model      those and what they need (`make demo` runs these two)
    python3 tests/bootstrap --list          the steps, what each needs, and whether each is done (runs the checks)
    python3 tests/bootstrap --force native-check   run a step even where its check says done
    python3 tests/bootstrap --times t.json  also write each step's state and seconds (`make test-profile`)
    python3 tests/bootstrap --show-times t.json   print those steps again, slowest first; run nothing

Standard library only: it runs with the system's python3 before the venv exists. Each step's lines are printed
with its name in front, and its time when it ends; a table of them closes the run. Exit status 1 if a step failed.
"""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a folder: its modules by their plain names

from graph import closure, run_graph  # noqa: E402
from steps import ROOT, STEPS  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("steps", nargs="*", help=f"steps to run, with what they need (default: all: {', '.join(STEPS)})")
    ap.add_argument("--list", action="store_true", help="list the steps and whether each is done; run nothing")
    ap.add_argument("--force", action="append", default=[], metavar="STEP", help="run STEP even if done")
    ap.add_argument("--times", type=Path, metavar="JSON", help="write each step's state and seconds here")
    ap.add_argument("--show-times", type=Path, metavar="JSON", help="print a --times file, slowest step first")
    args = ap.parse_args(argv)
    if args.show_times:
        return show_times(json.loads(args.show_times.read_text()))
    names = closure(STEPS, args.steps or list(STEPS))
    if args.list:
        for name in names:
            step = STEPS[name]
            state = step.check() or "done"
            needs = f" (needs {', '.join(step.needs)})" if step.needs else ""
            print(f"{name:>12}  {step.why}{needs}\n{'':>12}  -> {state}")
        return 0
    start = time.monotonic()
    outcomes = run_graph(STEPS, names, str(ROOT), frozenset(closure(STEPS, args.force) and args.force))
    wall = time.monotonic() - start
    print(f"\nset-up in {wall:.1f} s (steps overlap; each step's own time):")
    for o in outcomes:
        print(f"  {o.name:>12}  {o.state:>8}  {o.seconds:6.1f} s  {o.note[:90]}")
    if args.times:
        args.times.write_text(json.dumps({"wall_s": round(wall, 1), "steps": [
            {"name": o.name, "state": o.state, "seconds": round(o.seconds, 1), "note": o.note} for o in outcomes]},
            indent=1))
    return 1 if any(o.state in ("failed", "not run") for o in outcomes) else 0


def show_times(times: dict) -> int:
    """`make test-profile`'s closing lines: the set-up's steps, slowest first (they overlapped: the wall time is the
    set-up's, each step's is its own, waits for its needs not counted)."""
    print(f"set-up: {times['wall_s']:.1f} s wall; its steps, slowest first:")
    for step in sorted(times["steps"], key=lambda s: -s["seconds"]):
        print(f"  {step['seconds']:7.1f} s  {step['name']:>12}  {step['state']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
