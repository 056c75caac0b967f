"""The soak: the stage 07 server under hours of mixed open-loop traffic, judged on what must not drift
(``python -m stages.bench.soak``; docs/soak.md). verdict.py holds the judgement, traffic.py the clients,
probe.py what is sampled from the server, __main__.py the run."""
