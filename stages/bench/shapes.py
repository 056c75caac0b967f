"""The real architectures' shapes that `make_model` fills with random weights (issue 54: how cost grows).

Only SmolLM2-135M's weights exist offline, so larger models are random weights in the real models' shapes: the
bytes read per token, the memory held and the time taken do not depend on what the weights say. Each entry is
the published config.json of the model (hidden size, layers, heads, KV heads, MLP width, RoPE theta and scaling,
tied embeddings, norm epsilon, Qwen2's q/k/v bias) with one change said wherever a figure is printed: the
vocabulary is SmolLM2's 49,152 tokens (its tokenizer), not the model's own (151,936 for Qwen2.5, 128,256 for
Llama 3.2), so the embedding and the head are smaller than the real model's.

A reduced version (``reduced(shape, divisor, layers)``) keeps the layer structure (head size, GQA grouping,
biases, RoPE) with fewer heads and layers, for tests that compare every stage with transformers in seconds.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

VOCAB = 49152  # SmolLM2's tokenizer
VOCAB_NOTE = "random weights, SmolLM2 tokenizer, 49,152 vocab"
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}


@dataclass(frozen=True)
class Shape:
    name: str
    family: str  # config.json's model_type: 'qwen2' (q/k/v bias, NEOX RoPE in llama.cpp) or 'llama'
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool = True
    rope_scaling: dict | None = None
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    source: str = ""  # where the numbers come from

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def config(self, dtype: str = "bfloat16") -> dict:
        """config.json as transformers writes it for this family (our loader reads the same file)."""
        arch = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}[self.family]
        cfg = {
            "architectures": [arch], "model_type": self.family, "hidden_act": "silu",
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers, "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_size,
            "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta, "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings, "tie_word_embeddings": self.tie_word_embeddings,
            "vocab_size": VOCAB, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "torch_dtype": dtype,
            "initializer_range": 0.02, "attention_dropout": 0.0, "use_cache": True,
        }
        if self.family == "llama":
            cfg.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
        else:
            cfg.update(use_sliding_window=False, sliding_window=None, max_window_layers=self.num_hidden_layers)
        return cfg

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor of the checkpoint and its shape, in the order they are written."""
        h, f, d = self.hidden_size, self.intermediate_size, self.head_size
        q, kv = self.num_attention_heads * d, self.num_key_value_heads * d
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, h)}
        for i in range(self.num_hidden_layers):
            p = f"model.layers.{i}."
            shapes.update({p + "input_layernorm.weight": (h,), p + "self_attn.q_proj.weight": (q, h),
                           p + "self_attn.k_proj.weight": (kv, h), p + "self_attn.v_proj.weight": (kv, h)})
            if self.family == "qwen2":
                shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                               p + "self_attn.v_proj.bias": (kv,)})
            shapes.update({p + "self_attn.o_proj.weight": (h, q), p + "post_attention_layernorm.weight": (h,),
                           p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                           p + "mlp.down_proj.weight": (h, f)})
        shapes["model.norm.weight"] = (h,)
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (VOCAB, h)
        return shapes

    def parameters(self) -> int:
        n = 0
        for shape in self.tensor_shapes().values():
            size = 1
            for s in shape:
                size *= s
            n += size
        return n


SHAPES = {s.name: s for s in (
    Shape("qwen2.5-0.5b", "qwen2", 896, 24, 14, 2, 4864, 1000000.0, 1e-6, 32768,
          source="Qwen/Qwen2.5-0.5B config.json"),
    Shape("llama-3.2-1b", "llama", 2048, 16, 32, 8, 8192, 500000.0, 1e-5, 131072, rope_scaling=LLAMA3_ROPE,
          head_dim=64, source="meta-llama/Llama-3.2-1B config.json"),
    Shape("qwen2.5-1.5b", "qwen2", 1536, 28, 12, 2, 8960, 1000000.0, 1e-6, 131072,
          source="Qwen/Qwen2.5-1.5B config.json"),
    Shape("llama-3.2-3b", "llama", 3072, 28, 24, 8, 8192, 500000.0, 1e-5, 131072, rope_scaling=LLAMA3_ROPE,
          head_dim=128, source="meta-llama/Llama-3.2-3B config.json"),
)}


def get_shape(name: str) -> Shape:
    """The shape called ``name``, or an error listing the known ones."""
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}: choose one of {', '.join(SHAPES)}")
    return SHAPES[name]


def reduced(shape: Shape, width_divisor: int = 1, layers: int | None = None) -> Shape:
    """``shape`` with heads and KV heads divided by ``width_divisor`` (at least one each, head size and GQA kept),
    the MLP narrowed alike (to a multiple of 32, int4's group), and ``layers`` layers; the name says so."""
    if width_divisor < 1 or (layers is not None and layers < 1):
        raise ValueError(f"width divisor {width_divisor} and layers {layers} must be at least 1")
    if width_divisor == 1 and layers in (None, shape.num_hidden_layers):
        return shape
    heads = max(1, shape.num_attention_heads // width_divisor)
    kv = max(1, shape.num_key_value_heads // width_divisor)
    if heads % kv:
        raise ValueError(f"{shape.name} / {width_divisor}: {heads} heads do not split into {kv} KV heads; "
                         "choose another --width-divisor")
    ffn = max(32, round(shape.intermediate_size / width_divisor / 32) * 32)
    n_layers = layers or shape.num_hidden_layers
    return replace(shape, name=f"{shape.name}-w{width_divisor}-l{n_layers}", hidden_size=heads * shape.head_size,
                   num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=ffn,
                   num_hidden_layers=n_layers, head_dim=shape.head_size)
