"""The lean HTTP/1.1 client of the chat upstream calls (providers/http1.py), through real
sockets on loopback: kept-alive connections reused, every body framing, gzip, servers that
close or cut answers, TLS trusted and not, injected header lines refused, the per-origin
limit; and through the gateway, an SDK's calls sharing one upstream connection."""
import asyncio
import gzip
import shutil
import subprocess
import zlib

import openai
import orjson
import pytest
from aiohttp import web

from providers.http1 import HTTPError, InvalidHeader, MalformedResponse, Pool, ServerDisconnected
from tests.conftest import DEMO_MODELS, UPSTREAM_PRICES, openai_upstream
from tests.fakes import FakeOpenAIChat, Reply
from tests.servers import unavailable

OK_JSON = b'{"ok": true}'


def answer(body: bytes = OK_JSON, *headers: str, status: str = "200 OK") -> bytes:
    """A whole response with a Content-Length."""
    lines = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{lines}\r\n".encode() + body


def chunked(*pieces: bytes, head: str = "") -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    return f"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n{head}\r\n".encode() + body


class Upstream:
    """A loopback HTTP/1.1 server. `script` is a list of what to do per request, in order:
    bytes to write (the connection stays open), or (bytes, "close") to write and close."""

    def __init__(self, script):
        self.script = list(script)
        self.connections = 0
        self.open = 0
        self.most_open = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self.server: asyncio.Server | None = None
        self.delay = 0.0
        self.handlers: dict[asyncio.Task, asyncio.StreamWriter] = {}

    async def start(self, ssl=None) -> "Upstream":
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0, ssl=ssl)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    def url(self, scheme: str = "http", host: str = "127.0.0.1") -> str:
        return f"{scheme}://{host}:{self.port}/v1/chat/completions"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.handlers[asyncio.current_task()] = writer
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                self.requests.append((head, await reader.readexactly(length)))
                step = self.script.pop(0) if self.script else answer()
                if self.delay:
                    await asyncio.sleep(self.delay)
                data, close = (step, False) if isinstance(step, bytes) else (step[0], True)
                writer.write(data)
                await writer.drain()
                if close:
                    return
        finally:
            self.open -= 1
            writer.close()

    async def stop(self) -> None:
        self.server.close()
        for writer in self.handlers.values():
            writer.close()
        await asyncio.gather(*self.handlers, return_exceptions=True)


@pytest.fixture
async def pool():
    pool = Pool(limit_per_origin=10)
    yield pool
    await pool.close()


async def upstream(*script, ssl=None) -> Upstream:
    return await Upstream(script).start(ssl)


async def call(pool: Pool, url: str, headers: dict | None = None) -> tuple[int, bytes]:
    resp = await pool.post(url, b'{"q": 1}', headers or {"Content-Type": "application/json"}, 5)
    try:
        return resp.status, await resp.read()
    finally:
        resp.close()


async def test_a_kept_alive_connection_serves_call_after_call(pool):
    up = await upstream()
    for _ in range(4):
        assert await call(pool, up.url()) == (200, OK_JSON)
    assert up.connections == 1 and len(up.requests) == 4
    head, body = up.requests[0]
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"Accept-Encoding: gzip, deflate\r\n" in head and body == b'{"q": 1}'
    await up.stop()


