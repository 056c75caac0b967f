"""What stage 06 runs when told nothing: the speculative_config of its command lines and of the ladder."""
from __future__ import annotations

# Prompt lookup of 2 to 5 tokens, up to 4 drafts (a prediction, which agrees for long runs: 16), fed where the adaptive
# policy (cost_model.py) finds they pay here at this load; disable_by_batch_size (docs/speculative.md): an override.
STAGE_DEFAULT = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5,
                 "prediction_num_speculative_tokens": 16}
# The same, feeding every draft at every batch size: the table then shows where speculation stops paying (the
# crossover the policy acts on). `python -m stages.06_speculative --draft-always` runs it.
DRAFT_ALWAYS = {**STAGE_DEFAULT, "enable_adaptive_verification": False}
