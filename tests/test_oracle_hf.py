"""The reference against an independent oracle: Hugging Face transformers on the same GGUF file."""
import pytest
import torch

from common import ReferenceLLM, SamplingParams
from common.kv_cache import ContiguousKVCache
from common.paths import smollm2_gguf_path

LOGIT_ATOL = 2e-3  # float32, logits of magnitude ~40; measured max difference is ~1e-4

LONG = " ".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog while counting {i * 7} sheep."
                for i in range(70))
PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Explain TCP in one line."}],
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "SELECT name, COUNT(*) FROM users GROUP BY name HAVING",
    "Les mathématiques sont 😀 très importantes: ∑ x² ≥ 0 — n'est-ce pas?",
    "1, 1, 2, 3, 5, 8, 13, 21,",
    "    \n\n\t  indented   whitespace   runs   \n",
    "Once upon a time",
    "Summarize: " + LONG,
]


@pytest.fixture(scope="module")
def hf_models(real_folder):
    from transformers import AutoModelForCausalLM

    gguf = smollm2_gguf_path()
    from_gguf = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    from_folder = AutoModelForCausalLM.from_pretrained(real_folder, dtype=torch.float32)
    return from_gguf.eval(), from_folder.eval()


@pytest.fixture(scope="module")
def reference():
    return ReferenceLLM("smollm2-135m", dtype="float32")


def prompt_ids(ref, prompt):
    text = ref.tokenizer.apply_chat_template(prompt) if isinstance(prompt, list) else prompt
    return ref.tokenizer.encode(text)


def our_logits(ref, ids):
    cache = ContiguousKVCache(ref.config, 1, len(ids), torch.float32, ref.device)
    cache.prepare([0], [len(ids)], [len(ids)])
    hidden = ref.model.forward(torch.tensor(ids), torch.arange(len(ids)), cache)
    return ref.model.compute_logits(hidden)


def test_prompts_cover_long_context(reference):
    assert max(len(prompt_ids(reference, p)) for p in PROMPTS) > 1000


@pytest.mark.parametrize("i", range(len(PROMPTS)))
def test_full_vocabulary_logits_match_transformers(hf_models, reference, i):
    from_gguf, from_folder = hf_models
    ids = prompt_ids(reference, PROMPTS[i])
    with torch.no_grad():
        expected = from_gguf(torch.tensor([ids])).logits[0].float()
        folder_logits = from_folder(torch.tensor([ids])).logits[0].float()
    # Our prepared folder holds exactly what transformers dequantizes from the GGUF.
    torch.testing.assert_close(folder_logits, expected, rtol=0, atol=1e-5)
    got = our_logits(reference, ids)
    assert got.shape == (len(ids), 49152)
    diff = (got - expected).abs().max().item()
    assert diff < LOGIT_ATOL, f"max |logit difference| {diff:.2e} over {len(ids)} positions"


@pytest.mark.parametrize("i", [0, 3, 6])
def test_greedy_64_tokens_match_transformers(hf_models, reference, i):
    from_gguf, _ = hf_models
    ids = prompt_ids(reference, PROMPTS[i])
    with torch.no_grad():
        hf = from_gguf.generate(torch.tensor([ids]), max_new_tokens=64, min_new_tokens=64, do_sample=False,
                                eos_token_id=None, pad_token_id=2)[0, len(ids):].tolist()
    ours = reference.generate([ids], SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))[0]
    assert ours.token_ids == hf
