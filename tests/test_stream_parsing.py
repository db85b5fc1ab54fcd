"""The OpenAI chat stream parsed a network read at a time gives the same canonical events,
and the same error after them, as the event-at-a-time parser it replaced, however the
upstream's bytes are cut into reads; and each read's events are out (one list, written
together) before the next read."""
import asyncio
import random

import orjson
import pytest

from config import ProviderConfig
from providers import base
from providers.base import SSEReader, UpstreamError
from providers.openai import FINISH_TO_STOP, OpenAIProvider
from providers.types import (
    END, ChatRequest, Message, ReasoningDelta, StreamEnd, StreamStart, TextDelta, TextPart, TextRun, ToolCallDelta,
    ToolCallStart,
)


def reference(name: str, datas: list[bytes], eof: bool):
    """The parser as it was before batching, one event at a time: -> (events, error text)."""
    out, started, done, finish, usage, ordinal, ids = [], False, False, None, None, {}, {}
    try:
        for data in datas:
            if data.strip() == b"[DONE]":
                done = True
                break
            chunk = base.loads_event(name, data)
            if "error" in chunk:
                err = chunk["error"]
                raise UpstreamError(502, f"{name} failed mid-stream: "
                                         f"{err.get('message') if isinstance(err, dict) else err}")
            if not started:
                started = True
                out.append(StreamStart(id=chunk.get("id", ""), model=chunk.get("model", "")))
            if chunk.get("usage"):
                from providers.openai import usage_from_openai
                usage = usage_from_openai(chunk["usage"])
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                if delta.get("reasoning_content"):
                    out.append(ReasoningDelta(text=delta["reasoning_content"]))
                if delta.get("content"):
                    out.append(TextDelta(delta["content"]))
                for tc in delta.get("tool_calls") or []:
                    out.extend(OpenAIProvider._tool_delta(tc, ordinal, ids))
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
        if not done and not eof:
            return out, None
        if not done and finish is None:
            raise UpstreamError(502, f"{name} ended the stream before finishing")
        out.append(StreamEnd(stop_reason=FINISH_TO_STOP.get(finish or "stop", END), usage=usage))
    except Exception as exc:
        return out, describe(exc)
    return out, None


def deltas(events: list) -> list:
    """The events with each TextRun as the TextDelta of each of its texts, which is what it means;
    its encodings are checked to be orjson's."""
    out = []
    for ev in events:
        if isinstance(ev, TextRun):
            assert ev.texts and all(ev.texts) and ev.encoded == [orjson.dumps(t) for t in ev.texts]
            out += [TextDelta(t) for t in ev.texts]
        else:
            out.append(ev)
    return out


def describe(exc: Exception) -> str:
    return f"UpstreamError: {exc.message}" if isinstance(exc, UpstreamError) else f"{type(exc).__name__}: {exc}"


