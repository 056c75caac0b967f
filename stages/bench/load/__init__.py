"""The serving benchmark: streaming clients against stage 05's server, measured as `vllm bench serve` measures
(``python -m stages.bench.load``). ``client.py`` sends the requests and records their times, ``metrics.py`` turns
the records into vLLM's figures, ``args.py`` reads its options, ``aiperf.py`` runs NVIDIA's aiperf with the same
settings and ``proc_cpu.py`` counts each client's CPU."""
