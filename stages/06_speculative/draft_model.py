"""The draft model: a smaller, cheaper copy of the model guesses the next k tokens, greedily (Leviathan et al. 2023).

Here the copy is the same checkpoint with int4 weights (method ``draft_model``, quantization ``int4``): a quarter of
the bytes a bfloat16 step reads, agreeing with the full model on most tokens. It keeps its OWN paged KV cache, one
`DraftState` per request. Each step it catches up (the tokens the target kept since it last drafted, all requests in
one batched pass whose last rows give the first drafts), then drafts (k - 1 passes of one token per request); next
time its KV past the first rejected draft is given back (`BlockManager.truncate`). ``draft_num_layers: N`` keeps the
first N layers only (early exit): a cheaper pass that agrees less. Its passes are timed (``pass_cost``) for the
adaptive policy. Drafting is greedy whatever the request samples: verification keeps the target's tokens anyway.
"""
from __future__ import annotations

import time

import torch

from common.sequence import Sequence
from stages.kernels import KernelLlama, KernelPagedCache  # stage 04: model.py, kernel_cache.py (what build loads)
from stages.paged_kv import BlockManager  # stage 03: block_manager.py

from .cost_model import PassCost
from .proposer import Proposer


class DraftState:
    """What the draft model holds for one request: the tokens its KV cache holds (``fed``) and their count."""

    def __init__(self, seq_id: int):
        self.seq_id, self.fed, self.num_cached_tokens = seq_id, [], 0


class DraftModelProposer(Proposer):
    cheap = False  # each draft token is a pass of the draft model: asked only for the drafts worth feeding
    def __init__(self, model: KernelLlama, cache: KernelPagedCache, block_manager: BlockManager, max_catch_up: int,
                 k: int, disable_by_batch_size: int | None = None):
        super().__init__(k, disable_by_batch_size)
        self.model, self.max_catch_up = model, max_catch_up  # prompt tokens it catches up on per step, at most
        self.block_manager, self.cache = block_manager, cache  # its own pool, of the engine's kind and size
        self.states: dict[int, tuple[Sequence, DraftState]] = {}
        self.pass_cost = PassCost()  # seconds of each of its passes against the rows fed

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        for seq_id in [i for i, (s, _) in self.states.items() if s.is_finished]:
            self.drop(seq_id)
        feeds, complete = self.catch_up(seqs)
        want = {s.seq_id: k for s, k in zip(seqs, ks)}
        drafts, active = {i: [] for i in complete}, list(feeds)  # seq_id -> its draft tokens; those fed this pass
        while active:  # pass 1 catches up (and gives each first draft token), the next ones draft one token each
            tokens = self.forward([self.states[i][1] for i in active], [feeds[i] for i in active])
            for i, token in zip(active, tokens):
                if i in complete:
                    drafts[i].append(token)
                    feeds[i] = [token]
            active, taken = [], 0  # blocks this pass holds for the requests before
            for i in complete:
                if len(drafts[i]) < want[i] and self.room(self.states[i][1], 1, taken):
                    active.append(i)
                    taken += self.block_manager.blocks_needed(self.states[i][1], 1)
            complete = set(active)
        return [drafts.get(s.seq_id, []) for s in seqs]

    def catch_up(self, seqs: list[Sequence]) -> tuple[dict[int, list[int]], set[int]]:
        """What each request's draft is fed first: the target's kept tokens past those its cache holds (rejected drafts
        given back first), at most ``max_catch_up`` a step; and the requests whose feed reaches their last token."""
        feeds, complete, budget, taken = {}, set(), self.max_catch_up, 0
        for seq in seqs:
            state, tokens = self.state(seq), seq.token_ids
            same = next((i for i, (a, b) in enumerate(zip(state.fed, tokens)) if a != b), len(state.fed))
            self.block_manager.truncate(state, min(same, len(tokens) - 1))  # its last token is always fed
            del state.fed[state.num_cached_tokens:]
            rest = tokens[state.num_cached_tokens:]
            n = min(len(rest), budget)
            if n == 0 or not self.room(state, n, taken):
                continue
            taken += self.block_manager.blocks_needed(state, n)
            feeds[seq.seq_id] = rest[:n]
            if n == len(rest):
                complete.add(seq.seq_id)
            budget -= n
        return feeds, complete

    def forward(self, states: list[DraftState], feeds: list[list[int]]) -> list[int]:
        """One batched pass of the draft model: each state is fed its tokens; the greedy next token of each."""
        bm, dev, start = self.block_manager, self.model.device, time.perf_counter()
        for state, ids in zip(states, feeds):
            bm.append_slots(state, len(ids))
        self.cache.prepare(states, [len(f) for f in feeds], [bm.table(s) for s in states])
        ids = torch.tensor([t for f in feeds for t in f], device=dev)
        positions = torch.tensor([p for s, f in zip(states, feeds) for p in range(len(s.fed), len(s.fed) + len(f))],
                                 device=dev)
        hidden = self.model.forward(ids, positions, self.cache)
        last = torch.tensor([len(f) for f in feeds], device=dev).cumsum(0) - 1
        for state, f in zip(states, feeds):
            state.fed.extend(f)
            state.num_cached_tokens = len(state.fed)
        tokens = self.model.compute_logits(hidden[last]).argmax(-1).tolist()  # on the host: the pass is done
        if max(map(len, feeds)) <= self.k + 1:  # a drafting pass, what the policy prices (not a prompt's catch-up)
            self.pass_cost.observe(len(ids), time.perf_counter() - start)
        return tokens

    def calibrate(self) -> None:
        """Passes of 1, 2, 4 and 8 rows, so drafts are priced from the first request (the first round, unmeasured)."""
        bm, vocab = self.block_manager, self.model.config.vocab_size
        for i, rows in enumerate([1, 2, 4, 8] * 3):
            states = [DraftState(-1 - 8 * i - j) for j in range(rows)]  # not requests' ids
            for state in states:
                bm.allocate(state, [])
            if bm.num_free_blocks >= rows:
                self.forward(states, [[3 + (i * 31 + j * 7) % (vocab - 3)] for j in range(rows)])
            for state in states:
                bm.free_sequence(state)
            if i == 3:
                self.pass_cost = PassCost()

    def state(self, seq: Sequence) -> DraftState:
        if seq.seq_id not in self.states:
            self.states[seq.seq_id] = (seq, DraftState(seq.seq_id))
            self.block_manager.allocate(self.states[seq.seq_id][1], [])
        return self.states[seq.seq_id][1]

    def room(self, state: DraftState, n: int, taken: int = 0) -> bool:
        """Whether the pool takes ``n`` more of its tokens besides the ``taken`` blocks this pass holds for requests
        before it (each alone could fit and all together not), giving back preempted requests' KV if it must."""
        bm = self.block_manager
        for seq_id in [i for i, (s, _) in self.states.items() if s.num_cached_tokens == 0 and i != state.seq_id]:
            if bm.blocks_needed(state, n) + taken <= bm.num_free_blocks:
                break
            self.drop(seq_id)
        return bm.blocks_needed(state, n) + taken <= bm.num_free_blocks

    def release(self) -> None:
        for seq_id in list(self.states):
            self.drop(seq_id)

    def drop(self, seq_id: int) -> None:
        _, state = self.states.pop(seq_id)
        self.block_manager.free_sequence(state)

