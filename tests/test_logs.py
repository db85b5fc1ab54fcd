"""The logs of a real `gateway run` process, as an operator reads them: start-up says which
providers have keys (names only), which database (no password) and Redis, and where it
listens; each call is one line whose request_id is the X-Request-Id the client saw and
the usage row's id (account and admin APIs); shutdown says so. No key is ever logged."""
import json

import aiohttp
import openai
import pytest

from tests.conftest import UPSTREAM_PRICES
from tests.fakes import Reply
from tests.gateway_process import GatewayProcess

ADMIN_KEY = "adm_logs-test-admin-key"
PASSWORD = "hunter2-not-for-logs"
HI = [{"role": "user", "content": "hi"}]


async def get(url, key):
    async with aiohttp.ClientSession() as s:
        async with s.get(url, headers={"Authorization": f"Bearer {key}"}) as r:
            assert r.status == 200, await r.text()
            return await r.json()


@pytest.fixture
async def logged(tmp_path, postgres_server, redis_url, fake_openai):
    database = (await postgres_server.fresh_url()).replace("postgres@", f"postgres:{PASSWORD}@")  # trust: any password
    config = {"storage": database, "redis": redis_url,
              "providers": {"demo": {"type": "demo"},
                            "up": {"type": "openai", "base_url": str(fake_openai.server.make_url("/v1")),
                                   "api_key": "sk-test-upstream"},
                            "spare": {"type": "anthropic", "api_key": "${SPARE_KEY_UNSET_IN_TEST:-}"}},
              "models": {"chat": [{"id": "up/gpt", "provider": "up", "upstream": "gpt-4o-mini", **UPSTREAM_PRICES}]}}
    gp = GatewayProcess(tmp_path, config, env={"GATEWAY_ADMIN_KEY": ADMIN_KEY})
    await gp.start()
    try:
        yield gp, fake_openai, database, redis_url
    finally:
        gp.stop()


async def test_start_calls_and_stop_are_logged_with_one_id_per_call(logged):
    gp, upstream, database, redis = logged
    key = gp.cli("keys", "create", "--credits", "5").strip().splitlines()[-1]
    client = openai.AsyncOpenAI(base_url=f"{gp.url}/api/v1", api_key=key, max_retries=0)
    plain = await client.chat.completions.with_raw_response.create(
        model="up/gpt", max_tokens=30, messages=HI, extra_headers={"X-Client-Request-Id": "client-abc"})
    upstream.enqueue(Reply(text="streamed words here", chunk_delay=0.02))
    stream = await client.chat.completions.create(model="up/gpt", max_tokens=30, messages=HI, stream=True)
    async for _ in stream:
        pass
    ids = [plain.headers["X-Request-Id"], stream.response.headers["X-Request-Id"]]
    own = (await get(f"{gp.url}/api/v1/account/usage", key))["data"]
    admin = (await get(f"{gp.url}/api/v1/admin/usage", ADMIN_KEY))["data"]
    gp.stop()
    assert gp.proc.returncode == 0

    text = gp.log.read_text()
    assert key not in text and key[12:] not in text and PASSWORD not in text and "sk-test-upstream" not in text
    assert "\n\n" not in text                               # one JSON object a line, no blank lines between
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    events = {}
    for line in lines:
        events.setdefault(line["event"], []).append(line)
    starting = events["starting"][0]
    assert starting["database"] == database.replace(PASSWORD, "***")
    assert starting["redis"] == redis
    assert starting["providers"]["up"] == {"type": "openai", "base_url": str(upstream.server.make_url("/v1")),
                                           "api_key": "***"}
    assert events["providers"][0]["ready"] == ["demo", "up"]
    assert events["providers_without_keys"][0]["set"] == {"spare": "SPARE_KEY_UNSET_IN_TEST"}
    assert (events["serving"][0]["host"], events["serving"][0]["port"]) == ("127.0.0.1", gp.port)
    assert [line["event"] for line in lines][-2:] == ["stopping", "stopped"]

    calls = events["call"]
    assert [c["request_id"] for c in calls] == ids
    assert sorted(u["call_id"] for u in own) == sorted(ids) == sorted(u["call_id"] for u in admin)
    usage = {u["call_id"]: u for u in own}
    for line, streamed in zip(calls, (False, True)):
        row = usage[line["request_id"]]
        assert line["account_id"] == admin[0]["account_id"] and line["key_prefix"] == key[:12]
        assert (line["requested_model"], line["model"], line["provider"]) == ("up/gpt", "up/gpt", "up")
        assert (line["input_tokens"], line["output_tokens"]) == (row["input_tokens_billed"],
                                                                 row["output_tokens_billed"])
        assert line["usd_micro"] == round(row["usd"] * 1_000_000) > 0
        assert line["payment"] == "credits" and line["outcome"] == "ok" and line["status"] == 200
        assert 0 < line["upstream_ms"] <= line["ms"]
        assert (line["first_token_ms"] is not None) == streamed
    assert calls[0]["client_request_id"] == "client-abc" and "client_request_id" not in calls[1]


