"""One Llama forward pass (RMSNorm, RoPE, grouped-query attention, SwiGLU, tied LM head).

The model does not own a KV cache. Each layer hands its new q, k, v to an
``AttentionBackend`` supplied by whoever runs the step: the reference uses a
contiguous cache, stage 01 a padded batch buffer, stage 02 per-slot buffers,
stage 03 paged blocks. The rest of the model is the same code for all of them.
All matmuls go through ``common.invariant`` so results never depend on the batch.
"""
from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from common.config import ModelConfig
from common.invariant import ROW_TILE, pad_rows
from common.quant import LinearFactory


class AttentionBackend(Protocol):
    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store this step's k, v ([tokens, kv_heads, d]) and return attention output [tokens, heads, d]."""


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Llama:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype,
                 device: torch.device | str = "cpu", quantization: str | None = None):
        self.config, self.dtype, self.device = config, dtype, torch.device(device)
        make = LinearFactory(weights, quantization, dtype, self.device)  # 16-bit, int8 or int4 (common.quant)
        self.quantization = make.quantization
        w = make.dense
        # Merged projections: one matmul for q, k and v, one for gate and up.
        self.embed = make.embedding("model.embed_tokens.weight")
        self.layers = []
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            self.layers.append({
                "attn_norm": w(p + "input_layernorm.weight"),
                "qkv": make.linear([p + f"self_attn.{x}_proj.weight" for x in "qkv"]),
                "o": make.linear([p + "self_attn.o_proj.weight"]),
                "mlp_norm": w(p + "post_attention_layernorm.weight"),
                "gate_up": make.linear([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]),
                "down": make.linear([p + "mlp.down_proj.weight"]),
            })
        self.norm = w("model.norm.weight")
        self.lm_head = make.lm_head(config.tie_word_embeddings)
        d = config.head_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        freqs = torch.outer(torch.arange(config.max_position_embeddings, dtype=torch.float32), inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos, self.sin = emb.cos().to(self.device), emb.sin().to(self.device)

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one decode step reads (the tied LM head counts once)."""
        parts = [self.embed, self.norm] + [t for layer in self.layers for t in layer.values()]
        if not self.config.tie_word_embeddings:
            parts.append(self.lm_head)
        return sum(t.nbytes for t in parts)

    # ---- the element-wise operations stage 04 replaces with fused kernels ----------------
    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor):
        """(RMSNorm(x + residual), x + residual): the residual stream is added into, then normalized."""
        residual = x if residual is None else x + residual
        return rms_norm(residual, weight, self.config.rms_norm_eps), residual

    def apply_rope(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        rotate = lambda x: (x.float() * cos + rotate_half(x.float()) * sin).to(x.dtype)  # noqa: E731
        return rotate(q), rotate(k)

    def swiglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return (F.silu(gate) * up).contiguous()

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attention: AttentionBackend) -> torch.Tensor:
        """Hidden states [tokens, hidden] for a flattened step of one or many sequences."""
        c = self.config
        tokens = input_ids.shape[0]
        nq, nkv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        # Rows stay padded to ROW_TILE through the layers so every op sees whole tiles.
        h, residual = pad_rows(self.embed[input_ids]), None
        for i, layer in enumerate(self.layers):
            h, residual = self.add_rms_norm(h, residual, layer["attn_norm"])
            qkv = layer["qkv"](h)[:tokens]
            q = qkv[:, : nq * d].view(tokens, nq, d)
            k = qkv[:, nq * d: (nq + nkv) * d].view(tokens, nkv, d)
            v = qkv[:, (nq + nkv) * d:].reshape(tokens, nkv, d)
            q, k = self.apply_rope(q, k, positions)
            o = attention(i, q, k, v).reshape(tokens, nq * d)
            h, residual = self.add_rms_norm(layer["o"](pad_rows(o)), residual, layer["mlp_norm"])
            h = layer["down"](self.swiglu(layer["gate_up"](h)))
        h, _ = self.add_rms_norm(h, residual, self.norm)
        return h[:tokens]

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits [rows, vocab] for the given hidden rows (usually each sequence's last)."""
        rows = hidden.shape[0]
        return self.lm_head(pad_rows(hidden))[:rows].float()


__all__ = ["Llama", "AttentionBackend", "ROW_TILE"]
