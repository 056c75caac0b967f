"""OpenAI's streaming format, as a grader reads it: the raw body of a streamed completion is a series of server-sent
events, each one line ``data: <json>`` and a blank line; the JSON is a chunk object (id, object, created, model,
one choice) or, at the end, the usage chunk (choices empty) or an error object; ``data: [DONE]`` comes last, once.
Everything here raises AssertionError naming the first event that breaks the format, what was expected there and
what came, so that a learner can find the line that wrote it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

CHUNK_KEYS = ("id", "object", "created", "model", "choices")


@dataclass
class Want:
    chat: bool
    texts: list[str]  # per choice: the whole text (the reference's tokens decoded; with echo, the prompt first)
    finish: list[str | None]  # per choice: the finish reason of its last event
    prompt_tokens: int
    completion_tokens: int  # every choice's tokens
    include_usage: bool
    error: str | None = None  # the stream fails: its error event's message starts with this
    logprobs: list[int] | None = None  # per choice: how many tokens its events' logprobs cover


def clip(text: str, n: int = 160) -> str:
    return repr(text) if len(text) <= n else repr(text[:n]) + f" ... (+{len(text) - n} characters)"


def shown(payload: str) -> str:
    """An event for a message: a chunk without its head (id, object, created, model), which says nothing new."""
    try:
        event = json.loads(payload)
    except ValueError:
        return clip(payload)
    if isinstance(event, dict) and "choices" in event:
        return clip("{<head>, " + json.dumps({k: v for k, v in event.items() if k not in CHUNK_KEYS[:4]})[1:])
    return clip(payload)


def read_events(raw: str, request: dict) -> list[str]:
    """The payloads of a stream of ``data: <payload>`` events, each ended by a blank line."""
    what = f"the request {json.dumps(request)}"
    if not raw:
        raise AssertionError(f"{what}: the response body is empty: not one event, not even data: [DONE]")
    blocks = raw.split("\n\n")
    for k, block in enumerate(blocks[:-1]):
        if "\n" in block or not block.startswith("data: "):
            lines = block.split("\n")
            second = (f", the second {clip(lines[1], 60)} (each event ends with \\n\\n, not \\n)"
                      if len(lines) > 1 else "")
            raise AssertionError(
                f"{what}: event {k + 1}: expected one line `data: <json>`, then a blank line (\"\\n\\n\"); produced "
                f"{len(lines)} line(s) before the blank line, the first {clip(lines[0], 100)}{second}")
    if blocks[-1]:
        raise AssertionError(f"{what}: the body ends with {clip(blocks[-1])}, which no blank line (\"\\n\\n\") ends: "
                             f"every event, data: [DONE] included, ends with \\n\\n")
    return [block.removeprefix("data: ") for block in blocks[:-1]]


def check_events(payloads: list[str], want: Want, request: dict) -> None:
    """The stream answers ``request`` as ``want`` says, in OpenAI's format."""
    def bad(k: int, why: str):
        raise AssertionError(f"{what}: event {k + 1} of {len(payloads)} (data: {shown(payloads[k])}): {why}")

    what = f"the request {json.dumps(request)}"
    done = [k for k, p in enumerate(payloads) if p == "[DONE]"]
    if not done:
        raise AssertionError(f"{what}: the stream's last event is data: {clip(payloads[-1])}; expected data: [DONE]")
    if done[0] != len(payloads) - 1:
        bad(done[0], f"[DONE] here, but {len(payloads) - 1 - done[0]} event(s) follow it: [DONE] is the last event")
    last = len(payloads) - 2  # the index of the event before [DONE]
    n, obj = len(want.texts), "chat.completion.chunk" if want.chat else "text_completion"
    texts, finished, logprobs, first_id, usage_seen = [""] * n, [None] * n, [0] * n, None, False
    errors, seen = [], set()
    for k, payload in enumerate(payloads[:-1]):
        try:
            event = json.loads(payload)
        except ValueError as e:
            bad(k, f"not JSON ({e})")
        if not isinstance(event, dict):
            bad(k, "not a JSON object")
        if "error" in event:
            check_error(bad, k, event, want, last)
            errors.append(k)
            continue
        missing = [key for key in CHUNK_KEYS if key not in event]
        if missing:
            bad(k, f"a chunk has {', '.join(CHUNK_KEYS)}; this one lacks {', '.join(missing)}")
        if event["object"] != obj:
            bad(k, f"object {event['object']!r}; expected {obj!r}")
        first_id = first_id or event["id"]
        if event["id"] != first_id or not isinstance(event["id"], str):
            bad(k, f"id {event['id']!r}, not the first chunk's {first_id!r}: every chunk of a response has its id")
        if event["model"] != "tiny" or not isinstance(event["created"], int):
            bad(k, f"model {event['model']!r} and created {event['created']!r}; expected 'tiny' and an integer")
        if event["choices"] == []:
            check_usage(bad, k, event, want, last)
            usage_seen = True
            continue
        if event.get("usage") is not None:
            bad(k, "a chunk with a choice carries usage; the usage comes in a chunk of its own, with choices [], "
                   "after the last choice's chunk")
        if not isinstance(event["choices"], list) or len(event["choices"]) != 1:
            bad(k, f"{len(event['choices'])} choices; expected one per chunk")
        i, piece, finish, lp = check_choice(bad, k, event["choices"][0], want, n, seen, finished)
        seen.add(i)
        texts[i] += piece
        finished[i] = finish
        logprobs[i] += count_logprobs(lp, want.chat)
    check_whole(what, want, texts, finished, logprobs, usage_seen, errors)


