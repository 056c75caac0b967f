"""python -m stages.05_streaming cluster: stage 05's OpenAI server in front of engine replicas on Ray Serve.

The gateway is this process: the same FastAPI app, checks and errors as `serve`, whose engine
is a deployment handle (`gateway.RemoteEngine`). Each replica (`replica.EngineReplica`) is a
stage-05 `LLM` in its own Ray actor. Ray Serve routes each request to the less loaded of two
replicas, queues it when all are at their limit, scales the replica count on ongoing requests,
and replaces a replica that dies. Without ``--address`` a Ray instance starts on this machine,
bound to loopback; with one, the same code runs on an existing (multi-node) Ray cluster.
"""
from __future__ import annotations

import importlib.util
import os
import threading
import time
from dataclasses import dataclass

from rich.console import Console

from common.paths import DEFAULT_MODEL

from .calibrate import calibrate
from .replica import EngineReplica

RAY_MISSING = ("the cluster command needs Ray Serve, an optional extra: pip install -e '.[cluster]' "
               "(or pip install 'ray[serve]==2.60.0')")


def require_ray() -> None:
    if importlib.util.find_spec("ray") is None:
        raise SystemExit(f"error: {RAY_MISSING}")


@dataclass
class ClusterConfig:
    model: str = DEFAULT_MODEL
    dtype: str = "bfloat16"
    device: str = "cpu"
    replicas: int = 1  # a fixed count, unless min_replicas/max_replicas ask for autoscaling
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_ongoing_requests: float | None = None  # per replica; default: its batch limit
    max_num_seqs: int | None = None  # None: calibrated from tpot_target_ms
    tpot_target_ms: float = 100.0
    max_model_len: int | None = None
    kv_memory: str | None = None
    max_waiting: int = 256  # requests the router holds when every replica is full; past that: 503
    torch_threads: int = 1
    cpus_per_replica: float = 1.0
    app_name: str = "stepwise"
    upscale_delay_s: float = 5.0
    downscale_delay_s: float = 30.0
    look_back_period_s: float = 5.0
    metrics_interval_s: float = 1.0
    health_check_period_s: float = 2.0

    @property
    def autoscaling(self) -> bool:
        return self.min_replicas is not None or self.max_replicas is not None


def connect(address: str | None = None, num_cpus: int | None = None) -> None:
    """Join the Ray cluster at ``address``, or start one on this machine (loopback only), and start Serve."""
    if address is None:
        # Ray binds a local instance to the machine's network address unless told it is single-node.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        # Replicas sharing a machine's cores answer the router's queue-length probes late under load (the 0.1 s
        # default then times out, and the router picks replicas without knowing their queues).
        os.environ.setdefault("RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S", "0.5")
    import ray
    from ray import serve
    if not ray.is_initialized():
        local = {} if address else {"num_cpus": num_cpus or os.cpu_count(), "object_store_memory": 200 << 20}
        ray.init(address=address, include_dashboard=False, **local)
    serve.start(proxy_location="Disabled")  # the gateway serves HTTP; Serve only routes, scales and heals


