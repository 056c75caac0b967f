"""The X-ray's recording (stages/xray draws it): every `StepEvent` of a run, as JSON a page can replay and a
test can check.

An observer (`Recorder.on_step`) turns each step into a plain dict (`StepEncoder.encode`) and keeps it. The
numbers are the engine's own counters, copied, never recomputed: which sequences ran and what each fed and
kept, the queue, the block pool (``num_blocks - free`` is the engine's blocks in use), prefix hits, copies.

To stay small, a step stores what changed: the block tables that changed since the previous step (``gone``:
tables dropped), the cached blocks that came and went, and the text each request gained. The first step of a
run is a *keyframe* (``"key": true``) that holds everything; a live client that fell behind gets another one
(live.py). `replay` rebuilds the whole state after every step.

The file: ``{"format": "stepwise-xray", "version": 1, "runs": [{"label", "meta", "steps": [...]}]}``; a step:
``{"index", "time", "duration", "seqs": [{"seq", "kind", "start", "fed", "prompt_fed", "tokens", "drafted",
"accepted", "slot", "finish", "text"}], "admitted", "preempted", "finished", "prefix_hits": {seq: tokens},
"prefix_query_tokens", "copies", "slots", "in_step", "running", "waiting", "kv_reserved", "kv_used",
"new": [requests first seen], "blocks": {"num_blocks", "block_size", "free", "tables", "gone",
"cached_add", "cached_del"}}`` (zeros, empty lists and None are left out of a sequence's entry).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

FORMAT, VERSION = "stepwise-xray", 1
PROMPT_CHARS = 2000  # a request's prompt text kept for the page (the token count is always exact)


class TraceError(ValueError):
    """A trace file this version cannot read: the message names what is wrong and what to do."""


def request_info(seq) -> dict:
    """What the page shows about a request the first time it is seen."""
    p = seq.params
    prompt = seq.prompt
    if prompt is None and seq.detokenizer is not None:
        prompt = seq.detokenizer.tokenizer.decode(seq.prompt_token_ids)
    info = {"seq": seq.seq_id, "index": seq.index, "prompt": (prompt or "")[:PROMPT_CHARS],
            "prompt_tokens": seq.num_prompt_tokens, "max_tokens": p.max_tokens, "temperature": p.temperature}
    if len(seq.group) > 1:
        info.update(sample=seq.sample_index, group=seq.group[0].seq_id)
    return info


class StepEncoder:
    """Turns step events into dicts, each holding what changed since the one before (or all of it: a keyframe)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.tables: dict[int, list[int]] = {}
        self.cached: set[int] = set()
        self.texts: dict[int, str] = {}
        self.live: dict = {}  # seq_id -> Sequence, seen and not finished (a keyframe names them again)
        self.need_key = True

    def encode(self, event) -> dict:
        key, self.need_key = self.need_key, False
        if len(self.live) > 256:  # an aborted request never shows a finish: forget the finished ones now and then
            self.live = {i: s for i, s in self.live.items() if not s.is_finished}
            self.texts = {i: t for i, t in self.texts.items() if i in self.live}
        state, new, seqs = event.state, [], []
        if key:  # everything again: the tables, the cached blocks, every request in flight and its text
            self.tables, self.cached, self.texts = {}, set(), {}
            ran = {s.seq_id for s in event.seqs}
            self.live = {i: s for i, s in self.live.items() if not s.is_finished}
            for seq_id, seq in self.live.items():
                info = request_info(seq)
                if seq_id not in ran and seq.output_text:
                    info["text"] = self.texts[seq_id] = seq.output_text
                new.append(info)
        for s in event.seqs:
            if s.seq_id not in self.live and s.seq is not None:
                self.live[s.seq_id] = s.seq
                new.append(request_info(s.seq))
            entry = {"seq": s.seq_id, "kind": s.kind, "start": s.start, "fed": s.fed}
            for name, value in (("prompt_fed", s.prompt_fed), ("tokens", s.tokens), ("drafted", s.drafted),
                                ("accepted", s.accepted), ("finish", s.finish_reason)):
                if value:
                    entry[name] = value
            if s.slot is not None:
                entry["slot"] = s.slot
            if s.seq is not None:
                self.text_delta(entry, s.seq_id, s.seq.output_text, key)
            seqs.append(entry)
            if s.finish_reason is not None:
                self.live.pop(s.seq_id, None)
                self.texts.pop(s.seq_id, None)
        step = {"index": event.index, "time": round(event.time, 6), "duration": round(event.duration, 6),
                "seqs": seqs, "admitted": event.admitted, "preempted": event.preempted, "finished": event.finished,
                "prefix_hits": {str(k): v for k, v in event.prefix_hits.items()},
                "prefix_query_tokens": event.prefix_query_tokens, "copies": [list(c) for c in event.copies],
                "slots": state.num_slots, "in_step": state.num_in_step, "running": state.num_running,
                "waiting": state.num_waiting, "kv_reserved": state.kv_bytes_reserved, "kv_used": state.kv_bytes_used}
        if key:
            step["key"] = True
        if new:
            step["new"] = new
        if state.blocks is not None:
            step["blocks"] = self.blocks(state.blocks)
        return step

    def text_delta(self, entry: dict, seq_id: int, text: str, key: bool) -> None:
        """The text the request gained this step. In a keyframe, or when the text before is no prefix of the new
        one (a stop string cut it), the whole text replaces it."""
        before = self.texts.get(seq_id, "")
        if key or not text.startswith(before):
            if text:
                entry["text_reset"] = text
        elif len(text) > len(before):
            entry["text"] = text[len(before):]
        self.texts[seq_id] = text

    def blocks(self, b) -> dict:
        changed = {str(k): t for k, t in b.tables.items() if self.tables.get(k) != t}
        gone = [k for k in self.tables if k not in b.tables]
        cached = set(b.cached)
        out = {"num_blocks": b.num_blocks, "block_size": b.block_size, "free": b.num_free, "tables": changed,
               "gone": gone, "cached_add": sorted(cached - self.cached), "cached_del": sorted(self.cached - cached)}
        self.tables, self.cached = dict(b.tables), cached
        return out


