"""Slow and idle clients against a real gateway process: they are cut off in time, the
connection cap refuses clearly, and calls keep succeeding while thousands wait."""
import asyncio
import resource
import time

import openai
import pytest

from tests.gateway_process import GatewayProcess

DEMO = {"providers": {"demo": {"type": "demo"}},
        "models": {"chat": [{"id": "demo/echo", "provider": "demo", "list_input_usd_per_mtok": 1,
                             "list_output_usd_per_mtok": 2}]}}
BODY_HEAD = (b"POST /api/v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer chk_x\r\n"
             b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n")


@pytest.fixture
async def gateway(tmp_path):
    started = []

    async def start(server: dict | None = None, **kw) -> GatewayProcess:
        config = {**DEMO, "storage": f"sqlite:///{tmp_path / 'gw.db'}", "server": server or {}}
        gw = GatewayProcess(tmp_path, config, **kw)
        started.append(gw)
        return await gw.start()
    yield start
    for gw in started:
        gw.stop()


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """Everything the server sent until it closed the connection (fails if it did not)."""
    return await asyncio.wait_for(reader.read(), seconds)


async def drip(writer: asyncio.StreamWriter, data: bytes, every: float) -> None:
    try:
        for i in range(len(data)):
            writer.write(data[i:i + 1])
            await writer.drain()
            await asyncio.sleep(every)
    except (ConnectionError, OSError):
        pass


def open_file_limit(pid: int) -> tuple[int, int]:
    for line in open(f"/proc/{pid}/limits"):
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open-file limit")


async def test_the_process_raises_its_open_file_limit(gateway):
    gw = await gateway(open_files=256)
    soft, hard = open_file_limit(gw.proc.pid)
    assert soft == hard > 256


async def test_idle_connections_and_dripped_headers_are_closed(gateway):
    gw = await gateway({"keepalive_seconds": 1})
    started = time.monotonic()
    idle_reader, _ = await asyncio.open_connection("127.0.0.1", gw.port)
    slow_reader, slow_writer = await asyncio.open_connection("127.0.0.1", gw.port)
    dripping = asyncio.create_task(drip(slow_writer, BODY_HEAD, 0.1))
    assert await closed_within(idle_reader, 5) == b""
    assert await closed_within(slow_reader, 5) == b""
    assert time.monotonic() - started < 4
    dripping.cancel()


async def test_a_dripped_body_gets_a_408(gateway):
    gw = await gateway({"request_timeout_seconds": 1})
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(BODY_HEAD)
    dripping = asyncio.create_task(drip(writer, b"x" * 1000, 0.1))      # 10 bytes a second
    started = time.monotonic()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 408") and time.monotonic() - started < 4
    dripping.cancel()


async def test_past_the_connection_cap_a_clear_503(gateway):
    gw = await gateway({"max_connections": 20})
    held = [await asyncio.open_connection("127.0.0.1", gw.port) for _ in range(20)]
    await asyncio.sleep(0.2)
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    answer = await closed_within(reader, 5)
    assert answer.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in answer
    assert b"maximum of 20 connections" in answer and b"too_many_connections" in answer
    for _, w in held:
        w.close()


async def test_calls_succeed_among_2000_idle_and_200_slow_connections(gateway):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 4096:
        pytest.skip(f"needs an open-file hard limit of 4096 or more (is {hard}); raise it with ulimit -Hn")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))       # this test's own 2,200 sockets
    gw = await gateway({"request_timeout_seconds": 5, "keepalive_seconds": 30}, open_files=1024)
    key = gw.cli("keys", "create", "--credits", "5").split()[-1]
    idle = [await asyncio.open_connection("127.0.0.1", gw.port) for _ in range(2000)]
    slow = []
    for _ in range(200):
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(BODY_HEAD)
        slow.append((reader, asyncio.create_task(drip(writer, b"x" * 1000, 0.5))))
    client = openai.AsyncOpenAI(base_url=f"{gw.url}/api/v1", api_key=key, max_retries=0, timeout=10)
    started = time.monotonic()
    answers = await asyncio.gather(*[client.chat.completions.create(
        model="demo/echo", messages=[{"role": "user", "content": f"call {i}"}]) for i in range(50)])
    took = time.monotonic() - started
    assert all(a.choices[0].message.content for a in answers) and took < 10
    # The slow bodies are cut off at the request deadline: all 200 get their 408.
    heads = await asyncio.gather(*[asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 15) for r, _ in slow])
    assert all(h.startswith(b"HTTP/1.1 408") for h in heads)
    for _, task in slow:
        task.cancel()
    for _, w in idle:
        w.close()
    await client.close()
