"""Workloads the stages' command lines and the benchmark run: toy, chat, random and nano-vllm."""
from __future__ import annotations

import random
from collections import deque
from dataclasses import replace

from common.sampling import SamplingParams

TOY_LENGTHS = [62, 14, 15, 28, 98, 2, 28, 39]  # 286 tokens: the article's toy-run totals (160 vs 112 steps)

CHAT_QUESTIONS = [
    "What is the capital of France?", "Give me three tips for writing clear code.",
    "Explain in two sentences why the sky is blue.", "Write a haiku about autumn leaves.",
    "What is the difference between a list and a tuple in Python?", "How do vaccines work?",
    "Suggest a name for a bakery that sells only croissants.", "Summarize the plot of Romeo and Juliet.",
    "What are the main causes of inflation?", "Translate 'good morning, how are you?' into Spanish.",
    "Write a short poem about the ocean.", "Explain what a hash table is.",
    "Why do cats purr?", "Give me a recipe for a simple tomato pasta.",
    "What is photosynthesis?", "How can I improve my sleep?",
    "Explain the Pythagorean theorem with an example.", "Write a limerick about a programmer.",
    "What is the tallest mountain in the world and how tall is it?", "List five fruits that are high in vitamin C.",
    "Describe the water cycle.", "What does HTTP stand for and what is it used for?",
    "Give me a motivational quote and explain it.", "How does a bicycle stay upright?",
    "What are black holes?", "Write a two-line dialogue between a robot and a child.",
    "What is the boiling point of water at sea level?", "Explain recursion to a ten-year-old.",
    "Name three famous painters and one work by each.", "What is machine learning, in one paragraph?",
    "How do I make a good cup of coffee?", "Why is exercise important?",
]


SYSTEM_PROMPT = (
    "You are the support assistant of Lumen, a company that sells solar-powered desk lamps. Answer in at most "
    "three sentences, in plain language, and stay friendly. If the question is about a Lumen lamp, mention "
    "that the battery lasts about twelve hours and that every lamp has a two-year warranty. If it is about "
    "something else, answer it briefly and helpfully anyway. Never invent order numbers or prices."
)


def toy(tokenizer=None) -> tuple[list, list[SamplingParams]]:
    """8 requests whose output lengths are fixed (ignore_eos), one token per request per step."""
    prompts = [[100 + i, 200 + i, 300 + i] for i in range(len(TOY_LENGTHS))]
    return prompts, [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in TOY_LENGTHS]


def static_steps(lengths: list[int], slots: int) -> int:
    """Steps for requests of these output lengths under static batching (stage 01): batches of ``slots`` requests
    in arrival order, each as long as its longest request. The toy's 160."""
    return sum(max(lengths[i:i + slots]) for i in range(0, len(lengths), slots))


def continuous_steps(lengths: list[int], slots: int) -> int:
    """Steps for requests of these output lengths when a freed slot is refilled at the next step (stages 02-05,
    llama.cpp batched): a request holds its slot for one step per token. The toy's 112."""
    waiting, running, steps = deque(lengths), [], 0
    while waiting or running:
        while waiting and len(running) < slots:
            running.append(waiting.popleft())
        running = [n - 1 for n in running if n > 1]
        steps += 1
    return steps


def chat(tokenizer, n: int, max_tokens: int = 128, seed: int = 0,
         system: str | None = None) -> tuple[list, list[SamplingParams]]:
    """Real chat prompts of varied length, outputs until EOS or ``max_tokens`` (greedy).

    With ``system``, every prompt starts with that system message (a shared prefix)."""
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        q = CHAT_QUESTIONS[i % len(CHAT_QUESTIONS)]
        if i >= len(CHAT_QUESTIONS):  # vary repeats so prompts differ
            q = f"{q} Please answer in {rng.choice(['one', 'two', 'three', 'a few'])} sentences."
        head = [{"role": "system", "content": system}] if system else []
        prompts.append(tokenizer.apply_chat_template(head + [{"role": "user", "content": q}]))
    return prompts, [SamplingParams(temperature=0, max_tokens=max_tokens) for _ in prompts]


def random_lengths(n: int, prompt_range=(16, 256), output_range=(8, 128), vocab: int = 1024,
                   seed: int = 0) -> tuple[list, list[SamplingParams]]:
    """nano-vllm's benchmark shape scaled to a CPU: random prompt ids and output lengths, ignore_eos."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(17, vocab) for _ in range(rng.randint(*prompt_range))] for _ in range(n)]
    params = [SamplingParams(temperature=0, max_tokens=rng.randint(*output_range), ignore_eos=True)
              for _ in range(n)]
    return prompts, params


NANO_VLLM_REQUESTS = 256


def nano_vllm(vocab: int, n: int = NANO_VLLM_REQUESTS, seed: int = 0) -> tuple[list, list[SamplingParams]]:
    """nano-vllm's bench.py, so the ladder can be held against its published table (Qwen3-0.6B on a GPU): 256
    requests of random token ids (0-10,000, within the vocabulary), input and output lengths uniform in
    100-1,024, temperature 0.6, ignore_eos. Its draws come from Python's ``random`` seeded with 0, as here; each
    request samples with its own seed (its index), so every stage must still give the reference's tokens."""
    rng = random.Random(seed)
    top = min(10_000, vocab - 1)
    prompts = [[rng.randint(0, top) for _ in range(rng.randint(100, 1024))] for _ in range(n)]
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=rng.randint(100, 1024), seed=i)
              for i in range(n)]
    return prompts, params


def build(name: str, tokenizer, n: int, max_tokens: int, vocab: int, seed: int = 0, system: str | None = None):
    if name == "toy":
        return toy()
    if name == "chat":
        return chat(tokenizer, n, max_tokens, seed, system)
    if name == "random":
        return random_lengths(n, output_range=(8, max_tokens), vocab=vocab, seed=seed)
    if name == "nano-vllm":  # its own request count and lengths: --num-requests and --max-tokens do not apply
        return nano_vllm(vocab, seed=seed)
    raise ValueError(f"unknown workload {name!r}: use toy, chat, random or nano-vllm")


def sampled(params: list[SamplingParams], temperature: float = 0.0, top_p: float = 1.0) -> list[SamplingParams]:
    """The workload's requests sampled instead of greedy (``temperature`` > 0), each with its own seed (its index),
    so every stage must still give each request the reference's tokens. vLLM's throughput benchmark samples
    (temperature 1); a greedy ladder never pays for sampling."""
    if temperature <= 0:  # greedy: top-p has nothing to cut
        return params
    return [replace(p, temperature=temperature, top_p=top_p, seed=i) for i, p in enumerate(params)]