def random_event(rng: random.Random) -> bytes:
    text = rng.choice(["word ", "", "é\u2028\"q\"\\n", "🙂", " "])
    kind = rng.choices(["text", "reason", "tool", "finish", "usage", "other", "error", "bad", "list"],
                       [40, 6, 10, 6, 5, 5, 1, 1, 1])[0]
    choice: dict = {"index": 0, "delta": {}, "finish_reason": None}
    body: dict = {"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}
    if kind == "text":
        choice["delta"] = {"content": text}
    elif kind == "reason":
        choice["delta"] = {"reasoning_content": text}
    elif kind == "tool":
        tc = {"index": rng.choice([0, 0, 1]), "function": {"arguments": rng.choice(['{"a":', "1}", ""])}}
        if rng.random() < 0.3:
            tc.update(id=rng.choice(["call_a", "call_b"]), type="function")
            tc["function"]["name"] = "f"
        if rng.random() < 0.1:
            tc = {"index": 0, "type": "custom", "custom": {"name": "g", "input": "x"}}
        choice["delta"] = {"tool_calls": [tc]}
    elif kind == "finish":
        choice["finish_reason"] = rng.choice(["stop", "length", "tool_calls", "content_filter", "odd"])
    elif kind == "usage":
        body.update(choices=[], usage={"prompt_tokens": 3, "completion_tokens": rng.randint(0, 9)})
    elif kind == "other":
        body["choices"] = rng.choice([[], None, [{"index": 0}]])
    elif kind == "error":
        body = {"error": rng.choice([{"message": "boom"}, "plain"])}
    elif kind == "bad":
        return rng.choice([b"{not json", b"[1, 2]", b"\"s\""])
    else:
        choice["delta"] = {"tool_calls": [{"index": "x"}]}     # a malformed shape
    return orjson.dumps(body)


def random_stream(rng: random.Random) -> tuple[bytes, list[bytes], bool]:
    """-> (the upstream's bytes, the data of its events, whether it ends with [DONE])"""
    datas = [random_event(rng) for _ in range(rng.randint(0, 12))]
    done = rng.random() < 0.7
    if done:
        datas.append(rng.choice([b"[DONE]", b" [DONE] "]))
    nl = rng.choice([b"\n", b"\r\n"])
    raw = b"".join(b"data: " + d + nl + nl if rng.random() < 0.8 else b": c" + nl + b"data:" + d + nl + nl
                   for d in datas)
    return raw, datas, done


class Content:
    """An upstream body handed over in the given pieces, one piece per read."""

    def __init__(self, pieces: list[bytes], before_read=None):
        self.pieces, self.got, self.before_read = list(pieces), b"", before_read

    def is_eof(self):
        return True

    def iter_any(self):
        return self

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.before_read:
            self.before_read(self.got)
        if not self.pieces:
            raise StopAsyncIteration
        self.got += self.pieces[0]
        return self.pieces.pop(0)

    async def readany(self):        # as aiohttp's reader: the next piece, b"" at the end
        try:
            return await self.__anext__()
        except StopAsyncIteration:
            return b""

    def ready(self):                # as the lean client's answer: what has arrived (a piece a read), b"" at the end
        if self.before_read:
            self.before_read(self.got)
        if not self.pieces:
            return b""
        self.got += self.pieces[0]
        return self.pieces.pop(0)


def cut(raw: bytes, rng: random.Random) -> list[bytes]:
    points = sorted(rng.sample(range(1, len(raw)), min(len(raw) - 1, rng.randint(0, 6)))) if len(raw) > 1 else []
    return [raw[a:b] for a, b in zip([0] + points, points + [len(raw)])]


def complete_datas(got: bytes) -> list[bytes]:
    """The data of every complete event in what has arrived so far."""
    blocks = got.replace(b"\r\n", b"\n").split(b"\n\n")[:-1]
    return [line[6:] if line[5:6] == b" " else line[5:]
            for block in blocks for line in block.split(b"\n") if line.startswith(b"data:")]


@pytest.fixture
def provider():
    return OpenAIProvider(ProviderConfig(name="up", type="openai", settings={"api_key": "k"}), None)


REQ = ChatRequest(model="m", messages=[Message("user", [TextPart("hi")])], max_tokens=16, stream=True)


@pytest.mark.parametrize("seed", range(40))
async def test_batched_parsing_matches_the_event_at_a_time_parser(provider, monkeypatch, seed):
    rng = random.Random(seed)
    for _ in range(25):
        raw, _, _ = random_stream(rng)
        pieces = cut(raw, rng)
        want, want_error = reference("up", complete_datas(raw), eof=True)

        flushed: list = []

        def before_read(got: bytes) -> None:        # no event of an earlier read waits for this one
            assert flushed == reference("up", complete_datas(got), eof=False)[0]

        content = Content(pieces, before_read)

        class Resp:
            status = 200

        Resp.content = content

        class Request:
            end = None          # no total deadline

            def __init__(self, *a, **k):
                pass

            async def __aenter__(self):
                return Resp()

            async def __aexit__(self, *exc):
                pass

        monkeypatch.setattr(base, "_Request", Request)
        got, error = [], None
        try:
            async for item in provider.stream(REQ, type("M", (), {"upstream": "m"})()):
                assert isinstance(item, list) and item      # a read's events, written together
                got.extend(deltas(item))
                if not isinstance(item[-1], StreamEnd):     # what arrived so far is out, none held back
                    so_far, _ = reference("up", complete_datas(content.got), eof=False)
                    assert got == so_far
                flushed[:] = got
        except UpstreamError as err:
            error = describe(err)
        assert got == want
        if want_error is None:
            assert error is None
        else:
            assert error is not None
            if want_error.startswith("UpstreamError"):
                assert error == want_error
            else:               # a malformed shape: the 502 the shape guard makes of it
                assert "shape" in error

        # the event-at-a-time interface (a subclass calling super().parse_stream) agrees too
        got2, error2 = [], None
        try:
            async for ev in provider.parse_stream(SSEReader(Content(pieces), "up"), REQ):
                got2.append(ev)
        except Exception as exc:
            error2 = describe(exc)
        assert got2 == want and error2 == want_error


def random_text(rng: random.Random) -> str:
    alphabet = ["a", " ", "é", "🙂", "\u2028", '"', "\\", "/", "\n", "\t", "\x00", "\x1f", "\x7f", "{", "}", ",",
                '":', "\\u0001", "content"]
    return "".join(rng.choice(alphabet) for _ in range(rng.choice([0, 0, 1, 2, 5, 12])))


def envelope_chunk(rng: random.Random, style: int, text: str) -> bytes:
    """A text chunk in one of several upstream spellings of the same envelope."""
    import json
    body: dict = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                  "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    if style == 1:          # spaces after separators, non-ASCII as \u escapes
        return json.dumps(body).encode()
    if style == 2:          # the envelope's own strings look like the content key
        body["id"] = 'x"content":"y'
        body["system_fingerprint"] = '\\"content": '
    if style == 3:          # the content before other delta keys (then not a template: two keys)
        body["choices"][0]["delta"] = {"content": text, "role": "assistant"}
    if style == 4:          # usage on every chunk (never a template)
        body["usage"] = {"prompt_tokens": 1, "completion_tokens": 1}
    if style == 5:          # extra fields after the choices, logprobs in the choice
        body["choices"][0]["logprobs"] = None
        body["obfuscation"] = "abc"
    if style == 6:          # another "content" key before the delta's: the template's place is checked
        body = {"meta": {"content": "z"}, **body}
    if style == 7:          # OpenAI's field that changes every chunk, last: read around by the template
        body["obfuscation"] = "".join(rng.choice("abcXYZ019") for _ in range(rng.randint(8, 12)))
    if style == 8:          # the same, at times with bytes the template does not read (parsed whole)
        body["obfuscation"] = "".join(rng.choice(["a", "Z", "0", '"', "\\", "é", "\x01", "~", " "])
                                      for _ in range(rng.randint(0, 12)))
    if style == 9:          # a field that changes every chunk after the text, not OpenAI's: the template never fits
        body["nonce"] = "".join(rng.choice("abcXYZ019") for _ in range(rng.randint(8, 12)))
    return orjson.dumps(body)


OTHER = orjson.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                      "choices": [{"index": 0, "delta": {"reasoning_content": "r"}, "finish_reason": None}]})


