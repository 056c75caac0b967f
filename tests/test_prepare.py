"""common.prepare: GGUF -> Hugging Face checkpoint folder, tiny model, atomic and idempotent writes."""
import json

import numpy as np
import pytest
import torch
from safetensors import safe_open

from common.gguf_convert import prepare_smollm2, unpermute_qk, write_atomically
from common.prepare import prepare_tiny


def llama_cpp_permute(w, n_head):
    """llama.cpp's convert script: interleave the two rotary halves of each head's rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("n_head", [1, 3, 9])
def test_unpermute_inverts_llama_cpp_permute(n_head):
    w = np.random.default_rng(0).standard_normal((n_head * 64, 40)).astype(np.float32)
    np.testing.assert_array_equal(unpermute_qk(llama_cpp_permute(w, n_head), n_head), w)


def test_tiny_is_idempotent_and_loads_in_transformers(tmp_path):
    from transformers import LlamaForCausalLM

    folder = prepare_tiny(tmp_path / "tiny")
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert prepare_tiny(tmp_path / "tiny") == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp, "second run must be a no-op"
    hf = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert hf.config.num_key_value_heads < hf.config.num_attention_heads  # GQA


def test_interrupted_write_leaves_nothing(tmp_path):
    def boom(tmp):
        (tmp / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomically(tmp_path / "ckpt", boom)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("dtype,torch_dtype", [("float32", torch.float32), ("bfloat16", torch.bfloat16),
                                               ("float16", torch.float16)])
@pytest.mark.real_model
def test_smollm2_in_each_dtype(tmp_path, dtype, torch_dtype, real_folder):
    folder = prepare_smollm2(tmp_path / dtype, dtype=dtype, quiet=True)
    cfg = json.loads((folder / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["vocab_size"]) == (30, 576, 9, 3, 49152)
    with safe_open(folder / "model.safetensors", "pt") as f, safe_open(real_folder / "model.safetensors", "pt") as ref:
        assert len(list(f.keys())) == 272
        name = "model.layers.7.self_attn.q_proj.weight"
        t = f.get_tensor(name)
        assert t.dtype == torch_dtype
        # The same numbers as the float32 checkpoint, rounded once to this dtype.
        torch.testing.assert_close(t, ref.get_tensor(name).to(torch_dtype), rtol=0, atol=0)


def test_tiny_model_samples_with_real_entropy(tiny_reference):
    """Seeded tests on the tiny model must check sampling, not greedy decoding in disguise: at temperature 1,
    different seeds give different continuations, and the most likely token is typically far from certain."""
    from common import SamplingParams
    from common.kv_cache import ContiguousKVCache

    ref = tiny_reference
    prompts = [[5, 6, 7], [100, 200, 300], list(range(40, 70)), [900, 3], [17, 99, 5, 301], [11] * 20, [512, 513]]
    varied = 0
    for prompt in prompts:
        outs = ref.generate([prompt] * 6, [SamplingParams(temperature=1.0, seed=s, max_tokens=6, ignore_eos=True)
                                           for s in range(6)])
        varied += len({tuple(o.token_ids) for o in outs}) >= 4
    assert varied >= 6, f"only {varied} of {len(prompts)} prompts give >= 4 distinct continuations over 6 seeds"
    top1 = []
    for prompt in prompts:
        cache = ContiguousKVCache(ref.config, 1, len(prompt), ref.dtype, ref.device)
        cache.prepare([0], [len(prompt)], [len(prompt)])
        hidden = ref.model.forward(torch.tensor(prompt), torch.arange(len(prompt)), cache)
        top1 += torch.softmax(ref.model.compute_logits(hidden).float(), -1).max(-1).values.tolist()
    top1.sort()
    assert top1[len(top1) // 2] < 0.5 and top1[int(0.9 * len(top1))] < 0.95, top1
    greedy = ref.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    assert len({tuple(g.token_ids) for g in greedy}) == len(prompts)  # and the output depends on the prompt
