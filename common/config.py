"""The model's shape, read from a checkpoint folder's config.json (and generation_config.json's EOS ids).

Four families share one layout (embeddings, N x [RMSNorm, attention, RMSNorm, SwiGLU MLP], RMSNorm, LM
head) and differ in a few switches: Qwen2 adds a bias to q, k and v; Qwen3 normalizes each query and key
head (RMSNorm over head_dim) before RoPE; Llama 3 rescales RoPE's frequencies; Mistral may limit
attention to a sliding window. Every field that changes the math is read here or refused: a config
field this file does not know is an error naming it, so nothing is half-read. transformers 4.x writes
RoPE as top-level ``rope_theta`` / ``rope_scaling``, 5.x as ``rope_parameters``; both are read, and
they must agree.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

FAMILIES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM"}
DEFAULT_MAX_POSITIONS = {"llama": 2048, "mistral": 4096 * 32, "qwen2": 32768, "qwen3": 32768}
# Fields that do not change inference math (bookkeeping, training-only, or read elsewhere).
IGNORED = {
    "architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "_name_or_path", "use_cache",
    "initializer_range", "attention_dropout", "bos_token_id", "pad_token_id", "output_hidden_states",
    "output_attentions", "return_dict", "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id",
    "problem_type", "stepwise_source", "tokenizer_class", "max_window_layers", "use_sliding_window",
    "layer_types", "sliding_window", "pretraining_tp",  # pretraining_tp: a training-time split of the same matmul
}
READ = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "head_dim", "vocab_size", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
        "max_position_embeddings", "tie_word_embeddings", "eos_token_id", "hidden_act", "attention_bias",
        "mlp_bias"}
# RoPE types and the keys each takes (besides rope_type / type / rope_theta).
ROPE_TYPES = {"default": set(), "linear": {"factor"},
              "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}}
ROPE_REFUSED = {
    "dynamic": "its frequencies depend on the current sequence length, which in a batch is the longest "
               "sequence's, so a request's tokens would depend on its batch",
}


class UnsupportedConfig(ValueError):
    """config.json asks for math stepwise does not implement; the message names the field and its value."""


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
    family: str = "llama"
    rope_type: str = "default"
    rope_scaling: tuple[tuple[str, float], ...] = ()  # the rope type's parameters, sorted by name
    qkv_bias: bool = False  # Qwen2, or attention_bias
    o_bias: bool = False  # attention_bias (Llama, Mistral, Qwen3): o_proj has a bias too
    qk_norm: bool = False  # Qwen3: RMSNorm on each query and key head before RoPE
    eos_token_ids: tuple[int, ...] = ()  # every id that ends a request (config.json and generation_config.json)
    sliding_window: int | None = None  # the window the checkpoint declares; max_position_embeddings is capped to it

    @classmethod
    def from_folder(cls, folder: str | Path) -> "ModelConfig":
        folder = Path(folder)
        path = folder / "config.json"
        if not folder.is_dir():
            raise FileNotFoundError(f"checkpoint folder {folder} does not exist")
        if not path.exists():
            raise FileNotFoundError(f"{folder} has no config.json: is it a Hugging Face checkpoint folder?")
        raw = json.loads(path.read_text())
        gen_path = folder / "generation_config.json"
        generation = json.loads(gen_path.read_text()) if gen_path.exists() else {}
        return cls.from_dict(raw, str(path), generation)

    @classmethod
    def from_dict(cls, raw: dict, where: str = "config.json", generation: dict | None = None) -> "ModelConfig":
        def refuse(field: str, why: str):
            raise UnsupportedConfig(f"{where}: {field}={raw.get(field)!r} {why}")

        family, archs = raw.get("model_type"), raw.get("architectures") or [FAMILIES.get(raw.get("model_type"))]
        if family not in FAMILIES or FAMILIES[family] not in archs:
            raise UnsupportedConfig(
                f"{where}: unsupported architecture (model_type={family!r}, architectures={archs}); stepwise runs "
                + ", ".join(f"{k} ({v})" for k, v in FAMILIES.items()))
        unknown = sorted(set(raw) - IGNORED - READ)
        if unknown:
            k = unknown[0]
            raise UnsupportedConfig(f"{where}: field {k}={raw[k]!r} is not understood by stepwise (it may change "
                                    f"the model's math); unknown fields: {', '.join(unknown)}")
        if raw.get("hidden_act", "silu") != "silu":
            refuse("hidden_act", "is not supported: stepwise's MLP is SwiGLU (silu)")
        if raw.get("mlp_bias"):
            refuse("mlp_bias", "is not supported: stepwise's MLP has no bias")
        missing = [k for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                               "vocab_size") if k not in raw]
        if missing:
            raise UnsupportedConfig(f"{where}: required fields missing: {', '.join(missing)}")
        heads = raw["num_attention_heads"]
        kv_heads = raw.get("num_key_value_heads") or heads
        if heads % kv_heads:
            refuse("num_key_value_heads", f"does not divide num_attention_heads={heads}")
        head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
        if head_dim % 16 or raw["hidden_size"] % 16:
            refuse("head_dim", f"(hidden_size={raw['hidden_size']}): both must be multiples of 16 (the RMSNorm's "
                               "16 lanes, RoPE's halves)")
        rope_type, theta, scaling = read_rope(raw, where)
        max_positions = raw.get("max_position_embeddings", DEFAULT_MAX_POSITIONS[family])
        window = sliding_window(raw, family)
        if window is not None and window < max_positions:
            # Within the window, sliding-window attention is full attention: cap the context to it.
            max_positions = window
        attention_bias = bool(raw.get("attention_bias", False))
        eos = []
        for source in (raw.get("eos_token_id"), (generation or {}).get("eos_token_id")):
            for e in source if isinstance(source, list) else [] if source is None else [source]:
                if e not in eos:
                    eos.append(int(e))
        eos = eos or [2]
        return cls(
            hidden_size=raw["hidden_size"], intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"], num_attention_heads=heads, num_key_value_heads=kv_heads,
            head_dim=head_dim, vocab_size=raw["vocab_size"], rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta), max_position_embeddings=max_positions,
            tie_word_embeddings=raw.get("tie_word_embeddings", False), eos_token_id=eos[0],
            family=family, rope_type=rope_type, rope_scaling=tuple(sorted(scaling.items())),
            qkv_bias=family == "qwen2" or attention_bias, o_bias=family != "qwen2" and attention_bias,
            qk_norm=family == "qwen3", eos_token_ids=tuple(eos), sliding_window=window,
        )

    def kv_bytes_per_token(self, bytes_per_value: int) -> int:
        return kv_bytes(self.num_hidden_layers, self.num_key_value_heads, self.head_dim, bytes_per_value)


def kv_bytes(layers: int, kv_heads: int, head_dim: int, bytes_per_value: int) -> int:
    """Keys and values of one token across all layers: 2 x layers x KV heads x head size x bytes (the capacity
    lesson's arithmetic, for a config or for the article's model, which has none)."""
    return 2 * layers * kv_heads * head_dim * bytes_per_value


def read_rope(raw: dict, where: str) -> tuple[str, float, dict]:
    """(rope type, theta, the type's parameters) from either spelling; a type or key not implemented is refused."""
    params = dict(raw.get("rope_scaling") or {})
    new = raw.get("rope_parameters") or {}
    if not isinstance(params, dict) or not isinstance(new, dict):
        raise UnsupportedConfig(f"{where}: rope_scaling / rope_parameters must be objects")
    for k, v in new.items():
        if k in params and params[k] != v:
            raise UnsupportedConfig(f"{where}: rope_parameters[{k!r}]={v!r} contradicts rope_scaling[{k!r}]="
                                    f"{params[k]!r}")
        params[k] = v
    thetas = {float(t) for t in (raw.get("rope_theta"), params.pop("rope_theta", None)) if t is not None}
    if len(thetas) > 1:
        raise UnsupportedConfig(f"{where}: rope_theta={raw.get('rope_theta')!r} contradicts rope_parameters' "
                                f"rope_theta={new.get('rope_theta')!r}")
    theta = thetas.pop() if thetas else 10000.0
    kinds = {params.pop(k) for k in ("rope_type", "type") if k in params}
    if len(kinds) > 1:
        raise UnsupportedConfig(f"{where}: rope type given twice, as {sorted(kinds)}")
    kind = kinds.pop() if kinds else "default"
    if kind in ROPE_REFUSED:
        raise UnsupportedConfig(f"{where}: rope_type={kind!r} is not supported: {ROPE_REFUSED[kind]}")
    if kind not in ROPE_TYPES:
        raise UnsupportedConfig(f"{where}: rope_type={kind!r} is not supported; stepwise implements "
                                f"{', '.join(ROPE_TYPES)}")
    if params.get("partial_rotary_factor", 1.0) == 1.0:
        params.pop("partial_rotary_factor", None)
    extra, lacking = sorted(set(params) - ROPE_TYPES[kind]), sorted(ROPE_TYPES[kind] - set(params))
    if extra or lacking:
        what = f"has {', '.join(f'{k}={params[k]!r}' for k in extra)}" if extra else f"lacks {', '.join(lacking)}"
        raise UnsupportedConfig(f"{where}: rope_type={kind!r} {what}: stepwise's {kind} RoPE takes "
                                f"{', '.join(sorted(ROPE_TYPES[kind])) or 'no parameters'}")
    return kind, theta, {k: float(v) for k, v in params.items()}


def sliding_window(raw: dict, family: str) -> int | None:
    """The attention window a checkpoint applies (None: full attention everywhere)."""
    window = raw.get("sliding_window")
    layer_types = raw.get("layer_types") or []
    bad = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
    if bad:
        raise UnsupportedConfig(f"config.json: layer_types holds {bad}, which stepwise does not implement")
    if family in ("qwen2", "qwen3"):  # Qwen declares a window but applies it only with use_sliding_window
        applies = raw.get("use_sliding_window", False) or "sliding_attention" in layer_types
    else:
        applies = True
    return int(window) if applies and window else None