def reads(datas: list[bytes], rng: random.Random) -> list[list[bytes]]:
    """The events cut into network reads of random sizes."""
    out, i = [], 0
    while i < len(datas):
        n = rng.choice([1, 1, 2, 5, 40])
        out.append(datas[i:i + n])
        i += n
    return out


def odd_chunk(head: bytes, tail: bytes, rng: random.Random) -> bytes:
    """The template's bytes around something that is not one string."""
    return head + rng.choice([b'"a","reasoning_content":"r"', b'null', b'"a\x00b"', b'"a\\u0000b"', b'"a"   ', b'1', b'"unterminated', b'""',
                              b'"a","x":"b"}],"usage":{"prompt_tokens":1},"y":[{"z":"w"']) + tail


@pytest.mark.parametrize("seed", range(30))
def test_a_text_chunk_parsed_from_its_template_means_what_the_whole_chunk_means(seed):
    """Only a text chunk's string is parsed once a chunk showed the bytes around it; the events
    (text, empty deltas, escapes, control characters, lookalike keys) are those of the full parse."""
    from providers.openai import ChunkParser
    rng = random.Random(seed)
    for style in range(10):
        datas = [orjson.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                               "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                            "finish_reason": None}]})]
        texts = [random_text(rng) for _ in range(rng.randint(1, 30))]
        datas += [envelope_chunk(rng, style, text) for text in texts]
        parser, learned = ChunkParser("up"), None
        got = []
        for read in reads(datas, rng):
            events, error = parser.feed([("", data) for data in read])
            assert error is None
            got += deltas(events)
            if parser.head is not None and learned is None:
                learned = (parser.head, parser.tail)
        if learned:             # now something else between the same bytes, among text chunks: parsed whole
            more = [rng.choice([odd_chunk(*learned, rng), OTHER]) if rng.random() < 0.3
                    else envelope_chunk(rng, style, random_text(rng)) for _ in range(rng.randint(1, 12))]
            datas += more
            for read in reads(more, rng):
                events, error = parser.feed([("", data) for data in read])
                got += deltas(events)
                if error is not None:
                    got.append(describe(error))
                    break
        want, want_error = reference("up", datas, eof=False)
        if want_error is None:
            assert got == want
        else:
            assert got[:-1] == want and got[-1] == want_error
        if style in (0, 1, 2, 5, 7) and any(texts):
            assert learned is not None, "the text template is learned from a plain text chunk"
        if style in (3, 4):
            assert learned is None
        first = next((i for i, text in enumerate(texts) if text), len(texts))
        if style == 7 and len(texts) - first > 3:       # kept: three chunks it did not fit would have dropped it
            assert parser.closing is not None and parser.head is not None
        if style == 9 and len(texts) - first > 3:       # learned, then dropped for good
            assert parser.head is None and parser.tries == 0


@pytest.mark.parametrize("seed", range(20))
def test_a_text_run_is_written_as_its_text_deltas_would_be(seed):
    """Each client format writes a TextRun as the same bytes as a TextDelta of each of its texts,
    around reasoning that closes the text item, over random text (unicode, quotes, backslashes,
    control characters)."""
    from plugins.formats.chat_completions import ChunkWriter
    from plugins.formats.messages import EventWriter
    from plugins.formats.responses import ResponseEventWriter

    class Ctx:
        call_id, billing, chat = "c1", {}, REQ

        class route:
            class model:
                id = "m"

            class provider:
                @staticmethod
                def same_format(req):
                    return False

    rng = random.Random(seed)
    runs = []
    for _ in range(rng.randint(1, 8)):
        if rng.random() < 0.2:
            runs.append(ReasoningDelta(text="think"))
        else:
            texts = [t for t in (random_text(rng) for _ in range(rng.randint(1, 6))) if t] or ["x"]
            runs.append(TextRun(texts, [orjson.dumps(t) for t in texts]))
    for make in (ChunkWriter, ResponseEventWriter, EventWriter):
        fast, slow = make(Ctx()), make(Ctx())
        got = b"".join(fast.texts(ev) if isinstance(ev, TextRun) else fast.event(ev) for ev in runs)
        want = b"".join(slow.event(ev) for ev in deltas(runs))
        assert got == want, make.__name__


def test_a_read_of_one_line_events_is_split_as_event_by_event():
    """The one-go split of a read whose events are single `data: ` lines queues what the
    block-by-block split does, for any bytes (other fields, comments, CRLF, blank lines)."""
    class Nothing:
        def iter_any(self):
            return self

        def __aiter__(self):
            return self

    def by_block(buffer: bytes):
        events = []
        blocks = buffer.replace(b"\r\n", b"\n").split(b"\n\n")
        rest = blocks.pop()
        for block in blocks:
            if (event := base._parse_block(block)) is not None:
                events.append(event)
        return events, rest

    rng = random.Random(7)
    pieces = [b"data: ", b"x", b"\n", b"\n\n", b"data:", b"event: e\n", b": c\n", b"{}", b"\r\n", b" ", b"[DONE]",
              b"\n\ndata: "]
    for _ in range(20000):
        buffer = (b"data: " if rng.random() < 0.7 else b"") + b"".join(rng.choice(pieces)
                                                                        for _ in range(rng.randint(0, 12)))
        reader = SSEReader(Nothing(), "up")
        rest = reader._split(buffer)
        assert (list(reader.events), rest) == by_block(buffer), buffer


def test_a_template_dropped_with_its_chunks_still_pending_sends_them_first():
    """A stream whose text chunks alternate between the template's tail and other tails: when the
    third differing one drops the template, the chunks it already read still go out, in order."""
    from providers.openai import ChunkParser

    def chunk(text: str, nonce: str) -> bytes:
        return orjson.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                             "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
                             "nonce": nonce})
    parser = ChunkParser("up")
    first, error = parser.feed([("", chunk("a", "x1"))])
    assert error is None and parser.head is not None
    datas = [chunk(text, nonce) for text, nonce in [("b", "x1"), ("c", "x2"), ("d", "x1"), ("e", "x3"), ("f", "x1"),
                                                     ("g", "x4"), ("h", "x1")]]
    events, error = parser.feed([("", data) for data in datas])
    assert error is None
    assert [ev.text for ev in deltas(first + events) if isinstance(ev, TextDelta)] == list("abcdefgh")
    assert parser.head is None


