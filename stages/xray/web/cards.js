// The cards: this step, the KV pool (or a stage 01-02 KV bar) and the queue, the selected request.

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
    "dark grey: free but still holding a cached prefix; light grey: free.";
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
  for (const [c, label] of [["#e9ecf1", "free"], ["#b4bac6", "cached (free, prefix kept)"],
    [color(3), "held"], [`repeating-linear-gradient(45deg,rgba(255,255,255,.75) 0 2px,${color(3)} 2px 5px)`, "shared"]]) {
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
