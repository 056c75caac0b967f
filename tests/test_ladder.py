"""The benchmark ladder: its figures are the engines' own counters and the workload's arithmetic; its baselines
count tokens like the stages."""
import importlib
import json

import pytest

from common import ReferenceLLM, SamplingParams
from stages import workloads
from stages.workloads import continuous_steps
from stages.cli import STAGE_NAMES, make_llm
from common.prepare import resolve_model

ladder = importlib.import_module("stages.__main__")
runs = importlib.import_module("stages.bench.runs")  # where the ladder builds each stage's engine


def test_ladder_figures_are_the_engines_counters(tmp_path, monkeypatch, capsys):
    built, alone = {}, []

    def spy(module, args):  # keep each engine and its outputs, to check the table against them
        llm = make_llm(module, args)
        generate = llm.generate

        def keep(*a, **kw):
            llm.outputs = generate(*a, **kw)
            return llm.outputs

        llm.generate = keep
        if args.max_num_seqs == 1:  # one request alone through the best stage, after the ladder
            alone.append((STAGE_NAMES[module], llm))
        else:
            built[STAGE_NAMES[module]] = llm
        return llm

    monkeypatch.setattr(runs, "make_llm", spy)
    monkeypatch.setenv("COLUMNS", "200")  # the table's full width
    out = tmp_path / "bench.json"
    result = ladder.main(["--model", "tiny", "--workload", "random", "--num-requests", "6", "--max-tokens", "12",
                          "--prompt-range", "4,40", "--max-num-seqs", "4", "--stages", "01,02,03,05", "--no-hf",
                          "--no-llama-cpp", "--no-vllm", "--no-plain", "--json", str(out)])
    assert "same tokens as first stage" in capsys.readouterr().out
    assert json.loads(out.read_text())["engines"] == json.loads(json.dumps(result["engines"], default=str))
    engines = result["engines"]
    assert list(engines) == list(built) == ["01 static", "02 continuous", "03 paged", "05 streaming"]
    assert all(result["same_tokens"].values())
    # One request alone through the stage with the most output tok/s, in a one-slot engine: its decode rate.
    best = max(engines, key=lambda name: engines[name]["output tok/s"])
    [(name, llm)] = alone
    times = llm.outputs[0].metrics.token_times
    assert name == best and result["single_request"]["best stage"] == (best, (len(times) - 1) / (times[-1] - times[0]))
    # The workload the ladder ran, rebuilt: random prompts, outputs of fixed length (ignore_eos).
    prompts, params = workloads.random_lengths(6, (4, 40), (8, 12), 1024)
    lengths = [p.max_tokens for p in params]
    expected_tokens = [o.token_ids for o in ReferenceLLM("tiny").generate(prompts, params)]
    steps = {"01 static": sum(max(lengths[i:i + 4]) for i in range(0, 6, 4)),
             "02 continuous": continuous_steps(lengths, 4), "03 paged": continuous_steps(lengths, 4)}
    first = engines["01 static"]["output tok/s"]
    for name, llm in built.items():
        r, st = engines[name], llm.stats
        assert [o.token_ids for o in llm.outputs] == expected_tokens, name
        assert r["requests"] == 6 and r["prompt tokens"] == sum(map(len, prompts))
        assert r["output tokens"] == st.output_tokens == sum(lengths)
        assert r["steps"] == st.steps
        if name in steps:
            assert st.steps == steps[name], name
        else:  # stage 05's loop may start on part of the batch
            assert st.steps >= continuous_steps(lengths, 4)
        assert st.prefill_tokens == sum(map(len, prompts)) and st.decode_tokens == sum(n - 1 for n in lengths)
        assert st.slot_steps_used == sum(lengths)  # every slot that ran produced a token
        assert r["slot util"] == pytest.approx(st.slot_steps_used / st.slot_steps_available)
        assert r["peak in flight"] == st.peak_running == 4
        assert r["wall s"] == st.wall_seconds and r["output tok/s"] == pytest.approx(sum(lengths) / st.wall_seconds)
        assert r["x stage 01"] == pytest.approx(r["output tok/s"] / first)
        assert (r["KV reserved MB"], r["KV used MB"]) == (st.kv_bytes_reserved / 1e6, st.kv_bytes_used / 1e6)
        assert r["KV waste"] == pytest.approx(1 - st.kv_bytes_used / st.kv_bytes_reserved)
        assert r["preemptions"] == st.preemptions == 0 and r["prefix hit rate"] == st.prefix_hit_rate == 0
        ttft = [o.metrics.time_to_first_token for o in llm.outputs]
        assert min(ttft) <= r["TTFT p50 s"] <= r["TTFT p99 s"] == max(ttft)
        # The roofline columns, from the same counters: bytes read (weights every step, KV of every token held)
        # and FLOPs (2 per weight per token fed), over the time taken and the machine's measured rates.
        weights, per_token = llm.model.weight_bytes, llm.config.kv_bytes_per_token(llm.dtype.itemsize)
        kv_read = sum(len(p) + n / 2 for p, n in zip(prompts, lengths)) * per_token
        assert r["bandwidth use"] == pytest.approx(
            (st.steps * weights + kv_read) / st.wall_seconds / result["read_bandwidth_bytes_per_s"])
        assert r["compute use"] == pytest.approx(
            2 * weights / llm.dtype.itemsize * (sum(map(len, prompts)) + sum(lengths) - 6) / st.wall_seconds
            / result["matmul_flops"])


