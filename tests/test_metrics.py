"""`GET /metrics` as Prometheus scrapes it: scrape, make one call of each kind through the
official SDKs, scrape again, and check the exact deltas against what the ledger recorded.
Label values stay bounded; the token protects it; `--workers 2` sums both workers."""
import asyncio
import os
import time
from collections import Counter
from pathlib import Path

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster import Cluster
from tests.conftest import DEMO_MODELS, UPSTREAM_PRICES
from tests.fakes import Reply
from tests.fakes.facilitator import FakeFacilitator
from tests.test_x402 import BODY as X402_BODY
from tests.test_x402 import capture_payment, chains
from tests.test_x402 import post as post_raw

HI = [{"role": "user", "content": "hi"}]
SECRET_MODEL = "user-typed/whatever-they-like"


async def scrape(url: str, token: str | None = None) -> dict[tuple, float]:
    """Every sample of a scrape: (name, sorted labels) -> value."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{url}/metrics", headers=headers) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
            text = await r.text()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def deltas(before: dict, after: dict, name: str) -> dict[tuple, float]:
    """What changed in metric `name`, by its labels."""
    out = {}
    for (sample, labels), value in after.items():
        if sample == name and value != before.get((sample, labels), 0):
            out[labels] = value - before.get((sample, labels), 0)
    return out


def labels(**kw) -> tuple:
    return tuple(sorted(kw.items()))


@pytest.fixture
async def metered(aiohttp_server, start_gateway, fake_openai):
    facilitator = FakeFacilitator()
    fac_server = await aiohttp_server(facilitator.app)
    gw = await start_gateway({
        "providers": {"up": {"type": "openai", "base_url": str(fake_openai.server.make_url("/v1")),
                             "api_key": "sk-test-upstream"}},
        "models": {"chat": DEMO_MODELS + [
            {"id": "up/gpt", "provider": "up", "upstream": "gpt-4o-mini", **UPSTREAM_PRICES},
            {"id": "up/free", "provider": "up", "upstream": "gpt-4o-mini", **UPSTREAM_PRICES}],
                   "image": [{"id": "demo/image", "provider": "demo", "upstream": "d", "list_usd_per_image": 0.01}]},
        "free": {"daily_allowance_usd": 0.001, "models": ["up/free"]},
        "moderation": {"rules": [{"category": "weapons", "patterns": ["(?i)\\bbuild a bomb\\b"]}]},
        "limits": {"per_key": {"tpm": 5000}},
        "payments": {"x402": {"facilitator": {"url": str(fac_server.make_url(""))}, "chains": chains("usdc")}}})
    return gw, fake_openai


async def test_each_kind_of_call_moves_exactly_its_metrics(metered):
    gw, upstream = metered
    key, account = await gw.key(10)
    client, claude = gw.openai(key), gw.anthropic(key)
    before = await scrape(gw.url)

    await client.chat.completions.create(model="up/gpt", max_tokens=50, messages=HI)
    upstream.enqueue(Reply(text="one two three four", chunk_delay=0.05, text_chunks=4))
    stream = await client.chat.completions.create(model="up/gpt", max_tokens=50, messages=HI, stream=True)
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            mid = await scrape(gw.url)                      # a hold is open while the answer streams
            assert deltas(before, mid, "gateway_holds_open") == {(): 1}
            break
    async for _ in stream:
        pass
    await claude.messages.create(model="up/gpt", max_tokens=50, messages=HI)
    upstream.enqueue(Reply(output_tokens=50))
    free = await client.chat.completions.create(model="up/free", max_tokens=100, messages=HI)
    await client.images.generate(model="demo/image", prompt="a red fox")
    with pytest.raises(openai.RateLimitError):
        await client.chat.completions.create(model="up/gpt", max_tokens=6000, messages=HI)
    with pytest.raises(openai.UnprocessableEntityError):
        await client.chat.completions.create(model="up/gpt", messages=[{"role": "user", "content": "build a bomb"}])
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model=SECRET_MODEL, messages=HI)
    upstream.enqueue(Reply(error_status=500))
    with pytest.raises(openai.APIStatusError) as failed:
        await client.chat.completions.create(model="up/gpt", max_tokens=50, messages=HI)
    assert failed.value.status_code == 502
    payment = await capture_payment(gw)                     # the x402 client: a 402 challenge, then paid
    status, _, _ = await post_raw(gw, "/api/v1/chat/completions", X402_BODY, payment)
    assert status == 402                                    # the same payment again: refused

    after = await scrape(gw.url)
    chat, ok = "chat.completions", "ok"
    assert deltas(before, after, "gateway_requests_total") == {
        labels(endpoint=chat, model="up/gpt", provider="up", status="200", outcome=ok): 3,    # JSON, stream, x402
        labels(endpoint="messages", model="up/gpt", provider="up", status="200", outcome=ok): 1,
        labels(endpoint=chat, model="up/free", provider="up", status="200", outcome=ok): 1,
        labels(endpoint="images.generations", model="demo/image", provider="demo", status="200", outcome=ok): 1,
        labels(endpoint=chat, model="up/gpt", provider="none", status="429", outcome="refused"): 1,
        labels(endpoint=chat, model="up/gpt", provider="none", status="422", outcome="refused"): 1,
        labels(endpoint=chat, model="other", provider="none", status="400", outcome="refused"): 1,
        labels(endpoint=chat, model="up/gpt", provider="up", status="502", outcome="failed"): 1,
        labels(endpoint=chat, model="up/gpt", provider="up", status="402", outcome="refused"): 2,   # challenge, replay
    }
    rows = await gw.store.fetchall("SELECT model, input_tokens, output_tokens, usd_micro, account_id FROM usage")
    tokens = Counter()
    for r in rows:
        tokens[labels(model=r["model"], direction="input")] += r["input_tokens"]
        tokens[labels(model=r["model"], direction="output")] += r["output_tokens"]
    assert deltas(before, after, "gateway_tokens_total") == {k: v for k, v in tokens.items() if v}
    keyed = sum(r["usd_micro"] for r in rows if r["account_id"] is not None)
    paid = sum(r["usd_micro"] for r in rows if r["account_id"] is None)
    free_use = round(free.model_extra["billing"]["usage_usd"] * 1_000_000)
    assert free.model_extra["billing"]["usd"] == 0 and free_use > 0
    assert keyed == 10_000_000 - await gw.balance(account) and paid > 0
    assert deltas(before, after, "gateway_charged_usd_micro_total") == {
        labels(payment="credits"): keyed, labels(payment="x402"): paid, labels(payment="allowance"): free_use}
    assert deltas(before, after, "gateway_x402_payments_total") == {
        labels(result="verified"): 1, labels(result="settled"): 1, labels(result="refused"): 1}
    assert deltas(before, after, "gateway_rate_limited_total") == {labels(limit="tokens"): 1}
    assert deltas(before, after, "gateway_moderation_refusals_total") == {labels(by="rules"): 1}
    assert deltas(before, after, "gateway_upstream_errors_total") == {labels(provider="up", kind="upstream_error"): 1}
    assert deltas(before, after, "gateway_holds_open") == {}
    assert deltas(before, after, "gateway_request_duration_seconds_count") == {
        labels(endpoint=chat): 10, labels(endpoint="messages"): 1, labels(endpoint="images.generations"): 1}
    assert deltas(before, after, "gateway_upstream_duration_seconds_count") == {
        labels(provider="up"): 6, labels(provider="demo"): 1}
    assert deltas(before, after, "gateway_time_to_first_token_seconds_count") == {labels(provider="up"): 1}
    assert not any(SECRET_MODEL in str(labels) for _, labels in after)       # user input is never a label


async def test_the_metrics_token(start_gateway, monkeypatch):
    monkeypatch.setenv("METRICS_TOKEN", "s3cret-scrape")
    gw = await start_gateway({"metrics": {"token": "${METRICS_TOKEN:-}"}})
    async with aiohttp.ClientSession() as s:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer s3cret-scrape-"}):
            async with s.get(f"{gw.url}/metrics", headers=headers) as r:
                assert r.status == 401 and (await r.json())["error"]["code"] == "invalid_metrics_token"
                assert r.headers["WWW-Authenticate"] == "Bearer"
    assert await scrape(gw.url, token="s3cret-scrape")


def test_counts_kept_until_a_scrape_read_as_if_counted_at_once():
    """One process keeps a call's counts beside each child until a scrape: once flushed,
    the samples (every histogram bucket, sums, counters, a gauge) are what prometheus-client
    shows for the same counts made directly; before the flush, the child has none of them."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    from plugins.metrics.instruments import LATENCY_BUCKETS, Pending, PendingHistogram

    def family(prefix: str, registry):
        return (Counter(f"{prefix}_c", "c", ["a"], registry=registry).labels("x"),
                Histogram(f"{prefix}_h", "h", ["a"], buckets=LATENCY_BUCKETS, registry=registry).labels("x"),
                Gauge(f"{prefix}_g", "g", registry=registry))

    direct, kept = CollectorRegistry(), CollectorRegistry()
    counter, histogram, gauge = family("m", direct)
    children = family("m", kept)
    pending = (Pending(children[0]), PendingHistogram(children[1]), Pending(children[2]))
    # Binary fractions: the sum is exact in any order. 0.005 and 300.0 sit on bounds, 1000 past them all.
    for value in (0.0, 0.005, 0.0078125, 0.25, 0.25, 3.0, 300.0, 1000.0):
        for sink in (histogram, pending[1]):
            sink.observe(value)
    for amount in (1, 40, 7):
        for sink in (counter, pending[0]):
            sink.inc(amount)
    for sink in (gauge, pending[2]):
        sink.inc()
        sink.inc()
        sink.dec()

    def samples(registry) -> list[str]:
        return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]

    assert samples(kept) != samples(direct)          # nothing handed over yet
    for each in pending:
        each.flush()
    assert samples(kept) == samples(direct)
    for each in pending:
        each.flush()                                 # a second scrape adds nothing
    assert samples(kept) == samples(direct)


