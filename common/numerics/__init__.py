"""The numerics the engine rests on: the one door from the core (``common/model.py``, ``kv_cache.py``) into them.

The contract, which every stage's "same tokens everywhere" relies on: **a row's bits never depend on
its batch.** A token's hidden state, logits and sampled token come out bit for bit the same whether it
runs alone or beside any other rows, in a prefill or a decode, at any position of the step. Each
operation keeps a row's reductions in one fixed order whatever the batch:

* linears, 16-bit (``invariant.py``): on CPU our kernels (``native/linear.cpp``, AMX or AVX-512) where the
  CPU has them, else torch's on a fixed row tile checked at load; on CUDA torch's on a fixed row tile;
* int8 / int4 linears (``int8.py``, ``int4.py``; ``factory.py`` builds whichever the model asks for): ours on
  CPU, else torch's packed kernels; Triton on CUDA (``quant_cuda.py``);
* attention (``attention.py`` dispatches): on CPU a compiled kernel (``attention_native.py``, source
  ``native/attention.cpp``); elsewhere tensor ops over fixed key tiles (``attention_tiles.py``);
* RMSNorm, RoPE, SwiGLU (``ops.py``): torch, with a fixed lane order (stage 04 fuses them, same bits).

``batch_invariant=False`` swaps in torch's plain math (one matmul per linear, fused attention on a padded
batch: ``attention_plain.py``), to show what the design buys; then bits depend on the batch. One process
uses one implementation per operation for the reference and every stage alike.
"""
from common.numerics import ops
from common.numerics.attention import KEY_TILE, AttentionMetadata, attention, describe_attention
from common.numerics.factory import LinearFactory
from common.numerics.invariant import ROW_TILE, choose_row_tile

__all__ = ["ops", "KEY_TILE", "AttentionMetadata", "attention", "describe_attention", "LinearFactory", "ROW_TILE",
           "choose_row_tile"]