# ---- the per-call line as written: its fields, its order, its flushes --------------------

CALL_FIELDS = ["endpoint", "account_id", "key_prefix", "requested_model", "model", "provider", "outcome", "status",
               "payment", "input_tokens", "output_tokens", "usd_micro", "free_usd_micro", "upstream_ms",
               "first_token_ms", "ms", "error", "event", "request_id", "path"]


def sqlite_gateway(tmp_path, fake_openai, **kw) -> GatewayProcess:
    config = {"storage": f"sqlite:///{tmp_path / 'gw.db'}",
              "providers": {"up": {"type": "openai", "base_url": str(fake_openai.server.make_url("/v1")),
                                   "api_key": "sk-test-upstream"}},
              "models": {"chat": [{"id": "up/gpt", "provider": "up", "upstream": "gpt-4o-mini", **UPSTREAM_PRICES}]}}
    return GatewayProcess(tmp_path, config, **kw)


def json_lines(text: str) -> list[dict]:
    assert text.endswith("\n") and "\n\n" not in text
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


async def post_chat(session, url, key, **headers):
    body = {"model": "up/gpt", "max_tokens": 30, "messages": HI}
    async with session.post(f"{url}/api/v1/chat/completions", json=body,
                            headers={"Authorization": f"Bearer {key}", **headers}) as r:
        await r.read()
        return r.status, r.headers["X-Request-Id"]


async def test_call_lines_carry_every_field_in_the_order_the_calls_ended(tmp_path, fake_openai):
    """Through HTTP: each call's line has every documented field (and the request's own),
    lines come in the order they were logged, and a warning goes out at once behind the
    lines that waited; a quiet gateway has written its lines within a moment, not at exit."""
    import asyncio
    import time

    gp = await sqlite_gateway(tmp_path, fake_openai).start()
    try:
        key = gp.cli("keys", "create", "--credits", "5").strip().splitlines()[-1]
        async with aiohttp.ClientSession() as s:
            first = await post_chat(s, gp.url, key, **{"X-Client-Request-Id": "client-abc"})
            fake_openai.enqueue(Reply(error_status=500))
            failed = await post_chat(s, gp.url, key)
            refused = await post_chat(s, gp.url, "sk-not-a-key")
            last = await post_chat(s, gp.url, key)
        assert [first[0], refused[0], last[0]] == [200, 401, 200] and failed[0] >= 500
        deadline = time.monotonic() + 5
        while last[1] not in gp.log.read_text():          # written soon after, while still running
            assert time.monotonic() < deadline, gp.log.read_text()
            await asyncio.sleep(0.05)
    finally:
        gp.stop()
    assert gp.proc.returncode == 0
    lines = json_lines(gp.log.read_text())
    served = [line for line in lines if line["event"] in ("call", "call_refused", "upstream_error_text")]
    assert [(line["event"], line.get("request_id")) for line in served] == [
        ("call", first[1]), ("upstream_error_text", failed[1]), ("call", failed[1]), ("call_refused", refused[1]),
        ("call", last[1])]
    ok, bad = served[0], served[2]
    assert list(ok) == [*CALL_FIELDS, "client_request_id", "level", "timestamp"]
    assert list(bad) == list(served[4]) == [*CALL_FIELDS, "level", "timestamp"]
    assert (ok["endpoint"], ok["requested_model"], ok["model"], ok["provider"], ok["payment"]) == (
        "chat.completions", "up/gpt", "up/gpt", "up", "credits")
    assert (ok["outcome"], ok["status"], ok["error"], ok["first_token_ms"]) == ("ok", 200, None, None)
    assert ok["key_prefix"] == key[:12] and isinstance(ok["account_id"], int)
    assert ok["input_tokens"] > 0 and ok["output_tokens"] == 7 and ok["usd_micro"] > 0 and ok["free_usd_micro"] == 0
    assert 0 < ok["upstream_ms"] <= ok["ms"] and isinstance(ok["ms"], float)
    assert (ok["path"], ok["client_request_id"], ok["level"]) == ("/api/v1/chat/completions", "client-abc", "info")
    assert abs(ok["timestamp"] - time.time()) < 120 and isinstance(ok["timestamp"], float)
    assert bad["outcome"] != "ok" and bad["status"] == failed[0] and bad["error"] and bad["usd_micro"] == 0
    assert served[1]["level"] == "warning" and served[3]["status"] == 401
    assert [line["event"] for line in lines][-2:] == ["stopping", "stopped"]


