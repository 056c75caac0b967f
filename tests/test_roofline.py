"""The calculator reproduces the article's worked figures (the arithmetic in its text is the oracle)."""
import pytest

from common import roofline


@pytest.fixture(scope="module")
def article():
    return roofline.Article().figures()


@pytest.mark.parametrize("figure, expected, tol", [
    ("weights GB (16-bit)", 26, 0), ("weights GB (8-bit)", 13, 0),
    ("tok/s, 1 request (weights only)", 76.9, 0.05), ("tok/s, 32 requests (weights only)", 2461.5, 0.05),
    ("KV GB read, 32 x 400 tokens", 10.49, 0.005), ("step cost vs 1 request", 1.4, 0.05),
    ("tok/s, 32 x 400 tokens", 1754.1, 0.05), ("tok/s, 1 x 400 tokens", 75.97, 0.005),
    ("KV bytes per token", 819_200, 0), ("GB per 2,048-token sequence", 1.678, 0.0005),
    ("sequences reserving 2,048", 27, 0), ("sequences paged at 400", 140, 0),
    ("KV GB read, 27 x 2,048 tokens", 45.30, 0.005), ("tok/s, 27 x 2,048 tokens", 757.4, 0.05),
])
def test_article_figures(article, figure, expected, tol):
    assert article[figure] == pytest.approx(expected, abs=tol)


def test_edge_example():
    f = roofline.edge_figures()
    assert [f[f"weights GB ({b}-bit)"] for b in (16, 8, 4)] == [6, 3, 1.5]
    assert f["ms per token (8-bit)"] == pytest.approx(30) and f["ms per token (4-bit)"] == pytest.approx(15)


def test_paging_rounds_up_to_whole_blocks():
    per_token = 100
    assert roofline.seqs_paged(32 * 16 * per_token, 17, per_token, block_size=16) == 16  # 17 tokens hold 2 blocks
    assert roofline.seqs_reserving(32 * 16 * per_token, 64, per_token) == 8


def test_smollm2_bytes_per_token_matches_the_model_config(real_folder):
    from common.config import ModelConfig
    c = ModelConfig.from_folder(real_folder)
    assert roofline.kv_bytes_per_token(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 2) == \
        c.kv_bytes_per_token(2) == 23_040


def test_measurements_are_positive_and_finite():
    assert 1e8 < roofline.measure_bandwidth(mb=16, repeats=2) < 1e13
    assert 1e8 < roofline.measure_matmul_flops(n=256) < 1e16
