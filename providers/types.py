"""Canonical chat types: the one vocabulary between client formats and providers.

A client format (chat completions, messages, responses) parses its wire body into a
`ChatRequest` and renders `ChatResponse` / stream events back. A provider turns a
`ChatRequest` into its upstream's wire and the upstream's answer back into these
types. N formats x M providers therefore need N + M translators, never N x M.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Union

Role = Literal["system", "user", "assistant", "tool"]

# Canonical stop reasons. Every format maps its own vocabulary onto these.
END = "end"                      # natural end of turn
MAX_TOKENS = "max_tokens"        # hit the output cap
TOOL_USE = "tool_use"            # the model called one or more tools
STOP_SEQUENCE = "stop_sequence"  # a caller stop sequence matched
CONTENT_FILTER = "content_filter"  # refusal or provider safety filter
STOP_REASONS = (END, MAX_TOKENS, TOOL_USE, STOP_SEQUENCE, CONTENT_FILTER)


@dataclass(slots=True)
class TextPart:
    text: str


@dataclass(slots=True)
class ImagePart:
    """An image given by an https URL or a `data:` URL (kept as given)."""
    url: str
    detail: str | None = None
    field: str | None = None    # where a client gave it (e.g. messages[0].content[1].image_url.url), for errors

    @property
    def is_data(self) -> bool:
        return self.url.startswith("data:")

    def split_data_url(self) -> tuple[str, str]:
        """`data:image/png;base64,AAA` -> ("image/png", "AAA")."""
        header, _, data = self.url.partition(",")
        media_type = header[5:].split(";", 1)[0] or "application/octet-stream"
        return media_type, data


@dataclass(slots=True)
class ToolCall:
    """A call the model made. `arguments` is JSON text (custom tools: raw input)."""
    id: str
    name: str
    arguments: str
    kind: Literal["function", "custom"] = "function"


@dataclass(slots=True)
class ToolResult:
    """The caller's answer to a tool call, sent back in a later turn."""
    call_id: str
    content: str | list[TextPart | ImagePart]
    is_error: bool = False
    name: str | None = None  # some upstreams (Gemini) key results by tool name

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if isinstance(p, TextPart))


@dataclass(slots=True)
class ReasoningPart:
    """Model reasoning. `signature` / `redacted` must travel back verbatim to providers
    that verify them (Anthropic thinking blocks)."""
    text: str = ""
    signature: str | None = None
    redacted: str | None = None


@dataclass(slots=True)
class OtherPart:
    """A block only one wire format understands (an Anthropic `document`, say). It travels
    untouched to an upstream of that format; any other provider refuses it with a 400."""
    format: str
    data: dict[str, Any]


Part = Union[TextPart, ImagePart, ToolCall, ToolResult, ReasoningPart, OtherPart]


@dataclass(slots=True)
class Message:
    role: Role
    parts: list[Part]

    def text(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))


@dataclass(slots=True)
class Tool:
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None   # JSON schema (function tools)
    kind: Literal["function", "custom"] = "function"
    strict: bool | None = None
    format: dict[str, Any] | None = None       # custom tools' input grammar
    namespace: str | None = None               # the client's tool group (responses `namespace` tools)


@dataclass(slots=True)
class ToolChoice:
    mode: Literal["auto", "none", "required", "tool"] = "auto"
    name: str | None = None                 # with mode "tool"
    parallel: bool | None = None            # None = provider default


