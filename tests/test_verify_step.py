"""`python -m stages.bench.verify_step` on the tiny model: it times stage 06's steps by part, tells the steps that feed
prompt tokens from the decoding ones (and counts their rows fed and tokens kept), leaves the tokens the reference's,
and puts back what it wrapped."""
from common import SamplingParams
from common.numerics.invariant import RowTiled
from stages import speculative
from stages.bench import verify_step
from stages.speculative.defaults import DRAFT_ALWAYS


def test_steps_are_timed_by_part_and_the_tokens_stay_the_references(tiny_folder, tiny_reference, capsys):
    prompts = [[1, 5, 9, 14, 3, 7], [2, 8, 4, 4, 11]]
    plain = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    expected = [o.token_ids for o in tiny_reference.generate(prompts, [plain, plain])]
    llm = speculative.LLM(str(tiny_folder), dtype="bfloat16", max_num_seqs=1, speculative_config=DRAFT_ALWAYS)
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, prediction=llm.tokenizer.decode(e))
              for e in expected]  # the reference's own answer as the prediction: drafts fed, most of them kept
    call = RowTiled.__call__
    outs, steps, wall = verify_step.profile(llm, prompts, params)
    assert [o.token_ids for o in outs] == expected
    assert RowTiled.__call__ is call and "step" not in vars(llm.engine)  # put back
    # one request at a time: each prompt in a step of its own, which samples its first token; then decoding steps
    assert [s["rows"] for s in steps if s["prompt"]] == [6, 5]
    assert sum(s["kept"] for s in steps) == 24 and any(s["rows"] > 1 for s in steps if not s["prompt"])
    for s in steps:
        assert s["linears"] > 0 and s["LM head"] > 0 and s["norms"] > 0
        assert sum(v for k, v in s.items() if k not in ("wall", "rows", "kept", "prompt")) < s["wall"]
    assert sum(s["wall"] for s in steps) <= wall
    verify_step.report("stage 06", steps, wall, 24)
    out = capsys.readouterr().out
    assert "stage 06: 24 tokens" in out and "1-6" in out and "the rest" in out
