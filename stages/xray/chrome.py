"""The recording in the Chrome trace event format, which Perfetto (ui.perfetto.dev) and chrome://tracing open.

One process per run; in it one track per slot (stages 01-02) or per request (paged stages, which have no slots),
each step a slice on the tracks of the sequences it ran (its kind, tokens fed and kept in the slice's args),
an "engine" track with one slice per step, counters for KV blocks in use and the queue, and instant events for
preemptions. Times are the engine's, in microseconds from the start of the LLM.
"""
from __future__ import annotations

import json
import os

from .replay import replay


def events(trace: dict) -> list[dict]:
    out = []
    for pid, run in enumerate(trace["runs"], start=1):
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": run["label"]}})
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "args": {"name": "engine steps"}})
        named, labels = set(), {}
        for frame in replay(run):
            step = frame.step
            ts, dur = step.get("time", 0) * 1e6, max(step.get("duration", 0) * 1e6, 1)
            out.append({"ph": "X", "name": f"step {step['index']}", "pid": pid, "tid": 0, "ts": ts, "dur": dur,
                        "args": {"sequences": len(step["seqs"]), "waiting": step["waiting"]}})
            for info in step.get("new", []):
                labels[info["seq"]] = f"request {info['index']}" + (f".{info['sample']}" if "sample" in info else "")
            for s in step["seqs"]:
                slot = s.get("slot")
                tid = 1 + slot if slot is not None else 1000 + s["seq"]
                if tid not in named:
                    named.add(tid)
                    name = f"slot {slot}" if slot is not None else labels.get(s["seq"], f"seq {s['seq']}")
                    out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
                    out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                                "args": {"sort_index": tid}})
                args = {"seq": s["seq"], "fed": s["fed"], "kept": len(s.get("tokens", [])), "start": s["start"]}
                if s.get("text"):
                    args["text"] = s["text"]
                out.append({"ph": "X", "name": f"{labels.get(s['seq'], s['seq'])} {s['kind']}", "cat": s["kind"],
                            "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args})
            end = ts + dur
            out.append({"ph": "C", "name": "queue", "pid": pid, "ts": end,
                        "args": {"waiting": step["waiting"], "running": step["running"]}})
            if "blocks" in step:
                out.append({"ph": "C", "name": "KV blocks", "pid": pid, "ts": end,
                            "args": {"in use": frame.blocks_used, "cached": len(frame.cached)}})
            else:
                out.append({"ph": "C", "name": "KV bytes", "pid": pid, "ts": end,
                            "args": {"reserved": step.get("kv_reserved", 0), "holding tokens": step.get("kv_used", 0)}})
            for seq in step.get("preempted", []):
                out.append({"ph": "i", "s": "p", "name": f"preempt {labels.get(seq, seq)}", "pid": pid, "tid": 0,
                            "ts": ts})
    return out


def write(trace: dict, path: str | os.PathLike) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"traceEvents": events(trace), "displayTimeUnit": "ms"}, f, separators=(",", ":"))
