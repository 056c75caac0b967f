"""`python -m stages.bench.attention VERSION`: one attention version on SmolLM2's decode shapes
(9 heads, 3 KV heads, d 64, blocks of 16 in shuffled order), the fastest single call of many per case, and a hash
of every output, so that versions run in separate processes can be compared bit for bit.

VERSION: ``kernel`` (attention.cpp as this build runs it), ``portable`` (its reference, STEPWISE_ATTENTION_PORTABLE),
``tiles`` (the tensor-op attention, what runs where the kernel does not build), or the path of another build's
library (e.g. an older one from ``$STEPWISE_HOME/native``). One version per process: CPython keeps one extension
module per name, and every build of attention.cpp is named ``stepwise_attention``. Environment: THREADS (torch's
threads, default 1), DTYPE (default bfloat16; float32 to compare versions bit for bit, since a bfloat16 output
hides most float32 rounding changes), CASES (``requests x keys-1``, default 1x160,8x160,32x160,32x500),
HEADS (``heads/kv_heads``, default 9/3: SmolLM2's; 32/8 is Llama-3.2-1B's), LAYERS (default 1: one layer's keys,
which at long context stay in the caches between calls; 16 gives each call of a step its own layer's keys, cold as in
an engine step, where the weights stream through the caches between layers). docs/native-kernels.md quotes its
figures; docs/scale.md the long-context ones (``HEADS=32/8 LAYERS=16 THREADS=2 CASES=1x127,1x8191``).
LAYOUT=head-major stores each layer's keys [kv_heads, blocks, block, d] instead of the paged cache's [blocks, kv_heads,
block, d] (one head's keys contiguous; same bits, only the addresses change), to time what that layout would save;
BLOCKS=in-order gives each request consecutive blocks (as a fresh pool hands them out) instead of shuffled ones.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import time

import numpy as np
import torch


def attention_of(version: str):
    """A function (q, k, v, token_seq, token_pos, table, kv_heads, head_stride) -> out, or None for ``tiles``."""
    if version == "tiles":
        return None
    if version in ("kernel", "portable"):
        if version == "portable":
            os.environ["STEPWISE_ATTENTION_PORTABLE"] = "1"
        from common.numerics import native
        return native.kernels().attention
    spec = importlib.util.spec_from_file_location("stepwise_attention", version)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.attention


def decode_step(kernel, dtype: torch.dtype, requests: int, past: int, heads: int = 9, kv_heads: int = 3,
                layers: int = 1):
    """A function that runs a step's attention, one call per layer, for `requests` decode tokens each after `past`
    keys; it returns the layers' outputs, concatenated."""
    from common.numerics.attention import AttentionMetadata, attention
    gen = torch.Generator().manual_seed(0)
    block, d, context = 16, 64, past + 1
    need = -(-context // block)
    order = torch.randperm(requests * need + 2, generator=gen)
    if os.environ.get("BLOCKS") == "in-order":
        order = torch.arange(requests * need + 2)
    blocks, head_major = requests * need + 2, os.environ.get("LAYOUT") == "head-major"
    caches = [tuple(torch.randn(blocks, kv_heads, block, d, generator=gen).to(dtype) for _ in range(2))
              for _ in range(layers)]
    if head_major:
        caches = [tuple(x.transpose(0, 1).contiguous() for x in kv) for kv in caches]
    caches = [tuple(x.view(-1, block, d) for x in kv) for kv in caches]
    q = torch.randn(requests, heads, d, generator=gen).to(dtype)
    table = (order[:requests * need].view(requests, need) * (1 if head_major else kv_heads)).numpy().astype(np.int64)
    head_stride = blocks if head_major else 1
    if kernel is None:
        meta = AttentionMetadata.build([1] * requests, [context] * requests, heads, kv_heads, table, block, head_stride,
                                       native=False, head_dim=d, kv_dtype=dtype)
        return lambda: torch.cat([attention(q, kc, vc, meta) for kc, vc in caches])
    seq, pos, chunks = torch.arange(requests), torch.full((requests,), past), torch.from_numpy(table)
    return lambda: torch.cat([kernel(q, kc, vc, seq, pos, chunks, kv_heads, head_stride) for kc, vc in caches])


def main(version: str) -> str:
    torch.set_num_threads(int(os.environ.get("THREADS", "1")))
    kernel, dtype = attention_of(version), getattr(torch, os.environ.get("DTYPE", "bfloat16"))
    digest, cells = hashlib.sha256(), []
    for case in os.environ.get("CASES", "1x160,8x160,32x160,32x500").split(","):
        requests, past = map(int, case.split("x"))
        heads, kv_heads = map(int, os.environ.get("HEADS", "9/3").split("/"))
        call = decode_step(kernel, dtype, requests, past, heads, kv_heads, int(os.environ.get("LAYERS", "1")))
        digest.update(call().view(torch.int32 if dtype == torch.float32 else torch.int16).numpy().tobytes())
        best = float("inf")
        for _ in range(300 if requests * past < 16 * 500 else 60):
            start = time.perf_counter()
            call()
            best = min(best, time.perf_counter() - start)
        cells.append(f"{case}: {best * 1e6:,.1f} µs")
    return f"{os.path.basename(version)} ({torch.get_num_threads()} thread(s)): " + " | ".join(cells) + \
        f" | hash {digest.hexdigest()[:12]}"


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("version", help="kernel, portable, tiles, or the path of another build's library")
    print(main(ap.parse_args().version))
