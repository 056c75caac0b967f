"""The ladder's other engines: its baselines (HF `generate` in static batches, llama.cpp one request at a time)
and its peers, the engines a user would pick instead to serve many requests on a CPU.

Peers: vLLM's CPU backend (its own venv, a subprocess: `peer_vllm`), llama.cpp batched (`peer_llama_cpp`) and
HF continuous batching (`peer_hf_cb`). Each runs on the stages' prompt ids, greedy, with their EOS ids,
max_tokens and in-flight limit, one after the other in this process, so each has the machine to itself. A
peer that is not installed, or fails, costs one line of notes and the ladder goes on.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

import torch

from common.paths import DEFAULT_MODEL, smollm2_gguf_path
from common.prepare import resolve_model

from . import baselines

PEERS = {"vllm": "vLLM CPU", "llama-cpp": "llama.cpp batched", "hf-cb": "HF continuous batching"}
ALONE = {"vllm": "vLLM CPU", "llama-cpp": "llama.cpp", "hf-generate": "HF generate at batch 1"}  # one request alone
NOT_BUILT = {"vllm": "vLLM CPU peer: not built (make bench-peers)",
             "llama-cpp": "llama.cpp batched: llama-cpp-python is not installed (make bench-peers builds it; minutes)"}


def peer_list(text: str) -> list[str]:
    """--peers: 'all' (every one installed), 'none', or names from PEERS, comma-separated."""
    if text in ("all", "none"):
        return list(PEERS) if text == "all" else []
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in PEERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown peer {', '.join(unknown) or repr(text)}: choose from "
                                         f"{', '.join(PEERS)}, 'all' or 'none'")
    return names


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--peers", type=peer_list, default=list(PEERS),
                    help=f"peers to run beside the stages ({', '.join(PEERS)}; 'all', the default: every one "
                         "installed; 'none')")
    ap.add_argument("--no-vllm", action="store_true", help="skip the vLLM CPU peer")


def chosen(args) -> list[str]:
    """The peers asked for, less those the baselines' --no-hf and --no-llama-cpp (and --no-vllm) turn off."""
    off = {"vllm": args.no_vllm, "llama-cpp": args.no_llama_cpp, "hf-cb": args.no_hf}
    return [p for p in args.peers if not off[p]]


@dataclass
class Workload:
    """What every engine runs: prompt ids, each request's max_tokens, the EOS ids ([] where the workload
    ignores EOS), and where the weights are."""
    model: str
    ids: list[list[int]]
    max_tokens: list[int]
    eos: list[int]
    dtype: str
    max_batch_tokens: int

    @property
    def folder(self):
        return resolve_model(self.model)


def why_not(peer: str, work: Workload, temperature: float) -> str | None:
    """A reason this peer cannot run this workload, or None."""
    if temperature > 0:
        return f"{PEERS[peer]} skipped: the peers run greedy only (--temperature 0)"
    if peer == "llama-cpp" and work.model != DEFAULT_MODEL:
        return f"{PEERS[peer]} skipped: its GGUF is SmolLM2-135M's, not {work.model}'s"
    return None


def batched(peer: str, work: Workload, max_num_seqs: int) -> baselines.Row:
    """One peer's row at this in-flight limit (with its tokens where it gives them). Raises on failure."""
    if peer == "vllm":
        from .peer_vllm import vllm_cpu
        return vllm_cpu(work.folder, work.ids, work.max_tokens, work.eos, max_num_seqs, work.dtype)
    if peer == "llama-cpp":
        from . import peer_llama_cpp
        return peer_llama_cpp.batched(smollm2_gguf_path(), work.ids, work.max_tokens, work.eos, max_num_seqs)
    from . import peer_hf_cb
    return peer_hf_cb.hf_continuous(work.folder, work.ids, work.max_tokens, work.eos, max_num_seqs,
                                    getattr(torch, work.dtype), work.max_batch_tokens)


