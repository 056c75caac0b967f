// The X-ray page: replays a recording (stages/xray/recording.py) step by step, or follows a live server.
// Every figure shown is a counter the engine recorded; the page only rebuilds state from the steps' changes.
// page.py joins model.js, charts.js, cards.js and app.js, in that order, into one function scope.

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
const colors = new Map(); // a canvas parses every colour string it is given: build each one once
const color = (i, light = 56) => {
  const key = i * 1000 + light;
  let c = colors.get(key);
  if (c === undefined) { c = `hsl(${hue(i).toFixed(1)}, 64%, ${light}%)`; colors.set(key, c); }
  return c;
};
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
