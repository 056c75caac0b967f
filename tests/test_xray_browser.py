"""The X-ray page in a real browser: Debian's chromium, headless, driven by Playwright (nothing downloaded).

The page opens with every request but its own file refused; the slider moves; the step and the blocks in use it
shows are the recording's at several steps; the pool grid has one cell per block; a clicked request's text is
its recorded text at that step; play advances; the screenshot is not blank. The live page served by stage 05
follows a run over loopback and shows the engine's own figures. Without chromium these tests are skipped, except
under CI (CI=true), where `make test` installs it (`make chromium`) and a missing browser is a failure.
"""
import importlib
import io
import os
import threading

import httpx
import pytest

from common import SamplingParams
from stages.workloads import toy
from stages.xray import Recorder, page, replay
from stages.xray.browser import chromium_path, launch, open_offline, wait_js
from workloads import Server, wait_until

paged = importlib.import_module("stages.03_paged_kv")
continuous = importlib.import_module("stages.02_continuous_batch")
streaming = importlib.import_module("stages.05_streaming")
TINY_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 2

if chromium_path() is None:
    if os.environ.get("CI"):
        raise RuntimeError("CI needs chromium for the X-ray's browser tests: `make chromium` installs it")
    pytest.skip("no chromium here (make chromium installs it)", allow_module_level=True)


@pytest.fixture(scope="module")
def browser():
    with launch() as b:
        yield b


@pytest.fixture(scope="module")
def trace():
    """Stage 03 under a budget that preempts (with a shared prefix: prefix hits), then stage 02 on the toy."""
    rec = Recorder()
    llm = paged.LLM("tiny", block_size=4, kv_cache_memory=24 * 4 * TINY_BYTES_PER_TOKEN, max_num_seqs=6)
    llm.add_observer(rec)
    rec.begin_run("03 paged")
    llm.generate([[11] * 12 + [20 + i] * 18 for i in range(6)],
                 SamplingParams(temperature=0.9, seed=3, max_tokens=40, ignore_eos=True))
    rec.end_run(write=False)
    assert llm.stats.preemptions > 0 and llm.stats.prefix_hit_tokens > 0
    llm = continuous.LLM("tiny", max_num_seqs=4)
    llm.add_observer(rec)
    rec.begin_run("02 continuous")
    llm.generate(*toy())
    rec.end_run(write=False)
    return rec.trace()


@pytest.fixture(scope="module")
def opened(browser, trace, tmp_path_factory):
    path = tmp_path_factory.mktemp("xray") / "run.html"
    page.write(trace, path)
    pg, seconds, tried, errors = open_offline(browser, path)
    yield pg, tried, errors
    pg.close()


def set_slider(pg, frame: int) -> None:
    pg.locator("#slider").fill(str(frame))


def test_page_loads_offline_without_errors(opened, trace):
    pg, tried, errors = opened
    assert tried == [] and errors == []
    assert pg.locator("#charts .run").count() == 2
    titles = pg.locator("#charts .run .steps").all_inner_texts()
    assert titles == [f"{len(r['steps'])} steps" for r in trace["runs"]] and titles[1] == "112 steps"


def test_slider_shows_the_recordings_step_and_blocks_in_use(opened, trace):
    pg, *_ = opened
    pg.evaluate("window.xray.selectRun(0)")
    frames = [(f.step["index"], f.blocks_used, f.step["running"], f.step["waiting"])
              for f in replay(trace["runs"][0])]
    assert pg.locator("#pool .cell").count() == trace["runs"][0]["steps"][0]["blocks"]["num_blocks"] == 24
    assert pg.locator("#slider").get_attribute("max") == str(len(frames) - 1)
    for i in (0, 9, len(frames) // 3, len(frames) // 2, len(frames) - 1):
        set_slider(pg, i)
        index, used, running, waiting = frames[i]
        assert pg.locator("#step-now").get_attribute("data-step") == str(index)
        assert pg.locator("#blocks-used").get_attribute("data-value") == str(used)
        assert pg.locator("#stat-queue").inner_text() == f"{running} / {waiting}"
        held = pg.locator("#pool .cell.held").count()
        assert held == used  # a block is held exactly when some table lists it
    pg.keyboard.press("ArrowLeft")
    assert pg.locator("#step-now").get_attribute("data-step") == str(frames[-2][0])


def test_a_clicked_request_shows_its_recorded_text_at_that_step(opened, trace):
    pg, *_ = opened
    pg.evaluate("window.xray.selectRun(0)")
    frames = list((f.step["index"], {k: dict(v) for k, v in f.requests.items()}) for f in replay(trace["runs"][0]))
    i = len(frames) // 2
    set_slider(pg, i)
    seq, req = next((k, v) for k, v in frames[i][1].items() if v["text"])
    pg.locator("#requests button", has_text=f"#{req['index']}").first.click()
    shown = pg.locator("#request-text").inner_text()
    assert shown.endswith(req["text"]) and pg.locator("#request-head").inner_text().endswith(f"#{req['index']}")


def test_play_advances_and_the_screenshot_is_not_blank(opened):
    from PIL import Image
    pg, *_ = opened
    pg.evaluate("window.xray.selectRun(1)")
    set_slider(pg, 0)
    pg.locator("#play").click()
    wait_js(pg, "window.xray.step >= 3")
    pg.locator("#play").click()
    assert pg.locator("#play").inner_text() == "play"
    assert pg.locator("#pool .cell").count() == 0  # stage 02 has no block pool: a KV bar instead
    image = Image.open(io.BytesIO(pg.screenshot(full_page=True))).convert("RGB")
    colours = image.getcolors(1 << 20)
    assert image.size[0] >= 1000 and len(colours) > 50  # requests' colours, text, charts: not a blank page


def test_live_page_follows_the_server(browser):
    llm = streaming.LLM("tiny", max_num_seqs=6, block_size=4, kv_cache_memory=20 * 4 * TINY_BYTES_PER_TOKEN)
    with Server(llm, "tiny", api_key="k3y") as s, httpx.Client(timeout=60) as http:
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors, outside = [], []
        pg.on("pageerror", lambda e: errors.append(str(e)))

        def route(r):  # the server's own address only
            if r.request.url.startswith(s.url):
                return r.continue_()
            outside.append(r.request.url)
            r.abort()

        pg.route("**/*", route)
        pg.goto(s.url + "/xray#key=k3y")
        wait_js(pg, "document.getElementById('live-status').textContent.startsWith('connected')")

        def one(i):
            http.post(s.url + "/v1/completions", headers={"Authorization": "Bearer k3y"},
                      json={"model": "tiny", "prompt": [[11 + i] * 14], "max_tokens": 30, "ignore_eos": True})

        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert wait_until(lambda: pg.evaluate("window.xray.runs[0].frames.length") == llm.num_steps, 60)
        wait_js(pg, f"document.getElementById('step-now').dataset.step == '{llm.num_steps - 1}'")
        g = llm.gauges()
        assert pg.locator("#blocks-used").get_attribute("data-value") == str(g["kv_blocks_used"])
        assert pg.locator("#stat-preemptions").inner_text() == str(g["preemptions"]) != "0"
        assert pg.locator("#pool .cell").count() == g["kv_blocks"] == 20
        assert errors == [] and outside == []
        pg.close()
