"""The calculator reproduces the article's worked figures (the arithmetic in its text is the oracle)."""
from pathlib import Path

import pytest
import torch

from common.config import kv_bytes
from stages.bench import machine, roofline


@pytest.fixture(scope="module")
def article():
    return roofline.Article().figures()


# Each figure as the article prints it: the calculator's value, rounded to the article's digits, must print the same.
@pytest.mark.parametrize("figure, printed", [
    ("weights GB (16-bit)", "26"), ("weights GB (8-bit)", "13"),
    ("tok/s, 1 request (weights only)", "76.9"), ("tok/s, 32 requests (weights only)", "2,461.5"),
    ("KV GB read, 32 x 400 tokens", "10.49"), ("step cost vs 1 request", "1.4"),
    ("tok/s, 32 x 400 tokens", "1,754.1"), ("tok/s, 1 x 400 tokens", "75.97"),
    ("KV bytes per token", "819,200"), ("GB per 2,048-token sequence", "1.678"),
    ("sequences reserving 2,048", "27"), ("sequences paged at 400", "140"),
    ("KV GB read, 27 x 2,048 tokens", "45.30"), ("tok/s, 27 x 2,048 tokens", "757.4"),
])
def test_article_figures(article, figure, printed):
    digits = len(printed.partition(".")[2])
    assert f"{article[figure]:,.{digits}f}" == printed


def test_article_inputs_follow_from_its_text():
    a = roofline.Article()
    assert kv_bytes(a.layers, a.kv_heads, a.head_dim, 2) == 800 * 1024  # "(800 KiB)"
    # "On an 80 GB GPU with 90% usable, 46 GB is left for cache after the weights" (26 GB at 16 bits).
    assert a.cache_budget == pytest.approx(80 * 0.9 * roofline.GB - roofline.weight_bytes(a.params, 16))


def test_edge_example():
    f = roofline.edge_figures()
    assert [f"{f[f'weights GB ({b}-bit)']:g}" for b in (16, 8, 4)] == ["6", "3", "1.5"]
    assert (f"{f['ms per token (8-bit)']:.0f}", f"{f['ms per token (4-bit)']:.0f}") == ("30", "15")


def test_paging_rounds_up_to_whole_blocks():
    per_token, capacity = 100, roofline.capacity  # stage 03's arithmetic, which the roofline uses
    assert capacity.seqs_paged(32 * 16 * per_token, 17, per_token, block_size=16) == 16  # 17 tokens hold 2 blocks
    assert capacity.seqs_reserving(32 * 16 * per_token, 64, per_token) == 8


@pytest.mark.real_model
def test_smollm2_bytes_per_token_matches_the_model_config(real_folder):
    from common.config import ModelConfig
    c = ModelConfig.from_folder(real_folder)
    assert kv_bytes(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 2) == c.kv_bytes_per_token(2) == 23_040


class FakeClock:
    """time.perf_counter that advances by the given durations, one per reading after the first of each pair."""

    def __init__(self, durations):
        self.now, self.durations, self.readings = 0.0, list(durations), 0

    def __call__(self):
        self.readings += 1
        if self.readings % 2 == 0:
            self.now += self.durations.pop(0)
        return self.now


def test_bandwidth_is_bytes_read_and_written_over_the_best_copy(monkeypatch):
    monkeypatch.setattr(machine.time, "perf_counter", FakeClock([0.004, 0.002, 0.003]))
    mb = 16
    assert machine.measure_bandwidth(mb=mb, repeats=3) == pytest.approx(2 * mb * 2**20 / 0.002)


def test_matmul_rate_is_two_flops_per_multiply_add(monkeypatch):
    ticks = iter([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.8])  # start; four checks under 0.5 s, so four products; end
    monkeypatch.setattr(machine.time, "perf_counter", lambda: next(ticks))
    n = 64
    assert machine.measure_matmul_flops(n=n) == pytest.approx(2 * n**3 * 4 / 0.8)


def test_compute_ceiling_is_the_faster_of_the_dtype_and_float32(monkeypatch):
    rates = {torch.bfloat16: 1e9, torch.float32: 180e9}  # an AVX2 CPU: torch's bfloat16 matmul on a scalar path
    monkeypatch.setattr(machine, "measure_matmul_flops", lambda device="cpu", dtype=torch.bfloat16: rates[dtype])
    assert machine.measure_compute("cpu", torch.bfloat16) == (180e9, " (float32; bfloat16 1)")
    rates[torch.bfloat16] = 436e9  # AVX-512 BF16: the 16-bit path is the faster
    assert machine.measure_compute("cpu", torch.bfloat16) == (436e9, "")
    assert machine.measure_compute("cpu", torch.float32) == (180e9, "")


def test_measurements_on_this_machine_are_plausible():
    assert 1e8 < machine.measure_bandwidth(mb=16, repeats=2) < 1e13
    assert 1e8 < machine.measure_matmul_flops(n=256) < 1e16


MODEL_CONFIGS = sorted((Path(roofline.__file__).parent / "model_configs").glob("*.json"))


@pytest.mark.parametrize("path", MODEL_CONFIGS, ids=lambda p: p.stem)
def test_config_figures_count_the_parameters_transformers_builds(path):
    """From config.json alone: the parameter count of transformers' own model on that config (built on the meta
    device: no memory, no download), and the KV arithmetic."""
    import json

    import transformers
    raw = json.loads(path.read_text())
    hf_config = transformers.AutoConfig.for_model(raw["model_type"], **{k: v for k, v in raw.items()
                                                                         if k != "model_type"})
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(hf_config)
    c = roofline.read_config(str(path))
    assert roofline.config_params(c)[0] == sum(p.numel() for p in hf.parameters())
    f = roofline.config_figures(c, [100.0], batch=32, context=1024)
    assert f["KV bytes per token (16-bit)"] == 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 2
    assert f["tok/s at 100 GB/s, 1 request"] == pytest.approx(100e9 / f["weight GB read per decode step"] / 1e9)
