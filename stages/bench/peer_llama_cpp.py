"""llama.cpp batched: the continuous batching a user would write on llama-cpp-python's low-level API.

The one-at-a-time baseline (baselines.llama_cpp) calls `create_completion` request after request, which is not
how anyone would serve many requests with llama.cpp. Here up to `max_num_seqs` sequences share one
`llama_decode` call, each under its own sequence id with its own KV stream (`kv_unified` off, the setting
llama.cpp advises when sequences share no long prefix), and a sequence that ends frees its slot for the next
prompt at once (`llama_memory_seq_rm` clears its KV): stage 02's loop, in llama.cpp's vocabulary.

Prompts go in as token ids (SmolLM2's GGUF vocabulary is the checkpoint's), sampling is greedy (argmax over
`llama_get_logits_ith`), and tokens are counted as the stages count them: up to and including EOS.
"""
from __future__ import annotations

import argparse
import os
import time
from collections import deque
from dataclasses import dataclass, field
from statistics import median_low as median

import numpy as np

from .baselines import Row, row


@dataclass
class Slot:
    """One sequence id of the context: the request it serves, its next position, its tokens and their times."""
    request: int
    pos: int = 0
    tokens: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)


class Context:
    """A model and a context with `n_seq` KV streams of `seq_len` tokens each, and one batch of `n_batch`
    tokens to fill per `llama_decode`."""

    def __init__(self, gguf_path, n_seq: int, seq_len: int, n_batch: int, threads: int | None = None):
        import llama_cpp
        from llama_cpp._logger import set_verbose

        set_verbose(False)  # llama.cpp's load log on stderr: errors only
        self.lib = lib = llama_cpp
        lib.llama_backend_init()
        self.model = lib.llama_model_load_from_file(str(gguf_path).encode(), lib.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf_path}")
        params = lib.llama_context_default_params()
        params.n_seq_max, params.kv_unified = n_seq, False  # one KV stream per sequence
        params.n_ctx = n_seq * seq_len  # split evenly between the streams
        params.n_batch, params.n_ubatch = n_batch, min(n_batch, 512)
        params.n_threads = params.n_threads_batch = threads or os.cpu_count()
        self.ctx = lib.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not make a context of {n_seq} x {seq_len} tokens")
        self.memory = lib.llama_get_memory(self.ctx)
        self.n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self.model))
        self.n_batch = n_batch
        self.batch = lib.llama_batch_init(n_batch, 0, 1)

    def decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """One `llama_decode` over (token, position, sequence id, wants logits) entries."""
        b = self.batch
        for i, (token, pos, seq, logits) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, logits
            b.seq_id[i][0] = seq
        b.n_tokens = len(entries)
        if (rc := self.lib.llama_decode(self.ctx, b)) != 0:
            raise RuntimeError(f"llama_decode returned {rc} on a batch of {len(entries)} tokens")

    def argmax(self, i: int) -> int:
        """Greedy: the most likely token after the batch's i-th entry."""
        return int(np.ctypeslib.as_array(self.lib.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,)).argmax())

    def forget(self, seq: int) -> None:
        self.lib.llama_memory_seq_rm(self.memory, seq, -1, -1)

    def close(self) -> None:
        self.lib.llama_batch_free(self.batch)
        self.lib.llama_free(self.ctx)
        self.lib.llama_model_free(self.model)