def single(peer: str, work: Workload, tokens: int, rounds: int) -> float | None:
    """One request alone (the first prompt, `tokens` tokens, EOS ignored): decode tok/s; None for a peer that has
    no single-request mode of its own (HF's is `generate` at batch 1, timed beside ours)."""
    if peer == "vllm":
        from .peer_vllm import vllm_cpu_single
        return vllm_cpu_single(work.folder, work.ids[0], tokens, work.dtype)
    if peer == "llama-cpp":
        from . import peer_llama_cpp
        return peer_llama_cpp.single(smollm2_gguf_path(), work.ids[0], tokens, rounds)
    return None


def attempt(run, peer: str, *args):
    """(run(peer, *args), None), or (None, the one line that says why not): ImportError means not built."""
    try:
        return run(peer, *args), None
    except ImportError:
        return None, NOT_BUILT.get(peer, f"{PEERS[peer]}: not installed")
    except Exception as e:  # a peer's failure is a note, never the ladder's end
        text = " ".join(str(e).split()) or type(e).__name__
        return None, f"{PEERS[peer]} failed: {text[:300]}"


def run_at(running: list[str], work: Workload, n: int, notes: list[str], console) -> dict[str, baselines.Row]:
    """Every peer still running at this in-flight limit, one after the other; a peer that is not built or fails
    leaves `running` after its one note."""
    rows = {}
    for peer in list(running):
        r, why = attempt(batched, peer, work, n)
        if r is None:
            notes.append(f"{why} (at {n} in flight)")
            running.remove(peer)
            continue
        rows[peer] = r
        console.print(f"{PEERS[peer]} at {n} in flight: {r['output tok/s']:.1f} output tok/s")
    return rows


def run_alone(running: list[str], work: Workload, tokens: int, rounds: int, notes: list[str]) -> dict[str, float]:
    """Each peer's decode tok/s for one request alone (the peers that have a mode of their own for it)."""
    rates = {}
    for peer in running:
        rate, why = attempt(single, peer, work, tokens, rounds)
        if why:
            notes.append(f"{why} (one request alone)")
        elif rate is not None:
            rates[peer] = rate
    return rates


def agreement(tokens: list[list[int]], reference: list[list[int]]) -> str:
    """How many requests gave exactly the reference's tokens, and where the others first part (median token)."""
    same = sum(a == b for a, b in zip(tokens, reference))
    splits = sorted(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                    for a, b in zip(tokens, reference) if a != b)
    tail = f"; the others first differ at token {splits[(len(splits) - 1) // 2]} (median)" if splits else ""
    return f"{same} of {len(reference)} requests give the first stage's tokens{tail}"


def run_baselines(args, ids, params, eos: list[int], console) -> tuple[dict, list[str]]:
    base, notes = {}, []
    limits = [p.max_tokens for p in params]
    if not args.no_hf and not all(p.ignore_eos for p in params):
        best = None
        for bs in map(int, args.hf_batch_sizes.split(",")):
            r = baselines.hf_generate(resolve_model(args.model), ids, limits, eos, bs, getattr(torch, args.dtype),
                                      args.temperature, args.top_p)
            console.print(f"{r['engine']}: {r['output tok/s']:.1f} output tok/s")
            best = r if best is None or r["output tok/s"] > best["output tok/s"] else best
        base["HF"] = best
    elif not args.no_hf:
        notes.append("HF generate skipped: this workload ignores EOS, which generate cannot do per request")
    if not args.no_llama_cpp and baselines.llama_cpp_available() and args.model == DEFAULT_MODEL:
        base["llama.cpp"] = baselines.llama_cpp(smollm2_gguf_path(), ids, limits, os.cpu_count(), args.temperature,
                                                args.top_p)
        console.print(f"llama.cpp: {base['llama.cpp']['output tok/s']:.1f} output tok/s")
    elif not args.no_llama_cpp:
        notes.append("llama.cpp skipped: " + (f"its GGUF is SmolLM2-135M's, not {args.model}'s"
                     if baselines.llama_cpp_available() else
                     "llama-cpp-python is not installed (make bench-peers builds it; minutes)"))
    return base, notes
