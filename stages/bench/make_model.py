"""A checkpoint folder of random weights in a real model's shape (stages/bench/shapes.py), and its GGUF files.

    python -m stages.bench.make_model --shape llama-3.2-3b --out /tmp/scale/llama-3.2-3b --gguf bfloat16,q4_1
    python -m stages.bench.make_model --shape qwen2.5-0.5b --out /tmp/r --width-divisor 7 --layers 2 --dtype float32

Why random weights: only SmolLM2-135M's weights exist offline, and what a token costs (bytes read, memory held,
time) does not depend on what the weights say. The folder is what our loader and transformers read (config.json,
model.safetensors, SmolLM2's tokenizer files); ``--int4-blocks`` adds each projection's Q4_1 blocks
(``q4_1.safetensors``), so int4 loads without quantizing; ``--gguf`` adds ``model-<type>.gguf`` for llama.cpp.

Why streamed: a 3B shape is 6.4 GB in bfloat16, so each tensor is drawn (from its own seeded generator: the same
seed gives the same tensor whatever else is written), written and dropped before the next; peak memory is one
tensor. Everything is written into a temporary sibling and renamed at the end: an interrupted run leaves nothing.
"""
from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
import tempfile
import time
import zlib
from pathlib import Path

import torch

from common.gguf_convert import console
from common.numerics.int4 import q4_1_quantize
from common.numerics.quant import Q4_1_SUFFIX
from common.paths import DEFAULT_MODEL, checkpoint_dir, smollm2_gguf_path
from common.tokenizer import build_tokenizer_files

from .shapes import SHAPES, VOCAB_NOTE, Shape, get_shape, reduced

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SAFETENSORS_CODES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.uint8: "U8"}
GGUF_TYPES = ("bfloat16", "float16", "float32", "q4_1")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
EMBED_STD = 0.02  # the models' initializer_range: tied logits come out with a spread of about 1 at these widths


def tensor(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """One tensor, float32, from a generator seeded by the seed and the tensor's name alone."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    if name.endswith(".bias"):
        return 0.1 * torch.randn(shape, generator=gen)
    std = EMBED_STD if "embed_tokens" in name or "lm_head" in name else shape[-1] ** -0.5
    return torch.randn(shape, generator=gen) * std


def write_safetensors(path: Path, items: dict[str, tuple[tuple[int, ...], torch.dtype]], make, metadata: dict):
    """safetensors' layout (an 8-byte header length, a JSON header of offsets, the bytes) written tensor by tensor:
    ``make(name)`` gives each tensor when its turn comes, so only one is held at a time."""
    header, offset = {"__metadata__": metadata}, 0
    for name, (shape, dtype) in items.items():
        size = dtype.itemsize
        for s in shape:
            size *= s
        header[name] = {"dtype": SAFETENSORS_CODES[dtype], "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, (shape, dtype) in items.items():
            t = make(name).to(dtype).contiguous()
            assert tuple(t.shape) == tuple(shape), name
            if t.numel():
                f.write(t.view(torch.uint8).numpy().data)  # the tensor's own bytes, not a copy


def write_checkpoint(shape: Shape, folder: Path, dtype: str, seed: int, int4_blocks: bool) -> None:
    shapes = shape.tensor_shapes()
    torch_dtype = DTYPES[dtype]
    last: dict[str, torch.Tensor] = {}  # the tensor just written, for its Q4_1 blocks

    def make(name: str) -> torch.Tensor:
        last.clear()
        last[name] = tensor(name, shapes[name], seed).to(torch_dtype)
        return last[name]

    write_safetensors(folder / "model.safetensors", {n: (s, torch_dtype) for n, s in shapes.items()}, make,
                      {"format": "pt"})
    if int4_blocks:  # what int4 loads (common.numerics.factory), from the weights as stored, as llama.cpp would
        projections = [n for n in shapes if n.endswith("_proj.weight")]
        blocks = {n.removesuffix(".weight") + Q4_1_SUFFIX: (n, (shapes[n][0], shapes[n][1] // 32 * 20))
                  for n in projections}
        write_safetensors(folder / "q4_1.safetensors", {b: (s, torch.uint8) for b, (_, s) in blocks.items()},
                          lambda b: torch.from_numpy(q4_1_quantize(
                              tensor(blocks[b][0], shapes[blocks[b][0]], seed).to(torch_dtype))),
                          {"format": "gguf-q4_1-blocks"})
    config = shape.config(dtype)
    config["stepwise_source"] = f"make_model:{shape.name}:seed={seed}:{dtype}"
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    copy_tokenizer(folder)


def copy_tokenizer(folder: Path) -> None:
    """SmolLM2's tokenizer files: copied from its prepared checkpoint when there is one (reading the GGUF's
    vocabulary takes seconds), else built from the GGUF as `common.prepare` builds them."""
    import gguf

    prepared = checkpoint_dir(DEFAULT_MODEL, "float32")
    if all((prepared / f).exists() for f in ("stepwise.json", *TOKENIZER_FILES)):
        for f in TOKENIZER_FILES:
            shutil.copy(prepared / f, folder / f)
    else:
        build_tokenizer_files(gguf.GGUFReader(smollm2_gguf_path()), folder)


def make_model(shape: Shape, out: Path, dtype: str = "bfloat16", seed: int = 0, int4_blocks: bool = False,
               gguf_types: tuple[str, ...] = (), quiet: bool = False) -> Path:
    """Write the folder (and GGUF files) for ``shape`` at ``out``; refuse an ``out`` that holds anything."""
    out = Path(out)
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    bad = [g for g in gguf_types if g not in GGUF_TYPES]
    if bad:
        raise ValueError(f"--gguf {bad[0]!r} is not supported; use any of {', '.join(GGUF_TYPES)}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"--out {out} exists and is not empty: give a new folder (nothing was written)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o755)
    start = time.perf_counter()
    try:
        write_checkpoint(shape, tmp, dtype, seed, int4_blocks)
        if gguf_types:
            from .gguf_writer import write_ggufs
            write_ggufs(shape, tmp, gguf_types)
        (tmp / "stepwise.json").write_text(json.dumps({"complete": True, "note": VOCAB_NOTE}))
        if out.exists():
            out.rmdir()  # empty, checked above
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not quiet:
        size = sum(f.stat().st_size for f in out.iterdir())
        console.print(f"wrote {out}: {shape.name}, {shape.parameters() / 1e9:.2f}B parameters, {dtype}, "
                      f"{size / 1e9:.2f} GB on disk, in {time.perf_counter() - start:.1f} s ({VOCAB_NOTE})")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, help=f"one of {', '.join(SHAPES)}")
    ap.add_argument("--out", required=True, type=Path, help="a new (or empty) folder")
    ap.add_argument("--dtype", default="bfloat16", help=", ".join(DTYPES))
    ap.add_argument("--layers", type=int, default=None, help="fewer layers (a reduced shape)")
    ap.add_argument("--width-divisor", type=int, default=1, help="heads, KV heads and MLP divided by this")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gguf", default="", help=f"comma-separated GGUF files to add: {', '.join(GGUF_TYPES)}")
    ap.add_argument("--int4-blocks", action="store_true", help="store Q4_1 blocks so int4 loads without quantizing")
    args = ap.parse_args(argv)
    try:
        shape = reduced(get_shape(args.shape), args.width_divisor, args.layers)
        make_model(shape, args.out, args.dtype, args.seed, args.int4_blocks,
                   tuple(g for g in args.gguf.split(",") if g))
    except (ValueError, FileExistsError) as e:
        print(f"make_model: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
