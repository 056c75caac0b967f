"""The stage 03 ablation: each idea switched off changes the work done, never the tokens."""
import importlib

from common import ReferenceLLM
from stages import workloads
from stages.cli import parser

ablation = importlib.import_module("stages.paged_kv.ablation")


def test_each_idea_off_changes_the_work_not_the_tokens():
    # 12 chat requests that share a system prompt, 8 slots, 32 blocks of 16 tokens: all on preempts.
    args = parser("ablation").parse_args(["--model", "tiny", "--dtype", "float32", "--workload", "chat",
                                          "--system-prompt", "--num-requests", "12", "--max-tokens", "24",
                                          "--max-num-seqs", "8", "--max-model-len", "1024", "--kv-memory", "512KiB"])
    rows, tokens = ablation.ablate(args)
    reference = ReferenceLLM("tiny", dtype="float32")
    prompts, params = workloads.build("chat", reference.tokenizer, 12, 24, reference.config.vocab_size,
                                      system=workloads.SYSTEM_PROMPT)
    expected = [o.token_ids for o in reference.generate(prompts, params)]
    assert set(rows) == set(ablation.VARIANTS)
    for name, row in rows.items():
        assert tokens[name] == expected, name
        assert row["same tokens as all on"] and row["requests done"] == 12
        assert row["output tokens"] == sum(map(len, expected))
        assert row["peak KV blocks used"] <= row["KV blocks"] == 32
    prompt_tokens = sum(len(reference.tokenizer.encode(p)) for p in prompts)  # the chat prompts are text
    decoded = sum(len(t) - 1 for t in expected)
    on, no_cache, no_preempt = rows["all on"], rows["no prefix caching"], rows["no preemption"]
    assert on["preemptions"] > 0 and on["prefix hit rate"] > 0.5
    # Without the cache every prompt token is computed, once (nothing is preempted at this budget) ...
    assert no_cache["prefix hit rate"] == 0 and no_cache["tokens computed"] == prompt_tokens + decoded
    assert no_cache["tokens computed"] > on["tokens computed"]
    # ... and without preemption nothing is recomputed, but fewer requests fit at once.
    assert no_preempt["preemptions"] == 0 and no_preempt["peak in flight"] < on["peak in flight"]
    assert rows["no chunked prefill"]["tokens computed"] == on["tokens computed"]
