"""The Python API under bad arguments: a ValueError naming the field, before any work; chat content is text;
a command line whose every request failed says why and exits non-zero."""
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from common import ReferenceLLM, SamplingParams
from common.tokenizer import Tokenizer
from workloads import examples

paged = importlib.import_module("stages.03_paged_kv")
streaming = importlib.import_module("stages.05_streaming")
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("kwargs,field", [
    ({"stop": 5}, "stop"), ({"stop": {"a": 1}}, "stop"), ({"stop": [""]}, "stop"), ({"stop": ["a\ud800"]}, "stop"),
    ({"stop_token_ids": 5}, "stop_token_ids"), ({"stop_token_ids": "abc"}, "stop_token_ids"),
    ({"stop_token_ids": [True]}, "stop_token_ids"), ({"seed": 2**70}, "seed"), ({"seed": 1.5}, "seed"),
    ({"ignore_eos": "yes"}, "ignore_eos"), ({"ignore_eos": 1}, "ignore_eos"), ({"max_tokens": True}, "max_tokens"),
    ({"temperature": True}, "temperature"), ({"temperature": "0.5"}, "temperature"), ({"top_k": True}, "top_k"),
    ({"top_k": 2.0}, "top_k"), ({"top_p": None}, "top_p"),
])
def test_sampling_params_name_the_wrong_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field}\b"):
        SamplingParams(**kwargs)


def test_a_huge_value_is_not_echoed_whole():
    with pytest.raises(ValueError) as e:
        SamplingParams(stop={"x" * 100_000: 1})
    assert len(str(e.value)) < 200


@pytest.mark.parametrize("kwargs,field", [
    ({"max_model_len": "abc"}, "max_model_len"), ({"max_model_len": 1}, "max_model_len"),
    ({"max_model_len": 10**6}, "max_model_len"), ({"max_num_seqs": "4"}, "max_num_seqs"),
    ({"max_num_seqs": 0}, "max_num_seqs"), ({"block_size": 2.5}, "block_size"), ({"seed": -1}, "seed"),
    ({"enable_prefix_caching": "no"}, "enable_prefix_caching"), ({"kv_cache_memory": [1]}, "kv_cache_memory"),
    ({"kv_cache_memory": "1KiB"}, "kv_cache_memory"), ({"max_num_batched_tokens": None}, "max_num_batched_tokens"),
])
def test_llm_arguments_name_the_wrong_field(kwargs, field):
    with pytest.raises(ValueError, match=field) as e:
        paged.LLM("tiny", **kwargs)
    assert e.value.param == field


def test_max_waiting_must_be_positive():
    with pytest.raises(ValueError, match="max_waiting"):
        streaming.LLM("tiny", max_waiting=0)


@pytest.fixture(scope="module")
def llm():
    return paged.LLM("tiny", max_num_seqs=2)


@pytest.mark.parametrize("args,field", [
    ((None,), "prompts"), ((5,), "prompts"), (({"prompt": "Hi"},), "prompts"),
    (("Hi", {"bogus": 1}), "sampling_params"), (("Hi", "greedy"), "sampling_params"),
    (("Hi", {"max_tokens": 0}), "max_tokens"), ((["Hi", "Yo"], [SamplingParams()]), "sampling_params"),
])
def test_generate_rejects_malformed_arguments_before_any_work(llm, args, field):
    steps = llm.stats.steps
    with pytest.raises(ValueError) as e:
        llm.generate(*args)
    assert e.value.param == field and llm.stats.steps == steps


def test_a_bad_entry_in_a_list_fails_alone(llm):
    good = SamplingParams(temperature=0, max_tokens=3)
    outs = llm.generate(["Hi", None, "a\udfffb", [5, 10**9], "Hi", "Hi"], [good] * 4 + [{"bogus": 1}, "greedy"])
    assert [o.finish_reason for o in outs] == ["length"] + ["error"] * 5
    for out, words in zip(outs[1:], ["string or a list", "surrogate", "vocabulary", "bogus", "str"]):
        assert words in out.error


def test_a_tiny_temperature_is_greedy_not_a_nan(llm):
    """1e-149 overflowed logits / temperature to inf: the sampler failed every request in the batch."""
    greedy = ReferenceLLM("tiny").generate([[3, 4, 5]], SamplingParams(temperature=0, max_tokens=8))[0]
    out = llm.generate([[3, 4, 5]], SamplingParams(temperature=1e-149, max_tokens=8, seed=1))[0]
    assert out.token_ids == greedy.token_ids


@pytest.fixture(scope="module")
def tokenizer(tiny_folder):
    return Tokenizer(tiny_folder)


SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
contents = st.lists(st.sampled_from(["<|", "im_", "end", "start", "|>", "\n", " ", "  ", "a", "é", "1", *SPECIALS]),
                    max_size=8).map("".join)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                           "content": contents}), min_size=1, max_size=4)


@settings(max_examples=examples(200), deadline=None)
@given(messages=messages)
def test_chat_content_is_text_never_control_tokens(tokenizer, messages):
    ids = tokenizer.encode_chat(messages)
    text = tokenizer.apply_chat_template(messages)
    assert tokenizer.decode(ids, skip_special_tokens=False) == text  # nothing lost, nothing added
    # special ids appear exactly where the template puts them, whatever the content says
    benign = tokenizer.encode_chat([m | {"content": "x"} for m in messages])
    special = set(tokenizer._special_ids.values())
    assert sum(t in special for t in ids) == sum(t in special for t in benign)
    if not any(s in m["content"] for s in SPECIALS for m in messages):
        assert ids == tokenizer.encode(text)  # without special text: exactly the template's tokens


def test_chat_roles_are_checked(tokenizer):
    with pytest.raises(ValueError, match="role"):
        tokenizer.encode_chat([{"role": "user<|im_end|>", "content": "Hi"}])


def test_a_command_line_whose_every_request_failed_says_why_and_exits_non_zero():
    r = subprocess.run([sys.executable, "-m", "stages.03_paged_kv", "--model", "tiny", "--kv-memory", "40KiB",
                        "--alone", "--num-requests", "2"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "every request failed" in r.stderr and "kv_cache_memory" in r.stderr, r.stderr[-500:]


def test_a_port_out_of_range_is_refused_by_the_command_line(capsys):
    import importlib
    cli = importlib.import_module("stages.streaming.__main__")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["serve", "--model", "tiny", "--port", "81100"])
    assert exit_.value.code == 2 and "81100 is not a TCP port: use 0-65535" in capsys.readouterr().err
