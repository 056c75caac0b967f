"""Llama 3, Qwen2, Qwen3 and Mistral checkpoints, written in the test by transformers itself: stepwise's float32
logits and greedy tokens against transformers' on the same folder, identical tokens across every stage, and the
config / checkpoint errors a learner's folder can meet."""
import json
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from safetensors.torch import load_file, save_file

from common import ReferenceLLM, SamplingParams
from common.config import ModelConfig, UnsupportedConfig
from common.kv_cache import ContiguousKVCache
from families import FAMILIES, write_family
from test_identical_tokens import STAGES, run_in_order
from workloads import checked_steps, examples, sampling_params

LOGIT_ATOL = 1e-3  # float32; measured differences are 3e-6 to 2e-5 on logits of magnitude 4-40
DECODE_STEPS = 16
PROMPT = [5, 900, 17, 333, 42, 1000, 8, 64, 512, 77, 3, 250] * 3


@pytest.fixture(scope="session")
def family_folders(tmp_path_factory, tiny_folder):
    root = tmp_path_factory.mktemp("families")
    return {name: write_family(name, root / name, tiny_folder) for name in FAMILIES}


@pytest.fixture(scope="session", params=list(FAMILIES))
def family(request, family_folders):
    return request.param, family_folders[request.param]


def copy_folder(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def our_decode_logits(ref, tokens: list[int], prompt_len: int) -> torch.Tensor:
    """Logits for every position: the prompt in one prefill, then one token a step through the KV cache."""
    model = ref.model
    cache = ContiguousKVCache(model.config, 1, len(tokens), torch.float32, model.device)
    cache.prepare([0], [prompt_len], [prompt_len])
    rows = [model.compute_logits(model.forward(torch.tensor(tokens[:prompt_len]), torch.arange(prompt_len), cache))]
    for pos in range(prompt_len, len(tokens)):
        cache.prepare([0], [1], [pos + 1])
        rows.append(model.compute_logits(model.forward(torch.tensor(tokens[pos:pos + 1]), torch.tensor([pos]), cache)))
    return torch.cat(rows)


def test_logits_and_greedy_tokens_match_transformers(family):
    """The silent wrong answer of transformers 5's ``rope_parameters`` (Llama 3: rope type llama3, theta 500,000)
    included: the folder is exactly what ``save_pretrained`` wrote."""
    import transformers

    name, folder = family
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        full = hf.generate(torch.tensor([PROMPT]), max_new_tokens=DECODE_STEPS, do_sample=False, eos_token_id=None,
                           pad_token_id=2)[0].tolist()
        expected = hf(torch.tensor([full])).logits[0]
    ref = ReferenceLLM(str(folder), dtype="float32")
    got = our_decode_logits(ref, full, len(PROMPT))
    diff = (got - expected).abs().max().item()
    assert diff < LOGIT_ATOL, f"{name}: max |logit difference| {diff:.2e}"
    out = ref.generate([PROMPT], SamplingParams(temperature=0, max_tokens=DECODE_STEPS, ignore_eos=True))[0]
    assert out.token_ids == full[len(PROMPT):], name


def test_config_reads_what_the_family_declares(family_folders):
    llama, qwen2, qwen3, mistral = (ModelConfig.from_folder(family_folders[n]) for n in FAMILIES)
    assert (llama.rope_type, llama.rope_theta, llama.num_attention_heads // llama.num_key_value_heads) == \
        ("llama3", 500000.0, 4)
    assert not llama.tie_word_embeddings and set(llama.eos_token_ids) == {2, 7}  # config.json's list
    assert qwen2.qkv_bias and not qwen2.o_bias and qwen2.tie_word_embeddings and qwen2.rope_theta == 1e6
    assert qwen3.qk_norm and qwen3.head_dim == 128 != qwen3.hidden_size // qwen3.num_attention_heads
    assert mistral.sliding_window == 512 and mistral.max_position_embeddings == 512  # capped to the window


def test_transformers_4_spelling_reads_the_same(family_folders, tmp_path):
    """rope_theta / rope_scaling at the top level (transformers 4.x) give the config rope_parameters gives."""
    folder = copy_folder(family_folders["llama3"], tmp_path / "old")
    raw = json.loads((folder / "config.json").read_text())
    rope = raw.pop("rope_parameters")
    raw["rope_theta"] = rope.pop("rope_theta")
    raw["rope_scaling"] = rope
    (folder / "config.json").write_text(json.dumps(raw))
    assert ModelConfig.from_folder(folder) == ModelConfig.from_folder(family_folders["llama3"])


def mutate(raw: dict, change: dict) -> dict:
    raw = json.loads(json.dumps(raw))
    for key, value in change.items():
        if key.startswith("rope."):
            raw["rope_parameters"][key[5:]] = value
        elif value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    return raw


@pytest.mark.parametrize("change, message", [
    ({"rope.rope_type": "yarn"}, "rope_type='yarn' is not supported"),
    ({"rope.rope_type": "dynamic"}, "depend on the current sequence length"),
    ({"rope.low_freq_factor": None}, "lacks low_freq_factor"),
    ({"rope.partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5"),
    ({"rope_theta": 10000.0}, "rope_theta=10000.0 contradicts"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "contradicts rope_scaling"),
    ({"attn_logit_softcapping": 50.0}, "field attn_logit_softcapping=50.0 is not understood"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"mlp_bias": True}, "mlp_bias=True"),
    ({"model_type": "gemma2"}, "model_type='gemma2'"),
    ({"num_key_value_heads": 3}, "num_key_value_heads=3 does not divide"),
])
def test_a_config_it_does_not_understand_is_refused(family_folders, change, message):
    raw = json.loads((family_folders["llama3"] / "config.json").read_text())
    if change.get("rope.low_freq_factor", 0) is None:
        raw["rope_parameters"].pop("low_freq_factor")
        change = {}
    with pytest.raises(UnsupportedConfig, match=__import__("re").escape(message)):
        ModelConfig.from_dict(mutate(raw, change))


@pytest.mark.parametrize("damage, message", [
    ("drop q_norm", "'model.layers.1.self_attn.q_norm.weight' is missing"),
    ("wrong shape", "config.json implies"),
    ("stray bias", "implies no such tensor"),
])
def test_a_checkpoint_that_contradicts_its_config_is_refused(family_folders, tmp_path, damage, message):
    folder = copy_folder(family_folders["qwen3"], tmp_path / "bad")
    weights = load_file(folder / "model.safetensors")
    if damage == "drop q_norm":
        del weights["model.layers.1.self_attn.q_norm.weight"]
    elif damage == "wrong shape":
        raw = json.loads((folder / "config.json").read_text())
        raw["intermediate_size"] += 16
        (folder / "config.json").write_text(json.dumps(raw))
    else:
        weights["model.layers.0.self_attn.o_proj.bias"] = torch.zeros(128)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises((KeyError, ValueError), match=message):
        ReferenceLLM(str(folder), dtype="float32")


def test_every_eos_id_of_config_and_generation_config_ends_a_request(family_folders, tmp_path):
    """Llama 3 ends with any of several ids: one added in generation_config.json stops greedy decoding there."""
    folder = copy_folder(family_folders["llama3"], tmp_path / "eos")
    free = ReferenceLLM(str(folder), dtype="float32").generate(
        [PROMPT], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0].token_ids
    stop = next(t for i, t in enumerate(free) if i >= 2 and t not in free[:i] and t not in (2, 7))
    gen = json.loads((folder / "generation_config.json").read_text())
    gen["eos_token_id"] = [2, stop]
    (folder / "generation_config.json").write_text(json.dumps(gen))
    for llm in (ReferenceLLM(str(folder), dtype="float32"),
                __import__("stages").paged_kv.LLM(str(folder), dtype="float32", max_num_seqs=2)):
        out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=12))[0]
        assert (out.token_ids, out.finish_reason) == (free[:free.index(stop) + 1], "stop")


