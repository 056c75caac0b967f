"""The stage's measurement: stage 05 and stage 06 on the same requests, one after the other in one process, at each
in-flight limit, with the tokens checked equal. Speculation pays while a step is bound by reading the weights:
one request's k + 1 rows cost what its one row costs. Once enough requests fill the step, every draft row is
real work, and speculation stops paying: the crossover, measured here, not assumed."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table

from common.paths import cpu_identity
from common.prepare import resolve_model
from common.config import ModelConfig
from common.loader import parse_dtype
from stages import streaming

from . import rounds
from .draft_model import DraftModelProposer
from .engine import LLM
from .workloads import build


def describe(llm: LLM) -> str:
    """The line the stage's commands print first: what runs, and on which path (the figures depend on it)."""
    spec, front = llm.engine_config.speculative, llm.front
    weights = f" ({front.quantization} weights)" if front.quantization else ""
    draft = next((p for p in llm.engine.scheduler.proposers if isinstance(p, DraftModelProposer)), None)
    note = f"; the draft's {draft.model.row_tile_note}" if draft is not None else ""
    return (f"stage 06 on {front.execution_path}, {front.dtype}{weights}; speculation: "
            f"{spec.describe() if spec else 'off'}; {front.model.row_tile_note}{note}")


@dataclass
class Row:
    workload: str
    in_flight: int
    requests: int
    base_tps: float  # stage 05, output tokens per second
    spec_tps: float  # stage 06
    acceptance: float
    tokens_per_step: float
    proposer_share: float
    same: bool
    by_position: list[float] = field(default_factory=list)
    per_request: dict[int, float] = field(default_factory=dict)
    proposed: int = 0  # draft tokens the proposers offered (the adaptive policy's input)
    fed: int = 0  # of them, the ones the policy found worth their rows (all, drafting always)
    round: int = 0  # --rounds: which round of the cell
    spec_first: bool = False  # whether stage 06 ran before stage 05 in it (the order alternates round by round)

    @property
    def speedup(self) -> float:
        return self.spec_tps / self.base_tps if self.base_tps else 0.0


def kv_budget(args, in_flight: int) -> int:
    """Bytes of KV for ``in_flight`` requests of up to 512 prompt tokens and their answers: no preemption, so the
    comparison is about speculation alone."""
    config = ModelConfig.from_folder(resolve_model(args.model))
    per_token = config.kv_bytes_per_token(parse_dtype(args.dtype).itemsize)
    return in_flight * (512 + args.max_tokens + 32) * per_token


def engines(args, in_flight: int):
    options = dict(dtype=args.dtype, quantization=args.quantization, max_num_seqs=in_flight,
                   kv_cache_memory=kv_budget(args, in_flight), max_model_len=args.max_model_len)
    base = streaming.LLM(args.model, **options)
    spec = LLM(args.model, speculative_config=args.speculative_config, **options)
    for llm in (base, spec):  # a first step pays one-time costs (thread pools, caches) outside the timing
        llm.generate([[1, 2, 3]], {"temperature": 0, "max_tokens": 2})
    return base, spec


def forget_prefixes(llm) -> None:
    """Empty an idle engine's prefix cache, so that every run prefills its prompts as the first did (a round
    repeats the same requests)."""
    cache = llm.engine.scheduler.block_manager.prefix_cache
    for block_id in list(cache.of_block if cache is not None else ()):
        cache.evict(block_id)


def run_one(base, spec, workload: str, in_flight: int, args, recorder=None, round: int = 0,
            spec_first: bool = False) -> Row:
    n = max(args.num_requests, in_flight)
    prompts, params = build(workload, spec.tokenizer, n, args.max_tokens)
    for llm in (base, spec):
        forget_prefixes(llm)
    expected = None if spec_first else base.generate(prompts, params)
    if recorder is not None:  # the X-ray (--xray/--trace): stage 06's steps, drafts kept and rejected
        label = f"06 {workload}, {in_flight} in flight" + (f", round {round + 1}" if args.rounds > 1 else "")
        recorder.begin_run(label, {"requests": n, "max_num_seqs": in_flight})
    policy = spec.engine.scheduler.policy
    before = dict(policy.counts) if policy is not None else {}
    got = spec.generate(prompts, params)
    if recorder is not None:
        recorder.end_run(write=False)
    if spec_first:
        expected = base.generate(prompts, params)
    same = [o.token_ids for o in got] == [o.token_ids for o in expected]
    s = spec.spec_stats
    proposed = policy.counts["proposed"] - before.get("proposed", 0) if policy is not None else s.drafted
    return Row(workload, in_flight, n, base.stats.output_tokens_per_s, spec.stats.output_tokens_per_s,
               s.acceptance_rate, s.mean_tokens_per_step, s.proposer_share, same, s.acceptance_by_position(),
               s.tokens_per_step(), proposed, s.drafted, round, spec_first)


