"""How `make test` spreads the suite over two workers (pytest-xdist, `-n 2 --dist loadfile`): each test file goes
whole to one worker (but SPLIT's), so its module fixtures (engines, servers, a browser) are built once; and
the files start slowest first, so that no worker is left idle behind one long file at the end (longest first is
the classic rule for splitting jobs between machines). Most slow tests wait on a child process (a build for another
ISA, stage 04 under qemu, a server, Ray) or on I/O, so the other worker has a core to run on meanwhile.

SLOW_FIRST is from `make test-profile` (pytest --durations) on the 2-core AVX-512 EPYC, 2026-12-06, slowest first
(test_soak.py added and test_layout.py moved down on 2026-12-07, from the second run's file totals);
a file not named runs after these, in collection order. Being wrong here costs time, never a check.
"""
SLOW_FIRST = [
    "test_cluster.py",          # Ray Serve replicas (cluster)
    "test_isa_tokens.py",       # stage 04 built for AVX2 in a child process, every precision
    "test_arm64.py",            # stage 04 under qemu-aarch64, twice
    "test_quant_cuda.py",       # the Triton path interpreted on CPU
    "test_oracle_hf.py",        # transformers on the real model
    "test_soak.py",             # a one-minute soak of the stage 07 server (65.5 s of a second run, 2026-12-06)
    "test_quality.py",          # the real model's quality table, by its command
    "test_stages_01_02.py",
    "test_stage_04.py",
    "test_labs.py",
    "test_children.py",
    "test_identical_tokens.py",
    "test_stage_05_streaming.py",
    "test_stage_03_paged.py",
    "test_layout.py",           # the import graph, the house rules, every --help (one process in quick: ~14 s)
    "test_peers.py",
    "test_edge.py",
    "test_ablation.py",
    "test_multi_token_steps.py",
    "test_server_shutdown.py",
    "test_native_linear.py",
    "test_kernels.py",
    "test_parallel_sampling.py",
]
# Files whose tests go to the workers one by one, not whole: each test is minutes of its own child process (stage
# 04 under qemu, built by another compiler) and shares nothing but the x86 oracle, so the two can run side by side
# instead of one after the other on one worker.
SPLIT = ("test_arm64.py",)


def scheduler(config, log):
    """`--dist loadfile` as pytest-xdist does it, but for SPLIT's files, whose tests are scheduled one by one."""
    from xdist.scheduler import LoadFileScheduling  # imported here: the aarch64 Python runs some tests without xdist

    class FilesButSplit(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return nodeid if path.rsplit("/", 1)[-1] in SPLIT else path

    return FilesButSplit(config, log)


def slow_first(items: list) -> None:
    """Reorder collected ``items`` in place: SLOW_FIRST's files first, in its order; the rest as collected."""
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order is kept


def file_seconds(reports) -> list[tuple[str, float]]:
    """Each test file's seconds (set-up, call and tear-down of its tests, module fixtures included), slowest first:
    what SLOW_FIRST orders by, since a file runs whole on one worker."""
    totals: dict[str, float] = {}
    for report in reports:
        name = report.nodeid.split("::", 1)[0]
        totals[name] = totals.get(name, 0.0) + getattr(report, "duration", 0.0)
    return sorted(totals.items(), key=lambda item: -item[1])
