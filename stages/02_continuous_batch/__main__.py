"""python -m stages.02_continuous_batch [--toy] [--workload chat|random|toy] [--num-requests N] ..."""
from stages.cli import parser, run

STAGES = ["stages.01_static_batch", "stages.02_continuous_batch"]

if __name__ == "__main__":
    args = parser(__doc__).parse_args()
    run(STAGES if args.toy or args.compare else ["stages.02_continuous_batch"], args)
