"""Labs 04-07: a fused kernel, streaming, speculative decoding and a grammar, each task with its planted wrong
answer."""
from __future__ import annotations

from .task import S04, S05, S06, S07, Lab, Task

LABS_04_07 = [
    Lab("04", "04_kernels", f"{S04}/README.md#on-cpu-and-on-cuda", (
        Task("04.1", "the fused add_rms_norm kernel", f"{S04}/elementwise.py",
             "_add_rms_norm_kernel (Triton, one program per row): add the residual (when HAS_RESIDUAL), store the "
             "sum into res_ptr in the model dtype, then RMSNorm it exactly as common/numerics/ops.py does: squares "
             "summed per lane (LANES interleaved lanes, float64), the lanes added in order, the root in float64, "
             "IEEE division, and the weight. Graded bit for bit against ops.add_rms_norm.",
             "vLLM's fused_add_rms_norm: the residual add and RMSNorm in one pass over the row, one read and one "
             "write of each tensor (decoding is bound by memory traffic).",
             "Store the residual first, then read it back chunk by chunk of LANES columns for the sum of squares; "
             "tl.div_rn, not /.",
             ("row = tl.program_id(0)\n"
              "cols = tl.arange(0, BLOCK)\n"
              "mask = cols < n_cols\n"
              "x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)\n"
              "xf = x.to(res_ptr.dtype.element_ty).to(tl.float32)\n"
              "mean_sq = tl.div_rn(tl.sum(xf * xf, axis=0), n_cols.to(tl.float32)) + eps\n"
              "root = tl.sqrt(mean_sq.to(tl.float64)).to(tl.float32)\n"
              "normed = tl.div_rn(xf, root).to(out_ptr.dtype.element_ty).to(tl.float32)\n"
              "if HAS_RESIDUAL:\n"
              "    x = x + tl.load(res_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)\n"
              "tl.store(res_ptr + row * n_cols + cols, x.to(res_ptr.dtype.element_ty), mask=mask)\n"
              "w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)\n"
              "tl.store(out_ptr + row * n_cols + cols, (w * normed).to(out_ptr.dtype.element_ty), mask=mask)\n",),
             "normalizes x before adding the residual (and sums the squares in one float32 tree)"),
    )),
    Lab("05", "05_streaming", f"{S05}/README.md#what-the-code-does", (
        Task("05.1", "the incremental detokenizer", "common/tokenizer.py",
             "IncrementalDetokenizer.add and .flush: turn token ids into text pieces that concatenate to the full "
             "text. A byte-level token can end inside a UTF-8 character (its decode ends in U+FFFD): hold the piece "
             "back until the character completes; decode with the previous piece's tokens as left context (a "
             "leading space is folded into the token); at the end, flush whatever is still held back.",
             "vLLM's incremental detokenization: decode a window of tokens (prefix_offset, read_offset) and emit "
             "only the new, complete text (vLLM's detokenizer, paraphrased).",
             "A piece is new text only when the window's decode is longer than the prefix's and does not end in "
             "U+FFFD; flush() returns decode(all ids) minus what was already emitted.",
             ("self.ids.append(token_id)\n"
              "full = self.tokenizer.decode(self.ids, self.skip_special_tokens)\n"
              "piece = full[len(self.text):]\n"
              "self.text += piece\n"
              "return piece\n",
              "rest = self.tokenizer.decode(self.ids, self.skip_special_tokens)[len(self.text):]\n"
              "self.text += rest\n"
              "self.prefix_offset = self.read_offset = len(self.ids)\n"
              "return rest\n"),
             "emits a piece that ends in half a UTF-8 character (no hold-back)"),
        Task("05.2", "hold back a possible stop string", f"{S05}/streams.py",
             "stable_text_len: how much of seq.output_text a stream may show now. While the request runs and has "
             "stop strings, a tail that could still grow into one is held back; a finished request shows all.",
             "OpenAI-style stop strings end the text before the stop string, and a stream must never show text "
             "that a stop string arriving over later tokens would take back.",
             "Hold back len(longest stop) - 1 characters: a stop string can begin in this chunk and end in the next.",
             ("if seq.is_finished or not seq.params.stop:\n"
              "    return len(seq.output_text)\n"
              "return len(seq.output_text) if not any(s in seq.output_text for s in seq.params.stop) else 0\n",),
             "matches a stop string only within the text already there, holding nothing back across chunks"),
        Task("05.3", "the SSE chunk events", f"{S05}/server/events.py",
             "chunk_events: write a streaming request's chunks, as they come from its n samples, as server-sent "
             "events, each `data: <json>` and a blank line. A chunk object per chunk that has text, a finish "
             "reason or logprobs (and a choice's first chunk, which in chat says role 'assistant'): `head` with "
             "one choice (`choice(...)`); a chunk stopped by the engine (finish_reason 'abort' or 'error') becomes "
             "the error event (`ended_early(chunk).body()`) and ends the choices. With `include_usage`, one more "
             "chunk with choices [] and the whole request's usage (every sample's tokens); if reading the chunks "
             "raises, the error event `internal_error(e).body()`. And always `data: [DONE]` last, once. The check "
             "runs your code behind stage 05's real app on loopback (the tiny model), reads the raw bytes, and "
             "compares them with the reference's tokens decoded and with OpenAI's chunk format.",
             "OpenAI's streaming format: tokens are sent as data-only server-sent events as they become available, "
             "with the stream terminated by a `data: [DONE]` message; with stream_options include_usage, an "
             "additional chunk is streamed before the data: [DONE] message, whose usage field shows the token usage "
             "statistics for the entire request and whose choices field is always an empty array (OpenAI API "
             "reference, paraphrased).",
             "`sse(data)` writes one event (its `\\n\\n` ends it). Count every chunk's token_ids for the usage, also "
             "those of chunks you do not send (their text is held back). Put the loop in try/except Exception so "
             "that a failing stream still ends with an error event and [DONE]; remember which choices have had "
             "their first event.",
             ("import json\n"
              "announced: set[int] = set()\n"
              "tokens, failed = 0, False\n"
              "try:\n"
              "    async for i, chunk, logprobs in chunks:\n"
              "        tokens += len(chunk.token_ids)\n"
              "        if chunk.finish_reason in (\"abort\", \"error\"):\n"
              "            yield f\"data: {json.dumps(ended_early(chunk).body())}\\n\"\n"
              "            failed = True\n"
              "            break\n"
              "        first = i not in announced\n"
              "        if chunk.text or chunk.finish_reason or first or logprobs:\n"
              "            data = head | {\"choices\": [choice(chat, chunk.text, chunk.finish_reason, first, i, "
              "logprobs)]}\n"
              "            yield f\"data: {json.dumps(data)}\\n\"\n"
              "            announced.add(i)\n"
              "    if include_usage and not failed:\n"
              "        data = head | {\"choices\": [], \"usage\": usage(prompt_tokens, tokens)}\n"
              "        yield f\"data: {json.dumps(data)}\\n\"\n"
              "except Exception as e:\n"
              "    yield f\"data: {json.dumps(internal_error(e).body())}\\n\"\n"
              "yield \"data: [DONE]\\n\\n\"\n",),
             "ends each chunk event with one newline, not the blank line that ends a server-sent event"),
    )),
    Lab("06", "06_speculative", f"{S06}/README.md#what-the-code-does", (
        Task("06.1", "prompt lookup (n-gram) drafts", f"{S06}/proposers.py",
             "ngram_lookup(tokens, min_n, max_n, k): the draft vLLM's ngram method proposes. Find the longest "
             "suffix of tokens, from min_n to max_n tokens long, that also occurs earlier in tokens (an occurrence "
             "that ends before the last token); of its occurrences take the first, and return up to k tokens that "
             "followed it there. Return [] when no suffix of min_n tokens or more recurs. With a factor (not None), "
             "a match of n tokens drafts at most int(factor x n) of them: a long match is a copy, a short one a "
             "guess (suffix decoding's rule; the stage's default uses 2).",
             "Prompt lookup decoding: the output often repeats spans of the prompt (and of itself), so match its last "
             "few tokens against the text so far and propose what followed the match as the draft (Saxena, 2023; "
             "vLLM's ngram speculative method, paraphrased).",
             "Try n from max_n down to min_n: the first n with a match is the longest. The draft may run into the "
             "suffix itself: [1, 2, 3, 4, 2, 3] with n = 2 matches [2, 3] at 1 and proposes [4, 2, 3].",
             ("arr = np.asarray(tokens, dtype=np.int64)\n"
              "for n in range(min_n, min(max_n, len(arr) - 1) + 1):\n"
              "    windows = sliding_window_view(arr[:-1], n)\n"
              "    hits = np.flatnonzero((windows == arr[-n:]).all(axis=1))\n"
              "    if hits.size:\n"
              "        start = int(hits[0]) + n\n"
              "        return tokens[start:start + k]\n"
              "return []\n",),
             "tries the shortest n-gram first (vLLM takes the longest that matches)"),
        Task("06.2", "cap the drafts", f"{S06}/scheduler.py",
             "Scheduler.draft_caps: for each decoding request (num_new_tokens == 1), the most draft tokens it may "
             "take this step. Walk self.running in the order stage 03 schedules them, with the step's token budget "
             "(max_num_batched_tokens) and the free KV blocks: a request feeds its own tokens first (a prompt chunk, "
             "self.chunk; stop where it gives 0), and a decoding request's drafts are at most "
             "num_speculative_tokens, fit the budget left after its own token, leave room for the token after them "
             "within max_tokens and max_model_len, and need no more blocks than are free (blocks_needed): a draft "
             "never makes the scheduler preempt anyone. Each request's tokens and blocks come off what is left.",
             "The drafts of a sequence are verified in one pass, so they must be scheduled whole; vLLM's scheduler "
             "caps them by num_speculative_tokens, the token budget and max_model_len, and drops them rather than "
             "preempt (vLLM's v1 scheduler, paraphrased).",
             "A request with t tokens still to produce (max_tokens - len(output), or max_len - len(seq)) can keep at "
             "most t, its own sampled token included: k <= t - 1. Shrink k until blocks_needed(seq, 1 + k) <= free.",
             ("budget, free = self.max_num_batched_tokens, bm.num_free_blocks\n"
              "for seq in self.running:\n"
              "    own = self.chunk(seq, seq.num_new_tokens, budget)\n"
              "    if own == 0:\n"
              "        break\n"
              "    k = 0\n"
              "    if seq.num_new_tokens == 1:\n"
              "        k = max(0, min(self.draft_limit(seq), budget - 1))\n"
              "        while k > 0 and bm.blocks_needed(seq, 1 + k) > free:\n"
              "            k -= 1\n"
              "        caps[seq.seq_id] = k\n"
              "    free -= bm.blocks_needed(seq, own + k)\n"
              "    budget -= own + k\n",),
             "drafts past max_tokens (tokens the request can never keep)"),
    )),
    Lab("07", "07_structured", f"{S07}/README.md#the-worked-example-a-choice-as-an-automaton", (
        Task("07.1", "walk the token trie against the automaton", f"{S07}/fsm.py",
             "allowed_tokens: every token the automaton allows from `state`: walk the vocabulary's trie (each "
             "node's `children` by next byte, its `tokens` the ids whose bytes end there) together with the DFA "
             "(`dfa.row(s)[byte]`: the next state, -1 when no match can go on). A token is allowed when each of its "
             "bytes keeps the automaton alive, wherever it ends; a dead byte drops the whole subtree below it. The "
             "check compares your walk with reading every token's bytes one by one, then runs your stage against "
             "the reference with the same constraint.",
             "Guided generation: a regular expression is compiled to a finite-state machine, and for each state the "
             "vocabulary is walked once to find the tokens whose every character keeps the machine alive; that "
             "index turns masking into a lookup at each step (Willard & Louf 2023, paraphrased).",
             "A token may end in the middle of a match (\"y\" on the way to \"yes\"): what matters is that the state "
             "after its last byte is alive (>= 0), not that it accepts.",
             ("allowed, stack = [], [(trie, state)]\n"
              "while stack:\n"
              "    node, s = stack.pop()\n"
              "    row = dfa.row(s)\n"
              "    for byte, child in node.children.items():\n"
              "        nxt = row[byte]\n"
              "        if nxt >= 0:\n"
              "            if dfa.accepting(nxt):\n"
              "                allowed.extend(child.tokens)\n"
              "            stack.append((child, nxt))\n"
              "return allowed\n",),
             "allows a token only when it completes a match, so no token can stop on the way (\"y\" before \"es\")"),
    )),
]
