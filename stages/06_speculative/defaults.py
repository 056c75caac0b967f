"""What stage 06 runs when told nothing: the speculative_config of its command lines and of the ladder."""
from __future__ import annotations

# Prompt lookup of 1 to 16 tokens, up to 16 drafts but at most 2 x the match (a 1-token match: 2 guesses; a quote
# followed for 8 tokens: 16), a prediction up to 16, fed where the adaptive policy (cost_model.py) finds they pay
# here at this load; disable_by_batch_size (docs/speculative.md): an override.
STAGE_DEFAULT = {"method": "ngram", "num_speculative_tokens": 16, "prompt_lookup_min": 1, "prompt_lookup_max": 16,
                 "prompt_lookup_max_spec_factor": 2.0, "prediction_num_speculative_tokens": 16}
# The same, feeding every draft at every batch size: the table then shows where speculation stops paying (the
# crossover the policy acts on). `python -m stages.06_speculative --draft-always` runs it.
DRAFT_ALWAYS = {**STAGE_DEFAULT, "enable_adaptive_verification": False}
