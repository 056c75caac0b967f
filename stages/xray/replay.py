"""Replaying a recording: the whole state after every step, rebuilt from the steps' changes.

The page does the same in JavaScript (page.js); the tests replay here and compare with the engine's own
counters, and check the block pool from the replayed tables alone (`audit`).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Totals:
    """Running sums over the steps so far, named as `EngineStats` names them."""
    steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    output_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    preemptions: int = 0
    prefix_hit_tokens: int = 0
    prefix_query_tokens: int = 0


@dataclass
class Frame:
    """The state right after one step."""
    step: dict
    tables: dict[int, list[int]] = field(default_factory=dict)
    cached: set[int] = field(default_factory=set)
    num_blocks: int = 0
    block_size: int = 0
    free: int = 0
    requests: dict[int, dict] = field(default_factory=dict)  # seq_id -> its info, "text" and "tokens" so far
    totals: Totals = field(default_factory=Totals)

    @property
    def blocks_used(self) -> int:
        """The engine's counter, as recorded: blocks nobody holds are free."""
        return self.num_blocks - self.free

    @property
    def shared(self) -> set[int]:
        """Blocks in two or more tables (copy-on-write: n samples sharing a prompt, or a prefix in use twice)."""
        seen, twice = set(), set()
        for t in self.tables.values():
            for b in t:
                (twice if b in seen else seen).add(b)
        return twice


def replay(run: dict):
    """Yield a `Frame` after each step of ``run`` (one dict of a trace's "runs"); the frame's dicts are the
    replay's own and change with the next step: copy what you keep."""
    frame = Frame(step={})
    totals = frame.totals
    for step in run["steps"]:
        frame.step = step
        if step.get("key"):
            frame.tables, frame.cached = {}, set()
        for info in step.get("new", []):
            frame.requests[info["seq"]] = dict(info, text=info.get("text", ""), tokens=[])
        for s in step["seqs"]:
            req = frame.requests.setdefault(s["seq"], {"seq": s["seq"], "text": "", "tokens": []})
            req["text"] = s["text_reset"] if "text_reset" in s else req["text"] + s.get("text", "")
            req["tokens"] = req["tokens"] + s.get("tokens", [])
            if s.get("finish"):
                req["finish"] = s["finish"]
            totals.prefill_tokens += s.get("prompt_fed", 0)
            totals.decode_tokens += s["fed"] - s.get("prompt_fed", 0)
            totals.output_tokens += len(s.get("tokens", []))
            totals.drafted_tokens += s.get("drafted", 0)
            totals.accepted_tokens += s.get("accepted", 0)
        totals.steps += 1
        totals.preemptions += len(step.get("preempted", []))
        totals.prefix_hit_tokens += sum(step.get("prefix_hits", {}).values())
        totals.prefix_query_tokens += step.get("prefix_query_tokens", 0)
        blocks = step.get("blocks")
        if blocks is not None:
            frame.num_blocks, frame.block_size, frame.free = blocks["num_blocks"], blocks["block_size"], blocks["free"]
            for k in blocks["gone"]:
                frame.tables.pop(int(k), None)
            frame.tables.update({int(k): t for k, t in blocks["tables"].items()})
            frame.cached = (frame.cached - set(blocks["cached_del"])) | set(blocks["cached_add"])
        yield frame


def audit(frame: Frame) -> list[str]:
    """What is wrong with the pool after this step, seen from the recording alone: the blocks the tables hold are
    exactly the engine's blocks in use, each in range and at most once per table, and no cached block is held."""
    held = {b for t in frame.tables.values() for b in t}
    problems = []
    if len(held) != frame.blocks_used:
        problems.append(f"the tables hold {len(held)} blocks, the engine counts {frame.blocks_used} in use")
    if any(not 0 <= b < frame.num_blocks for b in held | frame.cached):
        problems.append(f"a block id outside [0, {frame.num_blocks})")
    if any(len(set(t)) != len(t) for t in frame.tables.values()):
        problems.append("a table lists a block twice")
    if held & frame.cached:
        problems.append(f"blocks {sorted(held & frame.cached)[:5]} are both held and cached (free)")
    if len(frame.cached) > frame.free:
        problems.append(f"{len(frame.cached)} cached blocks but only {frame.free} free")
    return problems
