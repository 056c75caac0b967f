"""LinearFactory: the one place the model asks for its linears, in the precision it was loaded in."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from common.numerics.int4 import Int4Linear, q4_1_quantize
from common.numerics.int8 import Int8Embedding, Int8Linear
from common.numerics.invariant import Linear
from common.numerics.native.arena import WeightArena
from common.numerics.quant import Q4_1_SUFFIX, parse_quantization


class LinearFactory:
    """Builds the model's linears and its embedding in the precision asked for (None: the model dtype).

    ``names`` lists checkpoint tensors stacked along the output features (q, k, v -> one
    matmul). ``weights`` maps names to the checkpoint's tensors, memory-mapped: a tensor's
    bytes are read only when used, so int4 never reads the dense projections.
    """

    def __init__(self, weights: Mapping[str, torch.Tensor], quantization: str | None, dtype: torch.dtype,
                 device: torch.device, plain: bool = False):
        self.quantization = parse_quantization(quantization, dtype, device)
        self.weights, self.dtype, self.device, self.plain = weights, dtype, device, plain
        self.built: dict[str, torch.Tensor | Int8Linear] = {}
        # Our CPU kernels' packed weights, on 2 MiB pages (address space only: what is placed becomes resident)
        reserve = 2 * sum(t.nbytes for t in weights.values()) if self.device.type == "cpu" and not plain else 0
        self.arena = WeightArena(reserve) if reserve else None

    def finish(self) -> None:
        """Every linear is built."""
        if self.arena is not None:
            self.arena.finish()

    def placed(self, linear):
        """``linear``, its packed weights moved into the arena (if it has both)."""
        if self.arena is not None:
            linear.place_weights(self.arena.place)
        return linear

    def dense(self, name: str) -> torch.Tensor:
        """The tensor in the model's dtype and device, in memory of its own: where the checkpoint already has that
        dtype, ``.to`` would hand back the memory-mapped view itself, and one view kept keeps the whole file
        mapped and its read pages resident beside the packed copies (a 3B bfloat16 shape held twice)."""
        source = self.weights[name]
        t = source.to(device=self.device, dtype=self.dtype)
        return t.clone() if t.data_ptr() == source.data_ptr() else t

    def embedding(self, name: str):
        if self.quantization is None:
            return self.built.setdefault(name, self.dense(name))
        return Int8Embedding(self.table(name), self.dtype)

    def table(self, name: str) -> Int8Linear:
        """A token table (embedding or LM head) in int8, built once: a tied head and the lookup share it."""
        if name not in self.built:
            self.built[name] = self.placed(Int8Linear(self.weights[name], self.dtype, self.plain, self.device))
        return self.built[name]

    def lm_head(self, tied: bool):
        name = "model.embed_tokens.weight" if tied else "lm_head.weight"
        if self.quantization is None:
            return self.placed(Linear(self.embedding(name) if tied else self.dense(name), self.plain))
        return self.table(name)

    def linear(self, names: list[str]):
        if self.quantization is None:
            weight = torch.cat([self.dense(n) for n in names]) if len(names) > 1 else self.dense(names[0])
            return self.placed(Linear(weight, self.plain))
        if self.quantization == "int8":
            return self.placed(Int8Linear(torch.cat([self.weights[n].float() for n in names]), self.dtype, self.plain,
                                          self.device))
        return self.placed(Int4Linear.from_q4_1(np.concatenate([self.q4_1_blocks(n) for n in names]), self.dtype,
                                                self.device, self.plain,
                                                activations=8 if self.quantization == "w4a8" else 16))

    def q4_1_blocks(self, name: str) -> np.ndarray:
        """The GGUF's own Q4_1 blocks when the checkpoint keeps them, else the dense weight quantized like them."""
        stored = name.removesuffix(".weight") + Q4_1_SUFFIX
        if stored in self.weights:
            return self.weights[stored].numpy()
        return q4_1_quantize(self.weights[name])
