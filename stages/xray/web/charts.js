// The slots x steps charts (one per run, one scale) and the line chart under them.

// ---- the slots x steps charts ----------------------------------------------------------------------------------
function maxFrames() { return Math.max(1, ...runs.map((r) => r.frames.length)); }

function rowHeight(v) { return Math.max(2, Math.min(18, Math.floor(150 / Math.max(1, v.rows)))); }

// The charts' width, measured once (and again on resize): reading it forces a layout, slow beside a big pool.
let chartWidth = null;
function widthNow() {
  if (chartWidth == null) chartWidth = Math.max(200, $("charts").clientWidth - 36);
  return chartWidth;
}

function chartCanvas(i) { return document.querySelector(`#charts .run[data-run="${i}"] canvas`); }

function drawBase(v, canvas) {
  const ratio = window.devicePixelRatio || 1;
  const width = widthNow();
  const rh = rowHeight(v), height = v.rows * rh + 2;
  canvas.style.height = height + "px";
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  const img = document.createElement("canvas");
  img.width = canvas.width;
  img.height = canvas.height;
  const g = img.getContext("2d");
  g.scale(ratio, ratio);
  const cw = width / (live ? Math.max(200, v.frames.length) : maxFrames());
  g.fillStyle = "#f1f3f7";
  g.fillRect(0, 0, cw * v.frames.length, v.rows * rh);
  const gap = rh > 5 ? 1 : 0, wgap = cw > 4 ? 0.5 : 0;
  v.frames.forEach((f, x) => {
    const ran = new Set(f.cells.map((c) => c.seq));
    f.held.forEach((seq, lane) => { // a lane held by a request that did not run this step
      if (seq == null || ran.has(seq)) return;
      g.fillStyle = color(v.request(seq).index, 88);
      g.fillRect(x * cw, lane * rh, cw - wgap, rh - gap);
    });
    for (const c of f.cells) {
      const idx = v.request(c.seq).index;
      g.fillStyle = color(idx, c.kind === "prefill" ? 38 : 58);
      g.fillRect(x * cw, c.lane * rh, cw - wgap, rh - gap);
      if (c.kind === "verify") { g.fillStyle = "#fff"; g.fillRect(x * cw, c.lane * rh, cw - wgap, 1); }
    }
    for (const m of f.marks) {
      g.fillStyle = m.type === "preempt" ? "#e0364b" : "#1f9d55";
      const y = m.lane * rh + rh / 2, s = Math.max(3, Math.min(6, rh / 2));
      g.beginPath();
      if (m.type === "preempt") { g.moveTo(x * cw, y - s); g.lineTo(x * cw + s * 1.6, y); g.lineTo(x * cw, y + s); }
      else g.arc(x * cw + cw / 2, y, s * 0.7, 0, 6.283);
      g.fill();
    }
  });
  v.image = {img, cw, rh, width, height};
}

function drawChart(i) {
  const v = runs[i], canvas = chartCanvas(i);
  if (!canvas) return;
  if (!v.image || v.image.width !== widthNow()) drawBase(v, canvas);
  const g = canvas.getContext("2d"), ratio = window.devicePixelRatio || 1;
  g.setTransform(1, 0, 0, 1, 0, 0);
  g.clearRect(0, 0, canvas.width, canvas.height);
  g.drawImage(v.image.img, 0, 0);
  if (i !== current) return;
  g.scale(ratio, ratio);
  const {cw, height} = v.image;
  g.fillStyle = "rgba(20, 30, 50, .85)";
  g.fillRect(at * cw + cw / 2 - 1, 0, 2, height);
  if (selectedSeq != null) { // outline the selected request's cells
    g.strokeStyle = "#111";
    g.lineWidth = 1;
    const rh = v.image.rh;
    v.frames.forEach((f, x) => {
      for (const c of f.cells) if (c.seq === selectedSeq) g.strokeRect(x * cw + .5, c.lane * rh + .5, Math.max(1, cw - 1), rh - 1);
    });
  }
}

function buildCharts() {
  const box = $("charts");
  box.textContent = "";
  runs.forEach((v, i) => {
    const d = el("div", "run" + (i === current ? " selected" : ""));
    d.dataset.run = i;
    const title = el("div", "title");
    title.append(el("b", null, v.label), el("b", "steps", ""), el("span", null, ""));
    d.append(title, el("canvas"));
    d.addEventListener("click", (e) => onChartClick(i, e));
    box.append(d);
  });
  updateTitles();
}

