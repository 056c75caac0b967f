"""Stage 04 on the tiny model in every precision, in a fresh process of some Python (this one, or an aarch64 one
under qemu): the kernels it took, and per precision the tokens (greedy and sampled), the log-probabilities and a
hash of every logit row it computed. Two builds that give the same bits give the same JSON (tests/test_isa_tokens.py,
tests/test_arm64.py)."""
import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRECISIONS = (("float32", None), ("bfloat16", None), ("bfloat16", "int8"), ("bfloat16", "int4"), ("bfloat16", "w4a8"))
GENERATE = f"""
import hashlib, importlib, json
import torch
from common.numerics import native
from common.sampling import SamplingParams
kernels = importlib.import_module("stages.04_kernels")
prompts = [[5 + i, 6, 7 + 2 * i, 9] * (1 + i % 3) for i in range(8)]
params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2)] * 4 + \\
         [SamplingParams(temperature=0.9, top_p=0.9, seed=i, max_tokens=24, ignore_eos=True, logprobs=2)
          for i in range(4)]
out = {{"kernels": [native.linear_kernel(), native.int4_kernel(), native.float32_kernel(), native.w4a8_kernel()]}}
for dtype, quant in {PRECISIONS!r}:
    llm = kernels.LLM("tiny", dtype=dtype, quantization=quant, max_num_seqs=4)
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
print(json.dumps(out))
"""


def generate(python: list[str], env: dict, timeout: int = 900) -> dict:
    """GENERATE's JSON from ``python`` (an argv prefix), run from the repository root with ``env`` added."""
    result = subprocess.run([*python, "-c", GENERATE], capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
