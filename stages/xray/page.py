"""The X-ray page: one self-contained HTML file (styles, script and data inline; no network) that replays a
recording, or, served by stage 05 at /xray, follows the engine live.

The template (web/page.html), its style (web/page.css) and its script (web/*.js: the model of a run, the charts,
the cards, the app) are files of their own, so each reads as what it is; `render` pastes them and the data into
one page, the scripts into one function scope. No build step: plain JavaScript, a canvas and the DOM. The
page's Content-Security-Policy allows no request at all (a recording) or only its own server's events (live).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

WEB = Path(__file__).parent / "web"
SCRIPTS = ["model.js", "charts.js", "cards.js", "app.js"]  # in this order: each uses what the ones before define


def embed(data) -> str:
    """JSON safe inside a <script> element: no '<' survives to end it early."""
    return json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")


def render(trace: dict | None = None, live: dict | None = None) -> str:
    """The page for ``trace`` (a recording), or for a live server when ``live`` names its events URL."""
    script = "\n".join((WEB / name).read_text(encoding="utf-8") for name in SCRIPTS)
    html = (WEB / "page.html").read_text(encoding="utf-8")
    html = html.replace("__CSS__", (WEB / "page.css").read_text(encoding="utf-8"))
    html = html.replace("__CONNECT__", "'self'" if live else "'none'")
    html = html.replace("__JS__", f'"use strict";\n(function () {{\n{script}}})();\n')
    return html.replace("__DATA__", embed({"trace": trace, "live": live}))


def write(trace: dict, path: str | os.PathLike) -> int:
    """Write the page for ``trace``; returns its size in bytes."""
    text = render(trace)
    Path(path).write_text(text, encoding="utf-8")
    return len(text.encode())
