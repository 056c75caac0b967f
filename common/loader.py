"""Load a checkpoint folder (Hugging Face layout: Llama, Mistral, Qwen2, Qwen3) into a `Llama` in a chosen dtype
and device. Every tensor config.json implies must be there in its shape, and no other: a stray tensor (a bias
the config does not declare, say) means the config and the weights disagree, and is refused."""
from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

import torch
from safetensors import safe_open

from common.config import ModelConfig
from common.model import Llama
from common.numerics.quant import Q4_1_SUFFIX

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def resolve_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} asked for, but torch sees no CUDA device")
    return torch.device(device)


def expected_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    h, f, d = c.hidden_size, c.intermediate_size, c.head_dim
    shapes = {"model.embed_tokens.weight": (c.vocab_size, h), "model.norm.weight": (h,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, h)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (c.num_attention_heads * d, h),
            p + "self_attn.k_proj.weight": (c.num_key_value_heads * d, h),
            p + "self_attn.v_proj.weight": (c.num_key_value_heads * d, h),
            p + "self_attn.o_proj.weight": (h, c.num_attention_heads * d),
            p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
            p + "mlp.down_proj.weight": (h, f),
        })
        if c.qkv_bias:
            shapes.update({p + "self_attn.q_proj.bias": (c.num_attention_heads * d,),
                           p + "self_attn.k_proj.bias": (c.num_key_value_heads * d,),
                           p + "self_attn.v_proj.bias": (c.num_key_value_heads * d,)})
        if c.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (h,)
        if c.qk_norm:
            shapes.update({p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)})
    return shapes


def is_extra(name: str, c: ModelConfig) -> bool:
    """Tensors a checkpoint may hold beyond ``expected_shapes``: the GGUF's Q4_1 blocks (int4), RoPE's cached
    frequencies (recomputed from the config), and a tied head saved anyway (the embedding is the head)."""
    return (name.endswith(Q4_1_SUFFIX) or name.endswith("rotary_emb.inv_freq")
            or (c.tie_word_embeddings and name == "lm_head.weight"))


def load_model(folder: str | Path, dtype: str | torch.dtype = "bfloat16", device: str | None = "auto",
               model_class: type[Llama] = Llama, batch_invariant: bool = True,
               quantization: str | None = None, num_layers: int | None = None) -> Llama:
    """quantization: None (the dtype throughout), 'int8', 'int4' or 'w4a8' (see common.numerics.quant).
    num_layers: build the first N decoder layers only, then the final norm and head (an early-exit draft, stage
    06); the checkpoint is checked whole, and the other layers' tensors are never read (memory-mapped)."""
    folder = Path(folder)
    config = ModelConfig.from_folder(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} holds no *.safetensors file")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(file, framework="pt") as f:  # memory-mapped: nothing is read until used
            for name in f.keys():
                weights[name] = f.get_tensor(name)
    expected = expected_shapes(config)
    extra = sorted(n for n in weights if n not in expected and not is_extra(n, config))
    if extra:
        raise ValueError(f"{folder}: tensor {extra[0]!r} is in the checkpoint but config.json "
                         f"(model_type={config.family!r}) implies no such tensor ({len(extra)} unexpected)")
    for name, shape in expected.items():
        if name not in weights:
            raise KeyError(f"{folder}: tensor {name!r} is missing from the checkpoint")
        if tuple(weights[name].shape) != shape:
            raise ValueError(f"{folder}: tensor {name!r} has shape {tuple(weights[name].shape)}, "
                             f"config.json implies {shape}")
    if num_layers is not None:
        if not 1 <= num_layers <= config.num_hidden_layers:
            raise ValueError(f"num_layers={num_layers}: {folder} has {config.num_hidden_layers} layers")
        kept = {f"model.layers.{i}." for i in range(num_layers)}
        weights = {n: t for n, t in weights.items() if not n.startswith("model.layers.") or
                   ".".join(n.split(".")[:3]) + "." in kept}
        config = replace(config, num_hidden_layers=num_layers)
    return model_class(config, weights, parse_dtype(dtype), resolve_device(device), batch_invariant=batch_invariant,
                       quantization=quantization)


UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_memory(value: str | int | float | None, device: torch.device | str) -> int | None:
    """'96MiB', '2GB', 123456 (bytes), or a fraction in (0, 1] of free memory (CUDA) / available RAM."""
    if value is None or isinstance(value, int):
        return value
    device = torch.device(device)
    text = str(value).strip().lower().replace(" ", "")
    match = re.fullmatch(r"([0-9]*\.?[0-9]+)([a-z]*)", text)
    if not match or match.group(2) not in UNITS:
        raise ValueError(f"KV memory {value!r} not understood: use bytes (123456), '96MiB', '2GB' "
                         "or a fraction like 0.5")
    number, unit = float(match.group(1)), match.group(2)
    if unit == "" and 0 < number <= 1 and "." in text:
        free = (torch.cuda.mem_get_info(device)[0] if device.type == "cuda"
                else os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        return int(number * free)
    return int(number * UNITS[unit])