def measure(args, console: Console, recorder=None) -> list[Row]:
    rows, start = [], time.perf_counter()
    for in_flight in args.in_flight:
        base, spec = engines(args, in_flight)
        if recorder is not None:
            spec.add_observer(recorder)
        if not rows:
            console.print(f"[bold]engine:[/] {describe(spec)}")
        for r in range(args.rounds):  # stage 05 first in even rounds, stage 06 first in odd ones
            for workload in args.workloads:
                rows.append(run_one(base, spec, workload, in_flight, args, recorder, r, r % 2 == 1))
                turn = f", round {r + 1}/{args.rounds} ({'06' if r % 2 else '05'} first)" if args.rounds > 1 else ""
                console.print(f"  {workload} at {in_flight} in flight{turn}: {rows[-1].speedup:.2f}x "
                              f"({time.perf_counter() - start:.0f} s)")
        del base, spec
    return rows


def machine_name() -> str:
    """The CPU the figures were taken on (they hold for it alone): its model name and core count."""
    model = next((line.split(":", 1)[1].strip() for line in cpu_identity().splitlines() if ":" in line), "a CPU")
    return f"{model}, {os.cpu_count()} cores"


def table(rows: list[Row], title: str) -> Table:
    t = Table(title=title)
    for name in ("workload", "in flight", "requests", "05 tok/s", "06 tok/s", "speedup", "acceptance",
                 "tokens/step", "drafts fed", "proposer share", "same tokens"):
        t.add_column(name, justify="left" if name == "workload" else "right")
    for r in rows:
        t.add_row(r.workload, str(r.in_flight), str(r.requests), f"{r.base_tps:.1f}", f"{r.spec_tps:.1f}",
                  f"{r.speedup:.2f}x", f"{r.acceptance:.1%}", f"{r.tokens_per_step:.2f}",
                  f"{r.fed}/{r.proposed}" if r.proposed else "-", f"{r.proposer_share:.1%}",
                  "yes" if r.same else "NO")
    return t


def crossover(rows: list[Row], workload: str) -> str:
    """Where speculation stops paying for ``workload``, from the measured rows (in-flight limits in order)."""
    mine = sorted((r for r in rows if r.workload == workload), key=lambda r: r.in_flight)
    pays = [r for r in mine if r.speedup > 1.0]
    if len(pays) == len(mine):
        return f"{workload}: speculation pays at every in-flight limit measured (up to {mine[-1].in_flight})"
    if not pays:
        return f"{workload}: speculation never pays here (acceptance {mine[0].acceptance:.0%})"
    last = max(pays, key=lambda r: r.in_flight)
    after = [r for r in mine if r.in_flight > last.in_flight]
    if not after:
        return f"{workload}: speculation pays up to {last.in_flight} in flight"
    return (f"{workload}: speculation pays up to {last.in_flight} in flight ({last.speedup:.2f}x) and stops paying at "
            f"{after[0].in_flight} ({after[0].speedup:.2f}x): the step is full of real rows there, and every "
            f"rejected draft row is work thrown away")


def report(rows: list[Row], args, console: Console) -> None:
    title = (f"stage 05 vs stage 06 ({args.speculative_config}), {args.model}, {args.dtype}, up to {args.max_tokens} "
             f"new tokens, greedy; {machine_name()}")
    found = rounds.cells(rows) if args.rounds > 1 else rows  # --rounds: a cell's median and range (rounds.py)
    console.print(rounds.table(found, f"{title}; the median of {args.rounds} rounds") if args.rounds > 1 else
                  table(rows, title))
    for workload in args.workloads:
        mine = [r for r in found if r.workload == workload]
        rows_of = [r for r in rows if r.workload == workload]
        first = rows_of[0]
        positions = ", ".join(f"{p:.0%}" for p in first.by_position) or "nothing drafted"
        console.print(f"[bold]{workload}[/]: acceptance by draft position (at {first.in_flight} in flight): "
                      f"{positions}")
        per = ", ".join(f"{v:.2f}" for v in list(first.per_request.values())[:16])
        console.print(f"  tokens per decoding step, request by request: {per}")
        if len(mine) > 1:
            console.print("  " + crossover(found, workload))
    console.print("[bold]drafts fed[/]: of the draft tokens proposed, those fed; the adaptive policy (cost_model.py) "
                  "feeds a draft where its expected tokens beat its rows' measured cost, so the share falls where "
                  "rows stop being free (more in flight) or drafts stop matching (chat)")
    if args.rounds > 1:
        console.print(rounds.verdict(found))
    if args.json:
        rounds.write_json(rows, args, machine_name(), args.json)
        console.print(f"wrote every round's figures to {args.json}")
    if not all(r.same for r in rows):
        console.print("[bold red]stage 06 gave other tokens than stage 05: a bug[/]")
