"""python -m stages.03_paged_kv: stage 02 and stage 03 side by side under one KV budget.

Add --alone to run stage 03 only, --toy for the 8-request toy run, --ablate to run stage 03
four times, with prefix caching, chunked prefill and preemption each switched off in turn."""
from rich.console import Console

from stages.cli import parser, run

from stages.paged_kv.ablation import ablate, print_ablation
from stages.paged_kv.capacity import print_capacity

if __name__ == "__main__":
    ap = parser(__doc__)
    ap.add_argument("--alone", action="store_true", help="run stage 03 only")
    ap.add_argument("--ablate", action="store_true", help="stage 03 with each of its ideas switched off in turn")
    # A budget where stage 02 fits two 1,024-token slots and stage 03 runs out of blocks now and then.
    ap.set_defaults(kv_memory="48MiB", max_model_len=1024, max_num_seqs=32, num_requests=32, system_prompt=True)
    args = ap.parse_args()
    console = Console()
    if not args.toy:
        print_capacity(console, args)
    if args.ablate:
        rows, _ = ablate(args, console)
        print_ablation(console, rows, f"stage 03 ablation: {args.workload} workload, {args.num_requests} requests, "
                                      f"{args.model}, {args.dtype}, KV budget {args.kv_memory}")
    else:
        run(["stages.03_paged_kv"] if args.alone else ["stages.02_continuous_batch", "stages.03_paged_kv"], args)
