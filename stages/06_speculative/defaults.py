"""What stage 06 runs when told nothing: the speculative_config of its command lines and of the ladder."""
from __future__ import annotations

# Prompt lookup of 1 to 16 tokens, 16 drafts at most 2 x the match (1 matched: 2; a quote 8 long: 16), a prediction
# 16, fed where the adaptive policy (cost_model.py) finds they pay; disable_by_batch_size: an override.
STAGE_DEFAULT = {"method": "ngram", "num_speculative_tokens": 16, "prompt_lookup_min": 1, "prompt_lookup_max": 16,
                 "prompt_lookup_spec_factor": 2.0, "prediction_num_speculative_tokens": 16}
# The same, every draft fed at every batch size (`--draft-always`): the table shows where speculation stops paying.
DRAFT_ALWAYS = {**STAGE_DEFAULT, "enable_adaptive_verification": False}
