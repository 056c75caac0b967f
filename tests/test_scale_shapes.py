"""The scale shapes (stages/bench/shapes.py) written by make_model: each reduced shape (the real layer structure,
fewer heads and layers) loads in transformers and in our loader with transformers' float32 logits, every stage
gives the reference's tokens on it, llama.cpp reads its GGUF with logits close to ours, and bad input is refused
with nothing written."""
import importlib

import pytest
import torch

from common import ReferenceLLM, SamplingParams
from common.config import ModelConfig
from stages.bench.make_model import main as make_model_main, make_model
from stages.bench.shapes import SHAPES, VOCAB, get_shape, reduced
from test_families import LOGIT_ATOL, PROMPT, our_decode_logits
from test_identical_tokens import STAGES, run_in_order

DIVISORS = {"qwen2.5-0.5b": 7, "llama-3.2-1b": 8, "qwen2.5-1.5b": 6, "llama-3.2-3b": 8}
GGUF_ATOL = 3e-3  # llama.cpp's float32 against ours; its matmuls sum in another order


@pytest.fixture(scope="session")
def reduced_folders(tmp_path_factory, real_folder):  # real_folder: SmolLM2's tokenizer files, copied
    root = tmp_path_factory.mktemp("scale")
    return {name: make_model(reduced(get_shape(name), d, 2), root / name, "float32", quiet=True)
            for name, d in DIVISORS.items()}


def test_shapes_are_the_real_configs():
    """The published config.json numbers (the issue's list); only the vocabulary is SmolLM2's."""
    got = {n: (s.hidden_size, s.num_hidden_layers, s.num_attention_heads, s.num_key_value_heads,
               s.intermediate_size, s.head_size, s.rope_theta, s.tie_word_embeddings) for n, s in SHAPES.items()}
    assert got == {"qwen2.5-0.5b": (896, 24, 14, 2, 4864, 64, 1e6, True),
                   "llama-3.2-1b": (2048, 16, 32, 8, 8192, 64, 5e5, True),
                   "qwen2.5-1.5b": (1536, 28, 12, 2, 8960, 128, 1e6, True),
                   "llama-3.2-3b": (3072, 28, 24, 8, 8192, 128, 5e5, True)}
    for name, shape in SHAPES.items():  # our config reader takes the full-size config as it is
        c = ModelConfig.from_dict(shape.config())
        assert (c.vocab_size, c.qkv_bias, c.rope_type) == (VOCAB, shape.family == "qwen2",
                                                           "llama3" if "llama" in name else "default")
    # Meta's published count for Llama 3.2 3B (3,212,749,824, vocabulary 128,256) less the rows SmolLM2's lacks
    assert SHAPES["llama-3.2-3b"].parameters() == 3_212_749_824 - (128_256 - VOCAB) * 3072


@pytest.mark.parametrize("name", list(DIVISORS))
def test_reduced_shape_gives_transformers_logits(reduced_folders, name):
    import transformers

    folder = reduced_folders[name]
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        full = hf.generate(torch.tensor([PROMPT]), max_new_tokens=8, do_sample=False, eos_token_id=None,
                           pad_token_id=2)[0].tolist()
        expected = hf(torch.tensor([full])).logits[0]
    got = our_decode_logits(ReferenceLLM(str(folder), dtype="float32"), full, len(PROMPT))
    assert (got - expected).abs().max().item() < LOGIT_ATOL, name


@pytest.mark.parametrize("name", list(DIVISORS))
def test_every_stage_gives_the_reference_tokens_on_a_reduced_shape(reduced_folders, name):
    folder = str(reduced_folders[name])
    prompts = [PROMPT[:7], PROMPT, PROMPT[3:20], [9, 40000, 12]]
    params = [SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
              SamplingParams(temperature=0.8, seed=3, max_tokens=9, ignore_eos=True)] * 2
    expected = [o.token_ids for o in ReferenceLLM(folder, dtype="bfloat16").generate(prompts, params)]
    for stage in STAGES:
        llm = importlib.import_module(stage).LLM(folder, dtype="bfloat16", max_num_seqs=3, max_model_len=256)
        assert [o.token_ids for o in run_in_order(llm, prompts, params, [2, 0, 3, 1])] == expected, stage


def test_gguf_round_trip_through_llama_cpp(tmp_path, real_folder):
    """llama.cpp loads the GGUF of a reduced Llama 3 shape (q/k permuted, rope_freqs) and of a Qwen2 one (biases)
    and gives our float32 logits for the same tokens."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not built here (make llama-cpp)")
    for name in ("llama-3.2-1b", "qwen2.5-0.5b"):
        folder = make_model(reduced(get_shape(name), DIVISORS[name], 2), tmp_path / name, "float32",
                            gguf_types=("float32",), quiet=True)
        ours = our_decode_logits(ReferenceLLM(str(folder), dtype="float32"), PROMPT, len(PROMPT))
        peer = llama_cpp.Llama(str(folder / "model-float32.gguf"), n_ctx=64, logits_all=True, n_threads=1,
                               verbose=False)
        peer.eval(PROMPT)
        theirs = torch.tensor(peer.scores[:len(PROMPT)])
        assert theirs.shape == ours.shape and (theirs - ours).abs().max().item() < GGUF_ATOL, name


def test_bad_input_is_refused_and_nothing_is_written(tmp_path, capsys):
    assert make_model_main(["--shape", "gpt-9", "--out", str(tmp_path / "a")]) == 2
    assert "unknown shape 'gpt-9'" in capsys.readouterr().err and not (tmp_path / "a").exists()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "keep.txt").write_text("mine")
    assert make_model_main(["--shape", "qwen2.5-0.5b", "--out", str(tmp_path / "b")]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["keep.txt"]
    assert make_model_main(["--shape", "qwen2.5-0.5b", "--out", str(tmp_path / "c"), "--width-divisor", "0"]) == 2
    assert "must be at least 1" in capsys.readouterr().err
    assert make_model_main(["--shape", "qwen2.5-0.5b", "--out", str(tmp_path / "c"), "--gguf", "q8_0"]) == 2
    assert "--gguf 'q8_0' is not supported" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]  # no temporary folder left behind
