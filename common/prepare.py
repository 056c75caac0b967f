"""Step 1 of an engine: prepare the model for the hardware.

Reads SmolLM2's GGUF file, dequantizes every tensor, undoes the Q/K row
permutation that llama.cpp's converter applies, and writes a checkpoint folder
in Hugging Face's layout (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json``) in the precision asked for.
``--tiny`` writes a small random Llama in the same format, for fast tests.

    python -m common.prepare --dtype bfloat16
    python -m common.prepare --tiny --out /tmp/tiny
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.progress import track
from safetensors import safe_open
from safetensors.torch import save_file

from common.paths import DEFAULT_MODEL, checkpoint_dir, smollm2_gguf_path
from common.numerics.quant import Q4_1_SUFFIX, QUANTIZATIONS, precision_bytes
from common.tokenizer import build_tokenizer_files

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
Q4_1_FILE = "q4_1.safetensors"  # the GGUF's 4-bit blocks of each projection, for int4 (common.numerics.quant)
GGUF_TO_HF = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
console = Console(stderr=True)


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Invert llama.cpp's `permute`, which interleaves each head's two rotary halves."""
    out_features = w.shape[0]
    return (w.reshape(n_heads, out_features // n_heads // 2, 2, *w.shape[1:])
             .swapaxes(1, 2).reshape(w.shape))


def hf_name(gguf_name: str) -> str:
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    _, layer, kind, _ = gguf_name.split(".")
    return f"model.layers.{layer}.{GGUF_TO_HF[kind]}.weight"


def llama_config(**kw) -> dict:
    """A config.json with LlamaConfig's keys, so transformers loads the folder as it is."""
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0,
        "initializer_range": 0.02, "pretraining_tp": 1, "use_cache": True, "rope_scaling": None,
        "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
    }
    cfg.update(kw)
    cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    return cfg


def describe(shapes: dict[str, tuple[int, ...]], dtype: str) -> None:
    """Bytes per precision: what the weights take, and what one decode step reads (the head is the embedding)."""
    n_params = sum(int(np.prod(s)) for s in shapes.values())
    console.print(f"[bold]{n_params:,}[/] parameters")
    for name in [*DTYPES, *QUANTIZATIONS]:
        mark = "  <- written" if name == dtype else ""
        how = {"int8": "1 byte/weight + a bf16 scale per row",
               "int4": "projections: 4 bits + a 16-bit scale, minimum per 32; head int8"}.get(name, "")
        how = how or f"{DTYPES[name].itemsize} bytes/param x {n_params:,}"
        console.print(f"  {name:>9}: {precision_bytes(shapes, name) / 1e6:6,.1f} MB  {how}{mark}")
    console.print("  (int8, int4: built at load; norms stay 16-bit; int4 keeps the GGUF's Q4_1 groups)")


def write_atomically(folder: Path, write) -> Path:
    """Write into a temporary sibling, then rename: an interrupted run leaves no half checkpoint."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        write(tmp)
        (tmp / "stepwise.json").write_text(json.dumps({"complete": True}))
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def is_prepared(folder: Path, source: str) -> bool:
    marker = folder / "stepwise.json"
    return marker.exists() and json.loads((folder / "config.json").read_text()).get("stepwise_source") == source


def prepare_smollm2(folder: Path | None = None, dtype: str = "float32", quiet: bool = False) -> Path:
    import gguf

    folder = Path(folder or checkpoint_dir("smollm2-135m", dtype))
    gguf_path = smollm2_gguf_path()
    source = f"{gguf_path.name}:{dtype}:{Q4_1_FILE}"
    if is_prepared(folder, source):
        if not quiet:
            with safe_open(folder / "model.safetensors", "pt") as f:
                describe({name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}, dtype)
            console.print(f"{folder} is already prepared ({dtype}); nothing to do")
        return folder
    reader = gguf.GGUFReader(gguf_path)
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.")}
    n_heads, n_kv = meta["llama.attention.head_count"], meta["llama.attention.head_count_kv"]
    config = llama_config(
        hidden_size=meta["llama.embedding_length"], intermediate_size=meta["llama.feed_forward_length"],
        num_hidden_layers=meta["llama.block_count"], num_attention_heads=n_heads,
        num_key_value_heads=n_kv, rms_norm_eps=meta["llama.attention.layer_norm_rms_epsilon"],
        rope_theta=meta["llama.rope.freq_base"], max_position_embeddings=meta["llama.context_length"],
        vocab_size=meta["llama.vocab_size"], torch_dtype=dtype, stepwise_source=source,
    )

    def write(tmp: Path) -> None:
        tensors, blocks = {}, {}
        for t in track(reader.tensors, description="dequantizing", console=console, disable=quiet):
            w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            # Q/K rows (output features) are permuted; Q4_1 groups run along a row, so whole blocks move with it.
            heads = n_heads if ".attn_q." in t.name else n_kv if ".attn_k." in t.name else None
            if heads:
                w = unpermute_qk(w, heads)
            tensors[hf_name(t.name)] = torch.from_numpy(np.ascontiguousarray(w)).to(DTYPES[dtype])
            if t.tensor_type == gguf.GGMLQuantizationType.Q4_1:  # kept as they are for int4 (common.numerics.quant)
                raw = unpermute_qk(t.data, heads) if heads else t.data
                blocks[hf_name(t.name).removesuffix(".weight") + Q4_1_SUFFIX] = torch.from_numpy(np.array(raw))
        if not quiet:
            describe({name: tuple(t.shape) for name, t in tensors.items()}, dtype)
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        save_file(blocks, tmp / Q4_1_FILE, metadata={"format": "gguf-q4_1-blocks"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        build_tokenizer_files(reader, tmp)

    write_atomically(folder, write)
    if not quiet:
        console.print(f"wrote {folder}")
    return folder


TINY = dict(hidden_size=192, intermediate_size=512, num_hidden_layers=2, num_attention_heads=6,
            num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0,
            max_position_embeddings=1024, vocab_size=1024)
# Standard deviation of the tiny model's embeddings, which are also its output head (tied). At 1.0 the residual
# stream is dominated by the input token's own embedding, so the logits are ~14 apart: the model repeats its input
# with probability 1 and sampling is greedy in effect. At 0.15 the next-token distribution at temperature 1 has
# real entropy (top-1 probability around 0.1-0.6), so seeded tests check sampling, not greedy decoding.
TINY_EMBED_STD = 0.15


def prepare_tiny(folder: Path | None = None, dtype: str = "float32", seed: int = 0, quiet: bool = False) -> Path:
    """A small random Llama (GQA, 1,024-token vocabulary cut from SmolLM2's) for fast tests."""
    import gguf

    folder = Path(folder or checkpoint_dir("tiny", dtype))
    source = f"tiny:embed_std={TINY_EMBED_STD}:seed={seed}:{dtype}"  # a new recipe re-prepares a cached one
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
    args = ap.parse_args(argv)
    if args.tiny:
        folder = prepare_tiny(args.out, dtype=args.dtype)
        console.print(f"wrote {folder}")
    else:
        prepare_smollm2(args.out, dtype=args.dtype)


if __name__ == "__main__":
    main()
