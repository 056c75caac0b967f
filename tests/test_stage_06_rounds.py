"""Stage 06's ``--rounds``: each cell's two runs taken N times, the order alternating; the table's median ratio and
range come from the rounds the JSON records. Oracle: the medians and ranges recomputed here from each round's own
tokens per second (sorted by hand, not statistics.median)."""
import importlib
import json

import pytest

main = importlib.import_module("stages.speculative.__main__").main

TINY = ["--model", "tiny", "--methods", "", "--max-tokens", "6", "--num-requests", "2", "--max-model-len", "256"]


def median(values: list[float]) -> float:
    ordered, half = sorted(values), len(values) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


@pytest.mark.parametrize("rounds", [2, 3])
def test_each_cells_median_and_range_come_from_its_rounds(tmp_path, capsys, monkeypatch, rounds):
    monkeypatch.setenv("COLUMNS", "250")
    out = tmp_path / "rounds.json"
    main([*TINY, "--in-flight", "1,2", "--workload", "edit,chat", "--rounds", str(rounds), "--json", str(out)])
    printed = capsys.readouterr().out
    doc = json.loads(out.read_text())
    runs = doc["runs"]
    assert len(runs) == 2 * 2 * rounds and all(r["same"] for r in runs)
    for workload in ("edit", "chat"):
        for limit in (1, 2):
            mine = [r for r in runs if r["workload"] == workload and r["in_flight"] == limit]
            assert [r["round"] for r in mine] == list(range(rounds))
            assert [r["spec_first"] for r in mine] == [i % 2 == 1 for i in range(rounds)]  # the order alternates
            ratios = [r["spec_tps"] / r["base_tps"] for r in mine]
            cell = next(c for c in doc["cells"] if c["workload"] == workload and c["in_flight"] == limit)
            assert cell["median_speedup"] == pytest.approx(median(ratios))
            assert (cell["min_speedup"], cell["max_speedup"]) == pytest.approx((min(ratios), max(ratios)))
            row = next(cells for x in printed.splitlines() if (cells := [c.strip() for c in x.split("│")])[1:3] ==
                       [workload, str(limit)])
            assert f"{median(ratios):.2f}x" in row and f"{min(ratios):.2f} .. {max(ratios):.2f}" in row
    assert "never slower (0.97x stage 05, median of the rounds)" in printed


def test_one_round_prints_todays_table(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    main([*TINY, "--in-flight", "1", "--workload", "chat"])
    printed = capsys.readouterr().out
    assert "proposer share" in printed and "rounds' range" not in printed and "never slower" not in printed


@pytest.mark.parametrize("bad", ["0", "-2"])
def test_rounds_below_one_are_refused_by_name(capsys, bad):
    with pytest.raises(SystemExit):
        main(["--rounds", bad])
    assert f"--rounds must be at least 1 (got {bad})" in capsys.readouterr().err