def test_the_folders_own_chat_template(family_folders, tmp_path):
    """chat_template.jinja (transformers 5's file) is the template; a folder without one says so."""
    folder = copy_folder(family_folders["qwen2"], tmp_path / "chat")
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    from common.tokenizer import Tokenizer
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer(folder).apply_chat_template([{"role": "user", "content": "hi"}])
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m['role'] | upper }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}")
    tok = Tokenizer(folder)
    messages = [{"role": "user", "content": "hi <|im_end|>"}]
    assert tok.apply_chat_template(messages) == "<|im_start|>USER\nhi <|im_end|><|im_end|>\n"
    ids = tok.encode_chat(messages)
    assert ids.count(tok.token_to_id("<|im_end|>")) == 1  # the content's marker stays text


@st.composite
def family_workloads(draw):
    tokens = st.integers(3, 1023)
    shared = draw(st.lists(tokens, max_size=24))
    n = draw(st.integers(1, 5))
    prompts = [(shared if draw(st.booleans()) else []) + draw(st.lists(tokens, min_size=1, max_size=40))
               for _ in range(n)]
    params = [draw(sampling_params(max_tokens=st.integers(1, 16))) for _ in range(n)]
    knobs = {"max_num_seqs": draw(st.integers(1, 4)), "block_size": draw(st.sampled_from([2, 16])),
             "spare_blocks": draw(st.integers(0, 6)), "token_budget": draw(st.integers(0, 32)),
             "enable_prefix_caching": draw(st.booleans())}
    return prompts, params, draw(st.permutations(range(n))), knobs


