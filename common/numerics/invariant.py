"""Batch-invariant linears: a row's result never depends on its neighbours.

Why this module exists
----------------------
Every stage must produce exactly the tokens of the one-request-at-a-time reference.
Batching changes the *shapes* the math runs on, and the matrix-multiply library picks
its kernel (its blocking, so its summation order, so its bits) by shape: on the machine
this was built on, oneDNN's bfloat16 linear gives a row the same bits in any call of up
to 32 rows and different bits (in about one row in ten) once a call has more. A one-bit
difference in a logit flips a greedy tie sooner or later, so "close" is not enough.

The only rule that matters is that *the order of each reduction* (here, over a row's
input features) must not depend on the batch; how many rows a call holds is free as
long as the kernel keeps that order. So ``Linear`` splits its rows into calls of at most
``row_tile`` rows, where ``row_tile`` is **checked when the model loads, on the machine it
runs on** (kernels differ between CPUs: AMX, AVX-512, AVX2): the largest tile at which
every row's bits equal its bits alone, for every linear shape of the model. The result
is cached per machine. If no tile passes, every call gets exactly ``ROW_TILE`` rows
(padding included): a kernel is then always called on one shape, which is invariant for
any deterministic kernel, at the price of padding.

On a CPU with Intel AMX, or with AVX-512 and its BF16 extension, a bfloat16 linear is our own kernel
(``common/numerics/native/linear.cpp``, ``linear_avx512.h``): each output's sum over the input features runs in one
fixed order by construction, so a row keeps its bits in a call of any size, and it streams one request's weights
faster than oneDNN does. On any other CPU (AVX2, ARM) bfloat16 linears run our portable kernel
(``linear_portable.h``), built on the same idea and giving the AVX-512 FMA kernel's bits: no padding to a tile and no
widening of bfloat16 weights there; float32 linears run it on every CPU where it builds (the others read bfloat16
only). Only where none of ours built (or in plain mode) does torch run: in bfloat16 the weight prepacked once into
oneDNN's blocked layout (what ``torch.compile``'s freezing does), which skips the re-layout of the whole weight that
a plain ``torch.mm`` does on every call, where oneDNN packs bfloat16 (AVX-512), else ``torch.mm``.
docs/native-kernels.md has the measurements.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from common.numerics import native
from common.paths import cpu_identity, home

ROW_TILE = 16  # rows per call when no larger tile keeps rows' bits (calls are then padded to it)
CANDIDATE_TILES = (256, 128, 64, 32, 16)  # tried largest first
PACK_HINT = 32  # the batch size oneDNN lays the prepacked weight out for


def pad_rows(x: torch.Tensor, multiple: int = ROW_TILE) -> torch.Tensor:
    pad = (-x.shape[0]) % multiple
    return torch.cat([x, x.new_zeros(pad, *x.shape[1:])]) if pad else x


def uses_packed_bf16(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a bfloat16 linear on ``device`` takes the packed paths (ours, else oneDNN's prepacked weight). Both
    need AVX-512 (oneDNN refuses to pack bfloat16 without it, or AVX-NE-CONVERT): on an AVX2-only CPU a bfloat16
    linear is ``torch.mm``, like float32, on a row tile the load-time check finds."""
    return (device.type == "cpu" and dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def widens_bf16(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a bfloat16 linear on ``device`` that runs on torch computes in float32 instead: on a CPU without
    AVX-512 (AVX2 only) torch's bfloat16 matmul takes a scalar path far slower than float32's (docs/measuring.md),
    while float32 products of bfloat16 values are exact, so widening the weights once and rounding each output once
    costs only memory. Where our portable kernel runs (``runs_portable``), nothing widens."""
    return device.type == "cpu" and dtype == torch.bfloat16 and not uses_packed_bf16(device, dtype)


def runs_portable(kernel: str | None, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a linear of ``dtype`` weights on ``device`` runs our portable kernel, ``kernel`` being
    ``native.linear_kernel()``: on CPU, bfloat16 or float32 weights (int8 and int4 decide in their own classes)."""
    return native.is_portable(kernel) and device.type == "cpu" and dtype in (torch.bfloat16, torch.float32)


class RowTiled:
    """Splits a matmul's rows into calls that keep every row's bits; subclasses give ``matmul`` (one call),
    ``in_features`` and ``out_features``. ``choose_row_tile`` sets the tile per model and machine."""
    row_tile: int = ROW_TILE
    exact_tiles: bool = True  # every call holds exactly ROW_TILE rows (padded), until a larger tile is checked
    plain: bool = False  # batch_invariant=False: one call on the whole batch, whatever the bits

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def place_weights(self, place) -> None:
        """Moves the packed weights our CPU kernels read to ``place(tensor)`` (``common.numerics.native.arena``)."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        x = x.contiguous()
        if self.plain:
            return self.matmul(x)
        if self.exact_tiles:  # every call on exactly ROW_TILE rows: pad, multiply, drop the padding
            padded = pad_rows(x)
            return torch.cat([self.matmul(padded[i:i + ROW_TILE]) for i in range(0, padded.shape[0], ROW_TILE)])[:rows]
        if rows <= self.row_tile:
            return self.matmul(x)
        return torch.cat([self.matmul(x[i:i + self.row_tile]) for i in range(0, rows, self.row_tile)])


class Linear(RowTiled):
    """``x @ weight.T`` in the model dtype; ``weight`` is [out_features, in_features]. ``plain``: the engine runs
    without batch invariance, so torch's own linear on the whole batch (never our kernels)."""

    def __init__(self, weight: torch.Tensor, plain: bool = False):
        self.out_features, self.in_features = weight.shape
        self.nbytes = weight.numel() * weight.element_size()
        self.plain = plain
        self.packed = self.ours = self.weight_t = None
        kernel = None if plain or weight.device.type != "cpu" else \
            native.float32_kernel() if weight.dtype == torch.float32 else native.linear_kernel()
        portable = runs_portable(kernel, weight.device, weight.dtype)
        self.widen = not portable and widens_bf16(weight.device, weight.dtype)
        if portable or (kernel and uses_packed_bf16(weight.device, weight.dtype)):  # ours
            self.kernel_name, self.native_kernels = kernel, native.kernels(native.LINEAR_SOURCE)
            self.kernel_arg = native.LINEAR_KERNELS[kernel]  # linear.cpp's name for it, looked up once
            self.interleave = native.block_interleave(self.kernel_arg, self.out_features)
            self.ours = (self.native_kernels.pack_portable(weight) if portable
                         else self.native_kernels.pack(weight.contiguous(), self.interleave))
        elif self.widen:  # no bfloat16 matmul worth the name here: float32 weights, exact products, one rounding
            self.weight_t = weight.t().float().contiguous()
        elif not uses_packed_bf16(weight.device, weight.dtype):
            self.weight_t = weight.t().contiguous()
        else:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), PACK_HINT)

    def place_weights(self, place) -> None:
        if self.ours is not None:
            self.ours = place(self.ours)

    @property
    def backend(self) -> str:
        if self.ours is not None:
            return f"{self.kernel_name} kernel (stepwise)"
        if self.widen:
            return "torch.mm in float32 (bfloat16 widened: this CPU has no bfloat16 matmul)"
        return "oneDNN prepacked" if self.packed is not None else f"torch.mm on {self.weight_t.device.type}"

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """One kernel call on all of x's rows."""
        if self.ours is not None:
            return self.native_kernels.linear(x, self.ours, None, self.out_features, self.kernel_arg, self.interleave)
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")
        if self.widen:
            return torch.mm(x.float(), self.weight_t).to(x.dtype)
        return torch.mm(x, self.weight_t)


