"""Load a Llama checkpoint folder (Hugging Face layout) into a `Llama` in a chosen dtype and device."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from common.config import ModelConfig
from common.model import Llama

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
    return shapes


def load_model(folder: str | Path, dtype: str | torch.dtype = "bfloat16", device: str | None = "cpu",
               model_class: type[Llama] = Llama) -> Llama:
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
    for name, shape in expected_shapes(config).items():
        if name not in weights:
            raise KeyError(f"{folder}: tensor {name!r} is missing from the checkpoint")
        if tuple(weights[name].shape) != shape:
            raise ValueError(f"{folder}: tensor {name!r} has shape {tuple(weights[name].shape)}, "
                             f"config.json implies {shape}")
    return model_class(config, weights, parse_dtype(dtype), resolve_device(device))
