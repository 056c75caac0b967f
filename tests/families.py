"""Small random-weight checkpoints of each supported family, written by transformers itself (its
``...ForCausalLM`` class and ``save_pretrained``, so config.json is spelled as transformers 5 spells it),
with the tiny model's 1,024-token tokenizer."""
import shutil
from pathlib import Path

import torch

# name -> (transformers config class, its keyword arguments). Between them: head_dim 64, 128 (Qwen3: not
# hidden / heads) and 32, GQA ratios 4, 2, 1 and 4, Llama 3 rope scaling, q/k/v bias, q/k norm, tied and untied.
FAMILIES = {
    "llama3": ("LlamaConfig", dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, head_dim=64,
                                   num_key_value_heads=1, rope_theta=500000.0, tie_word_embeddings=False,
                                   rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                                   eos_token_id=[2, 7])),
    "qwen2": ("Qwen2Config", dict(hidden_size=128, intermediate_size=384, num_attention_heads=4,
                                  num_key_value_heads=2, rope_theta=1000000.0, tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(hidden_size=128, intermediate_size=384, num_attention_heads=2, head_dim=128,
                                  num_key_value_heads=2, rope_theta=1000000.0, tie_word_embeddings=True)),
    "mistral": ("MistralConfig", dict(hidden_size=128, intermediate_size=256, num_attention_heads=8, head_dim=32,
                                      num_key_value_heads=2, sliding_window=512, tie_word_embeddings=False)),
}
VOCAB = 1024


def write_family(name: str, folder: Path, tiny_folder: Path, seed: int = 0) -> Path:
    """A 2-layer checkpoint of family ``name`` in ``folder`` (float32), every weight random (biases and norms too,
    so that a bias or norm left out shows)."""
    import transformers

    cls_name, kw = FAMILIES[name]
    config = getattr(transformers, cls_name)(num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=1024,
                                             rms_norm_eps=1e-5, bos_token_id=1, pad_token_id=2,
                                             **{"eos_token_id": 2, **kw})
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name.replace("Config", "ForCausalLM"))(config).float().eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif pname.endswith("bias"):
                p.copy_(0.2 * torch.randn_like(p))
            elif "embed" in pname:
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * p.shape[-1] ** -0.5)
    model.save_pretrained(folder)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tiny_folder) / f, folder / f)
    return folder
