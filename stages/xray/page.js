"use strict";
// The X-ray page: replays a recording (stages/xray/recording.py) step by step, or follows a live server.
// Every figure shown is a counter the engine recorded; the page only rebuilds state from the steps' changes.
(function () {
  const DATA = JSON.parse(document.getElementById("xray-data").textContent);
  const $ = (id) => document.getElementById(id);
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  };
  const fmt = (n) => Number(n).toLocaleString("en-US");
  const hue = (i) => (i * 137.508) % 360;
  const color = (i, light = 56) => `hsl(${hue(i)}, 64%, ${light}%)`;
  const LIVE_KEEP = 4000; // steps a live page keeps

  // ---- the model: one run, its steps replayed into frames ------------------------------------------------------
  class RunView {
    constructor(label, meta) {
      this.label = label;
      this.meta = meta || {};
      this.frames = [];
      this.dropped = 0; // frames dropped from the front (live)
      this.requests = new Map(); // seq -> request
      this.lanes = []; // lane -> seq (paged stages have no slots: a request takes the first free lane)
      this.laneOf = new Map();
      this.rows = 0;
      this.paged = false;
      this.numBlocks = 0;
      this.blockSize = 0;
      this.maxWaiting = 1;
      this.totals = {prefill: 0, decode: 0, output: 0, drafted: 0, accepted: 0, preemptions: 0, hits: 0,
        queried: 0, copies: 0, slotSteps: 0, usedSlotSteps: 0};
      this.waitingPreempted = [];
      this.image = null;
    }

    request(seq) {
      let r = this.requests.get(seq);
      if (!r) {
        r = {seq, index: seq, prompt: "", promptTokens: null, maxTokens: null, pieces: [], kept: [],
          preemptions: [], finish: null, finishPos: null, firstPos: null};
        this.requests.set(seq, r);
      }
      return r;
    }

    free(seq) {
      const lane = this.laneOf.get(seq);
      if (lane != null && this.lanes[lane] === seq) this.lanes[lane] = null;
      this.laneOf.delete(seq);
      return lane;
    }

    push(step) {
      const pos = this.dropped + this.frames.length;
      const prev = this.frames.length ? this.frames[this.frames.length - 1] : null;
      const key = !!step.key;
      let tables = key || !prev ? {} : prev.tables;
      let cached = key || !prev ? new Set() : prev.cached;
      for (const info of step.new || []) {
        const r = this.request(info.seq);
        Object.assign(r, {index: info.index, prompt: info.prompt || "", promptTokens: info.prompt_tokens,
          maxTokens: info.max_tokens, sample: info.sample, group: info.group});
        if (info.text) r.pieces.push({pos, text: info.text, reset: true});
      }
      const b = step.blocks;
      if (b) {
        this.paged = true;
        this.numBlocks = b.num_blocks;
        this.blockSize = b.block_size;
        if (b.gone.length || Object.keys(b.tables).length) {
          tables = Object.assign({}, tables);
          for (const k of b.gone) delete tables[k];
          Object.assign(tables, b.tables);
        }
        if (b.cached_add.length || b.cached_del.length) {
          cached = new Set(cached);
          for (const x of b.cached_del) cached.delete(x);
          for (const x of b.cached_add) cached.add(x);
        }
      }
      const marks = [];
      for (const seq of step.preempted || []) {
        const lane = this.free(seq);
        if (lane != null) marks.push({lane, type: "preempt"});
        this.request(seq).preemptions.push(pos);
        this.waitingPreempted.push(seq);
      }
      if ((step.admitted || []).length) {
        const admitted = new Set(step.admitted);
        this.waitingPreempted = this.waitingPreempted.filter((s) => !admitted.has(s));
      }
      const t = this.totals;
      const cells = [];
      for (const s of step.seqs) {
        const r = this.request(s.seq);
        if (s.text_reset != null) r.pieces.push({pos, text: s.text_reset, reset: true});
        else if (s.text) r.pieces.push({pos, text: s.text});
        const kept = (s.tokens || []).length;
        if (kept) r.kept.push({pos, n: kept});
        if (r.firstPos == null) r.firstPos = pos;
        const pf = s.prompt_fed || 0;
        t.prefill += pf;
        t.decode += s.fed - pf;
        t.output += kept;
        t.drafted += s.drafted || 0;
        t.accepted += s.accepted || 0;
        let lane = s.slot;
        if (lane == null) {
          lane = this.laneOf.get(s.seq);
          if (lane == null) {
            lane = this.lanes.indexOf(null);
            if (lane < 0) { lane = this.lanes.length; this.lanes.push(null); }
            this.lanes[lane] = s.seq;
            this.laneOf.set(s.seq, lane);
          }
        }
        cells.push({lane, seq: s.seq, kind: s.kind, s});
        if (step.prefix_hits && step.prefix_hits[s.seq]) marks.push({lane, type: "hit"});
      }
      const held = this.lanes.slice();
      for (const s of step.seqs) {
        if (s.finish) {
          const r = this.request(s.seq);
          r.finish = s.finish;
          r.finishPos = pos;
          this.free(s.seq);
        }
      }
      t.preemptions += (step.preempted || []).length;
      const hits = Object.values(step.prefix_hits || {}).reduce((a, v) => a + v, 0);
      t.hits += hits;
      t.queried += step.prefix_query_tokens || 0;
      t.copies += (step.copies || []).length;
      t.slotSteps += step.slots;
      t.usedSlotSteps += step.seqs.length;
      // Idle slots stay visible: every slot of stages 01-02; a paged stage's max_num_seqs when it is small.
      this.rows = Math.max(this.rows, this.lanes.length, cells.reduce((m, c) => Math.max(m, c.lane + 1), 0),
        !b || step.slots <= 64 ? step.slots : 0);
      this.maxWaiting = Math.max(this.maxWaiting, step.waiting);
      const frame = {pos, step, tables, cached, cells, held, marks, totals: Object.assign({}, t), hits,
        free: b ? b.free : null, numBlocks: b ? b.num_blocks : null, queuePreempted: this.waitingPreempted.slice()};
      this.frames.push(frame);
      if (this.frames.length > LIVE_KEEP) {
        const n = this.frames.length - LIVE_KEEP;
        this.frames.splice(0, n);
        this.dropped += n;
      }
      this.image = null;
      return frame;
    }

    textAt(r, pos) {
      let text = "", gained = "";
      for (const p of r.pieces) {
        if (p.pos > pos) break;
        text = p.reset ? p.text : text + p.text;
        gained = p.pos === pos ? (p.reset ? p.text : gained + p.text) : "";
      }
      if (gained && text.endsWith(gained)) return [text.slice(0, text.length - gained.length), gained];
      return [text, ""];
    }

    tokensAt(r, pos) {
      let n = 0;
      for (const k of r.kept) if (k.pos <= pos) n += k.n;
      return n;
    }
  }

  // ---- the state of the page ----------------------------------------------------------------------------------
  const runs = [];
  let current = 0; // selected run
  let at = 0; // frame index in the selected run
  let selectedSeq = null;
  let timer = null;
  const live = DATA.live || null;

  function view() { return runs[current]; }

  // ---- the slots x steps charts ----------------------------------------------------------------------------------
  function maxFrames() { return Math.max(1, ...runs.map((r) => r.frames.length)); }

  function rowHeight(v) { return Math.max(2, Math.min(18, Math.floor(150 / Math.max(1, v.rows)))); }

  function chartCanvas(i) { return document.querySelector(`#charts .run[data-run="${i}"] canvas`); }

  function drawBase(v, canvas) {
    const ratio = window.devicePixelRatio || 1;
    const width = Math.max(200, canvas.parentElement.clientWidth - 20);
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
    if (!v.image || v.image.width !== Math.max(200, canvas.parentElement.clientWidth - 20)) drawBase(v, canvas);
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
    const ratio = window.devicePixelRatio || 1, width = canvas.clientWidth, height = 84;
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

  // ---- the cards ---------------------------------------------------------------------------------------------------
  function stat(box, label, value, id) {
    const d = el("div", "stat");
    const b = el("b", null, value);
    if (id) b.id = id;
    d.append(el("span", null, label), b);
    box.append(d);
    return b;
  }

  function reqLabel(v, seq) {
    const r = v.request(seq);
    return `#${r.index}`;
  }

  function swatch(v, seq) {
    const s = el("span", "sw");
    s.style.background = color(v.request(seq).index);
    return s;
  }

  function renderStep() {
    const v = view(), f = v.frames[at], s = f.step, t = f.totals;
    const box = $("stats");
    box.textContent = "";
    const fed = s.seqs.reduce((a, q) => a + q.fed, 0), pf = s.seqs.reduce((a, q) => a + (q.prompt_fed || 0), 0);
    const kept = s.seqs.reduce((a, q) => a + (q.tokens || []).length, 0);
    stat(box, "step", `${fmt(s.index)}`, "stat-step");
    stat(box, "started at", `${(s.time || 0).toFixed(3)} s`);
    stat(box, "took", `${((s.duration || 0) * 1e3).toFixed(1)} ms`);
    stat(box, "in the step", `${s.seqs.length} of ${s.slots} slots`);
    stat(box, "running / waiting", `${s.running} / ${s.waiting}`, "stat-queue");
    stat(box, "tokens fed", `${fmt(fed)} (${fmt(pf)} prompt)`);
    stat(box, "tokens kept", fmt(kept));
    stat(box, "output tokens so far", fmt(t.output), "stat-output");
    stat(box, "preemptions so far", fmt(t.preemptions), "stat-preemptions");
    if (t.queried) stat(box, "prefix hits so far", `${fmt(t.hits)} of ${fmt(t.queried)}`);
    if (t.drafted) stat(box, "drafts kept so far", `${fmt(t.accepted)} / ${fmt(t.drafted)}`);
    const ev = $("step-events");
    ev.textContent = "";
    const tag = (cls, text) => ev.append(el("span", "tag " + cls, text));
    for (const q of s.admitted || []) tag("admit", `admit ${reqLabel(v, q)}`);
    for (const q of s.preempted || []) tag("preempt", `preempt ${reqLabel(v, q)}`);
    for (const [q, n] of Object.entries(s.prefix_hits || {})) tag("hit", `${reqLabel(v, +q)} hit ${n} tokens`);
    for (const [a, b] of s.copies || []) tag("copy", `copy block ${a} \u2192 ${b}`);
    for (const q of s.finished || []) tag("finish", `${reqLabel(v, q)} done (${v.request(q).finish || ""})`);
    const body = $("seqs");
    body.textContent = "";
    s.seqs.slice(0, 48).forEach((q) => {
      const tr = el("tr");
      const name = el("td");
      name.append(swatch(v, q.seq), reqLabel(v, q.seq));
      const gained = q.text_reset != null ? q.text_reset : (q.text || "");
      tr.append(name, el("td", "kind-" + q.kind, q.kind + (q.drafted ? ` (${q.accepted}/${q.drafted})` : "")),
        el("td", null, fmt(q.fed)), el("td", null, fmt((q.tokens || []).length)), el("td", "txt", JSON.stringify(gained)));
      tr.addEventListener("click", () => selectRequest(q.seq));
      body.append(tr);
    });
    if (s.seqs.length > 48) {
      const tr = el("tr");
      tr.append(el("td", null, `+${s.seqs.length - 48} more`));
      body.append(tr);
    }
  }

  function buildPool() {
    const v = view(), pool = $("pool");
    pool.textContent = "";
    $("kv-bar-box").style.display = v.paged ? "none" : "";
    $("pool-legend").textContent = "";
    if (!v.paged) {
      $("pool-title").textContent = "KV memory (one slot per request)";
      $("pool-how").textContent = "This stage reserves max_model_len positions per slot up front: the bar is " +
        "what is reserved, the dark part what holds tokens.";
      return;
    }
    $("pool-title").textContent = "KV block pool";
    $("pool-how").textContent = `${fmt(v.numBlocks)} blocks of ${v.blockSize} tokens. A block takes the colour ` +
      "of the request holding it; striped: shared by several (a cached prefix, or samples before copy-on-write); " +
      "grey: free but still holding a cached prefix; white: free.";
    const n = v.numBlocks, size = n <= 256 ? 16 : n <= 1024 ? 10 : n <= 4096 ? 6 : 4;
    pool.style.gridTemplateColumns = `repeat(auto-fill, ${size}px)`;
    pool.style.gridAutoRows = `${size}px`;
    pool.style.gap = size > 6 ? "2px" : "1px";
    const frag = document.createDocumentFragment();
    for (let i = 0; i < n; i++) {
      const c = el("div", "cell free");
      c.dataset.block = i;
      frag.append(c);
    }
    pool.append(frag);
    pool.cellState = new Array(n).fill("");
    for (const [c, label] of [["#fff", "free"], ["#c9ced8", "cached (free, prefix kept)"],
      [color(3), "held"], [`repeating-linear-gradient(45deg,#fff 0 2px,${color(3)} 2px 5px)`, "shared"]]) {
      const s = el("span");
      const sw = el("i");
      sw.style.background = c;
      s.append(sw, label);
      $("pool-legend").append(s);
    }
  }

  function owners(f) {
    const own = new Map();
    for (const [seq, table] of Object.entries(f.tables)) {
      for (const b of table) {
        const o = own.get(b);
        if (o) o.push(+seq); else own.set(b, [+seq]);
      }
    }
    return own;
  }

  function renderPool() {
    const v = view(), f = v.frames[at], s = f.step, box = $("pool-stats");
    box.textContent = "";
    if (!v.paged) {
      const res = s.kv_reserved, used = s.kv_used, cap = Math.max(1, ...v.frames.map((q) => q.step.kv_reserved));
      stat(box, "KV reserved", `${fmt(res)} B`, "kv-reserved");
      stat(box, "holding tokens", `${fmt(used)} B`);
      const bar = $("kv-bar");
      bar.innerHTML = "";
      const a = el("div"), b = el("div");
      a.style.cssText = `width:${100 * res / cap}%;background:rgba(47,111,237,.3)`;
      b.style.cssText = `width:${100 * used / cap}%;background:rgba(47,111,237,.75)`;
      bar.append(a, b);
      $("kv-bar-note").textContent = res ? `${(100 * (1 - used / res)).toFixed(1)}% of the reserved bytes hold no token` : "";
    } else {
      const own = owners(f), shared = [...own.values()].filter((o) => o.length > 1).length;
      const used = f.numBlocks - f.free;
      const b = stat(box, "blocks in use", `${fmt(used)} of ${fmt(f.numBlocks)}`, "blocks-used");
      b.dataset.value = used;
      stat(box, "free", fmt(f.free));
      stat(box, "cached", fmt(f.cached.size));
      stat(box, "shared", fmt(shared));
      const pool = $("pool"), cells = pool.children, state = pool.cellState;
      for (let i = 0; i < cells.length; i++) {
        const o = own.get(i);
        let key, cls, bg = "";
        if (o) {
          const idx = v.request(o[0]).index;
          cls = "cell held" + (o.length > 1 ? " shared" : "") + (o.includes(selectedSeq) ? " sel" : "");
          bg = color(idx);
          key = cls + bg;
        } else {
          cls = f.cached.has(i) ? "cell cached" : "cell free";
          key = cls;
        }
        if (state[i] !== key) {
          cells[i].className = cls;
          cells[i].style.backgroundColor = bg;
          state[i] = key;
        }
      }
    }
    const q = $("queue");
    q.textContent = "";
    const shown = Math.min(s.waiting, 80);
    const pre = f.queuePreempted;
    for (let i = 0; i < shown; i++) {
      const d = el("div", "q");
      if (i < pre.length) {
        d.style.background = color(v.request(pre[i]).index);
        d.title = `${reqLabel(v, pre[i])} (preempted)`;
        d.addEventListener("click", () => selectRequest(pre[i]));
      }
      q.append(d);
    }
    q.append(el("span", "more", s.waiting > shown ? `+${fmt(s.waiting - shown)} more` : s.waiting ? "" : "empty"));
  }

  function renderRequest() {
    const v = view(), f = v.frames[at];
    const head = $("request-head"), status = $("request-status"), text = $("request-text");
    head.textContent = "";
    if (selectedSeq == null || !v.requests.has(selectedSeq)) {
      head.textContent = "no request selected";
      status.textContent = "";
      text.textContent = "";
      return;
    }
    const r = v.request(selectedSeq), pos = f.pos;
    head.append(swatch(v, r.seq), `request ${reqLabel(v, r.seq)}`);
    const bits = [`seq ${r.seq}`];
    if (r.promptTokens != null) bits.push(`prompt ${fmt(r.promptTokens)} tokens`);
    if (r.maxTokens != null) bits.push(`max_tokens ${fmt(r.maxTokens)}`);
    bits.push(`${fmt(v.tokensAt(r, pos))} tokens out after this step`);
    const pre = r.preemptions.filter((p) => p <= pos).length;
    let where;
    if (r.finishPos != null && r.finishPos <= pos) where = `finished (${r.finish})`;
    else if (r.firstPos == null || r.firstPos > pos) where = "not started";
    else if (f.cells.some((c) => c.seq === r.seq)) where = "ran this step";
    else if (Object.prototype.hasOwnProperty.call(f.tables, r.seq)) where = "holds its blocks, not in this step";
    else where = pre ? "preempted: waiting to be recomputed" : "waiting";
    if (pre) bits.push(`preempted ${pre}\u00d7`);
    status.textContent = `${where} \u00b7 ${bits.join(" \u00b7 ")}`;
    const [before, gained] = v.textAt(r, pos);
    text.textContent = "";
    text.append(el("span", "prompt", r.prompt), el("span", null, before));
    if (gained) text.append(el("mark", null, gained));
    text.scrollTop = text.scrollHeight;
  }

  function buildRequestList() {
    const v = view(), box = $("requests");
    box.textContent = "";
    const reqs = [...v.requests.values()].sort((a, b) => a.index - b.index || (a.sample || 0) - (b.sample || 0));
    for (const r of reqs.slice(0, 400)) {
      const b = el("button", r.seq === selectedSeq ? "sel" : "", reqLabel(v, r.seq));
      b.style.background = color(r.index);
      b.addEventListener("click", () => selectRequest(r.seq));
      box.append(b);
    }
  }

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
    resizing = setTimeout(() => { runs.forEach((v, i) => { v.image = null; drawChart(i); }); drawLines(); }, 100);
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
      meta.model, meta.kv_memory && `KV budget ${meta.kv_memory}`].filter(Boolean).join(" \u00b7 ");
    $("footer").textContent = `Recorded by stepwise (X-ray format ${trace.format} v${trace.version}); ` +
      "every number is the engine's own counter after the step.";
    buildCharts();
    runs.forEach((v, i) => drawChart(i));
    selectRun(0);
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
})();