def order_revealing_rows(rows: int, in_features: int, seed: int = 0) -> torch.Tensor:
    """Rows whose products with a weight row partly cancel: large partial sums, small results. A change in
    summation order then changes the rounded result, where plain random rows would mostly hide it."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features, generator=gen)
    large = torch.randint(0, in_features, (rows, 8), generator=gen)
    return x.scatter_(1, large, torch.randn(rows, 8, generator=gen) * 300)


def find_row_tile(linears: list[RowTiled], dtype: torch.dtype, device: torch.device) -> int | None:
    """The largest candidate tile at which every row of every call of up to that many rows has the bits it has
    alone, for every given linear; None if not even the smallest does."""
    largest = max(CANDIDATE_TILES)
    checks = []
    for lin in linears:
        x = order_revealing_rows(largest, lin.in_features).to(device=device, dtype=dtype)
        alone = torch.cat([lin.matmul(x[r:r + 1]) for r in range(largest)])
        checks.append((lin, x, alone))
    for tile in CANDIDATE_TILES:
        counts = sorted({1, 2, 3, 5, 8, 13, tile // 2 - 1, tile // 2, tile // 2 + 1, tile - 1, tile} - {0})
        if all(torch.equal(lin.matmul(x[start:start + m]), alone[start:start + m])
               for lin, x, alone in checks for m in counts for start in (0, largest - m)):
            return tile
    return None


def choose_row_tile(linears: list[RowTiled], dtype: torch.dtype, device: torch.device) -> str:
    """Check (or recall) this machine's row tile for these linears' shapes, apply it to them, say what was chosen."""
    backend = " + ".join(sorted({lin.backend for lin in linears}))
    one_per_shape = list({(type(lin), lin.out_features, lin.in_features): lin for lin in linears}.values())
    key = _machine_key(backend, dtype, device, sorted((type(lin).__name__, lin.out_features, lin.in_features)
                                                      for lin in one_per_shape))
    path = home() / "row_tiles.json"
    cache = json.loads(path.read_text()) if path.exists() else {}
    if key in cache:
        tile, how = cache[key], "cached check"
    else:
        tile, how = find_row_tile(one_per_shape, dtype, device), "checked now"
        cache[key] = tile
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cache, indent=1))
    for lin in linears:
        lin.exact_tiles, lin.row_tile = tile is None, tile or ROW_TILE
    if tile is None:
        return (f"linears: {backend}, {str(dtype).removeprefix('torch.')}: no tile keeps rows' bits in calls of "
                f"varying size on this machine, so every call holds exactly {ROW_TILE} rows ({how})")
    name = str(dtype).removeprefix("torch.")
    return f"linears: {backend}, {name}: calls of up to {tile} rows keep every row's bits ({how})"


def _machine_key(backend: str, dtype: torch.dtype, device: torch.device, shapes: list) -> str:
    cpu = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_identity()
    # Our kernels' source is part of the key: an edited kernel is checked again, never trusted from the cache.
    ours = ""
    if "Triton" in backend:
        ours = hashlib.sha256((Path(__file__).parent / "quant_cuda.py").read_bytes()).hexdigest()[:16]
    elif "(stepwise)" in backend:
        ours = native.source_key(native.LINEAR_SOURCE)
    raw = f"{cpu}|{torch.__version__}|{torch.backends.mkldnn.is_available()}|{backend}|{dtype}|{shapes}|{ours}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]
