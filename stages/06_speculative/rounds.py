"""``--rounds N``: the comparison taken N times, each (workload, in-flight) cell's two runs back to back in every
round, stage 05 first in one round and stage 06 first in the next. This VM's speed drifts by up to a quarter over a
few minutes, so one run's ratio decides nothing at 8 in flight and more; each round's ratio is taken between two
runs seconds apart, and the table prints the median of the rounds' ratios and their range. ``--json`` keeps every
round's figures."""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass

from rich.table import Table

NEVER_SLOWER = 0.97  # issue 55: stage 06's default at least this share of stage 05's tokens per second


@dataclass
class Cell:
    """One (workload, in-flight) cell's rounds (measure.py's ``Row``, one per round)."""
    workload: str
    in_flight: int
    rounds: list

    @property
    def ratios(self) -> list[float]:
        return [r.speedup for r in self.rounds]

    @property
    def speedup(self) -> float:  # the median round's (the mean of the middle two for an even count)
        return statistics.median(self.ratios)

    @property
    def acceptance(self) -> float:
        return self.median("acceptance")

    def median(self, key: str) -> float:
        return statistics.median(getattr(r, key) for r in self.rounds)

    def by_order(self, spec_first: bool) -> str:
        mine = [r.speedup for r in self.rounds if r.spec_first == spec_first]
        return f"{statistics.median(mine):.2f}" if mine else "-"


def cells(rows: list) -> list[Cell]:
    """The rows grouped by (workload, in-flight limit), in the order measured."""
    grouped: dict[tuple[str, int], list] = {}
    for r in rows:
        grouped.setdefault((r.workload, r.in_flight), []).append(r)
    return [Cell(w, n, rs) for (w, n), rs in grouped.items()]


def table(found: list[Cell], title: str) -> Table:
    t = Table(title=title)
    for name in ("workload", "in flight", "05 tok/s", "06 tok/s", "speedup", "rounds' range",
                 "05 first / 06 first", "acceptance", "tokens/step", "drafts fed", "same tokens"):
        t.add_column(name, justify="left" if name == "workload" else "right")
    for c in found:
        fed, proposed = sum(r.fed for r in c.rounds), sum(r.proposed for r in c.rounds)
        t.add_row(c.workload, str(c.in_flight), f"{c.median('base_tps'):.1f}", f"{c.median('spec_tps'):.1f}",
                  f"{c.speedup:.2f}x", f"{min(c.ratios):.2f} .. {max(c.ratios):.2f}",
                  f"{c.by_order(False)} / {c.by_order(True)}", f"{c.acceptance:.1%}",
                  f"{c.median('tokens_per_step'):.2f}",
                  f"{fed}/{proposed}" if proposed else "-", "yes" if all(r.same for r in c.rounds) else "NO")
    return t


def verdict(found: list[Cell]) -> str:
    """Where the median round falls under issue 55's never-slower line, or that none does."""
    low = [c for c in found if c.speedup < NEVER_SLOWER]
    worst = min(found, key=lambda c: c.speedup)
    head = f"never slower ({NEVER_SLOWER}x stage 05, median of the rounds): "
    if not low:
        return head + f"held in every cell; the lowest {worst.workload} at {worst.in_flight} ({worst.speedup:.2f}x)"
    return head + "missed at " + ", ".join(f"{c.workload} {c.in_flight} ({c.speedup:.2f}x, rounds "
                                           f"{min(c.ratios):.2f} .. {max(c.ratios):.2f})" for c in low)


def write_json(rows: list, args, machine: str, path: str) -> None:
    """Every round of every cell, and each cell's median and range as the table printed them."""
    found = cells(rows)
    doc = {"machine": machine, "model": args.model, "dtype": args.dtype, "speculative_config": args.speculative_config,
           "max_tokens": args.max_tokens, "rounds": args.rounds,
           "runs": [asdict(r) | {"speedup": r.speedup} for r in rows],
           "cells": [{"workload": c.workload, "in_flight": c.in_flight, "median_speedup": c.speedup,
                      "min_speedup": min(c.ratios), "max_speedup": max(c.ratios)} for c in found]}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
