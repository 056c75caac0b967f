"""Hypothesis strategies for workloads, and small helpers, shared by the stage tests."""
import importlib
import os
import socket
import threading
import time
from contextlib import contextmanager

from hypothesis import strategies as st

from common import SamplingParams

TINY_VOCAB = 1024


# The test profiles ($STEPWISE_TEST_PROFILE): "deep" runs each property test's own count of hypothesis examples
# (`make test-deep`, and CI through .ci/run); "quick", `make test`'s default, runs QUICK_SHARE of it, never fewer
# than QUICK_FLOOR (nor more than the test's own count): the strategies are the same, so quick draws from the same
# space, less densely, and every fixed case (parametrize, @example, the explicit scenarios) runs in both. Two
# files trim more in quick, saying so where they do: test_layout.py runs every `--help` in one process instead of
# one each, test_oracle_hf.py the greedy comparison with transformers on one prompt of its three.
PROFILES = ("quick", "deep")
QUICK_SHARE, QUICK_FLOOR = 0.4, 10


def profile() -> str:
    """The test profile in force: $STEPWISE_TEST_PROFILE, "quick" when unset; any other name is refused."""
    name = os.environ.get("STEPWISE_TEST_PROFILE") or "quick"
    if name not in PROFILES:
        raise ValueError(f"STEPWISE_TEST_PROFILE={name!r}: the profiles are {', '.join(PROFILES)}")
    return name


def examples(n: int, name: str | None = None) -> int:
    """A property test's hypothesis examples, ``n`` being its own (deep) count: scaled by the profile ``name`` (the
    one in force by default), then times $STEPWISE_EXAMPLES_SCALE (`make mutants` runs fewer)."""
    if (name or profile()) == "quick":
        n = min(n, max(QUICK_FLOOR, round(n * QUICK_SHARE)))
    return max(1, round(n * float(os.environ.get("STEPWISE_EXAMPLES_SCALE", "1"))))


@st.composite
def sampling_params(draw, max_tokens=st.integers(1, 40)):
    greedy = draw(st.booleans())
    return SamplingParams(
        max_tokens=draw(max_tokens),
        temperature=0.0 if greedy else draw(st.sampled_from([0.5, 0.8, 1.0, 1.3])),
        top_k=draw(st.sampled_from([-1, 5, 50])),
        top_p=draw(st.sampled_from([1.0, 0.9, 0.5])),
        seed=None if greedy else draw(st.integers(0, 2**31)),
        stop_token_ids=draw(st.lists(st.integers(3, 40), max_size=3)),
        ignore_eos=draw(st.booleans()),
    )


@st.composite
def workloads(draw, max_requests=8, max_prompt=300):
    n = draw(st.integers(1, max_requests))
    prompts = [draw(st.lists(st.integers(3, TINY_VOCAB - 1), min_size=1, max_size=max_prompt)) for _ in range(n)]
    params = [draw(sampling_params()) for _ in range(n)]
    return prompts, params


def finish_problems(out, params: SamplingParams, eos_token_id: int, max_model_len: int | None = None) -> list[str]:
    """What is wrong with how an output ended, from its own tokens and text alone. Every engine and the reference
    run the same `Sequence` code, so comparing with the reference cannot see a mistake there. A request ends at its
    first stop token or EOS; a stop token or EOS wins over the length limit (the ``max_tokens``-th token can finish
    with "stop"); "length" means ``max_tokens`` (or the context) was reached; the text holds no stop string."""
    ids, problems = out.token_ids, []
    stops = lambda t: (t == eos_token_id and not params.ignore_eos) or t in params.stop_token_ids  # noqa: E731
    if any(stops(t) for t in ids[:-1]):
        problems.append("went on past a stop token or EOS")
    if ids and stops(ids[-1]) and out.finish_reason != "stop":
        problems.append(f"ended on a stop token or EOS with {out.finish_reason!r}, not 'stop'")
    if out.finish_reason == "stop" and not (ids and stops(ids[-1])) and not params.stop:
        problems.append("'stop' with no stop token, EOS or stop string")
    full = len(ids) == params.max_tokens or (max_model_len and len(out.prompt_token_ids) + len(ids) >= max_model_len)
    if out.finish_reason == "length" and not full:
        problems.append(f"'length' after {len(ids)} of max_tokens={params.max_tokens}")
    if any(s in out.text for s in params.stop):
        problems.append(f"a stop string in the text {out.text!r}")
    return problems


