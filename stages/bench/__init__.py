"""The measuring instruments, not part of any engine (README.md here maps them): the ladder (`python -m stages`)
with its baselines and peers, the load benchmark (`python -m stages.bench.load`), the roofline, quality, edge and
invariance lessons, the fusion report and the GPU and compile checks."""
