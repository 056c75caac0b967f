"""What stage 07 measures: every output checked, the tokens forced, the mask's cost, and the time per output token.

``run_suite`` runs the schema suite (suite.py) and checks each output; ``mask_cost`` replays outputs through fresh
constraints and times what the engine adds per request per step (the mask computed and applied to a row of the
vocabulary's size); ``time_per_token`` runs a workload at a given number in flight and reports the mean time per
output token after the first, from the engine's own per-token times.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from common.sampling import SamplingParams, StructuredOutputsParams

from .backends import grammars_for
from .constraint import GrammarConstraint
from .suite import CASES, check


@dataclass
class SuiteRun:
    names: list[str]
    outputs: list  # RequestOutput per case
    problems: list[str | None]  # per case: why its output breaks the constraint, or None
    steps: int
    drafted: int
    accepted: int

    @property
    def output_tokens(self) -> int:
        return sum(len(o.token_ids) for o in self.outputs)


def chat_ids(llm, prompt: str) -> list[int]:
    return llm.tokenizer.encode_chat([{"role": "user", "content": prompt}])


def run_suite(llm, max_tokens: int = 160, compact: bool = False, temperature: float = 0.0, cases=CASES) -> SuiteRun:
    """Every case of the suite in one batch; ``compact``: JSON without free whitespace (disable_any_whitespace)."""
    prompts, params = [], []
    for i, (_, prompt, so) in enumerate(cases):
        so = dict(so, disable_any_whitespace=True) if compact and ("json" in so or "json_object" in so) else so
        prompts.append(chat_ids(llm, prompt))
        params.append(SamplingParams(temperature=temperature, seed=i, max_tokens=max_tokens, structured_outputs=so))
    steps = llm.num_steps
    outputs = llm.generate(prompts, params)
    problems = [check(o.text, {k: v for k, v in so.items() if k != "disable_any_whitespace"})
                if o.finish_reason == "stop" else f"finished with {o.finish_reason}"
                for o, (_, _, so) in zip(outputs, cases)]
    return SuiteRun([c[0] for c in cases], outputs, problems, llm.num_steps - steps, llm.stats.drafted_tokens,
                    llm.stats.accepted_tokens)


def mask_cost(llm, run: SuiteRun, cases=CASES, compact: bool = False) -> dict[str, list[float]]:
    """Microseconds per request per step, per constraint kind: each output's tokens replayed through a fresh
    constraint, the mask computed and applied to a float32 row of the vocabulary's size at every position."""
    eos = tuple(sorted(llm.config.eos_token_ids or (llm.config.eos_token_id,)))
    grammars = grammars_for(str(llm.folder), llm.config.vocab_size, eos)
    row = torch.randn(llm.config.vocab_size, generator=torch.Generator().manual_seed(0))
    times: dict[str, list[float]] = {}
    for out, (_, _, so) in zip(run.outputs, cases):
        so = dict(so, disable_any_whitespace=True) if compact and ("json" in so or "json_object" in so) else so
        params = StructuredOutputsParams(**so)
        rule = GrammarConstraint(grammars.compile(params).matcher(), list(eos), llm.config.vocab_size)
        for token in out.token_ids:
            logits = row.clone()
            start = time.perf_counter()
            rule.apply(logits, [])
            times.setdefault(params.kind, []).append((time.perf_counter() - start) * 1e6)
            rule.accept(token)
            if rule.is_terminated():
                break
    return times


def summary(values: list[float]) -> tuple[float, float, float]:
    """(p50, p99, mean)"""
    ordered = sorted(values)
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], \
        statistics.fmean(ordered)


def time_per_token(llm, prompts: list[list[int]], params: list[SamplingParams]) -> tuple[float, int, int]:
    """(mean ms per output token after each request's first, output tokens, steps) for one run of the workload."""
    steps = llm.num_steps
    outputs = llm.generate(prompts, params)
    gaps = [(o.metrics.token_times[-1] - o.metrics.token_times[0], len(o.metrics.token_times) - 1)
            for o in outputs if len(o.metrics.token_times) > 1]
    per_token = 1000 * sum(g for g, _ in gaps) / max(1, sum(n for _, n in gaps))
    return per_token, sum(len(o.token_ids) for o in outputs), llm.num_steps - steps


PIECES = ("forward", "fill", "apply", "look-ahead", "sampler")


def pieces(llm) -> dict[str, float]:
    """The engine's running totals: seconds in each piece of a step (masks.py's runner: the forward with the logits,
    the masks filled in batches wherever that happened, looked up and applied, the sampler; forced.py's look-ahead),
    the steps, and each step's mask time per constrained row (µs)."""
    runner, forced = llm.engine.runner, llm.engine.scheduler.proposers[0]
    return {**runner.costs, "fill": runner.masks.seconds, "look-ahead": forced.seconds, "steps": runner.steps,
            "mask_us": list(runner.mask_us), "mask_steps": runner.mask_steps}


def per_step(before: dict, after: dict) -> dict[str, float]:
    """µs per step of each piece between two ``pieces`` snapshots, and the mask's p99 per row."""
    steps = max(1, after["steps"] - before["steps"])
    costs = {k: 1e6 * (after[k] - before[k]) / steps for k in PIECES}
    rows = after["mask_us"][len(after["mask_us"]) - min(after["mask_steps"] - before["mask_steps"],
                                                         len(after["mask_us"])):]
    return costs | {"mask p99": summary(rows)[1] if rows else 0.0}
