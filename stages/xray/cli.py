"""The X-ray's flags on every stage's command line: --trace FILE.json, --xray FILE.html, --chrome-trace FILE.json.

Without any of them nothing is built and no observer is attached: recording costs nothing when it is off.
"""
from __future__ import annotations

import argparse

from common.trace import Recorder, check_path


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("X-ray (stages/xray): a recording of every engine step")
    g.add_argument("--trace", metavar="FILE.json", default=None,
                   help="write every step (which requests ran, blocks, queue, texts) as JSON")
    g.add_argument("--xray", metavar="FILE.html", default=None,
                   help="write one self-contained page that replays the run step by step (open it in a browser)")
    g.add_argument("--chrome-trace", metavar="FILE.json", default=None,
                   help="write the steps in the Chrome trace event format (open it in ui.perfetto.dev)")


def recorder(args: argparse.Namespace, meta: dict | None = None, label: str = "run") -> Recorder | None:
    """A recorder when a flag asks for one, else None."""
    if not (getattr(args, "trace", None) or getattr(args, "xray", None) or getattr(args, "chrome_trace", None)):
        return None
    for flag, path in (("--trace", args.trace), ("--xray", args.xray), ("--chrome-trace", args.chrome_trace)):
        if path:
            try:
                check_path(path, flag)
            except ValueError as e:  # before the run, not after it
                raise SystemExit(f"error: {e}") from None
    return Recorder(label, meta)


def write_outputs(rec: Recorder, args: argparse.Namespace, console=None) -> None:
    """Write what the flags asked for, and say where."""
    from . import chrome, page
    from common.trace import save
    trace = rec.trace()
    written = []
    if args.trace:
        save(trace, args.trace)
        written.append(f"the recording {args.trace}")
    if args.xray:
        size = page.write(trace, args.xray)
        written.append(f"the X-ray page {args.xray} ({size / 1e6:.2f} MB: open it in a browser)")
    if args.chrome_trace:
        chrome.write(trace, args.chrome_trace)
        written.append(f"the Chrome trace {args.chrome_trace} (open it in ui.perfetto.dev)")
    steps = sum(len(r["steps"]) for r in trace["runs"])
    message = f"X-ray: {steps:,} steps of {len(trace['runs'])} run(s): wrote " + "; ".join(written)
    print(message) if console is None else console.print(message, highlight=False)