function updateTitles() {
  runs.forEach((v, i) => {
    const d = document.querySelector(`#charts .run[data-run="${i}"]`);
    if (!d) return;
    const t = v.totals, idle = t.slotSteps - t.usedSlotSteps;
    d.querySelector(".steps").textContent = `${fmt(v.frames.length + v.dropped)} steps`;
    const parts = [`${fmt(t.output)} tokens`, `${fmt(idle)} of ${fmt(t.slotSteps)} slot-steps idle`];
    if (t.preemptions) parts.push(`${fmt(t.preemptions)} preemptions`);
    if (t.queried) parts.push(`prefix hits ${fmt(t.hits)} of ${fmt(t.queried)} prompt tokens`);
    d.querySelector("span").textContent = parts.join(" · ");
    d.classList.toggle("selected", i === current);
  });
}

function onChartClick(i, e) {
  if (i !== current) { selectRun(i); return; }
  const v = view();
  if (!v.image) return;
  const rect = e.currentTarget.querySelector("canvas").getBoundingClientRect();
  const x = Math.floor((e.clientX - rect.left) / v.image.cw), lane = Math.floor((e.clientY - rect.top) / v.image.rh);
  if (x < 0 || x >= v.frames.length) return;
  const f = v.frames[x];
  const c = f.cells.find((c) => c.lane === lane);
  if (c) selectedSeq = c.seq;
  else if (lane >= 0 && f.held[lane] != null) selectedSeq = f.held[lane];
  setStep(x);
  buildRequestList();
}

// ---- the line chart: blocks in use (or KV bytes), the queue, and the step's events -----------------------------
function drawLines() {
  const v = view(), canvas = $("lines");
  const ratio = window.devicePixelRatio || 1, width = widthNow() + 16, height = 84;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  const g = canvas.getContext("2d");
  g.scale(ratio, ratio);
  const n = v.frames.length, cw = v.image ? v.image.cw : width / Math.max(1, n), top = 4, h = 56;
  g.fillStyle = "#f7f8fa";
  g.fillRect(0, top, width, h);
  const used = (f) => v.paged ? f.numBlocks - f.free : f.step.kv_reserved;
  const cap = v.paged ? Math.max(1, v.numBlocks) : Math.max(1, ...v.frames.map((f) => f.step.kv_reserved));
  g.fillStyle = "rgba(47, 111, 237, .28)";
  g.strokeStyle = "#2f6fed";
  g.beginPath();
  g.moveTo(0, top + h);
  v.frames.forEach((f, x) => g.lineTo(x * cw + cw / 2, top + h - h * used(f) / cap));
  g.lineTo((n - 1) * cw + cw / 2, top + h);
  g.fill();
  if (!v.paged) { // KV holding tokens, under what is reserved
    g.fillStyle = "rgba(47, 111, 237, .55)";
    g.beginPath();
    g.moveTo(0, top + h);
    v.frames.forEach((f, x) => g.lineTo(x * cw + cw / 2, top + h - h * f.step.kv_used / cap));
    g.lineTo((n - 1) * cw + cw / 2, top + h);
    g.fill();
  }
  g.strokeStyle = "#f08c00";
  g.lineWidth = 1.5;
  g.beginPath();
  v.frames.forEach((f, x) => {
    const y = top + h - h * f.step.waiting / v.maxWaiting;
    if (x === 0) g.moveTo(x * cw + cw / 2, y); else g.lineTo(x * cw + cw / 2, y);
  });
  g.stroke();
  const ey = top + h + 12; // events strip
  v.frames.forEach((f, x) => {
    const cx = x * cw + cw / 2;
    if ((f.step.preempted || []).length) { g.fillStyle = "#e0364b"; g.fillRect(cx - 1.5, ey - 8, 3, 8); }
    if (f.hits) { g.fillStyle = "#1f9d55"; g.fillRect(cx - 1.5, ey + 1, 3, 7); }
    if ((f.step.copies || []).length) { g.fillStyle = "#8b3fd9"; g.fillRect(cx - 1.5, ey + 9, 3, 6); }
  });
  g.fillStyle = "rgba(20, 30, 50, .85)";
  g.fillRect(at * cw + cw / 2 - 1, 0, 2, height);
  $("lines-legend").innerHTML = "";
  const items = v.paged
    ? [["rgba(47,111,237,.45)", `KV blocks in use (of ${fmt(v.numBlocks)})`]]
    : [["rgba(47,111,237,.3)", "KV bytes reserved"], ["rgba(47,111,237,.65)", "KV bytes holding tokens"]];
  items.push(["#f08c00", `waiting queue (max ${fmt(v.maxWaiting)})`], ["#e0364b", "preemption"],
    ["#1f9d55", "prefix-cache hit"], ["#8b3fd9", "copy-on-write"]);
  for (const [c, label] of items) {
    const s = el("span");
    const sw = el("i");
    sw.style.background = c;
    s.append(sw, label);
    $("lines-legend").append(s);
  }
}