@dataclass
class Run:
    label: str
    meta: dict = field(default_factory=dict)
    steps: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:  # a ring (a server's window: stages/xray/cli.py) starts at its first keyframe
        steps = list(self.steps)
        return {"label": self.label, "meta": self.meta, "steps": steps[next((i for i, s in enumerate(steps)
                                                                             if s.get("key")), 0):]}


class Recorder:
    """An observer that keeps every step: ``llm.add_observer(Recorder("02 continuous"))``. Each `end_run` closes a
    run (one `generate`); the next step opens another, with the same label unless `begin_run` names one."""

    def __init__(self, label: str = "run", meta: dict | None = None, path: str | os.PathLike | None = None):
        if path is not None:
            check_path(path)
        self.label, self.meta, self.path = label, dict(meta or {}), path
        self.runs: list[Run] = []
        self.current: Run | None = None
        self.encoder = StepEncoder()

    def begin_run(self, label: str | None = None, meta: dict | None = None) -> None:
        self.end_run(write=False)
        self.current = Run(label or self.label, dict(self.meta) | dict(meta or {}))
        self.encoder.reset()

    def on_step(self, event) -> None:
        if self.current is None:
            self.begin_run()
        self.current.steps.append(self.encoder.encode(event))

    def end_run(self, write: bool = True) -> None:
        """Close the run; with a ``path``, write every run recorded so far to it."""
        if self.current is not None and self.current.steps:
            self.runs.append(self.current)
        self.current = None
        if write and self.path is not None:
            save(self.trace(), self.path)

    def trace(self) -> dict:
        runs = self.runs + ([self.current] if self.current is not None and self.current.steps else [])
        return {"format": FORMAT, "version": VERSION, "runs": [r.as_dict() for r in runs]}


def check_path(path, name: str = "trace") -> None:
    """A trace path must be writable before a run, not after it: fail now, naming the argument."""
    from common.validate import InvalidParam
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise InvalidParam(name, f"{name}={path!r} is invalid: give a file path (FILE.json)")
    if name == "trace" and str(path).endswith((".html", ".htm")):
        raise InvalidParam(name, f"trace={str(path)!r}: trace= writes the recording as JSON; give FILE.json and "
                                 f"draw the page with `python -m stages.xray FILE.json FILE.html` (or pass --xray "
                                 f"FILE.html to a stage's command)")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InvalidParam(name, f"{name}={str(path)!r}: the folder {folder} does not exist")


def save(trace: dict, path: str | os.PathLike) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace, f, separators=(",", ":"))


def load(path: str | os.PathLike) -> dict:
    """Read and check a trace file; a `TraceError` says what is wrong with it."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise TraceError(f"cannot read the trace {path}: {e.strerror}") from None
    try:
        trace = json.loads(text)
    except json.JSONDecodeError as e:
        ended = e.pos >= len(text.rstrip()) or not text.rstrip().endswith("}")  # a whole trace ends its object
        why = "it ends early (a truncated file?)" if ended else f"invalid JSON at line {e.lineno} column {e.colno}"
        raise TraceError(f"{path} is not a complete X-ray trace: {why}; record it again") from None
    check(trace, str(path))
    return trace


def check(trace, where: str = "the trace") -> None:
    if not isinstance(trace, dict) or trace.get("format") != FORMAT:
        got = trace.get("format") if isinstance(trace, dict) else type(trace).__name__
        raise TraceError(f"{where} is not a stepwise X-ray trace (format {got!r}, expected {FORMAT!r})")
    if trace.get("version") != VERSION:
        raise TraceError(f"{where} is version {trace.get('version')!r} of the X-ray format; this stepwise reads "
                         f"version {VERSION}: record it again with this version (--trace)")
    runs = trace.get("runs")
    if not isinstance(runs, list):
        raise TraceError(f"{where} has no list of runs")
    for r, run in enumerate(runs):
        if not isinstance(run, dict) or not isinstance(run.get("steps"), list) or "label" not in run:
            raise TraceError(f"{where}: run {r} needs a label and a list of steps")
        for i, step in enumerate(run["steps"]):
            missing = [k for k in ("index", "seqs", "waiting", "running")
                       if not isinstance(step, dict) or k not in step]
            if missing:
                raise TraceError(f"{where}: run {r} ({run['label']}), step {i} has no {', '.join(missing)}")
        if run["steps"] and not run["steps"][0].get("key"):
            raise TraceError(f"{where}: run {r} ({run['label']}) does not start with a keyframe")