def check_choice(bad, k: int, c, want: Want, n: int, seen: set[int], finished: list):
    """(index, its text, its finish reason, its logprobs) of a chunk's one choice, in OpenAI's shape."""
    if not isinstance(c, dict) or not isinstance(c.get("index"), int) or not 0 <= c["index"] < n:
        bad(k, f"the choice's index must be one of {list(range(n))} (the request has n={n})")
    i = c["index"]
    if finished[i] is not None:
        bad(k, f"choice {i} already finished ({finished[i]!r}) at an earlier event; nothing of it may follow")
    for key in ("finish_reason", "logprobs", "delta" if want.chat else "text"):
        if key not in c:
            bad(k, f"the choice lacks {key!r}: a {'chat' if want.chat else 'completion'} chunk's choice has index, "
                   f"{'delta' if want.chat else 'text'}, logprobs and finish_reason")
    if c["finish_reason"] not in (None, "stop", "length"):
        bad(k, f"finish_reason {c['finish_reason']!r}; expected null until the last chunk, then 'stop' or 'length'")
    if not want.chat:
        if not isinstance(c["text"], str):
            bad(k, f"text {c['text']!r} is not a string")
        return i, c["text"], c["finish_reason"], c["logprobs"]
    delta = c["delta"]
    if not isinstance(delta, dict) or not set(delta) <= {"role", "content"}:
        bad(k, f"delta {delta!r}: expected an object with role (on a choice's first chunk) and content")
    if (delta.get("role") == "assistant") != (i not in seen):
        bad(k, f"choice {i}'s {'first' if i not in seen else 'later'} chunk has delta {delta!r}: its first chunk, "
               f"and only that one, says role 'assistant'")
    if not isinstance(delta.get("content", ""), str):
        bad(k, f"delta content {delta['content']!r} is not a string")
    return i, delta.get("content") or "", c["finish_reason"], c["logprobs"]


def count_logprobs(lp, chat: bool) -> int:
    if not lp:
        return 0
    return len(lp.get("content") or []) if chat else len(lp.get("tokens") or [])


def check_error(bad, k: int, event: dict, want: Want, last: int) -> None:
    if want.error is None:
        bad(k, "an error event, but the request should have finished: expected its chunks, then data: [DONE]")
    if k != last:
        bad(k, f"an error event with {last - k} event(s) after it before [DONE]: the error is the last event "
               f"before [DONE]")
    e = event["error"]
    if not isinstance(e, dict) or set(e) != {"message", "type", "param", "code"}:
        bad(k, "OpenAI's error object is {\"error\": {\"message\", \"type\", \"param\", \"code\"}}")
    if e["type"] != "server_error" or not str(e["message"]).startswith(want.error):
        bad(k, f"expected type 'server_error' and a message starting {want.error!r} (ended_early, internal_error)")


def check_usage(bad, k: int, event: dict, want: Want, last: int) -> None:
    expected = {"prompt_tokens": want.prompt_tokens, "completion_tokens": want.completion_tokens,
                "total_tokens": want.prompt_tokens + want.completion_tokens}
    if not want.include_usage:
        bad(k, "a chunk with no choices (the usage chunk), but the request did not ask for "
               "stream_options.include_usage")
    if want.error is not None:
        bad(k, "a usage chunk, but the request failed: expected the error event, then [DONE]")
    if k != last:
        bad(k, f"the usage chunk has {last - k} event(s) after it before [DONE]: it is the last event before [DONE]")
    if event.get("usage") != expected:
        bad(k, f"usage {event.get('usage')}; expected {expected} (the prompt's tokens and every choice's "
               f"completion tokens)")


def check_whole(what: str, want: Want, texts, finished, logprobs, usage_seen: bool, errors: list[int]) -> None:
    for i, (got, expected) in enumerate(zip(texts, want.texts)):
        if got != expected:
            at = next((j for j, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
            raise AssertionError(
                f"{what}: choice {i}'s events join to {clip(got)}; expected {clip(expected)} "
                f"({'the text shown before the failure' if want.error else 'the reference tokens, decoded'}); "
                f"they differ from character {at} on")
    if want.error is not None:
        if not errors:
            raise AssertionError(f"{what}: the stream failed after {len(want.texts[0])} characters, but no error "
                                 f"event came before [DONE] (a client cannot tell it from a finished answer)")
        return
    if finished != want.finish:
        raise AssertionError(f"{what}: the choices' finish reasons are {finished}; expected {want.finish} (the last "
                             f"chunk of each choice carries its finish_reason)")
    if want.include_usage and not usage_seen:
        raise AssertionError(f"{what}: stream_options.include_usage asks for a usage chunk (choices [], then "
                             f"[DONE]); none came")
    if want.logprobs is not None and logprobs != want.logprobs:
        raise AssertionError(f"{what}: the chunks' logprobs cover {logprobs} tokens per choice; expected "
                             f"{want.logprobs}: a chunk whose text is held back still carries its tokens' logprobs")
