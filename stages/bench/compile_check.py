"""Build every kernel for an NVIDIA sm_90 (H100/H200) target without a GPU.

The Triton interpreter runs kernels as NumPy and misses what only the GPU compiler
rejects (a ``tl.dot`` tile under 16, a bad layout, a type the hardware lacks).
``triton.compile`` with a CUDA ``GPUTarget`` runs the real pipeline (Triton IR, GPU
IR, LLVM, PTX, cubin with the bundled ptxas) on the CPU, so CI catches those too.
"""
from __future__ import annotations

import importlib

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

from common.numerics import quant_cuda as qc

ew = importlib.import_module("stages.kernels.elementwise")
pa = importlib.import_module("stages.kernels.paged_attention")

SM90 = GPUTarget("cuda", 90, 32)


def kernel_specs(dtype: str = "bf16", head_dim: int = 64, group: int = 3, kv_heads: int = 3,
                 hidden: int = 576, ffn: int = 1536, block_size: int = 16) -> dict:
    """Each kernel with the argument types and compile-time constants the engine launches it with."""
    p = f"*{dtype}"
    return {
        "add_rms_norm": (ew._add_rms_norm_kernel, {"x_ptr": p, "res_ptr": p, "w_ptr": p, "out_ptr": p,
                         "n_cols": "i32", "eps": "fp32"},
                         {"HAS_RESIDUAL": True, "BLOCK": triton.next_power_of_2(hidden), "LANES": ew.LANES}),
        "rope": (ew._rope_kernel, {"x_ptr": p, "cos_ptr": "*fp32", "sin_ptr": "*fp32",
                 "n_heads": "i32", "stride_tok": "i32", "stride_head": "i32"},
                 {"HALF": head_dim // 2, "BLOCK_H": triton.next_power_of_2(group * kv_heads),
                  "BLOCK_D": triton.next_power_of_2(head_dim // 2)}),
        "swiglu": (ew._swiglu_kernel, {"gate_up_ptr": p, "out_ptr": p, "n_cols": "i32"},
                   {"BLOCK": min(1024, triton.next_power_of_2(ffn)), "LIBDEVICE_EXP": True}),
        "store_kv": (ew._store_kv_kernel, {"k_ptr": p, "v_ptr": p, "k_cache_ptr": p, "v_cache_ptr": p,
                     "rows_ptr": "*i64"}, {"HEAD_DIM": head_dim, "BLOCK": triton.next_power_of_2(head_dim)}),
        "paged_decode_split": (pa._split_kernel, {
            "q_ptr": p, "k_cache_ptr": p, "v_cache_ptr": p, "tables_ptr": "*i32", "ctx_ptr": "*i32",
            "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "scale": "fp32", "max_blocks": "i32", "max_splits": "i32"},
            {"GROUP": group, "NUM_KV_HEADS": kv_heads, "HEAD_DIM": head_dim, "BLOCK_SIZE": block_size,
             "SPLIT": pa.SPLIT_SIZE, "BLOCK_N": pa.BLOCK_N, "BLOCK_G": pa.BLOCK_G,
             "BLOCK_D": max(16, triton.next_power_of_2(head_dim))}),
        "paged_decode_merge": (pa._merge_kernel, {"part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "out_ptr": p},
                               {"MAX_SPLITS": 8, "HEAD_DIM": head_dim,
                                "BLOCK_D": max(16, triton.next_power_of_2(head_dim))}),
        # common's quantized linears (every stage's on CUDA), as common.numerics.quant_cuda launches them on a GPU
        "int8_linear": (qc._int8_linear_kernel, {"x_ptr": p, "q_ptr": "*i8", "scale_ptr": "*fp32", "out_ptr": p,
                        "M": "i32", "N": "i32"},
                        {"K": hidden, "BLOCK_M": qc.BLOCK_M, "BLOCK_N": qc.BLOCK_N, "BLOCK_K": qc.BLOCK_K,
                         "DOT_IN_FP32": False}),
        "int4_linear": (qc._int4_linear_kernel, {"x_ptr": p, "nibbles_ptr": "*u8", "d_ptr": "*fp16", "m_ptr": "*fp16",
                        "out_ptr": p, "M": "i32", "N": "i32"},
                        {"K": hidden, "BLOCK_M": qc.BLOCK_M, "BLOCK_N": qc.BLOCK_N, "DOT_IN_FP32": False}),
    }


def compile_for(kernel, signature: dict, constexprs: dict, target: GPUTarget = SM90):
    # Under TRITON_INTERPRET=1 the decorator returned an interpreter wrapper; compile the function itself.
    fn = kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn)
    signature = {**signature, **{name: "constexpr" for name in constexprs}}
    signature = {name: signature[name] for name in fn.arg_names}
    return triton.compile(ASTSource(fn, signature, constexprs=constexprs), target=target, options=dict(ew.EXACT))


def compile_all(**shape) -> dict[str, int]:
    """Compile every kernel; return the size of each cubin in bytes."""
    return {name: len(compile_for(*spec).asm["cubin"]) for name, spec in kernel_specs(**shape).items()}


if __name__ == "__main__":
    import argparse
    argparse.ArgumentParser(description="compile every stage-04 and quantized-linear kernel for sm_90, no GPU "
                                        "needed, and print each cubin's size").parse_args()
    for name, size in compile_all().items():
        print(f"{name}: {size:,} bytes of sm_90 cubin")
