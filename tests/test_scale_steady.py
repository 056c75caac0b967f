"""The sweep's steady decode rate (stages/bench/steady.py) against timelines built by hand, each figure worked out
in the comments; the stages' per-token stamps moved to their step's end; vLLM's runner stepping a stand-in engine."""
import sys
from enum import Enum
from types import ModuleType, SimpleNamespace

import pytest

from stages.bench.scale_report import table, with_ceiling
from stages.bench.scale_run import summary
from stages.bench.steady import on_step_ends, steady_decode

# Three requests of 4 tokens, 8-token prompts. The step ending at 1.0 prefills A and B (their first tokens); the one
# ending at 4.0 prefills C (a 3-second stall for A and B, whose second tokens it also makes); then decode-only steps
# of 0.5 s at 4.5, 5.0, 5.5.
A = [1.0, 4.0, 4.5, 5.0]
B = [1.0, 4.0, 4.5, 5.0]
C = [4.0, 4.5, 5.0, 5.5]


def test_the_window_runs_from_the_last_first_token_to_the_first_last_token():
    # Window (4.0, 5.0]: A's 4.5 and 5.0, B's 4.5 and 5.0, C's 4.5 and 5.0 = 6 tokens in 1.0 s: 3 rows a 0.5 s step.
    got = steady_decode([A, B, C])
    assert got == {"steady decode tok/s": 6.0, "steady tokens": 6, "steady window s": 1.0}


def test_the_summary_keeps_tpot_with_its_stall_beside_the_steady_rate():
    got = summary(0.0, [A, B, C], prompt_tokens=24, end=5.5)
    # TPOT: A and B (5.0 - 1.0) / 3 = 1.333 s (the stall inside), C (5.5 - 4.0) / 3 = 0.5 s; median 1.333 s.
    assert got["TPOT p50 ms"] == pytest.approx(4000 / 3)
    assert got["in flight / TPOT p50 tok/s"] == pytest.approx(3 / (4 / 3))  # 2.25: the old "decode tok/s"
    assert got["steady decode tok/s"] == 6.0  # the decode step: 3 tokens a 0.5 s step
    assert got["TTFT p50 s"] == 1.0 and got["prefill tok/s"] == pytest.approx(24 / 4.0)  # firsts 1.0, 1.0, 4.0
    assert got["output tok/s"] == pytest.approx(12 / 5.5)


def test_one_request_alone_gives_one_over_its_time_per_token():
    # 3 tokens after the first in 1.3 - 0.5 = 0.8 s: 3.75 tok/s, 1 / TPOT (0.8 / 3 s).
    got = steady_decode([[0.5, 0.7, 0.9, 1.3]])
    assert got["steady decode tok/s"] == pytest.approx(3.75) and got["steady tokens"] == 3


@pytest.mark.parametrize("timeline", [
    [[1.0, 2.0], [3.0, 4.0, 5.0]],  # the first request finished (2.0) before the second's first token (3.0)
    [[1.0, 2.0], [2.0, 3.0]],  # it finished in the step that gave the second its first token: a window of 0 s
])
def test_no_moment_with_every_request_decoding_gives_no_figure(timeline):
    assert steady_decode(timeline) == {"steady decode tok/s": None, "steady tokens": 0, "steady window s": 0.0}


def test_the_table_says_n_a_where_there_is_no_window():
    point = {"model": "m", "engine": "04-bf16", "prompt": 8, "in_flight": 2, "out_tokens": 2, "weight bytes": 1000}
    result = with_ceiling(point | summary(0.0, [[1.0, 2.0], [3.0, 4.0]], 16, 4.0), 10, 1e6)
    assert result["steady decode tok/s"] is None and result["of ceiling"] is None
    from rich.console import Console

    console = Console(width=250, record=True)
    console.print(table([result], 1e6, "test machine"))
    text = console.export_text()
    assert text.count("n/a") >= 3 and "no moment had every request decoding" in text  # two cells and the caption


def test_a_stages_tokens_are_moved_to_the_end_of_their_step():
    # The stages stamp each token as it is appended: in the step ending at 4.0, C first (3.997), then A, then B.
    ends = [1.0, 4.0, 4.5, 5.0, 5.5]
    jitter = {id(A): 0.002, id(B): 0.001, id(C): 0.003}
    stamped = [[t - jitter[id(r)] for t in r] for r in (A, B, C)]
    # As stamped, the window opens at C's 3.997 (taking A's 3.998 and B's 3.999 from the stall step) and closes at
    # A's 4.998 (leaving B's 4.999 of that step out): A 3, B 2, C 2 = 7 tokens, where whole steps hold 6.
    assert steady_decode(stamped)["steady tokens"] == 7
    moved = [on_step_ends(times, ends) for times in stamped]
    assert moved == [A, B, C] and steady_decode(moved)["steady decode tok/s"] == 6.0


def test_bad_timelines_are_refused_with_what_is_wrong():
    with pytest.raises(ValueError, match="at least one output token"):
        steady_decode([[1.0], []])
    with pytest.raises(ValueError, match="after the last step end"):
        on_step_ends([1.0, 2.5], [1.0, 2.0])
    with pytest.raises(ValueError, match="after the last step end"):
        on_step_ends([1.0], [])


def test_vllm_runner_times_every_token_with_its_steps_engine_core_stamp(monkeypatch):
    """vllm_runner.timed_run against a stand-in for vLLM's engine (vLLM is not in the test venv): each step's new
    tokens (output kind DELTA) get that step's `metrics.last_token_ts`, measured from the run's start."""
    from stages.bench import vllm_runner

    kinds = Enum("RequestOutputKind", "CUMULATIVE DELTA FINAL_ONLY")
    sampling = ModuleType("vllm.sampling_params")
    sampling.RequestOutputKind = kinds
    monkeypatch.setitem(sys.modules, "vllm", ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sampling)

    def out(rid, tokens, stamp, finish=None, stop=None):
        return SimpleNamespace(request_id=rid, finished=finish is not None, metrics=SimpleNamespace(
            last_token_ts=stamp), outputs=[SimpleNamespace(token_ids=tokens, finish_reason=finish, stop_reason=stop)])

    # Step 1 (10.0): timed-0's first token; 2 (10.5): one each; 3 (11.0): timed-0 stops on 2, timed-1 gets two.
    steps = [[out("timed-0", [5], 10.0)], [out("timed-0", [6], 10.5), out("timed-1", [7], 10.5)],
             [out("timed-0", [2], 11.0, "stop", 2), out("timed-1", [8, 9], 11.0, "length")]]
    added = []
    engine = SimpleNamespace(add_request=lambda rid, prompt, p: added.append((rid, prompt, p.output_kind)),
                             has_unfinished_requests=lambda: bool(steps), step=lambda: steps.pop(0))
    params = [SimpleNamespace(output_kind=kinds.FINAL_ONLY) for _ in range(2)]
    got = vllm_runner.timed_run(SimpleNamespace(llm_engine=engine), ["p0", "p1"], params, start=9.0)
    assert added == [("timed-0", "p0", kinds.DELTA), ("timed-1", "p1", kinds.DELTA)]
    assert got[0] == {"token_ids": [5, 6, 2], "token_s": [1.0, 1.5, 2.0], "finish_reason": "stop", "stop_reason": 2,
                      "first_token_s": 1.0, "last_token_s": 2.0}
    assert got[1] == {"token_ids": [7, 8, 9], "token_s": [1.5, 2.0, 2.0], "finish_reason": "length",
                      "stop_reason": None, "first_token_s": 1.5, "last_token_s": 2.0}