def test_median_run_keeps_the_middle_rate_and_only_tokens_every_round_agrees_on():
    rows = [{"output tok/s": v, "tokens": [[1, 2]]} for v in (300.0, 100.0, 200.0)]
    row = runs.median_run(rows)
    assert (row["output tok/s"], row["tokens"], row["rounds tok/s"]) == (200.0, [[1, 2]], "300.0 / 100.0 / 200.0")
    assert runs.median_run(rows[:2])["output tok/s"] == 100.0  # an even count: the lower middle
    assert "rounds tok/s" not in runs.median_run(rows[:1])
    rows[0]["tokens"] = [[1, 3]]
    assert runs.median_run(rows)["tokens"] is None


def test_ladder_rounds_interleave_the_engines_and_report_each_ones_median(monkeypatch):
    built = []

    def spy(module, args):
        llm = make_llm(module, args)
        built.append((STAGE_NAMES[module] + (", plain math" if args.no_batch_invariant else ""), llm))
        return llm

    decode_rates = []

    def recorded_rate(token_times):  # fixed rates, so the medians are known: 26 (reference), 35 (best stage)
        decode_rates.append([30.0, 10.0, 26.0, 40.0, 20.0, 35.0][len(decode_rates)])
        return decode_rates[-1]

    monkeypatch.setattr(runs, "make_llm", spy)
    monkeypatch.setattr(runs, "decode_rate", recorded_rate)  # one request alone: its runs' rates
    result = ladder.main(["--model", "tiny", "--workload", "random", "--num-requests", "5", "--max-tokens", "10",
                          "--prompt-range", "4,30", "--max-num-seqs", "4", "--stages", "01,03", "--rounds", "3",
                          "--no-hf", "--no-llama-cpp", "--no-vllm"])
    assert len(decode_rates) == 6
    alone = result["single_request"]
    assert alone["decode tok/s"] == 26.0 and alone["rounds decode tok/s"] == "30.0 / 10.0 / 26.0"
    names = ["01 static", "03 paged", "03 paged, plain math"]
    # round by round, every other round backwards (a drifting machine favours neither end of the ladder)
    assert [name for name, _ in built[:9]] == names + names[::-1] + names
    best = max(names[:2], key=lambda name: result["engines"][name]["output tok/s"])  # plain math is no stage
    assert [(name, llm.max_num_seqs) for name, llm in built[9:]] == [(best, 1)] and alone["best stage"] == (best, 35.0)
    for name in names:
        rates = [llm.stats.output_tokens / llm.stats.wall_seconds for n, llm in built[:9] if n == name]
        row = result["engines"][name]
        assert row["output tok/s"] == pytest.approx(sorted(rates)[1])
        assert row["rounds tok/s"] == " / ".join(f"{r:.1f}" for r in rates)
    assert result["same_tokens"]["01 static"] and result["same_tokens"]["03 paged"]  # plain math may differ
    assert result["invariant_over_plain"][4] == pytest.approx(
        result["engines"]["03 paged"]["output tok/s"] / result["engines"]["03 paged, plain math"]["output tok/s"])