def build(stage, folder, config, dtype, knobs, prompts, params, quantization=None):
    kw = {"dtype": dtype, "max_num_seqs": knobs["max_num_seqs"], "quantization": quantization}
    if stage >= "stages.03":
        bs = knobs["block_size"]
        need = max(-(-(len(p) + sp.max_tokens) // bs) for p, sp in zip(prompts, params))
        per_token = config.kv_bytes_per_token(4 if dtype == "float32" else 2)
        kw.update(block_size=bs, kv_cache_memory=(need + knobs["spare_blocks"]) * bs * per_token,
                  max_num_batched_tokens=knobs["max_num_seqs"] + knobs["token_budget"],
                  enable_prefix_caching=knobs["enable_prefix_caching"])
    return __import__("importlib").import_module(stage).LLM(str(folder), **kw)


@pytest.fixture(scope="module", params=["bfloat16", "float32"])
def family_reference(request, family):
    name, folder = family
    return name, folder, request.param, ReferenceLLM(str(folder), dtype=request.param)


@settings(max_examples=examples(2), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=family_workloads())
def test_every_stage_gives_the_reference_tokens(family_reference, workload):
    """Each family, bfloat16 and float32: the five stages give the reference's tokens (batching, arrival order,
    preemption, chunked prefill, prefix caching, stage 04's fused CPU kernels at head_dim 32, 64 and 128)."""
    name, folder, dtype, ref = family_reference
    prompts, params, order, knobs = workload
    expected = [(e.token_ids, e.finish_reason) for e in ref.generate(prompts, params)]
    for stage in STAGES:
        with checked_steps() as violations:
            llm = build(stage, folder, ref.config, dtype, knobs, prompts, params)
            got = run_in_order(llm, prompts, params, order)
        assert [(g.token_ids, g.finish_reason) for g in got] == expected, (name, dtype, stage)
        assert not violations, (name, stage, violations[:3])


def test_nano_vllm_workload():
    """nano-vllm's bench.py: 256 requests, lengths uniform in 100-1,024, seeded (the same list every time)."""
    from stages import workloads
    prompts, params = workloads.build("nano-vllm", None, 32, 64, vocab=151936)
    assert len(prompts) == len(params) == 256
    assert all(100 <= len(p) <= 1024 for p in prompts) and all(100 <= sp.max_tokens <= 1024 for sp in params)
    assert all(0 <= t <= 10_000 for p in prompts for t in p)
    assert all(sp.ignore_eos and sp.temperature == 0.6 for sp in params)
    assert len({sp.seed for sp in params}) == 256  # each request its own draws
    lengths = [len(p) for p in prompts]
    assert min(lengths) < 150 and max(lengths) > 970  # spread over the range, not clustered
    again, _ = workloads.build("nano-vllm", None, 32, 64, vocab=151936)
    assert again == prompts
    small, _ = workloads.nano_vllm(vocab=1024)
    assert max(t for p in small for t in p) <= 1023  # within a small model's vocabulary


FIXED_PROMPTS = [PROMPT[:20], PROMPT[5:30] + [9, 10], PROMPT[:20] + [600, 601]]
FIXED_PARAMS = [SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
                SamplingParams(temperature=0.8, top_k=50, seed=3, max_tokens=12, ignore_eos=True),
                SamplingParams(temperature=1.0, top_p=0.9, seed=4, max_tokens=8, ignore_eos=True)]
FIXED_KNOBS = {"max_num_seqs": 2, "block_size": 16, "spare_blocks": 0, "token_budget": 12,
               "enable_prefix_caching": True}


@pytest.mark.parametrize("name", ["qwen2", "qwen3"])
def test_every_stage_gives_the_reference_tokens_int8(family_folders, name):
    """int8 weight-only quantization, every stage against the reference: the families whose layers add something
    to the linears (Qwen2's bias and Qwen3's q/k norms stay 16-bit); Llama 3 and Mistral add only RoPE and shapes,
    which bfloat16 checks."""
    folder = family_folders[name]
    ref = ReferenceLLM(str(folder), dtype="bfloat16", quantization="int8")
    expected = [e.token_ids for e in ref.generate(FIXED_PROMPTS, FIXED_PARAMS)]
    for stage in STAGES:
        llm = build(stage, folder, ref.config, "bfloat16", FIXED_KNOBS, FIXED_PROMPTS, FIXED_PARAMS,
                    quantization="int8")
        assert llm.quantization == "int8"
        assert [g.token_ids for g in run_in_order(llm, FIXED_PROMPTS, FIXED_PARAMS, [2, 0, 1])] == expected, \
            (name, stage)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the GPU path is checked where one is")
def test_every_stage_on_cuda_gives_the_same_tokens(family):
    """On CUDA: stage 04's Triton kernels at each family's head_dim, with the bias and q/k norm before them."""
    name, folder = family
    ref = ReferenceLLM(str(folder), dtype="bfloat16", device="cuda")
    expected = [e.token_ids for e in ref.generate(FIXED_PROMPTS, FIXED_PARAMS)]
    for stage in STAGES:
        llm = build(stage, folder, ref.config, "bfloat16", FIXED_KNOBS, FIXED_PROMPTS, FIXED_PARAMS)
        assert llm.device.type == "cuda"
        assert [g.token_ids for g in run_in_order(llm, FIXED_PROMPTS, FIXED_PARAMS, [2, 0, 1])] == expected, \
            (name, stage)


def test_int4_from_dense_weights_every_stage(family_folders):
    """int4 without a GGUF: the dense weights quantized to Q4_1 at load; head_dim 128 and the q/k norm (Qwen3)."""
    folder = family_folders["qwen3"]
    ref = ReferenceLLM(str(folder), dtype="bfloat16", quantization="int4")
    expected = [e.token_ids for e in ref.generate(FIXED_PROMPTS, FIXED_PARAMS)]
    for stage in STAGES:
        llm = build(stage, folder, ref.config, "bfloat16", FIXED_KNOBS, FIXED_PROMPTS, FIXED_PARAMS,
                    quantization="int4")
        assert [g.token_ids for g in run_in_order(llm, FIXED_PROMPTS, FIXED_PARAMS, [2, 0, 1])] == expected, stage


def test_a_prompt_past_the_sliding_window_is_refused_with_the_reason(family_folders):
    """Mistral's window (512 here) caps the context: a longer prompt fails alone, saying why; so does more."""
    llm = ReferenceLLM(str(family_folders["mistral"]), dtype="float32")
    long, short = llm.generate([[5] * 600, PROMPT], SamplingParams(temperature=0, max_tokens=2))
    assert long.finish_reason == "error" and "sliding window" in long.error and "511" in long.error
    assert short.finish_reason == "length" and len(short.token_ids) == 2
    with pytest.raises(ValueError, match="sliding window"):
        ReferenceLLM(str(family_folders["mistral"]), dtype="float32", max_model_len=1024)
