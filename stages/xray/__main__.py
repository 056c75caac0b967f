"""python -m stages.xray RUN.json RUN.html [--chrome-trace RUN.trace.json]: draw a recording (`LLM(trace=...)`,
`--trace`) as the self-contained X-ray page, and optionally as a Chrome trace for Perfetto."""
import argparse
import sys

from common.trace import TraceError, load

from . import chrome, page

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recording", help="a trace written by LLM(trace=FILE.json) or --trace FILE.json")
    ap.add_argument("page", help="the page to write (FILE.html)")
    ap.add_argument("--chrome-trace", metavar="FILE.json", default=None, help="also write the Chrome trace")
    args = ap.parse_args()
    try:
        trace = load(args.recording)
    except TraceError as e:
        sys.exit(f"error: {e}")
    size = page.write(trace, args.page)
    print(f"wrote the X-ray page {args.page} ({size / 1e6:.2f} MB: open it in a browser)")
    if args.chrome_trace:
        chrome.write(trace, args.chrome_trace)
        print(f"wrote the Chrome trace {args.chrome_trace} (open it in ui.perfetto.dev)")
