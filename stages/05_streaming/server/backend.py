"""What the server needs from an engine, and the engine in this process that provides it.

`create_app` talks to an engine through five things: `submit` a request (its `RequestStream`,
or `QueueFull`/`ValueError`; `submit_samples` for n samples, where an engine has it),
`abort` one, `health`, `metrics`, and the `tokenizer` with the
context length (`max_model_len`) that requests are checked against. `LocalEngine` gives them
for a stage-05 `LLM` in this process; the cluster's gateway gives them for engine replicas
on Ray Serve (`gateway.RemoteEngine`), so both serve the same API with the same checks.

A request is prepared (checked, its prediction tokenized, its grammar compiled and its first mask computed:
``LLM.add_samples``) on a small pool of worker threads, never on the engine's thread nor the event loop's: a 1 MB
prediction or a 275 KB schema takes seconds there, and the other requests' tokens must not wait for it.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from ..engine import LLM, RequestStream

PREPARE_WORKERS = 4  # requests prepared at once; more would only share the same two cores


class LocalEngine:
    def __init__(self, llm: LLM, pool: ThreadPoolExecutor | None = None):
        self.llm = llm
        self.tokenizer, self.max_model_len = llm.tokenizer, llm.max_model_len
        self.pool = pool or ThreadPoolExecutor(PREPARE_WORKERS, thread_name_prefix="prepare")

    async def prepare(self, fn, *args):
        """``fn(*args)`` on a worker thread (a prompt's tokenization, say), awaited."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def submit(self, prompt_ids: list[int], params) -> RequestStream:
        loop = asyncio.get_running_loop()
        return await self.prepare(lambda: self.llm.add_request(prompt_ids, params, loop=loop))

    async def submit_samples(self, prompt_ids: list[int], params) -> list[RequestStream]:
        """A request's n samples (params.n), a stream each, sharing the prompt's KV blocks."""
        loop = asyncio.get_running_loop()
        return await self.prepare(lambda: self.llm.add_samples(prompt_ids, params, loop=loop))

    def abort(self, request_id: str) -> None:
        self.llm.abort(request_id)

    async def health(self) -> tuple[str, dict]:
        """("ok" or what is wrong, details to add to the /health body)."""
        return ("ok" if self.llm.is_alive() else "engine stopped"), {}

    async def metrics(self) -> str:
        llm = self.llm
        g = llm.gauges()  # one snapshot of the engine after its last step
        gauges = {
            "stepwise_requests_waiting": (llm.num_waiting, "Requests waiting"),
            "stepwise_requests_running": (g["running"], "Requests running"),
            "stepwise_kv_blocks_used": (g["kv_blocks_used"], "KV blocks held by requests"),
            "stepwise_kv_blocks_free": (g["kv_blocks_free"], "KV blocks free (cached ones included)"),
            "stepwise_kv_cache_usage_ratio": (g["kv_blocks_used"] / g["kv_blocks"], "Share of KV blocks in use"),
            "stepwise_prefix_cache_hit_rate": (g["prefix_hit_rate"],
                                               "Prompt tokens found in the prefix cache / looked up"),
            "stepwise_preemptions": (g["preemptions"], "Preemptions since the server started"),
        } | llm.server_gauges()  # a later stage's (stage 07: the grammar cache's bytes)
        return llm.metrics.render(gauges)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.llm.shutdown()
