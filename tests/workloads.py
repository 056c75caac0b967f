"""Hypothesis strategies for workloads, and small helpers, shared by the stage tests."""
import importlib
import socket
import threading
import time

from hypothesis import strategies as st

from common import SamplingParams

TINY_VOCAB = 1024


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


def wait_until(condition, timeout: float = 30.0) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout`` seconds pass (False): the engine runs in a thread."""
    end = time.time() + timeout
    while time.time() < end:
        if condition():
            return True
        time.sleep(0.01)
    return False


class Server:
    """Stage 05's server (uvicorn) in a thread on a free loopback port; ``app_options`` go to `create_app`."""

    def __init__(self, llm, model_name, **app_options):
        import uvicorn
        create_app = importlib.import_module("stages.05_streaming.server").create_app
        self.llm = llm
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(create_app(llm, model_name, **app_options), log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        assert wait_until(lambda: self.server.started)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)
        self.llm.shutdown()
