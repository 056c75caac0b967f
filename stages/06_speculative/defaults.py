"""What stage 06 runs when told nothing: the speculative_config of its command lines and of the ladder."""
from __future__ import annotations

# What the engine, its server and the ladder run when told nothing: prompt lookup of 2 to 5 tokens, 4 drafts, and no
# drafts while more than 4 requests run. A verify pass's extra rows are not free on a CPU: on the 2-core AVX2 EPYC
# (docs/speculative.md) extraction stopped paying at 4 in flight (1.00x) and chat at 2 (0.94x); past 4, speculation
# lost on every workload measured, and at 16 in flight it made stage 06 slower than stage 05 in the ladder.
STAGE_DEFAULT = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5,
                 "disable_by_batch_size": 4}
# What `python -m stages.06_speculative` compares by default: the same, drafting at every batch size, so that its
# table shows where speculation stops paying (the crossover the engine's default acts on).
COMPARE_DEFAULT = {key: value for key, value in STAGE_DEFAULT.items() if key != "disable_by_batch_size"}
