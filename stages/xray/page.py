"""The X-ray page: one self-contained HTML file (styles, script and data inline; no network) that replays a
recording, or, served by stage 05 at /xray, follows the engine live.

The template (page.html), its style (page.css) and its script (page.js) sit beside this file, so each reads as
what it is; `render` pastes them and the data into one page. The page's Content-Security-Policy allows no
request at all (a recording) or only its own server's events (live).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

HERE = Path(__file__).parent


def embed(data) -> str:
    """JSON safe inside a <script> element: no '<' survives to end it early."""
    return json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")


def render(trace: dict | None = None, live: dict | None = None) -> str:
    """The page for ``trace`` (a recording), or for a live server when ``live`` names its events URL."""
    html = (HERE / "page.html").read_text(encoding="utf-8")
    html = html.replace("__CSS__", (HERE / "page.css").read_text(encoding="utf-8"))
    html = html.replace("__CONNECT__", "'self'" if live else "'none'")
    html = html.replace("__JS__", (HERE / "page.js").read_text(encoding="utf-8"))
    return html.replace("__DATA__", embed({"trace": trace, "live": live}))


def write(trace: dict, path: str | os.PathLike) -> int:
    """Write the page for ``trace``; returns its size in bytes."""
    text = render(trace)
    Path(path).write_text(text, encoding="utf-8")
    return len(text.encode())
