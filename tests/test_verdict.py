"""The ladder's verdict and picture, on fixed figures."""
from stages.bench import verdict


def rows(*rates):
    return {name: {"output tok/s": r, "TTFT p50 s": 1.0, "TPOT p50 ms": 50.0}
            for name, r in zip(verdict.STAGE_ORDER, rates)}


def test_a_ladder_that_climbs():
    ok, text = verdict.verdict(rows(100, 130, 140, 161, 161))
    assert ok and "04 kernels / 03 paged = 1.15x" in text and "05 streaming / 04 kernels = 1.00x" in text
    assert [round(r, 2) for _, _, r in verdict.climb(rows(100, 130, 140, 161, 161))] == [1.3, 1.08, 1.15, 1.0]


def test_a_ladder_that_falls_names_every_fall():
    ok, text = verdict.verdict(rows(100, 90, 140, 120, 130))
    assert not ok
    assert "02 continuous is 0.90x 01 static" in text and "04 kernels is 0.86x 03 paged" in text
    assert "03 paged is" not in text  # it climbed


def test_only_stages_that_ran_are_compared():
    r = rows(100, 130, 140, 161, 161)
    del r["02 continuous"], r["04 kernels"]
    assert verdict.climb(r) == [("03 paged", "01 static", 1.4), ("05 streaming", "03 paged", 161 / 140)]
    assert verdict.verdict({"01 static": r["01 static"]}) == (True, "one stage ran: nothing to climb")


def test_steps_against_rows_bounds_what_continuous_batching_can_give():
    """With time = steps x a + rows x b for both stages (the same rows), the speedup stays under the step ratio
    the line states and reaches it only as b goes to 0."""
    rows_total, s1, s2 = 13_662, 512, 338
    for a, b in [(0.014, 0.0008), (0.014, 0.0), (0.030, 0.0001)]:
        r = {name: {"prompt tokens": 5_577, "output tokens": rows_total - 5_577, "steps": s,
                    "output tok/s": (rows_total - 5_577) / (s * a + rows_total * b)}
             for name, s in [("01 static", s1), ("02 continuous", s2)]}
        text = verdict.steps_against_rows(r)
        speedup = (s1 * a + rows_total * b) / (s2 * a + rows_total * b)
        assert f"02 / 01 = {speedup:.2f}x" in text and "1.51x fewer steps (512 vs 338)" in text
        assert "which alone is worth 1.51x" in text
        assert speedup <= s1 / s2 + 1e-12 and (b > 0 or f"{speedup:.2f}" == "1.51")
    r["02 continuous"]["output tokens"] += 1  # not the same rows: no comparison
    assert verdict.steps_against_rows(r) is None
    assert verdict.steps_against_rows({"01 static": r["01 static"]}) is None


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "ladder.png"
    verdict.plot({**rows(100, 130, 140, 161, 161), "HF generate (batch 64)": {"output tok/s": 120.0}}, str(path), "t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_a_fall_within_the_rounds_spread_is_named_and_does_not_count():
    """--rounds 2 keeps each stage's lower run: a stage whose best round beats its predecessor's worst fell only
    with the machine's drift (05 and 04 here, as in an AVX2 run); one whose every round is slower fell for real."""
    r = rows(100, 90, 140, 120, 130)
    r["01 static"]["rounds"], r["02 continuous"]["rounds"] = [100, 110], [90, 95]  # 95 < 100: a real fall
    r["03 paged"]["rounds"], r["04 kernels"]["rounds"] = [140, 150], [120, 145]  # 145 >= 140: drift
    ok, text = verdict.verdict(r)
    assert not ok and "does not climb everywhere: 02 continuous is 0.90x 01 static;" in text
    assert "within the rounds' spread: 04 kernels is 0.86x 03 paged (rounds 120.0-145.0 against 140.0-150.0" in text
    r["02 continuous"]["rounds"] = [90, 105]
    ok, text = verdict.verdict(r)
    assert ok and "every stage is at least as fast as the one before it; within the rounds' spread: 02" in text
    assert "07 structured" in verdict.STAGE_ORDER
