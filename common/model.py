"""One Llama-layout forward pass (RMSNorm, RoPE, grouped-query attention, SwiGLU, tied or untied LM head).

The families ``common.config`` accepts differ only in switches this file reads: a bias on q, k, v
(Qwen2; and o with ``attention_bias``), an RMSNorm on each query and key head before RoPE (Qwen3),
and RoPE's frequency table (``rope_inv_freq``: Llama 3's rescaling, linear interpolation). Both
switches act on the merged projection's output before ``attend``, so every stage's attention and
stage 04's fused RoPE see the same q, k, v.

The model does not own a KV cache. Each layer hands its new q, k, v to an
``AttentionBackend`` supplied by whoever runs the step: the reference uses a
contiguous cache, stage 01 a padded batch buffer, stage 02 per-slot buffers,
stage 03 paged blocks. The rest of the model is the same code for all of them.
Everything numeric (the linears, attention, the element-wise ops) comes through one door,
``common.numerics``, whose contract is that no row's result depends on its batch.
"""
from __future__ import annotations

import math
from typing import Protocol

import torch

from common.config import ModelConfig
from common.numerics import ROW_TILE, LinearFactory, choose_row_tile, describe_attention, ops  # the one door


class AttentionBackend(Protocol):
    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store this step's k, v ([tokens, kv_heads, d]) and return attention output [tokens, heads, d]."""


