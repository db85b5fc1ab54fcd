"""What a strictly typed client checks: each client format's bodies and SSE events against
their published component schemas, plus the event-order rules each provider documents.

`check_body` and `check_stream` return violations; `allowed` says which of them are our
documented extension (`billing`) or a recorded provider-versus-schema difference.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from tests.conformance.openapi import Violation, check, event_schema

DOC = {"chat_completions": "openai", "messages": "anthropic", "responses": "openai"}
BODY = {"chat_completions": "CreateChatCompletionResponse", "messages": "Message", "responses": "Response"}


@dataclass(frozen=True)
class Frame:
    event: str | None       # the `event:` line, if any
    data: str               # the joined `data:` lines


def parse_sse(raw: bytes) -> list[Frame]:
    """SSE frames as a client parses them (LF or CRLF; comments ignored)."""
    frames = []
    for block in re.split(r"\r?\n\r?\n", raw.decode()):
        event, data = None, []
        for line in re.split(r"\r?\n", block):
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
        if data:
            frames.append(Frame(event, "\n".join(data)))
    return frames


def order(rule: str, message: str) -> Violation:
    return Violation("order", rule, "$", message)


def check_body(fmt: str, status: int, body, request: dict) -> list[Violation]:
    name = BODY[fmt] if status == 200 else "ErrorResponse"
    found = check(DOC[fmt], name, body)
    if fmt == "responses" and status == 200:
        found += _echo(request, body)
    return found


def check_stream(fmt: str, frames: list[Frame], request: dict) -> list[Violation]:
    if fmt == "responses":
        return _responses_stream(frames, request)
    return {"chat_completions": _chat_stream, "messages": _messages_stream}[fmt](frames)


ECHOED = ("instructions", "max_output_tokens", "temperature", "top_p", "parallel_tool_calls", "tool_choice",
          "text", "reasoning", "metadata")


def _echo(request: dict, response: dict) -> list[Violation]:
    """OpenAI's response object repeats the request's settings."""
    found = [order("C-echo", f"{key}: the request sent {request[key]!r}, the response says {response.get(key)!r}")
             for key in ECHOED if key in request and response.get(key) != request[key]]
    sent = [t.get("name") for t in request.get("tools", [])]
    if [t.get("name") for t in response.get("tools", [])] != sent:
        found.append(order("C-echo", f"tools: the request sent {sent}, the response says {response.get('tools')}"))
    return found


# ---------------------------------------------------------------- A: chat completions

def _chat_stream(frames: list[Frame]) -> list[Violation]:
    found: list[Violation] = []
    chunks = []
    done_at = next((i for i, f in enumerate(frames) if f.data == "[DONE]"), None)
    for f in frames:
        if f.data == "[DONE]":
            continue
        data = json.loads(f.data)
        found += check("openai", "ErrorResponse" if "error" in data else "CreateChatCompletionStreamResponse", data)
        chunks.append(data)
    failed = bool(chunks) and "error" in chunks[-1]
    if failed:
        if done_at is not None:
            found.append(order("A", "a stream that failed must not end with [DONE]"))
        chunks = chunks[:-1]
    elif done_at != len(frames) - 1:
        found.append(order("A", "the stream must end with data: [DONE]"))
    if not chunks:
        return found + [order("A", "no chunks")]
    if chunks[0]["choices"] and chunks[0]["choices"][0]["delta"].get("role") != "assistant":
        found.append(order("A", "the first chunk's delta carries role: assistant"))
    finishes = [i for i, c in enumerate(chunks) for ch in c["choices"] if ch.get("finish_reason")]
    if not failed:
        last = chunks[-1]
        if last["choices"] or not isinstance(last.get("usage"), dict):
            found.append(order("A", "the usage chunk (choices: []) comes last, then [DONE]"))
        if len(finishes) != 1 or finishes[0] != len(chunks) - 2:
            found.append(order("A", f"one finish_reason, in the chunk before the usage chunk; got {finishes}"))
    for i, c in enumerate(chunks[:-1] if not failed else chunks):
        if "usage" not in c or c["usage"] is not None:
            found.append(order("A", f"chunk {i}: with include_usage every chunk before the last has usage: null"))
            break
    return found


# ---------------------------------------------------------------- B: messages

BLOCK_DELTAS = {"text": {"text_delta", "citations_delta"}, "tool_use": {"input_json_delta"},
                "thinking": {"thinking_delta", "signature_delta"}}


def _typed_events(frames: list[Frame], rule: str, doc: str, schema_of) -> tuple[list[Violation], list[dict]]:
    """Events with an `event:` line naming their `type`: each checked against the schema
    `schema_of(type)` names (None: the type is not in the document)."""
    found: list[Violation] = []
    events = []
    for f in frames:
        data = json.loads(f.data)
        kind = data.get("type")
        if f.event != kind:
            found.append(order(rule, f"event line {f.event!r} differs from data.type {kind!r}"))
        name = schema_of(kind)
        if name is None:
            found.append(order(rule, f"event type {kind!r} is not in the document"))
        else:
            found += check(doc, name, data)
        events.append(data)
    return found, events


def _messages_stream(frames: list[Frame]) -> list[Violation]:
    found, events = _typed_events(   # Anthropic's stream error event has the error body's shape
        frames, "B", "anthropic", lambda kind: event_schema("anthropic", "MessageStreamEvent", kind) or "ErrorResponse")
    events = [e for e in events if e.get("type") != "ping"]
    kinds = [e["type"] for e in events]
    if not kinds or kinds[0] != "message_start":
        return found + [order("B", f"message_start comes first; got {kinds[:1]}")]
    failed = kinds[-1] == "error"
    body = kinds[1:-1] if failed else kinds[1:]
    if not failed and body[-2:] != ["message_delta", "message_stop"]:
        found.append(order("B", f"message_delta then message_stop end the stream; got {body[-2:]}"))
    if "error" in kinds[:-1] or (failed and "message_stop" in kinds):
        found.append(order("B", "an error event is the last event, with no message_stop"))
    open_block, open_type, next_index = None, None, 0
    for e in events[1:]:
        kind = e["type"]
        if kind == "content_block_start":
            if open_block is not None or e["index"] != next_index:
                found.append(order("B", f"block {e['index']} starts while {open_block} is open or out of order"))
            open_block, open_type, next_index = e["index"], e["content_block"]["type"], e["index"] + 1
        elif kind in ("content_block_delta", "content_block_stop"):
            if e["index"] != open_block:
                found.append(order("B", f"{kind} for block {e['index']}, but the open block is {open_block}"))
            elif kind == "content_block_stop":
                open_block = None
            elif e["delta"]["type"] not in BLOCK_DELTAS.get(open_type, {e["delta"]["type"]}):
                found.append(order("B", f"{e['delta']['type']} inside a {open_type} block"))
        elif kind == "message_delta" and open_block is not None:
            found.append(order("B", "message_delta while a content block is open"))
    start_usage = events[0]["message"]["usage"]
    for e in events:
        if e["type"] == "message_delta" and e["usage"]["output_tokens"] < start_usage.get("output_tokens", 0):
            found.append(order("B", "usage is cumulative: output_tokens never goes down"))
    return found


# ---------------------------------------------------------------- C: responses

TERMINAL = ("response.completed", "response.incomplete", "response.failed")


def _responses_stream(frames: list[Frame], request: dict) -> list[Violation]:
    found, events = _typed_events(frames, "C", "openai",
                                  lambda kind: event_schema("openai", "ResponseStreamEvent", kind))
    for e in events:
        if isinstance(e.get("response"), dict):
            found += _echo(request, e["response"])
    seq = [e.get("sequence_number") for e in events]
    if seq != list(range(len(events))):
        found.append(order("C", f"sequence_number runs from 0 with no gaps; got {seq}"))
    kinds = [e["type"] for e in events]
    if kinds[:2] != ["response.created", "response.in_progress"]:
        found.append(order("C", f"response.created then response.in_progress open the stream; got {kinds[:2]}"))
    if not kinds or kinds[-1] not in TERMINAL or any(k in TERMINAL for k in kinds[:-1]):
        found.append(order("C", f"exactly one terminal event, last; got {kinds[-1:]}"))
    if "error" in kinds and kinds.index("error") != len(kinds) - 2:
        found.append(order("C", "an error event comes right before response.failed"))
    added: dict[int, dict] = {}
    done: dict[int, dict] = {}
    parts: set = set()
    for e in events[2:-1]:
        index = e.get("output_index")
        kind = e["type"]
        if kind == "response.output_item.added":
            if index != len(added):
                found.append(order("C", f"output item {index} added out of order"))
            if e["item"]["type"] == "message" and e["item"].get("content"):
                found.append(order("C", "a message item is added with content: [], its parts follow"))
            added[index] = e["item"]
        elif index is not None and (index not in added or index in done):
            found.append(order("C", f"{kind} for output item {index} outside its added/done pair"))
        elif kind == "response.output_item.done":
            done[index] = e["item"]
            if any(p[0] == index for p in parts):
                found.append(order("C", f"output item {index} done while a content part is open"))
        elif kind == "response.content_part.added":
            parts.add((index, e["content_index"]))
        elif kind == "response.content_part.done":
            parts.discard((index, e["content_index"]))
        elif kind.startswith("response.output_text.") and (index, e["content_index"]) not in parts:
            found.append(order("C", f"{kind} outside content_part.added/done"))
    if kinds and kinds[-1] in ("response.completed", "response.incomplete"):
        if set(added) != set(done):
            found.append(order("C", "every added output item is done before the stream completes"))
        final = events[-1]["response"]["output"]
        if final != [done[i] for i in sorted(done)]:
            found.append(order("C", "the final response's output equals the items sent by output_item.done"))
    return found


# ---------------------------------------------------------------- what is allowed

@dataclass(frozen=True)
class Difference:
    """A provider-versus-schema difference we follow, shown by a recorded real response."""
    fmt: str
    kind: str
    schema: str          # regex on the component name
    path: str            # regex on the violation path
    message: str         # regex on the violation message
    recordings: tuple[str, ...]   # files under tests/conformance/recorded/ showing the provider do it
    why: str

    def covers(self, fmt: str, v: Violation) -> bool:
        return (fmt == self.fmt and v.kind == self.kind and re.fullmatch(self.schema, v.schema) is not None
                and re.fullmatch(self.path, v.path) is not None and re.search(self.message, v.message) is not None)


RECORDED = [
    Difference("responses", "undeclared", r"Response|Response\w+Event", r"\$(\.response)?\.store", "",
               ("openai-responses-body.json", "openai-responses-stream-tool-call.sse",
                "openai-responses-stream-failed.sse"),
               "OpenAI's response object carries `store`; the schema declares it only on requests. "
               "We send store: false (nothing is stored)."),
    Difference("responses", "schema", r"Response(Created|InProgress|Failed)Event", r"\$\.response\.usage",
               r"^None is not of type 'object'$",
               ("openai-responses-stream-tool-call.sse", "openai-responses-stream-failed.sse"),
               "OpenAI sends usage: null in response.created, response.in_progress and response.failed; "
               "the schema's usage is an object."),
]


def allowed(fmt: str, v: Violation) -> bool:
    """Our one extension (SPEC's billing object, on chat completions) and recorded differences."""
    if v.kind == "undeclared" and fmt == "chat_completions" and v.path == "$.billing":
        return True
    return any(d.covers(fmt, v) for d in RECORDED)