def wait_until(condition, timeout: float = 30.0) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout`` seconds pass (False): the engine runs in a thread."""
    end = time.time() + timeout
    while time.time() < end:
        if condition():
            return True
        time.sleep(0.01)
    return False


class Server:
    """Stage 05's server (uvicorn) in a thread on a free loopback port; ``app_options`` go to `create_app`, and
    ``wrap``, if given, wraps the app (an ASGI middleware that watches what the server serves)."""

    def __init__(self, llm, model_name, wrap=None, **app_options):
        import uvicorn
        create_app = importlib.import_module("stages.streaming.server.app").create_app
        self.llm = llm
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        app = create_app(llm, model_name, **app_options)
        self.app = wrap(app) if wrap else app
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        assert wait_until(lambda: self.server.started)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)
        self.llm.shutdown()


@contextmanager
def checked_steps():
    """Check every step a paged scheduler (stages 03-05) plans while the block runs; yields the violations found.

    A step feeds at most ``max_num_batched_tokens`` tokens and ``max_num_seqs`` sequences, each sequence once,
    each at least one and at most its uncomputed tokens, into blocks already allocated for them. The scheduling
    rules whose breach leaves every token unchanged (so no comparison with the reference sees it) are checked too:
    every request sent back to the queue counts as a preemption, the one that steps aside itself included; the
    victims are the newest running requests, back at the front of the queue in admission order; a step that
    preempted admits nobody, not even the request it preempted; and every full block of computed tokens a running
    request holds is in the prefix cache (committed the step it was filled, not when its request finishes), so a
    request with the same start hits it while the first still runs. Stage 05 plans in its engine thread, so
    violations are collected, not raised: the test asserts the list is empty."""
    scheduler_class = importlib.import_module("stages.03_paged_kv").Scheduler
    preemption = importlib.import_module("stages.paged_kv.preemption")
    plan, preempt, violations = scheduler_class.plan, preemption.preempt, []
    seen = threading.local()  # the sequences preempted by the step planning on this thread

    def record_preempt(seq, waiting, block_manager):
        getattr(seen, "preempted", []).append(seq)
        return preempt(seq, waiting, block_manager)

    def checked_plan(self):
        bm, pc = self.block_manager, self.prefix_cache
        bs = bm.block_size
        committed = pc is None or all(bm.table(s)[i] in pc.of_block
                                      for s in self.running for i in range(s.num_cached_tokens // bs))
        before, seen.preempted = list(self.running), []
        try:
            seqs, lens = plan(self)
        finally:
            preempted, seen.preempted = seen.preempted, []
        k = len(preempted)
        checks = {
            "token budget": sum(lens) <= self.max_num_batched_tokens,
            "sequence limit": len(seqs) <= self.max_num_seqs and len(self.running) <= self.max_num_seqs,
            "each sequence once": len({s.seq_id for s in seqs}) == len(seqs) == len(lens),
            "feeds 1..uncomputed tokens": all(1 <= n <= s.num_new_tokens for s, n in zip(seqs, lens)),
            "blocks allocated": all(len(bm.table(s)) * bs >= s.num_cached_tokens + n for s, n in zip(seqs, lens)),
            "every preemption counted": self.num_preempted == k,
            "the newest preempted, requeued first in admission order":
                preempted == before[::-1][:k] and list(self.waiting)[:k] == before[len(before) - k:],
            "no admission in a step that preempted": not k or self.running == before[:len(before) - k],
            "running requests' full blocks committed": committed,
        }
        violations.extend(f"{name}: lens={lens}, budget={self.max_num_batched_tokens}, preempted={k}"
                          for name, ok in checks.items() if not ok)
        return seqs, lens

    scheduler_class.plan, preemption.preempt = checked_plan, record_preempt
    try:
        yield violations
    finally:
        scheduler_class.plan, preemption.preempt = plan, preempt
