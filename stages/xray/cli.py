"""The X-ray's flags on every stage's command line: --trace FILE.json, --xray FILE.html, --chrome-trace FILE.json.

Without any of them nothing is built and no observer is attached: recording costs nothing when it is off.
"""
from __future__ import annotations

import argparse
from collections import deque

from common.trace import Recorder, Run, check_path

WINDOW = 10_000  # steps a server's recording keeps (--xray-window)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("X-ray (stages/xray): a recording of every engine step")
    g.add_argument("--trace", metavar="FILE.json", default=None,
                   help="write every step (which requests ran, blocks, queue, texts) as JSON")
    g.add_argument("--xray", metavar="FILE.html", default=None,
                   help="write one self-contained page that replays the run step by step (open it in a browser)")
    g.add_argument("--chrome-trace", metavar="FILE.json", default=None,
                   help="write the steps in the Chrome trace event format (open it in ui.perfetto.dev)")
    g.add_argument("--xray-window", metavar="STEPS", type=int, default=WINDOW,
                   help="serve: keep only the most recent STEPS steps (a server's recording would grow for its life)")


class RingRecorder(Recorder):
    """A server's recording: only its latest ``window`` steps, with a keyframe every quarter window so that what is
    kept replays on its own (the page says how many steps it keeps: its meta's ``window``)."""

    def __init__(self, label: str, meta: dict | None, window: int):
        super().__init__(label, dict(meta or {}) | {"window": window})
        self.window = window

    def begin_run(self, label: str | None = None, meta: dict | None = None) -> None:
        super().begin_run(label, meta)
        self.current = Run(self.current.label, self.current.meta, deque(maxlen=self.window))

    def on_step(self, event) -> None:
        if event.index % max(1, self.window // 4) == 0:
            self.encoder.need_key = True
        super().on_step(event)


def recorder(args: argparse.Namespace, meta: dict | None = None, label: str = "run",
             window: int | None = None) -> Recorder | None:
    """A recorder when a flag asks for one, else None; with ``window`` (a server), a ring of that many steps."""
    if not (getattr(args, "trace", None) or getattr(args, "xray", None) or getattr(args, "chrome_trace", None)):
        return None
    for flag, path in (("--trace", args.trace), ("--xray", args.xray), ("--chrome-trace", args.chrome_trace)):
        if path:
            try:
                check_path(path, flag)
            except ValueError as e:  # before the run, not after it
                raise SystemExit(f"error: {e}") from None
    if window is not None:
        if window < 1:
            raise SystemExit(f"error: --xray-window={window} is invalid: give a number of steps >= 1")
        return RingRecorder(label, meta, window)
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