async def test_the_read_deadline_counts_only_time_spent_waiting_for_the_upstream():
    """One timer per stream: time between reads (the relay writing to a slow client) does not
    count, a read that waits longer than the idle deadline fails as a stalled upstream, and the
    first byte has its own (longer) deadline."""
    from providers.guard import UpstreamLimits
    from providers.http1 import Response

    class Connection:
        loop = asyncio.get_running_loop()
        paused = False

    content = Response(Connection())

    def feed_data(data: bytes) -> None:         # a network read, as the connection hands it over
        content._chunks.append(data)
        if content._waiter is not None and not content._waiter.done():
            content._waiter.set_result(content._take())

    limits = UpstreamLimits(first_byte=0.6, idle=0.2)
    reader = SSEReader(content, "up", limits)
    loop = asyncio.get_running_loop()
    loop.call_later(0.4, feed_data, b"data: 1\n\n")                 # later than idle, sooner than first byte
    assert await reader.batch() == [("", b"1")]
    await asyncio.sleep(0.5)                                          # a slow client: not the upstream's time
    feed_data(b"data: 2\n\n")
    assert await reader.batch() == [("", b"2")]
    loop.call_later(0.1, feed_data, b"data: 3\n\n")                  # inside the deadline, which moved on
    assert await reader.batch() == [("", b"3")]
    started = loop.time()
    with pytest.raises(UpstreamError, match="stopped sending mid-stream"):
        await reader.batch()                                          # nothing comes: fails at the idle deadline
    assert 0.15 < loop.time() - started < 0.5
    reader.close()
    assert reader.timer is None
