"""The stage 07 server the soak and the probe run against: in a process (and session) of its own, so that its
RSS, file descriptors and threads are its own and nothing of it outlives the run (stages/bench/children.py)."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import tempfile
import time

import httpx

from stages.bench import children

SPECULATIVE = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}


def command(args, port: int, xray_page: str | None = None) -> list[str]:
    """The server's command line; with ``xray_page``, its X-ray recording on (a ring of ``args.xray_window`` steps,
    written to that page when the server stops), so that the soak sees the ring fill and stop growing."""
    xray = ["--xray", xray_page, "--xray-window", str(args.xray_window)] if xray_page else []
    return [sys.executable, "-m", "stages.07_structured", "serve", "--port", str(port), "--model", args.model,
            "--max-num-seqs", str(args.max_num_seqs), "--kv-memory", args.kv_memory,
            "--grammar-cache-mb", str(args.grammar_cache_mb), "--speculative-config", json.dumps(SPECULATIVE), *xray]


def ready(url: str, server) -> bool:
    """True once /health answers 200; raises if the server died first."""
    if server.poll() is not None:
        raise RuntimeError(f"the server exited with code {server.returncode} before it was ready")
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def serving(args, log_path: str = os.devnull):
    """Yields (url, process) once the server answers /health; ends its whole session afterwards."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    pages = tempfile.TemporaryDirectory(prefix="soak-xray-")
    page = f"{pages.name}/xray.html" if getattr(args, "xray_window", 0) > 0 else None
    with pages, open(log_path, "w") as log, children.session(command(args, port, page), grace=60,
                                                             stdout=log, stderr=log) as server:
        deadline = time.monotonic() + 600
        while not ready(url, server):
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not answer /health within 600 s")
            time.sleep(0.5)
        yield url, server