@dataclass(slots=True)
class ChatRequest:
    model: str                              # the id the client asked for
    messages: list[Message]                 # system messages included, in order
    max_tokens: int
    stream: bool = False
    tools: list[Tool] = field(default_factory=list)
    tool_choice: ToolChoice | None = None
    stop: list[str] = field(default_factory=list)
    temperature: float | None = None
    top_p: float | None = None
    # Parameters with no canonical field, in the client's own wire shape. A provider
    # passes them on only when it speaks that same wire format (`extra_format`).
    extra: dict[str, Any] = field(default_factory=dict)
    extra_format: str = ""
    reasoning: dict[str, Any] | None = None   # e.g. {"budget_tokens": 2048} or {"effort": "low"}
    # The client's own body and headers, for an upstream that speaks the same wire format:
    # it gets the request as sent (cache_control, documents, betas...), not a re-translation.
    raw: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Usage:
    input_tokens: int = 0          # total input, cached included
    output_tokens: int = 0         # total output, reasoning included
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(slots=True)
class ChatResponse:
    id: str
    model: str                      # what the upstream said it ran
    content: list[Part]             # TextPart, ToolCall, ReasoningPart in order
    stop_reason: str = END
    stop_sequence: str | None = None
    usage: Usage | None = None
    raw: dict[str, Any] | None = None   # the upstream body, for same-format pass-through
    raw_format: str = ""

    def text(self) -> str:
        return "".join(p.text for p in self.content if isinstance(p, TextPart))

    def tool_calls(self) -> list[ToolCall]:
        return [p for p in self.content if isinstance(p, ToolCall)]


# ---- stream events -------------------------------------------------------------
# A provider's stream is an async iterator of these. Tool calls are numbered by
# `index`, their position among the tool calls of the message (0, 1, ...), which is
# what chat-completions deltas need; block-based formats derive their own indices.

@dataclass(slots=True)
class StreamStart:
    id: str
    model: str
    input_tokens: int | None = None


@dataclass(slots=True)
class TextDelta:
    text: str


@dataclass(slots=True)
class TextRun:
    """Text deltas that arrived together, one per upstream chunk, none empty: what a
    TextDelta of each text would be, without an object per chunk. `encoded` has each
    text as orjson writes it (the JSON string, quotes included)."""
    texts: list[str]
    encoded: list[bytes]


@dataclass(slots=True)
class ReasoningDelta:
    text: str = ""
    signature: str | None = None
    redacted: str | None = None


@dataclass(slots=True)
class ToolCallStart:
    index: int
    id: str
    name: str
    kind: Literal["function", "custom"] = "function"


@dataclass(slots=True)
class ToolCallDelta:
    index: int
    arguments: str


@dataclass(slots=True)
class StreamEnd:
    stop_reason: str
    usage: Usage | None = None
    stop_sequence: str | None = None


@dataclass(slots=True)
class RawFrame:
    """One upstream SSE frame, verbatim, for a client speaking the upstream's own format.
    Providers yield it after the canonical events derived from the same frame."""
    data: bytes


@dataclass(slots=True)
class Flush:
    """Everything the upstream sent in one network read has been yielded: a good moment
    to write. Relays gather events between flushes, so chunks that arrived together leave
    together and nothing waits for more input."""


FLUSH = Flush()

StreamEvent = Union[StreamStart, TextDelta, TextRun, ReasoningDelta, ToolCallStart, ToolCallDelta, StreamEnd, RawFrame, Flush]


def estimate_tokens(chars: int) -> int:
    """The service's token estimate: about 4 characters per token, rounded up."""
    return -(-chars // 4)


IMAGE_ESTIMATE_CHARS = 4000   # an image counts as ~1,000 tokens in the input estimate


def measure_input(req: ChatRequest) -> tuple[int, int]:
    """-> (text characters, images) of everything sent: messages, tool calls and results,
    and tool definitions. Text counts toward size limits; images only toward estimates."""
    chars = images = 0
    for m in req.messages:
        for p in m.parts:
            if isinstance(p, TextPart):
                chars += len(p.text)
            elif isinstance(p, ImagePart):
                images += 1
            elif isinstance(p, ToolCall):
                chars += len(p.name) + len(p.arguments)
            elif isinstance(p, ToolResult):
                if isinstance(p.content, str):
                    chars += len(p.content)
                else:
                    for q in p.content:
                        if isinstance(q, TextPart):
                            chars += len(q.text)
                        else:
                            images += 1
            elif isinstance(p, ReasoningPart):
                chars += len(p.text)
            elif isinstance(p, OtherPart):
                chars += len(str(p.data))
    for t in req.tools:
        chars += len(t.name) + len(t.description or "") + len(str(t.parameters or t.format or ""))
    return chars, images
