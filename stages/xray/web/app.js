// Navigation, then the start: a recording embedded in the page, or a live server's events.

// ---- navigation --------------------------------------------------------------------------------------------------
function setStep(i) {
  const v = view();
  if (!v || !v.frames.length) return;
  at = Math.max(0, Math.min(v.frames.length - 1, i));
  const slider = $("slider");
  slider.max = v.frames.length - 1;
  slider.value = at;
  const f = v.frames[at];
  const now = $("step-now");
  now.textContent = `step ${fmt(f.step.index)} \u00b7 ${fmt(at + 1)} of ${fmt(v.frames.length)}`;
  now.dataset.step = f.step.index;
  now.dataset.frame = at;
  renderStep();
  renderPool();
  renderRequest();
  drawChart(current);
  drawLines();
}

function selectRequest(seq) {
  selectedSeq = seq;
  buildRequestList();
  setStep(at);
}

function selectRun(i) {
  const prev = current;
  current = i;
  at = 0;
  selectedSeq = null;
  buildPool();
  buildRequestList();
  updateTitles();
  drawChart(prev);
  setStep(0);
}

function play() {
  if (timer) { stop(); return; }
  const v = view();
  if (at >= v.frames.length - 1) setStep(0);
  $("play").textContent = "pause";
  timer = setInterval(() => {
    if (at >= view().frames.length - 1) { if (!live) stop(); return; }
    setStep(at + 1);
  }, 1000 / Number($("speed").value));
}

function stop() {
  clearInterval(timer);
  timer = null;
  $("play").textContent = "play";
}

$("slider").addEventListener("input", (e) => { stop(); setStep(Number(e.target.value)); });
$("first").addEventListener("click", () => { stop(); setStep(0); });
$("prev").addEventListener("click", () => { stop(); setStep(at - 1); });
$("next").addEventListener("click", () => { stop(); setStep(at + 1); });
$("last").addEventListener("click", () => { stop(); setStep(view().frames.length - 1); });
$("play").addEventListener("click", play);
$("speed").addEventListener("change", () => { if (timer) { stop(); play(); } });
$("pool").addEventListener("click", (e) => {
  const i = e.target.dataset && e.target.dataset.block;
  if (i == null) return;
  const o = owners(view().frames[at]).get(+i);
  if (o) selectRequest(o[0]);
});
$("pool").addEventListener("mouseover", (e) => {
  const i = e.target.dataset && e.target.dataset.block;
  if (i == null) return;
  const v = view(), f = v.frames[at], o = owners(f).get(+i);
  e.target.title = o ? `block ${i}: ${o.map((s) => reqLabel(v, s)).join(", ")}` + (o.length > 1 ? " (shared)" : "")
    : `block ${i}: ${f.cached.has(+i) ? "free, holds a cached prefix" : "free"}`;
});
document.addEventListener("keydown", (e) => {
  if (e.target.tagName === "INPUT" && e.target.type !== "range") return;
  if (e.key === "ArrowRight") { stop(); setStep(at + 1); e.preventDefault(); }
  else if (e.key === "ArrowLeft") { stop(); setStep(at - 1); e.preventDefault(); }
  else if (e.key === " ") { play(); e.preventDefault(); }
});
let resizing = null;
window.addEventListener("resize", () => {
  clearTimeout(resizing);
  resizing = setTimeout(() => {
    chartWidth = null;
    runs.forEach((v, i) => { v.image = null; drawChart(i); });
    drawLines();
  }, 100);
});

// ---- a recording ---------------------------------------------------------------------------------------------------
function loadTrace(trace) {
  for (const run of trace.runs) {
    const v = new RunView(run.label, run.meta);
    for (const s of run.steps) v.push(s);
    runs.push(v);
  }
  const meta = (trace.runs[0] || {}).meta || {};
  $("subtitle").textContent = [meta.workload && `${meta.workload} workload`, meta.requests && `${meta.requests} requests`,
    meta.model, meta.kv_memory && `KV budget ${meta.kv_memory}`,
    meta.window && `the last ${meta.window.toLocaleString()} steps at most (--xray-window)`].filter(Boolean).join(" \u00b7 ");
  $("footer").textContent = `Recorded by stepwise (X-ray format ${trace.format} v${trace.version}); ` +
    "every number is the engine's own counter after the step.";
  buildCharts();
  selectRun(0);
  runs.forEach((v, i) => { if (i) drawChart(i); });
}

// ---- live: server-sent events from stage 05's /xray/events ---------------------------------------------------------
function startLive() {
  const v = new RunView(live.label || "live", {});
  runs.push(v);
  $("live-badge").textContent = "LIVE";
  $("follow-box").style.display = "";
  buildCharts();
  let key = new URLSearchParams(location.hash.slice(1)).get("key");
  if (live.api_key && !key) {
    $("live-key").style.display = "flex";
    $("key-go").addEventListener("click", () => { $("live-key").style.display = "none"; connect($("key-input").value); });
  } else connect(key);
  let redraw = null;

  function onStep(step) {
    const first = !v.frames.length;
    v.push(step);
    if (redraw) return;
    redraw = setTimeout(() => { // at most ~10 redraws a second, however fast the engine steps
      redraw = null;
      updateTitles();
      if (first || v.frames.length === 1) { buildPool(); buildRequestList(); }
      else if (v.requests.size !== $("requests").children.length) buildRequestList();
      if (v.paged && $("pool").children.length !== v.numBlocks) buildPool();
      setStep($("follow").checked ? v.frames.length - 1 : at);
    }, 100);
  }

  async function connect(apiKey) {
    const headers = apiKey ? {Authorization: `Bearer ${apiKey}`} : {};
    $("live-status").textContent = "connecting\u2026";
    try {
      const res = await fetch(live.events, {headers, cache: "no-store"});
      if (!res.ok) {
        $("live-status").textContent = `the server answered ${res.status}` + (res.status === 401 ? ": a valid API key is required" : "");
        return;
      }
      $("live-status").textContent = "connected: waiting for the engine's next step";
      const reader = res.body.getReader(), dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buf += dec.decode(value, {stream: true});
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          let type = "message", data = "";
          for (const line of block.split("\n")) {
            if (line.startsWith("event:")) type = line.slice(6).trim();
            else if (line.startsWith("data:")) data += line.slice(5).trim();
          }
          if (!data) continue;
          const msg = JSON.parse(data);
          if (type === "step") { onStep(msg); $("live-status").textContent = `receiving steps (${fmt(v.frames.length + v.dropped)})`; }
          else if (type === "hello") $("subtitle").textContent = msg.label || "";
          else if (type === "resync") $("live-status").textContent = "fell behind: resynchronising from the next step";
        }
      }
      $("live-status").textContent = "the server closed the stream";
    } catch (err) {
      $("live-status").textContent = `disconnected: ${err}`;
    }
  }
}

window.xray = {runs, setStep, selectRun, selectRequest, get step() { return at; }, get run() { return current; }};
if (live) startLive(); else loadTrace(DATA.trace);
window.xray.ready = true;
