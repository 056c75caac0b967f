"""ReferenceLLM: the API every stage shares, errors that fail one request alone, loader errors."""
import json
import shutil

import pytest
import torch

from common import ReferenceLLM, RequestOutput, SamplingParams
from common.loader import load_model


def test_generate_accepts_strings_ids_and_per_prompt_params(tiny_reference):
    ids = tiny_reference.tokenizer.encode("hello there")
    outs = tiny_reference.generate(["hello there", ids], [SamplingParams(temperature=0, max_tokens=5),
                                                          SamplingParams(temperature=0, max_tokens=3)])
    assert all(isinstance(o, RequestOutput) for o in outs)
    assert outs[0].prompt_token_ids == ids and outs[1].prompt_token_ids == ids
    assert outs[1].token_ids == outs[0].token_ids[:3]  # greedy: a prefix of the longer run
    assert [o.finish_reason for o in outs] == ["length", "length"]
    assert outs[0].text == tiny_reference.tokenizer.decode(outs[0].token_ids)
    m = outs[0].metrics
    assert m.time_to_first_token > 0 and m.e2e_latency >= m.time_to_first_token


def test_stop_tokens_and_eos(tiny_reference):
    first = tiny_reference.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=8))[0].token_ids
    out = tiny_reference.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=8,
                                                             stop_token_ids=[first[2]]))[0]
    assert out.token_ids == first[:first.index(first[2]) + 1] and out.finish_reason == "stop"


@pytest.mark.parametrize("prompt,params,message", [
    ("", None, "prompt is empty"),
    ([], None, "prompt is empty"),
    ([1, 2, 99999], None, "outside the vocabulary"),
    ([1] * 2000, None, "max_model_len"),
    ("hi", {"max_tokens": 0}, "max_tokens"),
    ("hi", {"temperature": -0.5}, "temperature"),
    ("hi", {"stop_token_ids": [4096]}, "stop_token_ids"),
    (3.5, None, "string or a list"),
])
def test_a_bad_request_fails_alone(tiny_reference, prompt, params, message):
    good = SamplingParams(temperature=0, max_tokens=4)
    expected = tiny_reference.generate(["a good request"], good)[0].token_ids
    outs = tiny_reference.generate(["a good request", prompt, "a good request"], [good, params, good])
    assert outs[1].finish_reason == "error" and message in outs[1].error
    assert outs[0].token_ids == outs[2].token_ids == expected


def test_max_model_len_ends_with_length(tiny_folder):
    llm = ReferenceLLM(str(tiny_folder), dtype="float32", max_model_len=20)
    out = llm.generate([list(range(20, 35))], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))[0]
    assert len(out.prompt_token_ids) + len(out.token_ids) == 20 and out.finish_reason == "length"


def test_seeded_sampling_repeats(tiny_reference):
    p = SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=3, max_tokens=12)
    a, b = (tiny_reference.generate(["same seed"], p)[0].token_ids for _ in range(2))
    assert a == b


@pytest.fixture
def broken(tmp_path, tiny_folder):
    folder = tmp_path / "ckpt"
    shutil.copytree(tiny_folder, folder)
    return folder


def test_loader_errors(tmp_path, broken):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "nope")
    cfg = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="unsupported architecture"):
        load_model(broken)
    (broken / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 640}))
    with pytest.raises(ValueError, match="mlp.gate_proj.weight.*shape"):
        load_model(broken)
    (broken / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 3}))
    with pytest.raises(KeyError, match="model.layers.2"):
        load_model(broken)


def test_loads_in_each_dtype(tiny_folder):
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert load_model(tiny_folder, dtype).embed.dtype == dtype
    with pytest.raises(ValueError, match="dtype"):
        load_model(tiny_folder, "int3")


def test_first_token_is_the_argmax_of_the_whole_prompt(tiny_reference):
    """An oracle outside the request bookkeeping: the model run directly on every prompt position."""
    from common.kv_cache import ContiguousKVCache

    ref, prompt = tiny_reference, "the whole prompt counts"
    ids = ref.tokenizer.encode(prompt)
    cache = ContiguousKVCache(ref.config, 1, len(ids), ref.dtype, ref.device)
    cache.prepare([0], [len(ids)], [len(ids)])
    logits = ref.model.compute_logits(ref.model.forward(torch.tensor(ids), torch.arange(len(ids)), cache))
    out = ref.generate([prompt], SamplingParams(temperature=0, max_tokens=1))[0]
    assert out.token_ids == [int(torch.argmax(logits[-1]))]
    assert (out.prompt, out.prompt_token_ids) == (prompt, ids)
