"""python -m stages.04_kernels [--compare] [--kernels]: stage 04 (fused kernels: Triton on CUDA, C++ on CPU),
says which path ran; --kernels times each fused op against the reference (the kernel table)."""
import sys

from rich.console import Console

from stages.cli import parser, run
from common.loader import resolve_device

from .model import describe_path

if __name__ == "__main__":
    ap = parser(__doc__)
    ap.add_argument("--kernels", action="store_true",
                    help="each fused op as the reference, textbook torch and the fused kernel: bits and µs per call")
    args = ap.parse_args()
    if args.kernels:
        from .kernel_bench import main as kernel_bench
        from common.loader import parse_dtype
        kernel_bench(resolve_device(args.device).type, parse_dtype(args.dtype))
        sys.exit(0)
    Console().print(f"[bold]stage 04 path:[/] {describe_path(resolve_device(args.device))}")
    run(["stages.03_paged_kv", "stages.04_kernels"] if args.compare else ["stages.04_kernels"], args)
