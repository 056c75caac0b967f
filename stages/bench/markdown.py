"""`python -m stages --markdown`: one ladder run as the Markdown table the top README shows, machine named."""
from __future__ import annotations

from common.paths import DEFAULT_MODEL, cpu_identity

COLUMNS = [("output tok/s", "{:,.1f}"), ("steps", "{:,}"), ("slot util", "{:.1%}"), ("queue wait p99 s", "{:.2f}"),
           ("TTFT p50 s", "{:.2f}"), ("TTFT p99 s", "{:.2f}"), ("TPOT p50 ms", "{:.1f}")]


def machine_line(result: dict) -> str:
    cpu = cpu_identity().splitlines()[0].split(":", 1)[-1].strip() or "unknown CPU"
    flags = set(cpu_identity().split())
    isa = "AMX" if "amx_tile" in flags else "AVX-512 BF16" if "avx512_bf16" in flags else (
        "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2")
    return (f"{result['date']}, {cpu} ({isa}), {result['cpus']} cores, read bandwidth "
            f"{result['read_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s; {result.get('model', DEFAULT_MODEL)}, "
            f"{result['workload']} workload, "
            f"{result['requests']} requests, {result['dtype']}"
            + (f", {result['quantization']} weights" if result.get("quantization") else ""))


def ladder_table(result: dict, columns: dict[str, dict], same: dict[str, bool | None], argv: str) -> str:
    """Engines down, the figures that show each stage's idea across; every value from this run's rows; then the
    peer verdicts."""
    extra = [k for k in next(iter(columns.values())) if k.startswith("x ") and k != "x first column"]
    heads = [name for name, _ in COLUMNS] + extra + ["same tokens"]
    lines = [f"`python -m stages {argv}`".replace(" `", "`").replace("stages `", "stages`"),
             "", f"*{machine_line(result)}*", "", "| engine | " + " | ".join(heads) + " |",
             "| --- |" + " --- |" * len(heads)]
    for name, row in columns.items():
        cells = [fmt.format(row[k]) if isinstance(row.get(k), (int, float)) else "-" for k, fmt in COLUMNS]
        cells += [f"{row[k]:.2f}" if k in row else "-" for k in extra]
        cells.append("-" if name not in same else "yes" if same[name] else "NO")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if result.get("peer_verdicts"):  # stepwise's best stage over each peer, at each in-flight limit and alone
        lines += [""] + [f"* {v['text']}" for v in result["peer_verdicts"]]
    return "\n".join(lines)
