"""python -m stages.07_structured coverage [--out F.json] [--limit N] [--generate N --max-tokens M]

How many of the schemas people really send stage 07 serves: JSONSchemaBench (Geng et al. 2025, arXiv 2501.10868;
vendored in data/, nothing downloaded), split by split, compiled by each backend and by ``auto`` (llguidance, then
xgrammar: what ``auto`` serves is what either enforces whole), every refusal counted by its keyword, compile
time p50/p99 (a fresh compile, no cache). ``--generate N``: N compiled schemas, spread over the splits, generated
greedily and each output that ends by itself validated with ``jsonschema`` against the original schema (its own
draft): the promise "every output that ends by itself validates" measured.
"""
from __future__ import annotations

import json
import lzma
import re
import time
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from common.sampling import StructuredOutputsParams
from common.validate import InvalidParam

from .backends import grammars_for
from .schema import too_slow_reason

DATA = Path(__file__).with_name("data")
BACKENDS = ("xgrammar", "guidance")


def load(limit: int | None = None) -> dict[str, dict[str, dict]]:
    """split -> schema name -> schema, the first ``limit`` of each split by name."""
    splits = json.loads(lzma.decompress((DATA / "jsonschemabench.json.xz").read_bytes()))
    return {s: dict(list(v.items())[:limit]) for s, v in splits.items()}


def sample() -> dict[str, dict]:
    """The small sample the tests compile and generate (data/sample.json): "split/name" -> schema."""
    return json.loads((DATA / "sample.json").read_text(encoding="utf-8"))


def reason_of(message: str) -> str:
    """A refusal's message as a short reason to count: the keyword it names, or the backend's words."""
    named = re.findall(r"'([^']+)' at #", message)
    if named:
        return named[-1]
    tail = message.split(": ", 2)[-1]
    return re.sub(r"\d+", "N", tail)[:60]


def compile_one(grammars, schema: dict, every: bool = True, budget_s: float | None = None) -> dict:
    """One schema through each backend: {backend: (ok, reason, ms)}, and ``auto`` as build() would choose
    (``every`` False: xgrammar only where llguidance refuses, as ``auto`` does; its column then counts only those).
    A compile longer than ``budget_s`` is counted refused, as the server refuses it (schema/compile_budget.py); its
    time is kept."""
    out = {"xgrammar": (False, "not tried", 0.0)}
    for backend in ("guidance", "xgrammar"):
        if backend == "xgrammar" and not every and out["guidance"][0]:
            continue
        start = time.perf_counter()
        try:
            checked = grammars.build(StructuredOutputsParams(json=schema), backend).checked
            ok, reason = True, "checked: " + ", ".join(sorted({c.split("'")[1] for c in checked})) if checked else ""
        except InvalidParam as e:
            ok, reason = False, reason_of(str(e))
        except Exception as e:  # noqa: BLE001 - a crash is what this measures (a 5xx on the server)
            ok, reason = False, f"CRASH {type(e).__name__}: {str(e)[:80]}"
        out[backend] = (ok, reason, (time.perf_counter() - start) * 1e3)
    x, g = out["xgrammar"], out["guidance"]  # auto's order for a schema (backends.AUTO_ORDER): llguidance first
    out["auto"] = g if g[0] else (x[0], x[1], x[2] + g[2])
    if budget_s is not None:
        out = {b: (False, too_slow_reason(budget_s), ms) if ok and ms > 1e3 * budget_s
               else (ok, reason, ms) for b, (ok, reason, ms) in out.items()}
    return out


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def run(folder: str, vocab_size: int, eos: tuple[int, ...], splits: dict, console: Console,
        every: bool = True, budget_s: float | None = None) -> dict:
    grammars = grammars_for(folder, vocab_size, eos)
    _ = grammars.guidance, grammars.compiler  # each backend's tokenizer built once, outside the compile times
    report = {"splits": {}, "schemas": {}}
    for split, schemas in splits.items():
        rows = {}
        for name, schema in schemas.items():
            rows[name] = compile_one(grammars, schema, every, budget_s)
        report["schemas"][split] = rows
        report["splits"][split] = summarize(rows)
        s = report["splits"][split]
        console.print(f"{split}: {s['n']} schemas, auto {s['auto']['served']} served "
                      f"({s['auto']['served'] / max(1, s['n']):.0%}; {sum(s['auto']['checked'].values())} of them "
                      f"with a keyword checked at the end)")
    everything = {f"{s}/{n}": r for s, rows in report["schemas"].items() for n, r in rows.items()}
    report["total"] = summarize(everything)
    return report