@pytest.mark.parametrize("rounds", ["0", "-2", "three"])
def test_a_round_count_that_runs_nothing_is_refused_with_a_reason(rounds, capsys):
    with pytest.raises(SystemExit):
        importlib.import_module("stages.bench.ladder").build_parser().parse_args(["--rounds", rounds])
    assert "--rounds" in capsys.readouterr().err


def test_hf_baseline_counts_the_reference_tokens():
    import torch

    from stages.bench import baselines
    prompts = [[5, 6, 7, 8], [300, 301], [40, 41, 42, 43, 44, 45]]
    limits = [6, 9, 4]
    row = baselines.hf_generate(resolve_model("tiny"), prompts, limits, eos=[2], batch_size=2, dtype=torch.float32)
    ref = ReferenceLLM("tiny", dtype="float32").generate(prompts, [SamplingParams(temperature=0, max_tokens=n)
                                                                   for n in limits])
    assert row["output tokens"] == sum(len(r.token_ids) for r in ref)
    assert row["requests"] == 3 and row["prompt tokens"] == 12 and row["steps"] == 9 + 4
    # every EOS id ends a request: the first request's third token made a second EOS cuts it there
    extra = ref[0].token_ids[2]
    cut = [next((j + 1 for j, t in enumerate(r.token_ids) if t in (2, extra)), len(r.token_ids)) for r in ref]
    assert cut[0] <= 3
    row = baselines.hf_generate(resolve_model("tiny"), prompts, limits, eos=[2, extra], batch_size=2,
                                dtype=torch.float32)
    assert row["output tokens"] == sum(cut)


def test_a_sampled_ladder_samples_every_request_with_its_own_seed_and_keeps_the_tokens(monkeypatch):
    """--temperature / --top-p: each request sampled with its own seed (its index), so every stage must still give
    the reference's tokens; the table then prices sampling, which a greedy ladder never pays."""
    from common.llm import LLM
    seen, real_generate = [], LLM.generate

    def spy(self, prompts, params=None, **kw):
        seen.append(params)
        return real_generate(self, prompts, params, **kw)

    monkeypatch.setattr(LLM, "generate", spy)
    result = ladder.main(["--model", "tiny", "--workload", "random", "--num-requests", "5", "--max-tokens", "10",
                          "--prompt-range", "4,30", "--max-num-seqs", "4", "--stages", "01,03", "--no-plain",
                          "--no-hf", "--no-llama-cpp", "--no-vllm", "--temperature", "0.9", "--top-p", "0.8"])
    batched = [p for p in seen if isinstance(p, list) and len(p) == 5]
    assert batched and all([(q.temperature, q.top_p, q.seed) for q in p] == [(0.9, 0.8, i) for i in range(5)]
                           for p in batched)
    assert result["same_tokens"]["01 static"] and result["same_tokens"]["03 paged"]


def test_hf_baseline_samples_with_temperature_and_top_p_alone():
    from stages.bench import baselines
    assert baselines.hf_sampling(0.0, 0.9) == {"do_sample": False}
    assert baselines.hf_sampling(0.7, 0.9) == {"do_sample": True, "temperature": 0.7, "top_p": 0.9, "top_k": 0}
