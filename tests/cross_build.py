"""Stage 04 in every precision, in a fresh process of some Python (this one, or an aarch64 one under qemu): the
kernels it took and their compiler flags, and per precision the tokens (greedy and sampled), the log-probabilities
and a hash of every logit row it computed. Two builds that give the same bits give the same JSON but for the kernels'
names and flags (tests/test_isa_tokens.py, tests/test_arm64.py). By hand, on another model or machine:

    python tests/cross_build.py --model ~/.cache/stepwise/smollm2-135m-float32 --precisions bfloat16,int4 > a.json
    tests/arm64/python tests/cross_build.py --model ...same... > b.json
    python tests/cross_build.py --compare a.json b.json
"""
import argparse
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRECISIONS = (("float32", None), ("bfloat16", None), ("bfloat16", "int8"), ("bfloat16", "int4"), ("bfloat16", "w4a8"))


def script(model: str = "tiny", precisions=PRECISIONS, requests: int = 8, pinned_tile: int | None = None) -> str:
    """The generating program: ``requests`` prompts of token ids, the first half greedy, the rest seeded.
    ``pinned_tile``: every linear gets that row tile without the load-time check (``choose_row_tile``), which
    under qemu is most of a fresh run's loading, about 12 s a precision (test_arm64.py pins it in the quick
    profile only; nothing is written to the cache of checked tiles, so a later run still checks)."""
    half = requests // 2
    return f"""
import hashlib, importlib, json
import torch
import common.model
from common.numerics import native
from common.sampling import SamplingParams
kernels = importlib.import_module("stages.04_kernels")
def pinned(linears, dtype, device):
    for lin in linears:
        lin.exact_tiles, lin.row_tile = False, {pinned_tile}
    return "linears: calls of up to {pinned_tile} rows, pinned without the load-time check"
if {pinned_tile is not None}:
    common.model.choose_row_tile = pinned
prompts = [[5 + i, 6, 7 + 2 * i, 9] * (1 + i % 3) for i in range({requests})]
params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2)] * {half} + \\
         [SamplingParams(temperature=0.9, top_p=0.9, seed=i, max_tokens=24, ignore_eos=True, logprobs=2)
          for i in range({requests - half})]
out = {{"kernels": [native.linear_kernel(), native.int4_kernel(), native.float32_kernel(), native.w4a8_kernel()],
       "flags": native.compile_flags(), "row tiles": []}}
for dtype, quant in {tuple(precisions)!r}:
    llm = kernels.LLM({model!r}, dtype=dtype, quantization=quant, max_num_seqs=4)
    logits, compute = hashlib.sha256(), llm.engine.model.compute_logits
    def hashed(hidden):
        rows = compute(hidden)
        logits.update(rows.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        return rows
    llm.engine.model.compute_logits = hashed
    outs = llm.generate(prompts, params)
    out[f"{{dtype}} {{quant}}"] = [o.token_ids for o in outs]
    out[f"{{dtype}} {{quant}} logprobs"] = [repr(o.outputs[0].logprobs) for o in outs]
    out[f"{{dtype}} {{quant}} logits"] = logits.hexdigest()[:16]
    out[f"{{dtype}} {{quant}} path"] = llm.execution_path
    out["row tiles"].append(llm.engine.model.row_tile_note)
print(json.dumps(out))
"""


GENERATE = script()


def generate(python: list[str], env: dict, timeout: int = 900, program: str = GENERATE) -> dict:
    """``program``'s JSON (GENERATE's by default) from ``python`` (an argv prefix), run from the repository root with
    ``env`` added."""
    result = subprocess.run([*python, "-c", program], capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@functools.cache
def here() -> dict:
    """GENERATE run natively once per test session, on the kernel whose bits the portable ones reproduce ("AVX-512
    FMA" where this CPU has AVX-512): what the narrower x86 build and the ARM builds are compared with."""
    from common.numerics import native
    avx512 = native.load(native.LINEAR_SOURCE) and native.kernels(native.LINEAR_SOURCE).avx512_ready()
    return generate([sys.executable], {"STEPWISE_LINEAR": "fma"} if avx512 else {})


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--precisions", default="float32,bfloat16,int8,int4,w4a8",
                    help="comma-separated: float32, bfloat16, or a quantization of bfloat16 (int8, int4, w4a8)")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--compare", nargs=2, metavar="JSON", help="two outputs: which parts are equal")
    args = ap.parse_args()
    if args.compare:
        a, b = (json.loads(Path(f).read_text().strip().splitlines()[-1]) for f in args.compare)
        print("kernels:", a["kernels"], "|", b["kernels"])
        for key in a:
            if key not in ("kernels", "flags", "row tiles") and not key.endswith("path"):
                verdict = "not in the second" if key not in b else "equal" if a[key] == b[key] else "DIFFERENT"
                print(f"{key:28s} {verdict}")
    else:
        chosen = [(p, None) if p in ("float32", "bfloat16") else ("bfloat16", p) for p in args.precisions.split(",")]
        sys.path.insert(0, str(ROOT))
        exec(script(args.model, chosen, args.requests))
