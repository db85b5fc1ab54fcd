"""Hostile client input: deep JSON, absurd amounts, and URLs aimed at the operator's own
network. Each is a 400 naming what is wrong, before any upstream sees it."""
import aiohttp
import anthropic
import openai
import pytest

from tests.conftest import MICRO
from tests.fakes import FakeFal


def nested(depth: int):
    node: dict = {"type": "string"}
    for _ in range(depth):
        node = {"type": "object", "properties": {"x": node}}
    return node


async def post(gw, path, body, key):
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{gw.url}{path}", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
            return r.status, await r.json()


@pytest.mark.parametrize("where", ["tools", "passthrough"])
async def test_json_nested_too_deep_is_a_400_in_every_format(gw, where):
    key, account = await gw.key(1)
    deep = nested(200)
    extra = {"tools": [{"type": "function", "function": {"name": "f", "parameters": deep}}]} \
        if where == "tools" else {"metadata": {"x": deep}}
    with pytest.raises(openai.BadRequestError, match="nested more than 64 levels"):
        await gw.openai(key).chat.completions.create(model="demo/echo", messages=[{"role": "user", "content": "hi"}],
                                                     extra_body=extra)
    with pytest.raises(anthropic.BadRequestError, match="nested more than 64 levels"):
        await gw.anthropic(key).messages.create(
            model="demo/echo", max_tokens=10, messages=[{"role": "user", "content": [
                {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral", "x": deep}}]}])
    with pytest.raises(openai.BadRequestError, match="nested more than 64 levels"):
        await gw.openai(key).responses.create(model="demo/echo", input="hi", extra_body=extra)
    status, body = await post(gw, "/api/v1/chat/completions", {"model": "demo/echo", "messages": [
        {"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {
            "name": "f", "parameters": nested(25)}}]}, key)
    assert status == 200, body                                  # deep-ish real schemas still pass
    assert await gw.ledger_sum(account) == await gw.balance(account)


@pytest.mark.parametrize("amount", ["Infinity", "-Infinity", "NaN", "1e999999", 1e308, "1e13"])
async def test_credit_purchase_amounts_that_are_not_finite_are_a_400(gw, amount):
    key, account = await gw.key(1)
    status, body = await post(gw, "/api/v1/account/credits/purchase", {"usd": amount}, key)
    assert status == 400 and body["error"]["param"] == "usd" and "usd:" in body["error"]["message"], body
    assert await gw.balance(account) == MICRO


# Every form of "this machine or its network" that a URL may take.
PRIVATE_HOSTS = ["127.0.0.1", "127.1", "2130706433", "0x7f000001", "0177.0.0.1", "0x7f.1", "localhost", "localhost.",
                 "LOCALHOST", "api.localhost", "10.0.0.8", "172.16.0.1", "192.168.1.1", "169.254.169.254",
                 "100.64.0.1", "100.100.100.200", "0.0.0.0", "[::1]", "[::ffff:127.0.0.1]", "[::ffff:a9fe:a9fe]",
                 "[2002:7f00:1::]", "[2002:a9fe:a9fe::]", "[64:ff9b::a9fe:a9fe]", "[::127.0.0.1]", "[fe80::1]",
                 "[fc00::1]", "224.0.0.1"]


@pytest.mark.parametrize("host", PRIVATE_HOSTS)
async def test_chat_image_urls_to_private_addresses_are_a_400(gw, host):
    key, account = await gw.key(1)
    with pytest.raises(openai.BadRequestError) as err:
        await gw.openai(key).chat.completions.create(model="demo/echo", messages=[{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": f"https://{host}/latest/meta-data"}}]}])
    assert err.value.body["param"] == "messages[0].content[1].image_url.url"
    assert "private" in err.value.message or "this machine" in err.value.message
    assert await gw.balance(account) == MICRO


@pytest.mark.parametrize("url", ["http://example.com/a.png", "ftp://example.com/a.png", "file:///etc/passwd",
                                 "gopher://x/", "//example.com/a.png"])
async def test_chat_image_urls_must_be_https_or_data(gw, url):
    key, _ = await gw.key(1)
    with pytest.raises(openai.BadRequestError, match="https URL or a data: URL") as err:
        await gw.openai(key).chat.completions.create(model="demo/echo", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}]}])
    assert err.value.body["param"] == "messages[0].content[0].image_url.url"
    with pytest.raises(anthropic.BadRequestError, match="https URL or a data: URL"):
        await gw.anthropic(key).messages.create(model="demo/echo", max_tokens=10, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": url}}]}])
    with pytest.raises(openai.BadRequestError, match="https URL or a data: URL") as err:
        await gw.openai(key).responses.create(model="demo/echo", input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": url}]}])
    assert err.value.body["param"] == "input[0].content[0].image_url"


@pytest.fixture
async def fal_gw(aiohttp_server, start_gateway, tmp_path):
    async def start(allow_private: bool):
        fal = FakeFal()
        fal.server = await aiohttp_server(fal.app)
        gw = await start_gateway({
            "providers": {"fal": {"type": "fal", "base_url": str(fal.server.make_url("")), "api_key": "fal-test-key",
                                  "poll_seconds": 0.01}},
            "models": {"image": [{"id": "fal/edit", "provider": "fal", "max_references": 2,
                                  "upstream": {"generate": "fal-ai/nano-banana", "edit": "fal-ai/nano-banana/edit"}, "list_usd_per_image": 0.04,
                                  "upstream_fields": {"image_url": "image_urls"}}]},
            "media": {"artifacts": {"dir": str(tmp_path / "art")}, "allow_private_urls": allow_private}})
        key, account = await gw.key(1)
        return gw, fal, key, account
    return start


@pytest.mark.parametrize("host", PRIVATE_HOSTS)
async def test_media_references_passed_to_fal_are_checked_like_fetched_ones(fal_gw, host):
    gw, fal, key, account = await fal_gw(allow_private=False)
    status, body = await post(gw, "/api/v1/images/generations", {"model": "fal/edit", "prompt": "p",
                                                                 "image_url": f"https://{host}/x.png"}, key)
    assert status == 400 and body["error"]["param"] == "image_url", body
    assert fal.requests == []                                    # fal never saw it
    assert await gw.balance(account) == MICRO


async def test_fal_urls_on_another_host_are_followed_without_the_key(fal_gw):
    gw, fal, key, account = await fal_gw(allow_private=True)
    fal.queue_host = f"localhost:{fal.server.port}"              # another origin than the configured base_url
    status, body = await post(gw, "/api/v1/images/generations", {"model": "fal/edit", "prompt": "p"}, key)
    assert status == 200, body
    foreign = [r for r in fal.requests if r.headers.get("host") == fal.queue_host]
    assert foreign and all("authorization" not in r.headers for r in foreign)
    assert all(r.headers.get("authorization") == "Key fal-test-key" for r in fal.requests if r not in foreign)


async def test_fal_urls_on_another_host_go_through_the_address_check(fal_gw):
    gw, fal, key, account = await fal_gw(allow_private=False)
    fal.queue_host = f"localhost:{fal.server.port}"
    status, body = await post(gw, "/api/v1/images/generations", {"model": "fal/edit", "prompt": "p"}, key)
    assert status == 502, body
    assert [r.headers.get("host") for r in fal.requests if r.headers.get("host") == fal.queue_host] == []
    assert await gw.balance(account) == MICRO