def generate(ctx: Context, prompts: list[list[int]], max_tokens: list[int], eos: set[int],
             max_num_seqs: int) -> tuple[list[Slot], int]:
    """Continuous batching: each step decodes every running sequence's last token plus the whole prompts of as
    many waiting requests as fit the free slots and the batch; a sequence that emits an EOS id or reaches its
    max_tokens leaves at once and its slot takes the next prompt. Returns each request's slot record (in
    request order) and the number of steps (`llama_decode` calls)."""
    waiting, running, done, steps = deque(range(len(prompts))), {}, {}, 0
    free = deque(range(max_num_seqs))
    while waiting or running:
        entries, outputs = [(s.tokens[-1], s.pos, seq, True) for seq, s in running.items()], list(running)
        while waiting and free and len(entries) + len(prompts[waiting[0]]) <= ctx.n_batch:
            seq, r = free.popleft(), waiting.popleft()
            p = prompts[r]
            entries += [(t, i, seq, i == len(p) - 1) for i, t in enumerate(p)]
            running[seq], outputs = Slot(r, pos=len(p) - 1), outputs + [seq]
        if not entries:
            raise ValueError(f"a {len(prompts[waiting[0]])}-token prompt does not fit a {ctx.n_batch}-token batch")
        ctx.decode(entries)
        steps, now = steps + 1, time.perf_counter()
        for i, seq in zip((i for i, e in enumerate(entries) if e[3]), outputs):
            s = running[seq]
            s.tokens.append(ctx.argmax(i))
            s.times.append(now)
            s.pos += 1
            if s.tokens[-1] in eos or len(s.tokens) >= max_tokens[s.request]:
                done[s.request] = running.pop(seq)
                ctx.forget(seq)
                free.append(seq)
    return [done[r] for r in range(len(prompts))], steps


def open_context(gguf_path, prompts: list[list[int]], max_tokens: list[int], max_num_seqs: int,
                 threads: int | None = None) -> Context:
    """A context sized for this workload: every stream holds the longest request, the batch the longest prompt
    with a token for every other sequence."""
    longest = max(len(p) + n for p, n in zip(prompts, max_tokens))
    seq_len = -(-(longest + 1) // 256) * 256
    return Context(gguf_path, max_num_seqs, seq_len, max(512, max(map(len, prompts)) + max_num_seqs), threads)


def batched(gguf_path, prompts: list[list[int]], max_tokens: list[int], eos: int | list[int], max_num_seqs: int,
            threads: int | None = None) -> Row:
    """The ladder's row for llama.cpp batched (with the tokens, to compare): every request arrives at the start."""
    ctx = open_context(gguf_path, prompts, max_tokens, max_num_seqs, threads)
    try:
        generate(ctx, [prompts[0]], [2], set(), 1)  # warm: the first decode allocates the compute buffers
        start = time.perf_counter()
        slots, steps = generate(ctx, prompts, max_tokens, {eos} if isinstance(eos, int) else set(eos), max_num_seqs)
        wall = time.perf_counter() - start
    finally:
        ctx.close()
    r = row(f"llama.cpp batched ({max_num_seqs} seqs)", len(prompts), sum(map(len, prompts)),
            sum(len(s.tokens) for s in slots), wall, [s.times[0] - start for s in slots],
            [(s.times[-1] - s.times[0]) / (len(s.times) - 1) for s in slots if len(s.times) > 1], steps)
    r["tokens"] = [s.tokens for s in slots]
    return r


def single(gguf_path, prompt: list[int], tokens: int = 128, rounds: int = 1, threads: int | None = None) -> float:
    """One request alone, EOS ignored as in the stages' single request: decode tokens per second (after the
    first), the median of `rounds` runs."""
    ctx = open_context(gguf_path, [prompt], [tokens], 1, threads)
    rates = []
    try:
        for limit in [4] + [tokens] * rounds:  # the first run warms
            (s,), _ = generate(ctx, [prompt], [limit], set(), 1)
            rates.append((len(s.times) - 1) / (s.times[-1] - s.times[0]))
    finally:
        ctx.close()
    return median(rates[1:])


def main(argv=None) -> None:
    """python -m stages.bench.peer_llama_cpp: one request alone on SmolLM2's GGUF through this build of
    llama-cpp-python, and the instruction sets it was built for. `make bench-peers` runs it after the native
    build: a build that uses an instruction the CPU does not grant dies here by SIGILL, and is rebuilt for AVX2."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--tokens", type=int, default=16, help="tokens to decode (2 or more)")
    args = ap.parse_args(argv)
    import llama_cpp

    from common.paths import smollm2_gguf_path

    print(llama_cpp.llama_print_system_info().decode().strip())
    rate = single(smollm2_gguf_path(), list(range(100, 116)), max(args.tokens, 2))
    print(f"llama.cpp {llama_cpp.__version__}: one request alone, {max(args.tokens, 2)} tokens, {rate:.1f} tok/s")


if __name__ == "__main__":
    main()
