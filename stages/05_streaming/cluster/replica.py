"""One engine replica on Ray Serve: a stage-05 `LLM` in its own process, streaming one request per call.

`generate` answers first with where it runs (or why it refused the request: a full queue or
an invalid request, which the gateway turns into the same 503 or 400 as the single-process
server), then with the request's chunks as the engine produces them. A call cancelled by the
gateway (its client went away) aborts the request, and its blocks return at the next step.

Torch runs on ``torch_threads`` threads per replica (1 by default): replicas on one machine
share its cores, and torch ops issued from a thread other than the process's main one (the
engine loop's) run about twice as slow when OpenMP has to give that thread its own team.
"""
from __future__ import annotations

import asyncio
import os
from dataclasses import asdict


class EngineReplica:
    def __init__(self, model: str, engine_options: dict, torch_threads: int | None = 1):
        import torch
        if torch_threads:
            torch.set_num_threads(torch_threads)
        from stages import streaming
        self.llm = streaming.LLM(model, **engine_options)
        self.QueueFull = streaming.QueueFull
        self.where = where_am_i()

    def describe(self) -> dict:
        """What the gateway checks requests against, and where this replica runs."""
        return self.where | {"max_model_len": self.llm.max_model_len, "max_num_seqs": self.llm.max_num_seqs,
                             "device": str(self.llm.device)}

    def engine_state(self) -> dict:
        """This replica's engine right now (for tests and operators: requests in it, KV blocks held)."""
        g = self.llm.gauges()  # the engine after its last step
        return {"replica": self.where["replica"], "waiting": self.llm.num_waiting, "running": g["running"],
                "kv_blocks_used": g["kv_blocks_used"]}

    async def generate(self, prompt_ids: list[int], params: dict):
        try:
            stream = self.llm.add_request(prompt_ids, params, loop=asyncio.get_running_loop())
        except self.QueueFull as e:
            yield {"rejected": "queue_full", "message": str(e)}
            return
        except ValueError as e:
            yield {"rejected": "invalid", "message": str(e), "param": getattr(e, "param", None)}
            return
        yield {"accepted": True} | self.where
        try:
            async for chunk in stream:
                yield {"text": chunk.text, "token_ids": chunk.token_ids, "finish_reason": chunk.finish_reason,
                       "error": chunk.error}
        finally:  # done, or cancelled by the gateway: free the request's blocks
            if not stream.done.is_set():
                self.llm.abort(stream.request_id)

    def check_health(self) -> None:
        """Ray Serve calls this periodically; an engine whose loop died is replaced."""
        if not self.llm.is_alive():
            raise RuntimeError("the engine loop has stopped")

    def __del__(self):
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.shutdown()


def where_am_i() -> dict:
    import ray
    from ray import serve
    return {"replica": serve.get_replica_context().replica_id.unique_id, "node": ray.util.get_node_ip_address(),
            "pid": os.getpid()}


def sampling_dict(params) -> dict:
    """SamplingParams as plain data for the call to a replica (which checks it again against its vocabulary)."""
    return asdict(params)
