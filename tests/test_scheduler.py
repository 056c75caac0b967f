"""Stage 03's scheduler step by step, without a model: each plan checked against the rules its docstring states
(running sequences first, oldest first; newcomers with what budget is left; the newest preempted when blocks run
out, back at the front of the queue; stage 05's abort takes a request out wherever it is)."""
import importlib
from collections import deque

import torch
from hypothesis import given, settings, strategies as st

from common import SamplingParams, Sequence
from common.engine import SeqOutput
from common.engine_config import SchedulerConfig
from workloads import checked_steps, examples

paged = importlib.import_module("stages.03_paged_kv")
preemption = importlib.import_module("stages.paged_kv.preemption")


def request(prompt_len: int, max_tokens: int = 50) -> Sequence:
    return Sequence(list(range(10, 10 + prompt_len)), SamplingParams(temperature=0, max_tokens=max_tokens,
                                                                     ignore_eos=True), 2, torch.device("cpu"))


def scheduler(num_blocks: int, block_size: int, max_num_seqs: int = 4, budget: int = 512, cls=None):
    return (cls or paged.Scheduler)(SchedulerConfig(max_num_seqs, budget), paged.BlockManager(num_blocks, block_size))


def step(s) -> list[tuple[Sequence, int]]:
    """Plan a step, then do what the runner does: the fed tokens become cached, a completed one samples a token."""
    batch = s.schedule()
    seqs, lens = batch.seqs, batch.lens
    outputs = [SeqOutput([7] if seq.num_cached_tokens + n == len(seq) else []) for seq, n in zip(seqs, lens)]
    s.postprocess(batch, outputs)
    return list(zip(seqs, lens))


def test_running_first_then_newcomers_with_the_budget_left():
    s = scheduler(64, 4, budget=10)
    a, b, c = request(7), request(6), request(5)
    for seq in (a, b, c):
        s.add(seq)
    assert step(s) == [(a, 7), (b, 3)]  # b's prompt is chunked: 3 of its 6 tokens fit
    assert step(s) == [(a, 1), (b, 3), (c, 5)]  # a decodes, b finishes its prompt, c takes what is left
    assert step(s) == [(a, 1), (b, 1), (c, 1)]
    assert [len(x.output_token_ids) for x in (a, b, c)] == [3, 2, 2]


def test_sequence_limit_holds_newcomers_back():
    s = scheduler(64, 4, max_num_seqs=2)
    a, b, c = request(3), request(3), request(3)
    for seq in (a, b, c):
        s.add(seq)
    assert step(s) == [(a, 3), (b, 3)]
    assert list(s.waiting) == [c] and s.running == [a, b]


def test_the_newest_is_preempted_and_requeued_first_and_counted():
    s = scheduler(4, 2)  # 8 token slots
    a, b = request(3), request(3)
    s.add(a), s.add(b)
    assert step(s) == [(a, 3), (b, 3)]  # two blocks each: the pool is full
    assert step(s) == [(a, 1), (b, 1)]  # position 3 still fits their second blocks
    plan = step(s)  # a needs a third block: b (the newest) gives its blocks back
    assert plan == [(a, 1)] and s.running == [a] and list(s.waiting) == [b]
    assert b.status.value == "waiting" and s.block_manager.table(b) == [] and b.num_cached_tokens == 0
    assert (s.num_preempted, s.block_manager.num_free_blocks) == (1, 1)  # the step reports its preemption
    c = request(1)
    s.add(c)
    assert list(s.waiting) == [b, c]  # the preempted request goes first when memory frees
    a.params.max_tokens = len(a.output_token_ids) + 1  # a ends at the next step and frees its blocks
    assert step(s) == [(a, 1)] and a.is_finished
    assert step(s) == [(b, 5), (c, 1)]  # b recomputes its prompt and the 2 tokens it had sampled; c fits too
    assert s.num_preempted == 0
    s.running.remove(b)
    preemption.preempt(b, s.waiting, s.block_manager)  # preempted again: back at the front, its blocks freed
    assert list(s.waiting) == [b] and s.block_manager.num_free_blocks == 3 and b.num_cached_tokens == 0


def test_abort_takes_a_request_out_wherever_it_is():
    s = scheduler(8, 4, max_num_seqs=1, cls=paged.Scheduler)
    running, waiting = request(5), request(5)
    s.add(running), s.add(waiting)
    step(s)
    assert s.running == [running] and list(s.waiting) == [waiting]
    s.abort(waiting)  # still queued: it never held a block
    assert not s.waiting and waiting.finish_reason == "abort" and s.block_manager.num_free_blocks == 6
    s.abort(running)  # its blocks go back at once, not after one more step
    assert not s.running and running.finish_reason == "abort" and s.block_manager.num_free_blocks == 8
    assert not s.has_work() and step(s) == []
    done = request(2, max_tokens=1)
    s.add(done)
    step(s)
    s.abort(done)  # already finished: it keeps its reason
    assert done.finish_reason == "length"