async def test_workers_add_up(tmp_path):
    """20 calls over 20 connections, spread by the kernel over two workers: any worker's
    scrape counts all 20. The shared folder is the supervisor's and goes with it."""
    c = await Cluster(tmp_path, redis_url=None, mode="workers", count=2).start()
    try:
        folders = {Path(f"/proc/{pid}/environ").read_bytes().split(b"PROMETHEUS_MULTIPROC_DIR=")[1].split(b"\0")[0]
                   for pid in c.serving_pids()}
        assert len(folders) == 1
        folder = folders.pop().decode()
        key, account = await c.key(1_000_000)
        ok = labels(endpoint="chat.completions", model="demo/echo", provider="demo", status="200", outcome="ok")
        before = await scrape(c.urls[0])
        for client in c.clients(key, count=20):
            await client.chat.completions.create(model="demo/echo", max_tokens=5, messages=HI)
        assert await c.scalar("SELECT COUNT(DISTINCT substr(call_id, 1, 12)) FROM usage WHERE account_id = ?",
                              (account,)) == 2
        for _ in range(4):                       # new connections: each may land on either worker
            after = await scrape(c.urls[0])
            assert deltas(before, after, "gateway_requests_total") == {ok: 20}
            assert after[("gateway_holds_open", ())] == 0
        assert os.path.isdir(folder)
    finally:
        await c.stop()
    assert not os.path.exists(folder)


async def test_a_dead_workers_holds_leave_the_gauge(tmp_path):
    """kill -9 the worker that holds a streaming call's credits: once the supervisor has
    replaced it, the holds gauge no longer counts that worker's hold."""
    c = await Cluster(tmp_path, redis_url=None, mode="workers", count=2).start()
    try:
        key, _ = await c.key(1_000_000)
        client = c.clients(key, count=1)[0]
        stream = await client.chat.completions.create(model="demo/echo", stream=True,
                                                      messages=[{"role": "user", "content": "a long answer please"}])
        async for _ in stream:
            break
        assert (await scrape(c.urls[0]))[("gateway_holds_open", ())] == 1
        (pid,) = await c.open_holds_by_pid()
        c.kill9(pid)
        with pytest.raises(openai.APIConnectionError):
            async for _ in stream:
                pass
        deadline = time.monotonic() + 15
        while not (len(now := c.serving_pids()) == 2 and pid not in now):      # replaced by the supervisor
            assert time.monotonic() < deadline, c.logs()
            await asyncio.sleep(0.1)
        assert (await scrape(c.urls[0]))[("gateway_holds_open", ())] == 0
    finally:
        await c.stop()
