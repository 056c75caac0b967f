"""python -m stages.04_kernels [--compare] [--kernels] [--fusion] [--gpu-check]: stage 04 (fused kernels: Triton on
CUDA, C++ on CPU), says which path ran; --kernels times each fused op against the reference (the kernel table);
--fusion and --gpu-check hand over to their instruments (stages/bench/fusion_report.py, gpu_check.py)."""
import runpy
import sys

from rich.console import Console

from stages.cli import parser, run
from common.loader import resolve_device

from stages.kernels.model import describe_path

if __name__ == "__main__":
    ap = parser(__doc__)
    ap.add_argument("--kernels", action="store_true",
                    help="each fused op as the reference, textbook torch and the fused kernel, then (on CPU) the "
                         "linears as torch float32, the old torch path and ours: bits and µs per call; and ours at "
                         "1, 2, 5 and 8 rows (a verify step's)")
    ap.add_argument("--gpu-check", action="store_true",
                    help="on a CUDA machine: the kernel tests compiled, timings, every stage's tokens on the GPU")
    ap.add_argument("--fusion", action="store_true", help="tensor ops and bytes moved per decode step, 03 vs 04")
    args = ap.parse_args()
    if args.gpu_check:  # a shortcut to the instrument's own command (stages never import stages.bench)
        sys.argv = [sys.argv[0]]
        runpy.run_module("stages.bench.gpu_check", run_name="__main__")
    if args.fusion:
        sys.argv = [sys.argv[0], "--max-num-seqs", str(args.max_num_seqs)]
        runpy.run_module("stages.bench.fusion_report", run_name="__main__")
    if args.kernels:
        from stages.kernels.kernel_bench import main as kernel_bench
        from common.loader import parse_dtype
        device = resolve_device(args.device).type
        kernel_bench(device, parse_dtype(args.dtype))
        if device == "cpu":
            from stages.kernels.linear_bench import main as linear_bench
            from stages.kernels.rows_bench import main as rows_bench
            linear_bench()
            rows_bench()
        sys.exit(0)
    Console().print(f"[bold]stage 04 path:[/] {describe_path(resolve_device(args.device))}")
    run(["stages.03_paged_kv", "stages.04_kernels"] if args.compare else ["stages.04_kernels"], args)
