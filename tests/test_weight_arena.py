"""common/numerics/native/arena.py: the packed weights of our CPU linears, copied into one mapping on 2 MiB pages. The
copies must be the same bytes (so the same logits), the model's linears must read the copies, and where Linux
gives huge pages the mapping must actually get them."""
from pathlib import Path

import pytest
import torch

from common.loader import load_model
from common import SamplingParams
from common.numerics.native.arena import HUGE_PAGE, WeightArena
from common.reference import ReferenceLLM

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def arena_range(arena: WeightArena) -> tuple[int, int]:
    start = arena.tensor.data_ptr()
    return start, start + arena.tensor.numel()


def test_placed_tensors_are_copies_in_the_arena():
    arena = WeightArena(8 << 20)
    if arena.tensor is None:
        pytest.skip("no MADV_HUGEPAGE on this platform")
    tensors = [torch.randn(300, 7).bfloat16(), torch.randint(-127, 128, (5000,), dtype=torch.int8),
               torch.arange(12, dtype=torch.uint8).view(3, 4)]
    placed = [arena.place(t) for t in tensors]
    low, high = arena_range(arena)
    assert placed[0].data_ptr() % HUGE_PAGE == 0  # the first weight starts a huge page
    for t, p in zip(tensors, placed):
        assert torch.equal(t, p) and p.dtype == t.dtype and p.shape == t.shape
        assert low <= p.data_ptr() < high and p.data_ptr() % 4096 == 0
    assert arena.placed_bytes == 3 * 4096 + 4096 * 2  # each on pages of its own: 4,200 B, 5,000 B, 12 B


def test_what_does_not_fit_stays_where_it_was(monkeypatch):
    arena = WeightArena(4096)
    t = torch.zeros(3 << 20, dtype=torch.uint8)
    assert arena.place(t) is t
    monkeypatch.setenv("STEPWISE_HUGE_PAGES", "0")
    off = WeightArena(8 << 20)
    assert off.tensor is None and off.place(t) is t


@pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(), reason="no transparent huge pages here")
def test_the_arena_gets_huge_pages():
    arena = WeightArena(16 << 20)
    if arena.tensor is None:
        pytest.skip("no MADV_HUGEPAGE on this platform")
    arena.place(torch.ones(8 << 20, dtype=torch.uint8))
    assert huge_bytes_at(arena.tensor.data_ptr()) >= 4 * HUGE_PAGE


def huge_bytes_at(address: int) -> int:
    """AnonHugePages of the mapping holding ``address`` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(" ", 1)[0]
        if "-" in head and ":" not in head:  # a mapping's first line: "begin-end perms ..."
            begin, end = (int(x, 16) for x in head.split("-"))
            inside = begin <= address < end
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1]) << 10
    return 0


def linears(model):
    return [layer[n] for layer in model.layers for n in ("qkv", "o", "gate_up", "down")] + [model.lm_head]


def packed(lin):
    return lin.records if getattr(lin, "records", None) is not None else getattr(lin, "ours", None)


@pytest.mark.parametrize("quantization", [None, "int8", "int4"])
def test_a_model_reads_its_weights_from_the_arena_with_the_same_results(tiny_folder, monkeypatch, quantization):
    arena_here = WeightArena(4096).tensor is not None
    models = {}
    for setting in ("1", "0"):
        monkeypatch.setenv("STEPWISE_HUGE_PAGES", setting)
        models[setting] = load_model(tiny_folder, "bfloat16", "cpu", quantization=quantization)
    placed = [packed(lin) for lin in linears(models["1"])]
    if any(p is None for p in placed) or not arena_here:
        pytest.skip("torch's own kernels here (no packed weights to place), or no MADV_HUGEPAGE")
    pointers = sorted(p.data_ptr() for p in placed)
    # One mapping, in the order built: the weights lie within their own size (plus page rounding) of each other.
    assert pointers[-1] - pointers[0] < sum(p.nbytes + 4096 for p in placed)
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(placed, map(packed, linears(models["0"]))))
    x = torch.randn(5, models["1"].config.hidden_size, generator=torch.Generator().manual_seed(0)).bfloat16()
    for a, b in zip(linears(models["1"]), linears(models["0"])):
        xa = x if a.in_features == x.shape[1] else torch.randn(5, a.in_features).bfloat16()
        assert torch.equal(a(xa), b(xa))


@pytest.mark.parametrize("quantization", [None, "int8"])
def test_the_reference_tokens_do_not_move(tiny_folder, monkeypatch, quantization):
    outputs = {}
    for setting in ("1", "0"):
        monkeypatch.setenv("STEPWISE_HUGE_PAGES", setting)
        llm = ReferenceLLM(str(tiny_folder), quantization=quantization)
        outputs[setting] = [o.token_ids for o in llm.generate(
            [[3, 4, 5, 6], [9, 8]], [SamplingParams(temperature=0, max_tokens=12),
                                     SamplingParams(temperature=0.8, seed=7, max_tokens=12)])]
    assert outputs["1"] == outputs["0"]
