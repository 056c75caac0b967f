"""The model's shape, read from a checkpoint folder's config.json."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    eos_token_id: int

    @classmethod
    def from_folder(cls, folder: str | Path) -> "ModelConfig":
        folder = Path(folder)
        path = folder / "config.json"
        if not folder.is_dir():
            raise FileNotFoundError(f"checkpoint folder {folder} does not exist")
        if not path.exists():
            raise FileNotFoundError(f"{folder} has no config.json: is it a Hugging Face checkpoint folder?")
        raw = json.loads(path.read_text())
        archs = raw.get("architectures") or []
        if raw.get("model_type") != "llama" or "LlamaForCausalLM" not in archs:
            raise ValueError(
                f"{path}: unsupported architecture (model_type={raw.get('model_type')!r}, "
                f"architectures={archs}); stepwise runs Llama-architecture checkpoints (LlamaForCausalLM)"
            )
        if raw.get("rope_scaling"):
            raise ValueError(f"{path}: rope_scaling={raw['rope_scaling']!r} is not supported")
        eos = raw.get("eos_token_id", 2)
        return cls(
            hidden_size=raw["hidden_size"], intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"], num_attention_heads=raw["num_attention_heads"],
            num_key_value_heads=raw.get("num_key_value_heads", raw["num_attention_heads"]),
            head_dim=raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"],
            vocab_size=raw["vocab_size"], rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=raw.get("rope_theta", 10000.0),
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            eos_token_id=eos[0] if isinstance(eos, list) else eos,
        )

    def kv_bytes_per_token(self, bytes_per_value: int) -> int:
        """Keys and values of one token across all layers: 2 x layers x KV heads x head size x bytes."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * bytes_per_value