async def test_the_lines_of_the_last_calls_are_written_at_shutdown(tmp_path, fake_openai):
    """SIGTERM right after a burst of calls: every call's line is there, before `stopping`."""
    import asyncio

    gp = await sqlite_gateway(tmp_path, fake_openai).start()
    try:
        key = gp.cli("keys", "create", "--credits", "5").strip().splitlines()[-1]
        async with aiohttp.ClientSession() as s:
            ids = [rid for _, rid in await asyncio.gather(*(post_chat(s, gp.url, key) for _ in range(40)))]
        gp.proc.terminate()
        assert gp.proc.wait(timeout=30) == 0
    finally:
        gp.stop()
    events = [(line["event"], line.get("request_id")) for line in json_lines(gp.log.read_text())]
    calls = [rid for event, rid in events if event == "call"]
    assert sorted(calls) == sorted(ids)
    assert [event for event, _ in events][-len(ids) - 2:] == ["call"] * len(ids) + ["stopping", "stopped"]


async def test_two_workers_never_split_or_mix_their_lines(tmp_path, fake_openai):
    """`--workers 2` writing to one pipe: every line arrives whole, one JSON object a line,
    and every call has its line."""
    import asyncio
    import signal
    import subprocess
    import threading

    from tests.gateway_process import GATEWAY

    gp = sqlite_gateway(tmp_path, fake_openai)
    key = gp.cli("keys", "create", "--credits", "5").strip().splitlines()[-1]
    proc = subprocess.Popen([*GATEWAY, "run", "--config", str(gp.config_path), "--port", str(gp.port),
                             "--workers", "2"], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    out = bytearray()
    reader = threading.Thread(target=lambda: [out.extend(part) for part in iter(lambda: proc.stderr.read1(65536), b"")])
    reader.start()
    try:
        deadline = asyncio.get_running_loop().time() + 30
        while b'"serving"' not in out or out.count(b'"serving"') < 2:
            assert asyncio.get_running_loop().time() < deadline and proc.poll() is None, bytes(out[-3000:])
            await asyncio.sleep(0.05)
        long_id = "x" * 128                                  # long lines: a few to a write

        async def calls(n):
            async with aiohttp.ClientSession() as s:       # one connection each: both workers serve
                return [(await post_chat(s, gp.url, key, **{"X-Client-Request-Id": long_id}))[1] for _ in range(n)]

        ids = [rid for batch in await asyncio.gather(*(calls(10) for _ in range(16))) for rid in batch]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        reader.join(timeout=10)
    assert code == 0
    text = out.decode()
    lines = json_lines(text)                                # each line whole JSON, or this fails
    assert len(lines) == text.count("\n")
    calls = [line["request_id"] for line in lines if line["event"] == "call"]
    assert sorted(calls) == sorted(ids)
    assert len({rid[:12] for rid in calls}) == 2              # both workers served (a per-process id prefix)


# ---- the JSON writer itself -------------------------------------------------------------

def recording_writer(monkeypatch, tmp_path):
    """A LineWriter on a file, and the list of what each system call wrote."""
    import os

    from plugins import logs

    from types import SimpleNamespace

    writes = []
    recorded = SimpleNamespace(write=lambda fd, data: writes.append(bytes(data)) or os.write(fd, data))
    monkeypatch.setattr(logs, "os", recorded)                # only the writer's own calls
    fd = os.open(tmp_path / "out.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    return logs.LineWriter(fd), writes


async def test_lines_wait_for_one_write_of_whole_lines_and_a_warning_takes_them_along(monkeypatch, tmp_path):
    import asyncio

    from plugins import logs

    writer, writes = recording_writer(monkeypatch, tmp_path)
    lines = [b'{"n":%d,"pad":"%s"}\n' % (i, b"p" * (i * 7 % 300)) for i in range(40)]
    for line in lines[:3]:
        writer.write(line)
    assert writes == []                                   # waiting, in a running loop
    writer.write_now(lines[3])                            # a warning: at once, with what waited before it
    assert writes == [b"".join(lines[:4])]
    for line in lines[4:]:
        writer.write(line)
    await asyncio.sleep(logs.FLUSH_SECONDS * 2)            # the scheduled flush wrote the rest
    assert b"".join(writes) == b"".join(lines) == (tmp_path / "out.log").read_bytes()
    assert all(len(w) <= logs.PIPE_BUF and w.endswith(b"\n") for w in writes) and len(writes) < 10
    big = b'{"big":"%s"}\n' % (b"b" * logs.PIPE_BUF)
    writer.write(lines[0])
    writer.write(big)                                     # longer than one atomic write: it goes alone
    writer.flush()
    assert writes[-2:] == [lines[0], big]


def test_without_a_running_loop_a_line_is_written_at_once(monkeypatch, tmp_path):
    writer, writes = recording_writer(monkeypatch, tmp_path)
    writer.write(b'{"a":1}\n')
    writer.write(b'{"b":2}\n')
    assert writes == [b'{"a":1}\n', b'{"b":2}\n']


def test_lines_still_waiting_when_the_loop_ends_are_written_at_exit():
    """A program that logs in a loop and ends before the scheduled flush loses nothing."""
    import subprocess
    import sys

    from tests.gateway_process import ROOT

    program = ("import asyncio, structlog\n"
               "from plugins import logs\n"
               "logs.configure('info', json_logs=True)\n"
               "log = structlog.get_logger('t')\n"
               "async def main():\n"
               "    for i in range(200):\n"
               "        logs.info_line(log, 'n', {'i': i})\n"
               "    logs.REQUEST_FIELDS.set({'request_id': 'r1', 'path': '/p', 'client_request_id': 'c'})\n"
               "    fields = {'a': 1, 'b': None, 'c': 2.5, 'path': 'own', 'when': object}\n"
               "    log.info('same', **fields)\n"
               "    logs.info_line(log, 'same', dict(fields))\n"
               "    log.info('last')\n"
               "asyncio.run(main())\n")
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = json_lines(done.stderr.decode())
    assert [line.get("i") for line in lines] == [*range(200), None, None, None] and lines[-1]["event"] == "last"
    by_structlog, direct = lines[-3], lines[-2]              # the hot path renders what structlog would
    assert 0 <= direct.pop("timestamp") - by_structlog.pop("timestamp") < 5 and list(direct) == list(by_structlog)
    assert direct == by_structlog == {"a": 1, "b": None, "c": 2.5, "path": "own", "when": str(object),
                                      "event": "same", "request_id": "r1", "client_request_id": "c", "level": "info"}
    assert list(lines[0]) == ["i", "event", "level", "timestamp"] and lines[0]["level"] == "info"
