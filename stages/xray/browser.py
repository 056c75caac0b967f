"""Headless Chromium for checking the page: Debian's own browser (`apt-get install chromium`, `make chromium`),
driven by Playwright for Python with nothing downloaded (``executable_path``). Used by the browser tests and by
the benchmark (bench.py)."""
from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path

# As root Chromium needs --no-sandbox; the rest keep it from calling out (a closed network floods refusals).
ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-default-apps", "--mute-audio"]


def chromium_path() -> str | None:
    found = os.environ.get("STEPWISE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    return found if found and Path(found).exists() else None


@contextlib.contextmanager
def launch():
    """A headless Chromium (Playwright's Browser); raises RuntimeError when the system has none."""
    from playwright.sync_api import sync_playwright
    path = chromium_path()
    if path is None:
        raise RuntimeError("no chromium on this machine: install it with `make chromium` (apt-get install chromium)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


def open_offline(browser, path: str | os.PathLike, viewport=(1400, 1000)):
    """Open the page file with every other request refused; returns (page, seconds until the page is ready,
    the requests it tried, the errors it raised)."""
    page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
    url = Path(path).resolve().as_uri()
    tried, errors = [], []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)

    def route(r):
        if r.request.url == url:
            r.continue_()
        else:
            tried.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    start = time.perf_counter()
    page.goto(url)
    wait_js(page, "window.xray && window.xray.ready === true")
    return page, time.perf_counter() - start, tried, errors


def wait_js(page, expression: str, timeout: float = 30.0) -> None:
    """Poll a JavaScript expression until it is true (Playwright's wait_for_function evaluates strings with eval,
    which the page's Content-Security-Policy forbids)."""
    end = time.perf_counter() + timeout
    while not page.evaluate(expression):
        if time.perf_counter() > end:
            raise TimeoutError(f"the page never made {expression!r} true within {timeout:.0f} s")
        time.sleep(0.01)


def screenshot(path: str | os.PathLike, out: str | os.PathLike, run: int = 0, step: int = 0,
               request: int | None = None, width: int = 1400) -> None:
    """A PNG of the page at one step of one run (the docs' pictures): ``request`` selects a request by its label."""
    with launch() as browser:
        page, _, tried, errors = open_offline(browser, path, (width, 900))
        if tried or errors:
            raise RuntimeError(f"the page asked for {tried} or raised {errors}")
        page.evaluate(f"window.xray.selectRun({run})")
        if request is not None:
            page.evaluate(f"window.xray.selectRequest([...window.xray.runs[{run}].requests.values()]"
                          f".find((r) => r.index === {request}).seq)")
        page.evaluate(f"window.xray.setStep({step})")
        page.screenshot(path=str(out), full_page=True)
