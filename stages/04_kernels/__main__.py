"""python -m stages.04_kernels [--compare] [--gpu-check]: stage 04 (fused kernels: Triton on CUDA, C++ on CPU),
says which path ran."""
import importlib
import sys

from rich.console import Console

from common.tools.cli import parser, run
from common.loader import resolve_device

from .model import describe_path

if __name__ == "__main__":
    ap = parser(__doc__)
    ap.add_argument("--gpu-check", action="store_true", help="kernel tests, timings and stage 03 vs 04 on CUDA")
    ap.add_argument("--fusion", action="store_true", help="tensor ops and bytes moved per decode step, 03 vs 04")
    args = ap.parse_args()
    if args.gpu_check:
        sys.exit(importlib.import_module("stages.04_kernels.gpu_check").main())
    if args.fusion:
        sys.exit(importlib.import_module("stages.04_kernels.fusion_report").main(args.max_num_seqs))
    Console().print(f"[bold]stage 04 path:[/] {describe_path(resolve_device(args.device))}")
    run(["stages.03_paged_kv", "stages.04_kernels"] if args.compare else ["stages.04_kernels"], args)
