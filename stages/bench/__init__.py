"""Measuring the stages (not part of any engine): the ladder (`python -m stages`), its baselines (HF
`generate`, llama.cpp), its peers (vLLM's CPU backend, llama.cpp batched, HF continuous batching: peers.py),
its verdict and plot, and the price-of-invariance lesson (`python -m stages.bench.invariance`)."""
