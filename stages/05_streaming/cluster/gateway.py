"""The gateway's engine: stage 05's server talks to it as to a local LLM; it forwards to replicas on Ray Serve.

`submit` sends a request through the deployment handle, whose router (Ray Serve's
power-of-two-choices on queue length) picks the less loaded of two replicas, or holds the
request until one has room. It waits for the replica's first answer, so a full queue or an
invalid request still gets its 503 or 400 before any byte is sent; the stream then reads
the replica's chunks. A replica that dies ends its streams with an error chunk (the server
turns it into an OpenAI error object, or an error event and ``[DONE]``), never a hung client.
"""
from __future__ import annotations

import asyncio
import time
import uuid

from ray import serve
from ray.exceptions import RayError
from ray.serve.exceptions import BackPressureError

from common.tokenizer import Tokenizer
from common.validate import InvalidParam

from ..engine import QueueFull, StreamChunk
from .metrics import GatewayMetrics, ReplicaStats
from .replica import sampling_dict


class RemoteStream:
    """One request on a replica: what the server reads, like a local `RequestStream`."""

    def __init__(self, request_id: str, gen, replica: str, metrics: GatewayMetrics, arrival: float, on_close):
        self.request_id, self.gen, self.metrics, self.arrival = request_id, gen, metrics, arrival
        self.on_close = on_close
        self.stats: ReplicaStats = metrics.replicas[replica]
        self.headers = {"X-Stepwise-Replica": replica}
        self.done = asyncio.Event()
        self.started = self.aborted = False

    async def __aiter__(self):
        try:
            async for msg in self.gen:
                if msg["token_ids"]:
                    self.metrics.tokens(self.stats, len(msg["token_ids"]), not self.started,
                                        time.perf_counter() - self.arrival)
                    self.started = True
                chunk = StreamChunk(msg["text"], msg["token_ids"], msg["finish_reason"], error=msg["error"])
                if chunk.finish_reason is not None:
                    self.close(failed=chunk.finish_reason == "error")
                yield chunk
                if chunk.finish_reason is not None:
                    return
            raise RuntimeError("the replica's stream ended without a finish reason")
        except (RayError, RuntimeError) as e:
            if self.aborted:  # by the server (a client that left, or a shutdown): end like a local abort
                yield StreamChunk("", [], "abort")
                return
            self.close(failed=True)
            yield StreamChunk("", [], "error", error=f"the replica serving this request failed "
                                                     f"({type(e).__name__}); the request was not completed: retry it")

    def close(self, failed: bool = False) -> None:
        if not self.done.is_set():
            self.done.set()
            self.metrics.ended(self.stats, self.started, failed)
            self.on_close(self.request_id)

    def abort(self) -> None:
        if not self.done.is_set():
            self.aborted = True
            self.gen.cancel()  # the replica's call is cancelled: it aborts the request in its engine
            self.close()


class RemoteEngine:
    """`backend.LocalEngine`'s methods, for the replicas of the deployment ``app_name`` on Ray Serve."""

    def __init__(self, handle, model: str, app_name: str, deployment: str = "EngineReplica"):
        from common.prepare import resolve_model
        self.handle, self.app_name, self.deployment = handle.options(stream=True), app_name, deployment
        self.unary_handle = handle
        self.tokenizer = Tokenizer(resolve_model(model))
        self.description = handle.describe.remote().result()  # one replica's; they are configured alike
        self.max_model_len = self.description["max_model_len"]
        self.gateway_metrics = GatewayMetrics()
        self.streams: dict[str, RemoteStream] = {}

    async def submit(self, prompt_ids: list[int], params) -> RemoteStream:
        arrival = time.perf_counter()
        gen = self.handle.generate.remote(prompt_ids, sampling_dict(params))
        self.gateway_metrics.pending += 1
        try:
            first = await gen.__anext__()
        except asyncio.CancelledError:  # the handler was cancelled (a shutdown): no replica works for nobody
            gen.cancel()
            raise
        except BackPressureError as e:
            raise QueueFull(f"{e}: every replica is busy and the router's queue is full; retry shortly") from None
        except RayError as e:
            raise QueueFull(f"no replica could take the request ({type(e).__name__}); retry shortly") from None
        finally:
            self.gateway_metrics.pending -= 1
        if first.get("rejected") == "queue_full":
            raise QueueFull(first["message"])
        if first.get("rejected") == "invalid":
            raise InvalidParam(first["param"], first["message"])
        self.gateway_metrics.accepted(first)
        stream = RemoteStream(f"gw-{uuid.uuid4().hex}", gen, first["replica"], self.gateway_metrics, arrival,
                              on_close=lambda rid: self.streams.pop(rid, None))
        self.streams[stream.request_id] = stream
        return stream

    def abort(self, request_id: str) -> None:
        stream = self.streams.pop(request_id, None)
        if stream is not None:
            stream.abort()

    def replica_states_now(self) -> tuple[str, dict[str, int]]:
        """(the deployment's status, replicas by state), from the Serve controller (a blocking call)."""
        app = serve.status().applications.get(self.app_name)
        if app is None or self.deployment not in app.deployments:
            return "NOT_DEPLOYED", {}
        d = app.deployments[self.deployment]
        return str(getattr(d.status, "value", d.status)), dict(d.replica_states)

    async def replica_states(self) -> tuple[str, dict[str, int]]:
        return await asyncio.to_thread(self.replica_states_now)

    async def health(self) -> tuple[str, dict]:
        """ok: replicas run and none is failing; degraded: some run while others are replaced; else unavailable."""
        deployment, states = await self.replica_states()
        running = states.get("RUNNING", 0)
        scaling = deployment in ("HEALTHY", "UPSCALING", "DOWNSCALING")
        status = "unavailable" if not running else "ok" if scaling else "degraded"
        return status, {"deployment": deployment, "replicas": states}

    async def metrics(self) -> str:
        return self.gateway_metrics.render((await self.replica_states())[1])

    def run_forever(self, stop, on_start=None) -> None:
        """`serve` hands its main thread to the engine loop; here the engines step in their replicas, so the
        thread only starts HTTP (``on_start``) and waits, where a signal can reach it, until ``stop`` is set."""
        if on_start is not None:
            on_start()
        while not stop.wait(0.5):
            pass

    def shutdown(self) -> None:
        for stream in list(self.streams.values()):
            stream.abort()
        self.streams.clear()