class Llama:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype,
                 device: torch.device | str = "cpu", batch_invariant: bool = True, quantization: str | None = None):
        self.config, self.dtype, self.device = config, dtype, torch.device(device)
        # 16-bit, int8, int4 or w4a8 (common.numerics.quant); plain math (no batch invariance) takes torch's own linears
        make = LinearFactory(weights, quantization, dtype, self.device, plain=not batch_invariant)
        self.quantization = make.quantization
        w = make.dense
        # Merged projections: one matmul for q, k and v, one for gate and up.
        self.embed = make.embedding("model.embed_tokens.weight")
        self.layers = []
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            layer = {
                "attn_norm": w(p + "input_layernorm.weight"),
                "qkv": make.linear([p + f"self_attn.{x}_proj.weight" for x in "qkv"]),
                "o": make.linear([p + "self_attn.o_proj.weight"]),
                "mlp_norm": w(p + "post_attention_layernorm.weight"),
                "gate_up": make.linear([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]),
                "down": make.linear([p + "mlp.down_proj.weight"]),
            }
            if config.qkv_bias:  # added after the linear, in the model dtype: a row's result is its own
                layer["qkv_bias"] = torch.cat([w(p + f"self_attn.{x}_proj.bias") for x in "qkv"])
            if config.o_bias:
                layer["o_bias"] = w(p + "self_attn.o_proj.bias")
            if config.qk_norm:
                layer["q_norm"], layer["k_norm"] = w(p + "self_attn.q_norm.weight"), w(p + "self_attn.k_norm.weight")
            self.layers.append(layer)
        self.norm = w("model.norm.weight")
        self.lm_head = make.lm_head(config.tie_word_embeddings)
        make.finish()
        freqs = torch.outer(torch.arange(config.max_position_embeddings, dtype=torch.float32), rope_inv_freq(config))
        # The float32 angles' cos and sin taken in float64 and rounded once: torch's float32 cos and sin are other
        # code on each ISA (an ulp apart on ARM and x86), the float64 ones rounded agreed (docs/native-kernels.md).
        self.cos, self.sin = (f(freqs.double()).float().to(self.device) for f in (torch.cos, torch.sin))
        linears = [layer[n] for layer in self.layers for n in ("qkv", "o", "gate_up", "down")] + [self.lm_head]
        self.batch_invariant = batch_invariant
        if batch_invariant:
            self.row_tile_note = choose_row_tile(linears, dtype, self.device)  # e.g. "calls of up to 32 rows ..."
        else:
            for lin in linears:
                lin.plain = True
            self.row_tile_note = "linears: plain math, one matmul per linear on the whole batch (not batch-invariant)"
        self.attention_note = describe_attention(self.device, batch_invariant)

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one decode step reads (the tied LM head counts once)."""
        parts = [self.embed, self.norm] + [t for layer in self.layers for t in layer.values()]
        if not self.config.tie_word_embeddings:
            parts.append(self.lm_head)
        return sum(t.nbytes for t in parts)

    # ---- the element-wise operations stage 04 replaces with fused kernels (common.numerics.ops) ----------
    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor):
        return ops.add_rms_norm(x, residual, weight, self.config.rms_norm_eps)

    def rope_qkv(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        c = self.config
        return ops.rope_qkv(qkv, cos, sin, c.num_attention_heads, c.num_key_value_heads)

    def qk_norm(self, qkv: torch.Tensor, layer: dict) -> torch.Tensor:
        """Qwen3: RMSNorm over each query head and each key head (their own weights), v as it is."""
        c, tokens = self.config, qkv.shape[0]
        nq, nkv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        q = ops.add_rms_norm(qkv[:, :nq * d].reshape(tokens * nq, d), None, layer["q_norm"], c.rms_norm_eps)[0]
        k = ops.add_rms_norm(qkv[:, nq * d:(nq + nkv) * d].reshape(tokens * nkv, d), None, layer["k_norm"],
                             c.rms_norm_eps)[0]
        return torch.cat([q.view(tokens, -1), k.view(tokens, -1), qkv[:, (nq + nkv) * d:]], 1)

    def swiglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        return ops.swiglu(gate_up)

    def attend(self, layer: int, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               attention: AttentionBackend) -> torch.Tensor:
        """RoPE on the merged projection's q and k; the backend stores k and v and attends."""
        return attention(layer, *self.rope_qkv(qkv, cos, sin))

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attention: AttentionBackend) -> torch.Tensor:
        """Hidden states [tokens, hidden] for a flattened step of one or many sequences."""
        tokens = input_ids.shape[0]
        cos, sin = ops.rope_tables(self.cos[positions], self.sin[positions])  # once per step
        h, residual = self.embed[input_ids], None
        for i, layer in enumerate(self.layers):
            h, residual = self.add_rms_norm(h, residual, layer["attn_norm"])
            qkv = layer["qkv"](h)
            if "qkv_bias" in layer:
                qkv = qkv + layer["qkv_bias"]
            if "q_norm" in layer:
                qkv = self.qk_norm(qkv, layer)
            o = layer["o"](self.attend(i, qkv, cos, sin, attention).reshape(tokens, -1))
            if "o_bias" in layer:
                o = o + layer["o_bias"]
            h, residual = self.add_rms_norm(o, residual, layer["mlp_norm"])
            h = layer["down"](self.swiglu(layer["gate_up"](h)))
        h, _ = self.add_rms_norm(h, residual, self.norm)
        return h

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits [rows, vocab] for the given hidden rows (usually each sequence's last)."""
        return self.lm_head(hidden).float()


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """RoPE's inverse frequencies [head_dim / 2] in float32, as transformers computes them for the rope type.

    linear: every frequency divided by ``factor`` (positions interpolated). llama3: wavelengths longer
    than ``original_max_position_embeddings / low_freq_factor`` are divided by ``factor``, those shorter
    than ``... / high_freq_factor`` kept, and the band between blended smoothly."""
    d, p = config.head_dim, dict(config.rope_scaling)
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    if config.rope_type == "linear":
        return inv_freq / p["factor"]
    if config.rope_type == "llama3":
        factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
        old = p["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) * ~(wavelen > old / low)
        return torch.where(medium, smoothed, scaled)
    return inv_freq


__all__ = ["Llama", "rope_inv_freq", "AttentionBackend", "ROW_TILE"]
