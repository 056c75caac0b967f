"""What had to change for 0.5B-3B shapes and 8k prompts (issue 54), each against its own oracle: the checkpoint is
not kept mapped after a load, tensor-op attention in bounded slices gives the bits of one call, the default KV
pool fits the machine and a budget that cannot is refused saying what to set, a prompt over max_model_len says
how to raise it, and the decode-attention bench times each decode step."""
import gc
import re
import sys

import numpy as np
import pytest
import torch

from common import ReferenceLLM
from common.loader import load_model
from common.numerics import attention_tiles, native
from common.numerics.attention import AttentionMetadata, attention
from stages.bench.make_model import make_model
from stages.bench.shapes import get_shape, reduced


@pytest.fixture(scope="module")
def bf16_folder(tmp_path_factory, real_folder):
    return make_model(reduced(get_shape("llama-3.2-1b"), 8, 2), tmp_path_factory.mktemp("bf16") / "m", "bfloat16",
                      int4_blocks=True, quiet=True)


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/maps")
@pytest.mark.parametrize("quantization", [None, "int8", "int4"])
def test_a_loaded_model_keeps_no_view_of_the_checkpoint(bf16_folder, quantization):
    """A bfloat16 checkpoint loaded in bfloat16: a tensor kept as the file's memory-mapped view would keep the file
    mapped (and its pages resident beside the packed copies)."""
    model = load_model(bf16_folder, "bfloat16", "cpu", quantization=quantization)
    gc.collect()
    with open("/proc/self/maps") as f:
        mapped = [line for line in f if str(bf16_folder) in line]
    assert model.weight_bytes > 0 and mapped == []


def test_attention_in_slices_gives_the_bits_of_one_call(monkeypatch):
    """Two prefills (300 and 200 tokens, one behind 100 cached tokens) and a decode through the tensor-op tiles, with
    slices of 4 slots (many slices) against slices larger than the step (one call)."""
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, d, chunk = 6, 2, 32, 16
    query_lens, context_lens = [300, 200, 1], [300, 300, 90]
    blocks = -(-max(context_lens) // chunk)
    table = np.arange(len(query_lens) * blocks).reshape(len(query_lens), blocks) * kv_heads
    k = torch.randn(table.size * kv_heads, chunk, d, generator=gen)
    v = torch.randn(table.size * kv_heads, chunk, d, generator=gen)
    q = torch.randn(sum(query_lens), heads, d, generator=gen)
    meta = AttentionMetadata.build(query_lens, context_lens, heads, kv_heads, table, chunk, 1, native=False,
                                   head_dim=d, kv_dtype=torch.float32)
    monkeypatch.setattr(attention_tiles, "SLICE_SLOTS", 10**9)
    whole = attention(q, k, v, meta)
    monkeypatch.setattr(attention_tiles, "SLICE_SLOTS", 4)
    assert torch.equal(attention(q, k, v, meta), whole)


def test_the_default_kv_pool_fits_the_machine_and_a_budget_that_cannot_is_refused(bf16_folder, monkeypatch):
    """With 1 GiB available (set, so the figure cannot move under the test): the default pool is the whole blocks
    that fit in 90% of it, and a budget over it raises MemoryError naming the setting."""
    from stages.paged_kv.engine import kv_blocks
    from common.engine_config import EngineConfig

    monkeypatch.setattr(sys.modules[kv_blocks.__module__], "available_memory", lambda device: 2**30)
    model = load_model(bf16_folder, "bfloat16", "cpu")
    per_block = 16 * model.config.kv_bytes_per_token(2)
    # 4,096 requests of the model's 131,072 positions: what stage 02 would reserve, terabytes
    config = EngineConfig.create(str(bf16_folder), max_num_seqs=4096, max_model_len=131072,
                                 max_num_batched_tokens=4096)
    assert kv_blocks(config, model).num_blocks == int(0.9 * 2**30) // per_block
    small = EngineConfig.create(str(bf16_folder), max_num_seqs=2, max_model_len=256)
    assert kv_blocks(small, model).num_blocks == 2 * 256 // 16  # under the cap: stage 02's reservation, as before
    ragged = EngineConfig.create(str(bf16_folder), max_num_seqs=3, max_model_len=100)
    assert kv_blocks(ragged, model).num_blocks == 3 * 7  # 100 tokens need 7 blocks of 16, never 300 // 16 = 18
    too_much = EngineConfig.create(str(bf16_folder), kv_cache_memory="2GiB")
    with pytest.raises(MemoryError, match="only 1.00 GiB is available .* set kv_cache_memory below"):
        kv_blocks(too_much, model)


def test_a_prompt_over_max_model_len_says_the_limit_and_how_to_raise_it(bf16_folder):
    """The request fails alone, its error naming both ways out."""
    llm = ReferenceLLM(str(bf16_folder), dtype="bfloat16", max_model_len=64)
    out = llm.generate([[5] * 80])[0]
    assert out.finish_reason == "error"
    assert re.search("max_model_len is 64: shorten it to at most 63 tokens, or raise max_model_len .* above 80, up "
                     "to the model's context of 131,072 tokens", out.error)


@pytest.mark.skipif(not native.load(), reason="the compiled CPU attention did not build here")
def test_the_decode_attention_bench_times_each_decode_step_and_only_those(bf16_folder, capsys):
    """stages.bench.decode_attention (why int4's time per token grew at 8k): one timed step per output token after
    the first (the prefill gives that one), for each prompt, and the linears (int4 here) timed too; the wrappers it
    puts on the kernel and on the linears are gone afterwards."""
    from common.numerics.attention_native import NativeTable
    from common.numerics.invariant import RowTiled
    from stages.bench import decode_attention
    before, linear_call = NativeTable.attention, RowTiled.__call__
    decode_attention.main(["--model", str(bf16_folder), "--precision", "int4", "--prompts", "20,70", "--tokens", "5"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("prompt")]
    assert [re.match(r"prompt +(\d+):", line).group(1) for line in lines] == ["20", "70"]
    assert all(line.endswith("(4 steps)") for line in lines), lines
    assert all(float(re.search(r"linears +([\d.]+) ms", line).group(1)) > 0 for line in lines), lines
    assert NativeTable.attention is before and RowTiled.__call__ is linear_call
