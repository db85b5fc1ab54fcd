"""Upstreams that stall, drip, flood or talk nonsense: every call ends in time with a 502,
the hold is released, nothing is charged, and the upstream connection is closed."""
import asyncio
import time

import openai
import orjson
import pytest
from aiohttp import web

from tests.conftest import DEMO_MODELS, MICRO, UPSTREAM_PRICES, openai_upstream
from tests.fakes.script import Reply
from tests.gateway_process import GatewayProcess

OK_BODY = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",
           "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
           "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
CHUNK = b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,' \
        b'"delta":{"role":"assistant","content":"hel"},"finish_reason":null}]}\n\n'


class Hostile:
    """One upstream that misbehaves the way a test says, and notes when its client left."""

    def __init__(self, behaviour):
        self.behaviour = behaviour
        self.closed_at: float | None = None
        self.app = web.Application()
        self.app.router.add_route("*", "/{tail:.*}", self.handle)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        try:
            return await self.behaviour(request)
        except BaseException:           # the gateway hung up (reset, or our handler cancelled)
            self.closed_at = time.monotonic()
            raise


async def drip_json(request):
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    await resp.prepare(request)
    for _ in range(400):                # one byte every 50 ms: never silent, never done
        await resp.write(b" ")
        await asyncio.sleep(0.05)
    return resp


async def silent_stream(request):
    await asyncio.sleep(20)
    return web.Response()


async def stalled_stream(request):
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(CHUNK)
    await asyncio.sleep(20)
    return resp


