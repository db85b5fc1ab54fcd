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