def summarize(rows: dict) -> dict:
    out = {"n": len(rows)}
    for backend in (*BACKENDS, "auto"):
        results = [r[backend] for r in rows.values()]
        ms = [t for ok, _, t in results if ok]
        tried = [t for _, _, t in results]  # served or not: the time a request waits for its answer
        out[backend] = {"served": sum(ok for ok, _, _ in results),
                        "checked": dict(Counter(reason for ok, reason, _ in results if ok and reason)),
                        "refused": dict(Counter(reason for ok, reason, _ in results if not ok).most_common()),
                        "compile_ms_p50": percentile(ms, 0.5), "compile_ms_p99": percentile(ms, 0.99),
                        "tried_ms_p99": percentile(tried, 0.99), "tried_ms_max": max(tried, default=0.0)}
    return out


def show(report: dict, console: Console) -> None:
    table = Table(title="JSONSchemaBench: schemas served, by split and backend (compile only)")
    for col in ("split", "schemas", "xgrammar", "guidance", "auto", "of which checked", "auto p50 ms", "auto p99 ms"):
        table.add_column(col, justify="right")
    for split, s in [*report["splits"].items(), ("all", report["total"])]:
        n = max(1, s["n"])
        table.add_row(split, str(s["n"]), *[f"{s[b]['served'] / n:.0%}" for b in (*BACKENDS, "auto")],
                      f"{sum(s['auto']['checked'].values()) / n:.0%}",
                      f"{s['auto']['compile_ms_p50']:.1f}", f"{s['auto']['compile_ms_p99']:.1f}")
    console.print(table)
    reasons = Table(title="auto's refusals by reason (all splits)")
    reasons.add_column("reason")
    reasons.add_column("schemas", justify="right")
    for reason, count in list(report["total"]["auto"]["refused"].items())[:15]:
        reasons.add_row(reason, str(count))
    console.print(reasons)


def generate(llm, splits: dict, report: dict, n: int, max_tokens: int, console: Console,
             compact: bool = False) -> dict:
    """Greedy generations for ``n`` schemas ``auto`` serves, taken from each split in turn; each output that ends by
    itself parsed and validated with ``jsonschema`` under the schema's own draft."""
    from jsonschema.validators import validator_for
    from common.sampling import SamplingParams
    served = [[(s, name) for name, r in report["schemas"][s].items() if r["auto"][0]] for s in splits]
    picks = [row[i] for i in range(max(map(len, served), default=0)) for row in served if i < len(row)][:n]
    counts, failures = Counter(), []
    for i in range(0, len(picks), 16):
        batch = picks[i:i + 16]
        prompts = [llm.tokenizer.encode_chat([{"role": "user", "content": f"Write one JSON value for the schema "
                                               f"{name.split('.')[0]}."}]) for _, name in batch]
        params = [SamplingParams(temperature=0, max_tokens=max_tokens,
                                 structured_outputs={"json": splits[s][name], "disable_any_whitespace": compact})
                  for s, name in batch]
        for (s, name), out in zip(batch, llm.generate(prompts, params)):
            counts[out.finish_reason] += 1
            if out.finish_reason == "error":  # the check of the finished output refused it (schema/checked.py), or not
                counts["error: refused by the check" if "checked when the output ends" in (out.error or "")
                       else "error: other"] += 1
            if out.finish_reason != "stop":
                continue
            schema = splits[s][name]
            try:
                errors = list(validator_for(schema)(schema).iter_errors(json.loads(out.text)))
            except ValueError as e:  # not JSON at all
                errors = [e]
            except Exception as e:  # noqa: BLE001 - jsonschema cannot read the schema (a Python-only regex)
                counts["unchecked"] += 1
                console.print(f"[yellow]{s}/{name}: jsonschema cannot check it: {str(e)[:100]}[/]")
                continue
            counts["valid" if not errors else "invalid"] += 1
            if errors:
                failures.append({"schema": f"{s}/{name}", "output": out.text[:500], "error": str(errors[0])[:300]})
        console.print(f"generated {min(i + 16, len(picks))} of {len(picks)}: {dict(counts)}")
    return {"generations": len(picks), "finish": dict(counts), "invalid": failures}


def main(args, make_llm, folder: str, vocab_size: int, eos: tuple[int, ...]) -> None:
    console = Console()
    splits = load(args.limit)
    if args.splits:
        splits = {s: v for s, v in splits.items() if s in args.splits.split(",")}
    report = run(folder, vocab_size, eos, splits, console, every=not args.auto_only,
                 budget_s=args.grammar_compile_budget_s)
    show(report, console)
    if args.generate:
        report["generate"] = generate(make_llm(args), splits, report, args.generate, args.max_tokens, console,
                                      args.compact)
        g = report["generate"]
        console.print(f"{g['generations']} generations: {g['finish']}; outputs that ended by themselves and fail "
                      f"validation: {len(g['invalid'])}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
        console.print(f"wrote {args.out}")