def deploy(config: ClusterConfig, console: Console | None = None):
    """Calibrate (unless max_num_seqs is given), deploy the replicas, return (RemoteEngine, Calibration | None)."""
    import ray
    from ray import serve
    from .gateway import RemoteEngine
    console = console or Console()
    gpus = 1 if config.device.startswith("cuda") else 0
    calibration, max_num_seqs = None, config.max_num_seqs
    if max_num_seqs is None:  # measured where a replica would run, with a replica's resources
        # max_calls=1: the worker exits afterwards, and the model it loaded with it
        task = ray.remote(num_cpus=config.cpus_per_replica, num_gpus=gpus, max_calls=1)(calibrate)
        calibration = ray.get(task.remote(config.model, config.tpot_target_ms, config.dtype, config.device,
                                          config.torch_threads))
        console.print(calibration.table())
        max_num_seqs = calibration.max_num_seqs
    engine_options = {"dtype": config.dtype, "device": config.device, "max_num_seqs": max_num_seqs,
                      "max_model_len": config.max_model_len, "kv_cache_memory": config.kv_memory,
                      "max_waiting": config.max_waiting}
    options = {"name": "EngineReplica",
               # a little waiting room in each replica refills a freed slot at the next step; the rest waits at
               # the router, where whichever replica frees a slot first takes it
               "max_ongoing_requests": max_num_seqs + max(1, max_num_seqs // 4),
               "max_queued_requests": config.max_waiting,
               "ray_actor_options": {"num_cpus": config.cpus_per_replica, "num_gpus": gpus},
               "health_check_period_s": config.health_check_period_s, "health_check_timeout_s": 30,
               "graceful_shutdown_timeout_s": 5, "logging_config": {"enable_access_log": False}}
    if config.autoscaling:
        low = config.min_replicas if config.min_replicas is not None else 1
        options["autoscaling_config"] = {
            "min_replicas": low, "max_replicas": max(low, config.max_replicas or low), "initial_replicas": low,
            "target_ongoing_requests": config.target_ongoing_requests or max_num_seqs,
            "upscale_delay_s": config.upscale_delay_s, "downscale_delay_s": config.downscale_delay_s,
            "look_back_period_s": config.look_back_period_s, "metrics_interval_s": config.metrics_interval_s}
    else:
        options["num_replicas"] = config.replicas
    app = serve.deployment(EngineReplica).options(**options).bind(config.model, engine_options, config.torch_threads)
    handle = serve.run(app, name=config.app_name, route_prefix=None)
    return RemoteEngine(handle, config.model, config.app_name), calibration


def teardown(app_name: str, local: bool) -> None:
    """Remove the app; a Ray instance this process started goes too, an existing cluster stays up."""
    import ray
    from ray import serve
    if local:
        serve.shutdown()
        ray.shutdown()
    else:
        serve.delete(app_name)


def watch_replicas(engine, console: Console, stop: threading.Event, period: float = 1.0) -> None:
    """Print a line whenever the replica count by state changes: the autoscaling timeline."""
    start, last = time.monotonic(), None
    while not stop.wait(period):
        try:
            _, states = engine.replica_states_now()
        except Exception:  # noqa: BLE001 - the controller is restarting or Ray is shutting down
            continue
        if states != last:
            m = engine.gateway_metrics
            console.print(f"[dim]t={time.monotonic() - start:7.1f}s[/] replicas {dict(sorted(states.items()))}  "
                          f"pending at router {m.pending}  running {sum(s.running for s in m.replicas.values())}")
            last = states


def run_cluster(args, console: Console) -> None:
    require_ray()
    from ..server.shutdown import serve as serve_http
    config = ClusterConfig(
        model=args.model, dtype=args.dtype, device=args.device, replicas=args.replicas, min_replicas=args.min_replicas,
        max_replicas=args.max_replicas, target_ongoing_requests=args.target_ongoing_requests,
        max_num_seqs=args.max_num_seqs, tpot_target_ms=args.tpot_target_ms, max_model_len=args.max_model_len,
        kv_memory=args.kv_memory, max_waiting=args.max_waiting, torch_threads=args.torch_threads,
        cpus_per_replica=args.cpus_per_replica, upscale_delay_s=args.upscale_delay_s,
        downscale_delay_s=args.downscale_delay_s)
    connect(args.address)
    stop = threading.Event()
    try:
        engine, _ = deploy(config, console)
        d = engine.description
        scale = (f"{config.min_replicas or 1}..{config.max_replicas} replicas (autoscaling)" if config.autoscaling
                 else f"{config.replicas} replica(s)")
        console.print(f"[bold]cluster:[/] {scale} of stage 05, max_num_seqs={d['max_num_seqs']} each, "
                      f"on {d['device']}; gateway on http://{args.host}:{args.port}")
        threading.Thread(target=watch_replicas, args=(engine, console, stop), daemon=True).start()
        origins = tuple(o.strip() for o in args.allowed_origins.split(",") if o.strip())
        serve_http(engine, args.host, args.port, args.served_model_name or args.model,
                   shutdown_timeout=args.shutdown_timeout, api_key=args.api_key, docs=args.docs,
                   allowed_origins=origins, max_body_bytes=args.max_body_bytes)
    finally:
        stop.set()
        teardown(config.app_name, local=args.address is None)