async def test_chunked_content_length_and_close_delimited_bodies(pool):
    up = await upstream(
        b"HTTP/1.1 100 Continue\r\n\r\n" + chunked(b"a" * 5, b"b" * 70_000, b"c"),     # after an interim answer
        answer(b"x" * 3_000_000),                                                      # past the unread limit
        (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: 1\n\ndata: 2\n\n", "close"),
        answer(b"after"))
    assert await call(pool, up.url()) == (200, b"a" * 5 + b"b" * 70_000 + b"c")
    assert await call(pool, up.url()) == (200, b"x" * 3_000_000)
    assert await call(pool, up.url()) == (200, b"data: 1\n\ndata: 2\n\n")
    assert await call(pool, up.url()) == (200, b"after")
    assert up.connections == 2          # the close-delimited body ended its connection
    await up.stop()


async def test_gzip_and_deflate_bodies_are_decoded_and_other_encodings_refused(pool):
    text = b'{"answer": "' + b"words " * 2000 + b'"}'
    packed = gzip.compress(text)
    up = await upstream(
        chunked(packed[:10], packed[10:500], packed[500:], head="Content-Encoding: gzip\r\n"),
        answer(zlib.compress(text), "Content-Encoding: deflate"),
        answer(b"???", "Content-Encoding: br"),
        answer(gzip.compress(text)[:-30], "Content-Encoding: gzip"))
    assert await call(pool, up.url()) == (200, text)
    assert await call(pool, up.url()) == (200, text)
    with pytest.raises(MalformedResponse, match="Content-Encoding: br"):
        await call(pool, up.url())
    with pytest.raises(MalformedResponse, match="cut short"):
        await call(pool, up.url())
    await up.stop()


async def test_a_server_closing_an_idle_connection_does_not_fail_the_next_call(pool):
    up = await upstream((answer(), "close"), answer())
    assert await call(pool, up.url()) == (200, OK_JSON)
    await asyncio.sleep(0.05)                   # the close arrives while the connection is idle
    assert await call(pool, up.url()) == (200, OK_JSON)
    assert up.connections == 2 and len(up.requests) == 2
    await up.stop()


async def test_a_post_is_never_sent_twice(pool):
    """A kept-alive connection closed after the server read the request, before any byte of
    an answer: the call fails (the server may have acted on it) and is not sent again."""
    up = await upstream(answer(), (b"", "close"), answer())
    assert await call(pool, up.url()) == (200, OK_JSON)
    with pytest.raises(ServerDisconnected):
        await call(pool, up.url())
    assert len(up.requests) == 2                # the second request reached the server once
    assert await call(pool, up.url()) == (200, OK_JSON)
    assert up.connections == 2 and len(up.requests) == 3
    await up.stop()


async def test_an_idle_connection_is_dropped_after_the_keepalive_time():
    pool = Pool(keepalive=0.1)
    up = await upstream()
    assert await call(pool, up.url()) == (200, OK_JSON)
    await asyncio.sleep(0.3)
    assert up.open == 0                       # the pool closed it
    assert await call(pool, up.url()) == (200, OK_JSON)
    assert up.connections == 2
    await pool.close()
    await up.stop()


async def test_connection_close_from_the_server_is_honoured(pool):
    up = await upstream(answer(OK_JSON, "Connection: close"), answer(), answer())
    for _ in range(3):
        assert await call(pool, up.url()) == (200, OK_JSON)
    assert up.connections == 2
    await up.stop()


async def test_an_answer_cut_mid_body_fails_and_its_connection_is_not_reused(pool):
    up = await upstream((answer(b"0123456789")[:-4], "close"), answer(b"x" * 10)[:-3], answer())
    with pytest.raises(ServerDisconnected):
        await call(pool, up.url())
    resp = await pool.post(up.url(), b"{}", {}, 5)        # left before its end (the rest never comes)
    assert await resp.readany() == b"xxxxxxx"
    resp.close()
    assert await call(pool, up.url()) == (200, OK_JSON)
    assert up.connections == 3
    await up.stop()


async def test_a_malformed_answer_is_refused(pool):
    up = await upstream((b"HTTP/1.1 20x Oops\r\n\r\n", "close"), (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
                                                                    b"Content-Length: 3\r\n\r\nabc", "close"))
    for _ in range(2):
        with pytest.raises(MalformedResponse):
            await call(pool, up.url())
    await up.stop()


async def test_endless_headers_are_refused_and_not_buffered(pool):
    """A hostile upstream that never ends its headers (one endless header, or very many):
    the call fails once 64 KB have come without the headers ending, however long it goes on."""
    endless_value = b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 200_000
    many_headers = b"HTTP/1.1 200 OK\r\n" + b"X-Pad: aaaaaaaa\r\n" * 20_000
    up = await upstream(endless_value, many_headers)
    for _ in range(2):
        with pytest.raises(MalformedResponse, match="headers longer than 64 KB"):
            await call(pool, up.url())
    await up.stop()


@pytest.mark.parametrize("header", [{"X-Note": "a\r\nX-Injected: 1"}, {"X-Note": "a\nb"}, {"X\rInjected": "1"}])
async def test_a_header_with_a_line_break_is_refused_before_anything_is_sent(pool, header):
    up = await upstream()
    with pytest.raises(InvalidHeader):
        await call(pool, up.url(), header)
    assert up.requests == [] and up.connections == 0
    await up.stop()


async def test_the_per_origin_limit_queues_calls_until_a_connection_is_free():
    pool = Pool(limit_per_origin=3)
    up = await upstream()
    up.delay = 0.05
    results = await asyncio.gather(*(call(pool, up.url()) for _ in range(4)))
    assert results == [(200, OK_JSON)] * 4
    assert up.most_open == 3 and up.connections == 3
    await pool.close()
    await up.stop()


async def test_a_refused_connection_is_an_os_error(pool):
    up = await upstream()
    url = up.url()
    await up.stop()
    await up.server.wait_closed()
    with pytest.raises(OSError):
        await call(pool, url)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A self-signed certificate for localhost and 127.0.0.1 (made with the openssl command)."""
    if shutil.which("openssl") is None:
        unavailable("the openssl command", "openssl")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


async def test_https_with_a_certificate_trusted_through_ssl_cert_file(certificate, monkeypatch):
    import ssl
    cert, key = certificate
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(cert, key)
    up = await upstream(answer(b"secret"), answer(b"again"), ssl=server_side)

    untrusting = Pool()
    with pytest.raises(ssl.SSLCertVerificationError):
        await call(untrusting, up.url("https", "localhost"))
    await untrusting.close()

    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    trusting = Pool()
    assert await call(trusting, up.url("https", "localhost")) == (200, b"secret")
    assert await call(trusting, up.url("https", "localhost")) == (200, b"again")
    assert up.connections == 1 and b"Host: localhost:" in up.requests[0][0]      # one connection, reused
    await trusting.close()
    await up.stop()


async def test_shutdown_closes_idle_connections_and_refuses_new_calls():
    pool = Pool()
    up = await upstream()
    assert await call(pool, up.url()) == (200, OK_JSON)
    await pool.close()
    await asyncio.sleep(0.05)
    assert up.open == 0
    with pytest.raises(HTTPError):
        await call(pool, up.url())
    await up.stop()


# -- through the gateway --------------------------------------------------------------

async def test_gateway_calls_share_one_upstream_connection(start_gateway, aiohttp_server):
    """The openai SDK calls the gateway four times (two streams): the fake upstream sees one connection."""
    seen: set = set()

    @web.middleware
    async def count(request, handler):
        seen.add(request.protocol)          # one per connection
        return await handler(request)
    fake_openai = FakeOpenAIChat()
    fake_openai.app.middlewares.append(count)
    fake_openai.server = await aiohttp_server(fake_openai.app)
    gw = await start_gateway(openai_upstream(fake_openai))
    key, _ = await gw.key(1)
    client = gw.openai(key)
    for i in range(4):
        fake_openai.enqueue(Reply(text=f"answer {i}"))
        if i % 2:
            stream = await client.chat.completions.create(model="up/gpt", messages=[{"role": "user", "content": "hi"}],
                                                          stream=True)
            assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices]) == f"answer {i}"
        else:
            done = await client.chat.completions.create(model="up/gpt", messages=[{"role": "user", "content": "hi"}])
            assert done.choices[0].message.content == f"answer {i}"
    assert len(fake_openai.requests) == 4 and len(seen) == 1


async def test_gateway_an_answer_cut_mid_body_is_a_502_and_the_next_call_succeeds(start_gateway):
    completion = orjson.dumps({"id": "c1", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",
                               "choices": [{"index": 0, "message": {"role": "assistant", "content": "whole"},
                                            "finish_reason": "stop"}],
                               "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
    up = await upstream(answer(completion, "Content-Type: application/json"),
                        (answer(completion)[:-10], "close"),
                        answer(completion, "Content-Type: application/json"))
    gw = await start_gateway({
        "providers": {"raw": {"type": "openai", "base_url": f"http://127.0.0.1:{up.port}/v1", "api_key": "sk-raw"}},
        "models": {"chat": DEMO_MODELS + [{"id": "raw/gpt", "provider": "raw", "upstream": "gpt-4o-mini",
                                           **UPSTREAM_PRICES}]}})
    key, _ = await gw.key(1)
    client = gw.openai(key)
    hi = [{"role": "user", "content": "hi"}]
    assert (await client.chat.completions.create(model="raw/gpt", messages=hi)).choices[0].message.content == "whole"
    with pytest.raises(openai.InternalServerError, match="raw connection broke mid-response"):
        await client.chat.completions.create(model="raw/gpt", messages=hi)
    assert (await client.chat.completions.create(model="raw/gpt", messages=hi)).choices[0].message.content == "whole"
    assert up.connections == 2 and b"Authorization: Bearer sk-raw\r\n" in up.requests[0][0]
    await up.stop()
