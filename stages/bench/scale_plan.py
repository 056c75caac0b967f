"""The sweep's plan (issue 54): which (model, engine, prompt length, in-flight) points run, and which are skipped
and why, before anything loads.

A point fits when the weights in its precision and the KV cache of every request in flight (prompt plus output,
16-bit) take at most ``MEMORY_SHARE`` of the memory available now; a llama.cpp point needs its GGUF in the model's
folder (``make_model --gguf``); vLLM CPU needs its venv (``make vllm-venv``).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from safetensors import safe_open

from common.config import ModelConfig
from common.numerics.quant import precision_bytes

ENGINES = ("04-bf16", "04-int4", "05-bf16", "05-int4", "llama.cpp-bf16", "llama.cpp-q4_1", "vllm-bf16")
GGUF_FILES = {"llama.cpp-bf16": "model-bfloat16.gguf", "llama.cpp-q4_1": "model-q4_1.gguf"}
MEMORY_SHARE = 0.8  # the rest: activations, the engine's own buffers, the system


@dataclass(frozen=True)
class Point:
    model: str  # the name shown (a shape's name, or the folder's)
    folder: str
    engine: str
    prompt: int
    in_flight: int
    out_tokens: int

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def checkpoint_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        return {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}


def weight_bytes(folder: Path, engine: str) -> int:
    """Bytes of weights one decode step reads: a GGUF's tensors (its file size), or ours in the engine's precision."""
    if engine in GGUF_FILES:
        return (folder / GGUF_FILES[engine]).stat().st_size
    shapes = checkpoint_shapes(folder)
    if ModelConfig.from_folder(folder).tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    return precision_bytes(shapes, "int4" if engine.endswith("int4") else "bfloat16")


def plan(models: dict[str, Path], prompts: list[int], in_flights: list[int], engines: list[str], out_tokens: int,
         available: int, vllm_python: Path | None) -> tuple[list[Point], list[str]]:
    """Every point that fits, in the order they run (model by model, engine by engine), and a line per skip."""
    bad = [e for e in engines if e not in ENGINES]
    if bad:
        raise ValueError(f"unknown engine {bad[0]!r}: choose from {', '.join(ENGINES)}")
    points, skips = [], []
    for name, folder in models.items():
        config = ModelConfig.from_folder(folder)
        kv_per_token = config.kv_bytes_per_token(2)
        for engine in engines:
            if engine in GGUF_FILES and not (folder / GGUF_FILES[engine]).exists():
                skips.append(f"{name} {engine}: no {GGUF_FILES[engine]} in {folder} (make_model --gguf)")
                continue
            if engine.startswith("vllm") and vllm_python is None:
                skips.append(f"{name} {engine}: vLLM CPU is not built here (make vllm-venv)")
                continue
            weights = weight_bytes(folder, engine)
            for prompt in prompts:
                if prompt + out_tokens >= config.max_position_embeddings:
                    skips.append(f"{name} {engine} {prompt}: past the model's context "
                                 f"({config.max_position_embeddings:,} positions)")
                    continue
                for n in in_flights:
                    need = weights + n * (prompt + out_tokens) * kv_per_token
                    if need > MEMORY_SHARE * available:
                        skips.append(f"{name} {engine} prompt {prompt} x {n} in flight: needs {need / 1e9:.1f} GB "
                                     f"(weights {weights / 1e9:.1f} + KV), {MEMORY_SHARE:.0%} of available is "
                                     f"{MEMORY_SHARE * available / 1e9:.1f} GB")
                        continue
                    points.append(Point(name, str(folder), engine, prompt, n, out_tokens))
    return points, skips
