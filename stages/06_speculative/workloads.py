"""The workloads where drafts can match, held apart from chat, where they mostly do not.

* ``edit``: rewrite a given paragraph or piece of code with a small change; the original is the request's
  ``prediction`` (OpenAI's predicted outputs), so most of the answer is drafted from it.
* ``extract``: summarize/extract: pull sentences or fields out of a given text; the answer quotes the prompt, which
  the n-gram lookup finds without any help from the caller.
* ``chat``: the ladder's chat questions (stages/cli.py's workload), whose answers seldom repeat their prompt.
* ``agentic``: an agent editing the same file over several turns, each turn's request carrying the file as the
  last turn left it and asking for the whole file back with one more change; answers repeat earlier answers,
  which suffix decoding's global tree holds (and n-gram, looking only at the request itself, cannot).
"""
from __future__ import annotations

from common.sampling import SamplingParams
from stages import workloads as shared

TEXTS = [
    "The library opens at nine in the morning and closes at six in the evening. Visitors may borrow up to five "
    "books at a time, and each loan lasts three weeks. Late returns cost ten cents per day. The reading room on "
    "the second floor is quiet, and laptops are welcome there.",
    "Our team meets every Monday at ten. Each person shares what they finished last week and what they plan to do "
    "next. If something is blocking you, say so early. Notes from the meeting are posted in the shared folder by "
    "noon.",
    "def average(values):\n    total = 0\n    for value in values:\n        total += value\n    return total / "
    "len(values)\n\n\ndef largest(values):\n    best = values[0]\n    for value in values:\n        if value > best:"
    "\n            best = value\n    return best\n",
    "To make the bread, mix the flour, water, salt and yeast in a large bowl. Knead the dough for ten minutes, then "
    "let it rise for one hour. Shape it into a loaf, bake it at two hundred degrees for thirty minutes, and let it "
    "cool before slicing.",
    "class Counter:\n    def __init__(self):\n        self.count = 0\n\n    def increment(self):\n        self.count "
    "+= 1\n\n    def reset(self):\n        self.count = 0\n",
    "The train to the coast leaves from platform four at half past eight. It stops at every town along the river "
    "and arrives at the sea just after eleven. Tickets can be bought on board, but they cost more than at the "
    "station.",
    "Dear Anna, thank you for your letter. The garden is full of flowers this spring, and the old apple tree has "
    "more blossoms than ever. We hope you can visit us in June, when the strawberries are ripe. With love, Tom.",
    "def greet(name):\n    message = 'Hello, ' + name + '!'\n    print(message)\n    return message\n\n\ngreet('World')"
    "\n",
]
EDITS = [
    "Rewrite the following text exactly as it is, but fix any spelling mistakes. Return only the text.",
    "Copy the following text, changing nothing except making the first sentence a little more formal. Return only "
    "the text.",
    "Return the following text unchanged, except add one short sentence at the end.",
    "Repeat the following text word for word, then stop.",
    "Rewrite the following text with the same words, replacing only the first number you find with a different "
    "number. Return only the text.",
    "Copy the following text exactly. Return only the text.",
    "Rewrite the following text, keeping every sentence, but make it slightly friendlier. Return only the text.",
    "Return the following text as it is, with any obvious typo corrected.",
]
EXTRACTS = [
    "Extract every sentence of the following text that contains a number. Quote them exactly.",
    "Which sentences of the following text mention a time or a day? Quote them exactly.",
    "Summarize the following text in two sentences, reusing its own words.",
    "List the nouns of the following text, in the order they appear.",
    "Quote the first and the last sentence of the following text.",
    "Extract the key facts of the following text as a bulleted list, quoting the text.",
    "Copy the second sentence of the following text, then explain it in one sentence.",
    "What does the following text say? Answer by quoting it.",
]


def request(tokenizer, instruction: str, text: str) -> list[int]:
    return tokenizer.encode_chat([{"role": "user", "content": f"{instruction}\n\n{text}"}])


def edit(tokenizer, n: int, max_tokens: int) -> tuple[list, list[SamplingParams]]:
    """n edit requests (every text with every instruction, in turn), greedy, each predicting its own text."""
    pairs = [(EDITS[(i // len(TEXTS)) % len(EDITS)], TEXTS[i % len(TEXTS)]) for i in range(n)]
    return ([request(tokenizer, e, t) for e, t in pairs],
            [SamplingParams(temperature=0, max_tokens=max_tokens, prediction=t) for _, t in pairs])


def extract(tokenizer, n: int, max_tokens: int) -> tuple[list, list[SamplingParams]]:
    pairs = [(EXTRACTS[(i // len(TEXTS)) % len(EXTRACTS)], TEXTS[i % len(TEXTS)]) for i in range(n)]
    return [request(tokenizer, e, t) for e, t in pairs], [SamplingParams(temperature=0, max_tokens=max_tokens)
                                                          for _ in pairs]


FILE = ("def total(prices):\n    result = 0\n    for price in prices:\n        result += price\n    return result\n"
        "\n\ndef average(prices):\n    return total(prices) / len(prices)\n")
TURNS = [("total", "add_up"), ("prices", "amounts"), ("result", "acc"), ("average", "mean"), ("price", "amount"),
         ("acc", "running"), ("add_up", "summed"), ("mean", "arithmetic_mean")]


def agentic(tokenizer, n: int, max_tokens: int) -> tuple[list, list[SamplingParams]]:
    """n turns (in order) of one agent's edits to one file: turn i shows the file after turns 0..i-1 and asks for
    the rename of turn i, returning the whole file."""
    prompts, text = [], FILE
    for i in range(n):
        old, new = TURNS[i % len(TURNS)]
        ask = f"Rename `{old}` to `{new}` everywhere in this file. Return the whole file, nothing else."
        prompts.append(request(tokenizer, ask, f"```python\n{text}```"))
        text = text.replace(old, new)
    return prompts, [SamplingParams(temperature=0, max_tokens=max_tokens) for _ in prompts]


def build(name: str, tokenizer, n: int, max_tokens: int) -> tuple[list, list[SamplingParams]]:
    if name == "edit":
        return edit(tokenizer, n, max_tokens)
    if name == "extract":
        return extract(tokenizer, n, max_tokens)
    if name == "chat":
        return shared.chat(tokenizer, n, max_tokens)
    if name == "agentic":
        return agentic(tokenizer, n, max_tokens)
    raise ValueError(f"unknown workload {name!r}: use {', '.join(WORKLOADS)}")


WORKLOADS = ("edit", "extract", "chat", "agentic")