def flood(total_mb: int, sse: bool = False):
    async def handler(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream" if sse else "application/json"})
        await resp.prepare(request)
        await resp.write(b'data: {"x":"' if sse else b'{"x":"')
        block = b"a" * 1_000_000
        for _ in range(total_mb):
            await resp.write(block)
        await resp.write(b'"}\n\n' if sse else b'"}')
        return resp
    return handler


@pytest.fixture
def hostile_gw(aiohttp_server, start_gateway):
    async def start(behaviour, **settings):
        up = Hostile(behaviour)
        server = await aiohttp_server(up.app)
        gw = await start_gateway({
            "providers": {"bad": {"type": "openai", "base_url": str(server.make_url("/v1")), "api_key": "sk-bad-1",
                                  **settings}},
            "models": {"chat": DEMO_MODELS + [{"id": "bad/gpt", "provider": "bad", "upstream": "gpt-4o-mini",
                                               **UPSTREAM_PRICES}]}})
        key, account = await gw.key(1)
        return gw, up, key, account
    return start


async def assert_uncharged(gw, account):
    assert await gw.balance(account) == MICRO == await gw.ledger_sum(account)
    assert tuple(await gw.store.fetchone("SELECT COUNT(*) FROM holds WHERE status = 'open'")) == (0,)


async def refused_in_time(gw, key, account, seconds: float, stream: bool = False) -> openai.APIStatusError:
    """A call the upstream fails to answer in time: a 502 within `seconds`, nothing charged."""
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as err:
        await gw.openai(key, timeout=15).chat.completions.create(
            model="bad/gpt", messages=[{"role": "user", "content": "hi"}], stream=stream)
    assert err.value.status_code == 502 and time.monotonic() - started < seconds
    await assert_uncharged(gw, account)
    return err.value


async def test_a_dripping_upstream_meets_the_total_deadline(hostile_gw):
    gw, up, key, account = await hostile_gw(drip_json, total_timeout_seconds=1)
    started = time.monotonic()
    await refused_in_time(gw, key, account, 4)
    await asyncio.sleep(0.3)
    assert up.closed_at is not None and up.closed_at - started < 4          # the upstream was hung up on


async def test_a_silent_stream_meets_the_first_byte_deadline(hostile_gw):
    gw, up, key, account = await hostile_gw(silent_stream, first_byte_timeout_seconds=0.5)
    assert "in time" in (await refused_in_time(gw, key, account, 3, stream=True)).message


async def test_a_stalled_stream_meets_the_idle_deadline(hostile_gw):
    gw, up, key, account = await hostile_gw(stalled_stream, idle_timeout_seconds=0.5)
    started = time.monotonic()
    stream = await gw.openai(key, timeout=15).chat.completions.create(
        model="bad/gpt", messages=[{"role": "user", "content": "hi"}], stream=True)
    with pytest.raises(openai.APIError, match="stopped sending"):
        async for _ in stream:
            pass
    assert time.monotonic() - started < 3
    await asyncio.sleep(0.3)
    assert up.closed_at is not None
    await assert_uncharged(gw, account)


async def test_what_came_before_a_stall_reaches_the_client_at_once(hostile_gw):
    """The answer's headers and the chunk that came before a stall leave when it arrives,
    not with a later read (nor at the idle deadline)."""
    gw, up, key, account = await hostile_gw(stalled_stream, idle_timeout_seconds=4)
    started = time.monotonic()
    stream = await gw.openai(key, timeout=15).chat.completions.create(
        model="bad/gpt", messages=[{"role": "user", "content": "hi"}], stream=True)
    text = ""
    async for chunk in stream:
        text += chunk.choices[0].delta.content or ""
        if text:
            break
    assert text == "hel" and time.monotonic() - started < 2
    await stream.close()


async def drip_stream(request):
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for _ in range(200):                # a chunk every 100 ms: never idle, never done
        await resp.write(CHUNK)
        await asyncio.sleep(0.1)
    return resp


async def drip_error(request):
    resp = web.StreamResponse(status=500, headers={"Content-Type": "application/json"})
    await resp.prepare(request)
    for _ in range(400):                # an error body one byte every 50 ms
        await resp.write(b" ")
        await asyncio.sleep(0.05)
    return resp


async def test_a_dripping_stream_meets_the_total_deadline(hostile_gw):
    gw, up, key, account = await hostile_gw(drip_stream, total_timeout_seconds=1)
    started = time.monotonic()
    stream = await gw.openai(key, timeout=15).chat.completions.create(
        model="bad/gpt", messages=[{"role": "user", "content": "hi"}], stream=True)
    chunks = 0
    with pytest.raises(openai.APIError, match="stopped answering mid-response"):
        async for _ in stream:
            chunks += 1
    assert chunks >= 3 and time.monotonic() - started < 4        # it relayed until the deadline, then stopped
    await asyncio.sleep(0.3)
    assert up.closed_at is not None and up.closed_at - started < 4
    await assert_uncharged(gw, account)


async def test_a_stream_silent_past_the_total_deadline_is_a_502(hostile_gw):
    gw, up, key, account = await hostile_gw(silent_stream, total_timeout_seconds=0.5)    # first byte: 120 s
    assert "in time" in (await refused_in_time(gw, key, account, 3, stream=True)).message


async def test_a_stream_refused_with_a_dripping_error_body_meets_the_total_deadline(hostile_gw):
    gw, up, key, account = await hostile_gw(drip_error, total_timeout_seconds=1)
    assert "mid-response" in (await refused_in_time(gw, key, account, 4, stream=True)).message


@pytest.mark.parametrize("sse", [False, True], ids=["json", "sse-event"])
async def test_an_oversized_answer_is_dropped_with_a_502(hostile_gw, sse):
    gw, up, key, account = await hostile_gw(flood(6, sse), max_response_mb=2, max_event_mb=2)
    with pytest.raises(openai.APIStatusError) as err:
        await gw.openai(key, timeout=15).chat.completions.create(
            model="bad/gpt", messages=[{"role": "user", "content": "hi"}], stream=sse)
    assert err.value.status_code == 502
    assert "larger than 2 MB" in err.value.message or "more than 2 MB" in err.value.message
    await assert_uncharged(gw, account)


ECHOING = "bad request; you sent Authorization: Bearer sk-test-upstream and X-Other: Bearer abcdefgh12345678"


async def test_an_upstream_echoing_the_key_never_leaks_it(fake_openai, start_gateway):
    fake_openai.enqueue(Reply(error_status=400, error_message=ECHOING))
    gw = await start_gateway(openai_upstream(fake_openai))
    key, account = await gw.key(1)
    with pytest.raises(openai.BadRequestError) as err:
        await gw.openai(key).chat.completions.create(model="up/gpt", messages=[{"role": "user", "content": "hi"}])
    text = orjson.dumps(err.value.body).decode()
    assert "sk-test-upstream" not in text and "abcdefgh12345678" not in text
    assert "bad request; you sent Authorization: Bearer [redacted]" in text        # the rest is kept
    await assert_uncharged(gw, account)


async def test_the_operator_log_keeps_the_upstream_error_text_but_not_the_key(fake_openai, tmp_path):
    fake_openai.enqueue(Reply(error_status=400, error_message=ECHOING))
    config = openai_upstream(fake_openai)
    config["providers"]["demo"] = {"type": "demo"}
    gw = GatewayProcess(tmp_path, {"storage": f"sqlite:///{tmp_path / 'gw.db'}", **config})
    key = gw.cli("keys", "create", "--credits", "1").split()[-1]
    await gw.start()
    try:
        client = openai.AsyncOpenAI(base_url=f"{gw.url}/api/v1", api_key=key, max_retries=0)
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model="up/gpt", messages=[{"role": "user", "content": "hi"}])
    finally:
        gw.stop()
    log = gw.log.read_text()
    (line,) = [line for line in log.splitlines() if "upstream_error_text" in line]
    assert "X-Other: Bearer abcdefgh12345678" in line and '"status":400' in line     # the full text, to debug with
    assert "sk-test-upstream" not in log                                            # never the provider's key


async def test_a_deadline_is_asyncio_timeout_at_with_one_timer():
    """The first-byte wait's Deadline ends as `asyncio.timeout_at` would: TimeoutError when it
    passes, nothing when the work is done in time, and a cancellation from outside stays one;
    the task is never left cancelling."""
    from providers.base import Deadline
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        with Deadline(loop, loop.time() + 0.05):
            await asyncio.sleep(5)
    assert asyncio.current_task().cancelling() == 0
    with Deadline(loop, loop.time() + 5):
        await asyncio.sleep(0.01)
    assert asyncio.current_task().cancelling() == 0

    async def waits():
        with Deadline(loop, loop.time() + 5):
            await asyncio.sleep(5)
    task = asyncio.create_task(waits())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