def test_a_request_that_preempts_itself_counts_as_a_preemption():
    """What counts as a preemption: any request whose blocks go back so it is recomputed later, the one that steps
    aside itself (nothing newer is left to preempt) as much as a victim."""
    s = scheduler(4, 2)  # 8 token slots
    a, b = request(3), request(4)
    s.add(a), s.add(b)
    assert step(s) == [(a, 3), (b, 4)]  # two blocks each: the pool is full
    assert step(s) == [(a, 1)]  # a's position 3 fits its second block; b, the newest, needs a third and steps aside
    assert s.running == [a] and list(s.waiting) == [b] and s.block_manager.table(b) == []
    assert s.num_preempted == 1


def test_a_step_that_preempts_admits_nobody_not_even_the_request_it_preempted():
    """The admission rule after a preemption: newcomers are admitted only in a step that preempted nothing. Here the
    request that stepped aside would fit again at once (a 3-token chunk in the block it gave back) and would be
    readmitted, recomputed and preempted again, step after step."""
    s = scheduler(4, 4, max_num_seqs=2, budget=4)
    a, b = request(8), request(6)
    s.add(a), s.add(b)
    assert step(s) == [(a, 4)] and step(s) == [(a, 4)]  # a's prompt in two chunks: the budget is 4
    assert step(s) == [(a, 1), (b, 3)]  # a's first decode takes a third block, b's first chunk the fourth
    assert step(s) == [(a, 1)]  # b's next chunk needs a fifth block: b steps aside, and stays out this step
    assert s.num_preempted == 1 and s.running == [a] and list(s.waiting) == [b]
    assert s.block_manager.num_free_blocks == 1


@settings(max_examples=examples(200), deadline=None)
@given(prompts=st.lists(st.lists(st.integers(10, 12), min_size=1, max_size=24), min_size=1, max_size=7),
       max_tokens=st.lists(st.integers(1, 12), min_size=7, max_size=7), block_size=st.sampled_from([1, 2, 4]),
       spare_blocks=st.integers(0, 6), max_num_seqs=st.integers(1, 4), token_budget=st.integers(0, 12),
       prefix_caching=st.booleans())
def test_the_scheduling_rules_hold_at_every_step_of_any_workload(prompts, max_tokens, block_size, spare_blocks,
                                                                 max_num_seqs, token_budget, prefix_caching):
    """Without a model, so hundreds of workloads a second: every step checked by `checked_steps` (budgets, limits,
    preemptions counted, the newest preempted, no admission after a preemption, full blocks committed), with pools
    so small that requests preempt each other and themselves, and prompts over three token ids that share
    prefixes. Every request runs to its max_tokens and every block comes back."""
    seqs = [Sequence(prompt, SamplingParams(temperature=0, max_tokens=m, ignore_eos=True), 2, torch.device("cpu"))
            for prompt, m in zip(prompts, max_tokens)]
    need = max(-(-(len(q) + q.params.max_tokens) // block_size) for q in seqs)  # the pool fits the largest alone
    pc = paged.PrefixCache(block_size) if prefix_caching else None
    s = paged.Scheduler(SchedulerConfig(max_num_seqs, max_num_seqs + token_budget),
                        paged.BlockManager(need + spare_blocks, block_size, pc))
    for seq in seqs:
        s.add(seq)
    with checked_steps() as violations:
        for _ in range(2000):
            if not s.has_work():
                break
            assert step(s), "a step with nothing to run"
    assert not violations, violations[:3]
    assert all(q.is_finished and len(q.output_token_ids) == q.params.max_tokens for q in seqs)
    assert s.block_manager.num_free_blocks == s.block_manager.num_blocks


def test_make_room_counts_every_victim_it_preempts():
    """One call can preempt several requests (newest first) when the one that needs room needs several blocks."""
    bm = paged.BlockManager(4, 2)
    a, b, c = request(2), request(2), request(2)
    running, waiting = [a, b, c], deque()
    for seq in running:
        bm.allocate(seq, [])
        bm.append_slots(seq, 2)
        seq.num_cached_tokens = 2
    fits, victims = preemption.make_room(a, 5, running, waiting, bm)
    assert fits and len(victims) == 2  # a needs 3 more blocks: c's and b's
    assert running == [a] and list(waiting) == [b, c] and bm.num_free_blocks == 3
