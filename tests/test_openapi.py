"""The API document (`GET /api/v1/openapi.json`) and its docs page (`/docs`).

The document cannot drift from the code: it is valid OpenAPI 3.1; it names exactly the
routes the app serves; and every route's live answers (successes and the main errors,
streams included) validate against the response schemas it declares, driven through HTTP
with the official SDKs where a client is involved. A final check makes sure every status
the document lists for a route was seen (NOT_EXERCISED would name any exception, with why)."""
from __future__ import annotations

import json
import os
import shutil
from urllib.parse import quote

import aiohttp
import anthropic
import httpx
import openai
import pytest
from eth_account import Account
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from openapi_spec_validator import validate as validate_openapi
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from plugins.appstate import CONFIG
from plugins.openapi.document import PROVIDERS, pinned
from tests.conftest import DEMO_MODELS, UPSTREAM_PRICES
from tests.conformance.wire import parse_sse
from tests.fakes import FakeFal, FakeOpenAIChat, MediaReply, Reply
from tests.fakes.facilitator import FakeFacilitator
from tests.test_media import MEDIA
from tests.test_x402 import chains, payer_client

ADMIN_KEY = "adm_openapi-test-admin-key"
METHODS = ("get", "post", "put", "patch", "delete", "head")
HELLO = [{"role": "user", "content": "Hello!"}]
FLAGGED = "please build a bomb"
RULES = {"rules": [{"category": "weapons", "patterns": ["(?i)\\bbuild a bomb\\b"]}]}
MESSAGES_ROUTE, CHAT_ROUTE, RESPONSES_ROUTE = "/api/v1/messages", "/api/v1/chat/completions", "/api/v1/responses"
IMAGES_ROUTE, VIDEOS_ROUTE = "/api/v1/images/generations", "/api/v1/videos/generations"
ADMIN_ROUTES = [("get", "/api/v1/admin/accounts"), ("post", "/api/v1/admin/accounts"),
                ("get", "/api/v1/admin/accounts/{id}"), ("post", "/api/v1/admin/accounts/{id}/credits"),
                ("post", "/api/v1/admin/accounts/{id}/keys"), ("get", "/api/v1/admin/keys"),
                ("post", "/api/v1/admin/keys/{id}/revoke"), ("get", "/api/v1/admin/usage"),
                ("get", "/api/v1/admin/usage/summary"), ("get", "/api/v1/admin/ledger")]

# Statuses the document lists (they are true) that this test does not produce, and why.
METRICS_TOKEN = "metrics-scrape-token"
NOT_EXERCISED: dict[tuple[str, str, str], str] = {
    ("get", "/readyz", "503"): "needs a store that stops answering: tests/test_health.py stops a real Redis",
}


def pointer(*parts: str) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


class Documented:
    """The served document as a checker of live answers; remembers what it has seen."""

    def __init__(self, doc: dict):
        self.doc = doc
        self.registry = Registry().with_resource("urn:api", Resource(contents=doc, specification=DRAFT202012))
        self.seen: set[tuple[str, str, str]] = set()

    def at(self, where: str):
        node = self.doc
        for part in where.split("/")[1:]:
            node = node[part.replace("~1", "/").replace("~0", "~")]
        return node

    def follow(self, node: dict, where: str) -> tuple[dict, str]:
        while "$ref" in node:
            where = node["$ref"][1:]
            node = self.at(where)
        return node, where

    def operation(self, method: str, route: str) -> tuple[dict, str]:
        assert route in self.doc["paths"], f"{route} is not in the document"
        item, where = self.follow(self.doc["paths"][route], pointer("paths", route))
        assert method in item, f"{method.upper()} {route} is not in the document"
        return item[method], f"{where}/{method}"

    def operations(self):
        for route, raw in self.doc["paths"].items():
            item, _ = self.follow(raw, pointer("paths", route))
            yield from ((m, route, item[m]) for m in METHODS if m in item)

    def validate(self, instance, where: str, what: str) -> None:
        validator = Draft202012Validator({"$ref": "urn:api#" + quote(where, safe="/~")}, registry=self.registry)
        error = best_match(validator.iter_errors(instance))
        assert error is None, f"{what}: {error.message[:400]} at {list(error.absolute_path)}"

    def check_request(self, method: str, route: str, body) -> None:
        """A body the gateway accepted is one the document's request schema accepts."""
        op, where = self.operation(method.lower(), route)
        assert "requestBody" in op, f"{method.upper()} {route} took a body the document does not declare"
        _, where = self.follow(op["requestBody"], f"{where}/requestBody")
        self.validate(body, f"{where}/content/application~1json/schema", f"{method.upper()} {route} request")

    def check(self, method: str, route: str, status: int, content_type: str | None, body: bytes) -> None:
        """The answer `status` with `body` is one the document declares for the route."""
        method = method.lower()
        op, where = self.operation(method, route)
        assert str(status) in op["responses"], f"{method.upper()} {route} answered {status}: not in the document"
        response, where = self.follow(op["responses"][str(status)], f"{where}/responses/{status}")
        what = f"{method.upper()} {route} {status}"
        content = response.get("content")
        if method == "head" or not content:
            assert method == "head" or not body, f"{what}: a body the document does not declare"
        else:
            media = (content_type or "").split(";")[0].strip()
            key = media if media in content else f"{media.split('/')[0]}/*"
            assert key in content, f"{what}: content type {media} is not among {sorted(content)}"
            where = f"{where}/content/{pointer(key)[1:]}"
            if media == "application/json":
                self.validate(json.loads(body), f"{where}/schema", what)
            elif media == "text/event-stream":
                frames = parse_sse(body)
                assert frames, f"{what}: an empty stream"
                for frame in frames:
                    if frame.data != content[key].get("x-sse-done"):
                        self.validate(json.loads(frame.data), f"{where}/x-sse-data", f"{what} event {frame.event}")
        self.seen.add((method, route, str(status)))


class Client:
    """Calls the gateway as a client would and checks each answer against the document."""

    def __init__(self, gw, documented: Documented):
        self.gw, self.doc = gw, documented

    async def http(self, method: str, route: str, status: int, *, path: str | None = None, body=None,
                   key: str | None = None, headers: dict | None = None, raw: bytes | None = None):
        h = {"Authorization": f"Bearer {key}"} if key else {}
        async with aiohttp.ClientSession() as s:
            async with s.request(method, self.gw.url + (path or route), json=body, data=raw,
                                 headers={**h, **(headers or {})}) as r:
                content = await r.read()
                assert r.status == status, f"{method} {path or route}: {r.status} {content[:300]!r}"
                self.doc.check(method, route, r.status, r.headers.get("Content-Type"), content)
                if body is not None and r.status < 300:
                    self.doc.check_request(method, route, body)
                media = r.headers.get("Content-Type", "")
                return (json.loads(content) if content and media.startswith("application/json") else content), r.headers

    async def sdk(self, route: str, status: int, call) -> httpx.Response:
        """`call()` makes one request with an official SDK and returns its raw response."""
        try:
            answer = await call()
        except (openai.APIStatusError, anthropic.APIStatusError) as err:
            answer = err.response
        await answer.aread()
        assert answer.status_code == status, f"{route}: {answer.status_code} {answer.text[:300]}"
        self.doc.check("post", route, answer.status_code, answer.headers.get("content-type"), answer.content)
        if status < 300:                  # what the SDK sent is what the document describes
            self.doc.check_request("post", route, json.loads(answer.request.content))
        return answer


async def raw(call):
    """The raw HTTP answer of an SDK's `with_raw_response` call."""
    return (await call).http_response


async def streamed(make):
    """The raw HTTP answer of an SDK's `with_streaming_response` call, read to its end."""
    async with make as response:
        await response.read()
        return response.http_response


# ---- the gateways ---------------------------------------------------------------------

@pytest.fixture
async def served(aiohttp_server, start_gateway, monkeypatch, tmp_path):
    """A gateway with every feature on (admin key, x402, moderation, media, upstreams that
    can be made to fail), and a strict one: every limit at its tightest, moderation that
    fails closed with its provider down, no admin key, no x402."""
    monkeypatch.setenv("GATEWAY_ADMIN_KEY", ADMIN_KEY)
    facilitator, upstream, renders = FakeFacilitator(), FakeOpenAIChat(), FakeFal()
    fac_url = str((await aiohttp_server(facilitator.app)).make_url(""))
    up_url = str((await aiohttp_server(upstream.app)).make_url("/v1"))
    fal_url = str((await aiohttp_server(renders.app)).make_url(""))
    models = {"chat": DEMO_MODELS + [{"id": "up/gpt", "provider": "up", "upstream": "gpt-4o-mini",
                                      **UPSTREAM_PRICES}],
              "image": MEDIA["image"] + [{"id": "fal/flux", "provider": "fal", "upstream": "fal-ai/flux/dev",
                                          "list_usd_per_image": 0.05}],
              "video": MEDIA["video"] + [{"id": "fal/veo3", "provider": "fal", "upstream": "fal-ai/veo3",
                                          "list_usd_per_second": 0.40,
                                          "options": {"duration_seconds": {"values": [8], "default": 8}}}]}
    common = {"models": models, "moderation": RULES,
              "providers": {"up": {"type": "openai", "base_url": up_url, "api_key": "sk-test-upstream"},
                            "fal": {"type": "fal", "base_url": fal_url, "api_key": "fal-test-key",
                                    "poll_seconds": 0.01}},
              "media": {"artifacts": {"dir": str(tmp_path / "artifacts")}, "allow_private_urls": True}}
    gw = await start_gateway({**common, "payments": {"x402": {"facilitator": {"url": fac_url},
                                                              "chains": chains("usdc")}}})
    monkeypatch.delenv("GATEWAY_ADMIN_KEY")
    strict = await start_gateway({
        **common, "limits": {"per_key": {"rpm": 1}, "per_address": {"rpm": 1}},
        "providers": {**common["providers"], "down": {"type": "openai", "base_url": "http://127.0.0.1:9/v1",
                                                      "api_key": "unused"}},
        "moderation": {**RULES, "provider": {"provider": "down"}, "fail_closed": True},
        "metrics": {"token": METRICS_TOKEN}})
    documented = await fetch_document(gw)
    return Client(gw, documented), Client(strict, documented), upstream, renders


async def fetch_document(gw) -> Documented:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{gw.url}/api/v1/openapi.json") as r:
            assert r.status == 200 and r.content_type == "application/json"
            return Documented(await r.json())


@pytest.fixture
async def plain(gw) -> Client:
    """The default test gateway and its document: enough where no call is made."""
    return Client(gw, await fetch_document(gw))


# ---- the document itself ----------------------------------------------------------------

async def test_the_document_is_valid_openapi_3_1(plain):
    client = plain
    doc = client.doc.doc
    validate_openapi(doc)
    assert doc["openapi"] == "3.1.0" and doc["servers"][0]["url"] == client.gw.app[CONFIG].server.public_url


async def test_every_route_is_documented_and_every_documented_route_is_served(plain):
    client = plain
    served_routes = {(r.method.lower(), r.resource.canonical) for r in client.gw.app.router.routes()}
    documented = {(m, route) for m, route, _ in client.doc.operations()}
    assert served_routes - documented == set(), "routes the document does not describe"
    assert documented - served_routes == set(), "documented routes the gateway does not serve"


async def test_provider_formats_are_described_by_the_providers_own_schemas(plain):
    client = plain
    doc = client.doc.doc
    schemas = doc["components"]["schemas"]
    chat, _ = client.doc.operation("post", CHAT_ROUTE)
    assert chat["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/openai.CreateChatCompletionRequest"}
    message, _ = client.doc.operation("post", MESSAGES_ROUTE)
    assert message["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/anthropic.Message"}
    for provider in PROVIDERS:          # embedded as pinned, only renamed into our namespace
        assert doc["info"]["x-provider-schemas"][provider] == pinned(provider)["x-source"]
        theirs = pinned(provider)["components"]["schemas"]
        ours = {name.split(".", 1)[1] for name in schemas if name.startswith(provider + ".")}
        assert ours and ours <= set(theirs)
    assert schemas["anthropic.Message"] == theirs_renamed("anthropic", "Message")


def theirs_renamed(provider: str, name: str):
    """A pinned schema as the document should embed it: its references renamed."""
    text = json.dumps(pinned(provider)["components"]["schemas"][name])
    return json.loads(text.replace('"#/components/schemas/', f'"#/components/schemas/{provider}.'))


# ---- live answers of every route -------------------------------------------------------

async def chat_routes(c: Client, key: str, broke: str, restricted: str, upstream: FakeOpenAIChat) -> None:
    ai, bad = c.gw.openai(key), c.gw.openai("chk_not-a-real-key")
    await c.sdk(CHAT_ROUTE, 200, lambda: raw(ai.chat.completions.with_raw_response.create(
        model="demo/echo", messages=HELLO)))
    await c.sdk(CHAT_ROUTE, 200, lambda: streamed(ai.chat.completions.with_streaming_response.create(
        model="demo/echo", messages=HELLO, stream=True)))
    upstream.enqueue(Reply(text="one two three four", fail_after_events=1))     # an in-band error event
    await c.sdk(CHAT_ROUTE, 200, lambda: streamed(ai.chat.completions.with_streaming_response.create(
        model="up/gpt", messages=HELLO, stream=True)))
    await c.sdk(CHAT_ROUTE, 400, lambda: raw(ai.chat.completions.with_raw_response.create(
        model="demo/echo", messages=HELLO, n=2)))
    await c.sdk(CHAT_ROUTE, 401, lambda: raw(bad.chat.completions.with_raw_response.create(
        model="demo/echo", messages=HELLO)))
    await c.sdk(CHAT_ROUTE, 402, lambda: raw(c.gw.openai(broke).chat.completions.with_raw_response.create(
        model="demo/echo", messages=HELLO)))
    challenge, headers = await c.http("POST", CHAT_ROUTE, 402, body={"model": "demo/echo", "messages": HELLO})
    assert challenge["x402Version"] == 1 and "PAYMENT-REQUIRED" in headers
    async with payer_client(Account.create()) as payer:          # paid per call with x402
        paid = await payer.post(f"{c.gw.url}{CHAT_ROUTE}", json={"model": "demo/echo", "messages": HELLO,
                                                                  "max_tokens": 50})
    c.doc.check("post", CHAT_ROUTE, paid.status_code, paid.headers["content-type"], paid.content)
    assert paid.status_code == 200 and "PAYMENT-RESPONSE" in paid.headers
    await c.sdk(CHAT_ROUTE, 403, lambda: raw(c.gw.openai(restricted).chat.completions.with_raw_response.create(
        model="demo/echo", messages=HELLO)))
    await c.sdk(CHAT_ROUTE, 413, lambda: raw(ai.chat.completions.with_raw_response.create(
        model="demo/echo", messages=[{"role": "user", "content": "x" * 200_001}])))
    await c.sdk(CHAT_ROUTE, 422, lambda: raw(ai.chat.completions.with_raw_response.create(
        model="demo/echo", messages=[{"role": "user", "content": FLAGGED}])))
    upstream.enqueue(Reply(error_status=500))
    await c.sdk(CHAT_ROUTE, 502, lambda: raw(ai.chat.completions.with_raw_response.create(
        model="up/gpt", messages=HELLO)))


async def messages_route(c: Client, key: str, broke: str, restricted: str, upstream: FakeOpenAIChat) -> None:
    claude = c.gw.anthropic(key)

    def create(client=claude, **kw):
        body = {"model": "demo/echo", "max_tokens": 64, "messages": HELLO, **kw}
        return raw(client.messages.with_raw_response.create(**body))
    await c.sdk(MESSAGES_ROUTE, 200, create)
    await c.sdk(MESSAGES_ROUTE, 200, lambda: streamed(claude.messages.with_streaming_response.create(
        model="demo/echo", max_tokens=64, messages=HELLO, stream=True)))
    upstream.enqueue(Reply(text="one two three four", fail_after_events=1))
    await c.sdk(MESSAGES_ROUTE, 200, lambda: streamed(claude.messages.with_streaming_response.create(
        model="up/gpt", max_tokens=64, messages=HELLO, stream=True)))
    await c.sdk(MESSAGES_ROUTE, 400, lambda: create(model="no-such-model"))
    await c.sdk(MESSAGES_ROUTE, 401, lambda: create(client=c.gw.anthropic("chk_not-a-real-key")))
    await c.sdk(MESSAGES_ROUTE, 402, lambda: create(client=c.gw.anthropic(broke)))
    await c.sdk(MESSAGES_ROUTE, 403, lambda: create(client=c.gw.anthropic(restricted)))
    await c.sdk(MESSAGES_ROUTE, 413, lambda: create(messages=[{"role": "user", "content": "x" * 800_001}]))
    await c.sdk(MESSAGES_ROUTE, 422, lambda: create(messages=[{"role": "user", "content": FLAGGED}]))
    upstream.enqueue(Reply(error_status=500))
    await c.sdk(MESSAGES_ROUTE, 502, lambda: create(model="up/gpt"))


async def responses_route(c: Client, key: str, broke: str, restricted: str, upstream: FakeOpenAIChat) -> None:
    ai = c.gw.openai(key)

    def create(client=ai, **kw):
        return raw(client.responses.with_raw_response.create(**{"model": "demo/echo", "input": "Hello!", **kw}))
    await c.sdk(RESPONSES_ROUTE, 200, create)
    await c.sdk(RESPONSES_ROUTE, 200, lambda: streamed(ai.responses.with_streaming_response.create(
        model="demo/echo", input="Hello!", stream=True)))
    upstream.enqueue(Reply(text="one two three four", fail_after_events=1))
    await c.sdk(RESPONSES_ROUTE, 200, lambda: streamed(ai.responses.with_streaming_response.create(
        model="up/gpt", input="Hello!", stream=True)))
    await c.sdk(RESPONSES_ROUTE, 400, lambda: create(previous_response_id="resp_1"))
    await c.sdk(RESPONSES_ROUTE, 401, lambda: create(client=c.gw.openai("chk_not-a-real-key")))
    await c.sdk(RESPONSES_ROUTE, 402, lambda: create(client=c.gw.openai(broke)))
    await c.sdk(RESPONSES_ROUTE, 403, lambda: create(client=c.gw.openai(restricted)))
    await c.sdk(RESPONSES_ROUTE, 413, lambda: create(input="x" * 800_001))
    await c.sdk(RESPONSES_ROUTE, 422, lambda: create(input=FLAGGED))
    upstream.enqueue(Reply(error_status=500))
    await c.sdk(RESPONSES_ROUTE, 502, lambda: create(model="up/gpt"))


async def listings(c: Client) -> None:
    for route in ("/api", "/api/", "/api/v1", "/api/v1/"):
        await c.http("GET", route, 200)
        await c.http("HEAD", route, 200)
    await c.http("GET", "/api/v1/models", 200)
    await c.http("GET", "/api/v1/chat/models", 200)
    await c.http("GET", "/api/v1/media/models", 200)


async def media_routes(c: Client, key: str, broke: str, restricted: str, renders: FakeFal) -> None:
    ai = c.gw.openai(key)

    def image(client=ai, prompt="a red fox", **extra):
        return raw(client.images.with_raw_response.generate(model="demo/image", prompt=prompt, extra_body=extra))
    await c.sdk(IMAGES_ROUTE, 200, image)
    await c.sdk(IMAGES_ROUTE, 400, lambda: image(quality="ultra"))
    await c.sdk(IMAGES_ROUTE, 401, lambda: image(client=c.gw.openai("chk_not-a-real-key")))
    await c.sdk(IMAGES_ROUTE, 402, lambda: image(client=c.gw.openai(broke)))
    await c.http("POST", IMAGES_ROUTE, 402, body={"model": "demo/image", "prompt": "a fox"})      # x402 challenge
    await c.sdk(IMAGES_ROUTE, 403, lambda: image(client=c.gw.openai(restricted)))
    await c.sdk(IMAGES_ROUTE, 413, lambda: image(prompt="x" * 200_001))
    await c.sdk(IMAGES_ROUTE, 422, lambda: image(prompt=FLAGGED))
    renders.enqueue(MediaReply(error_status=500))
    await c.sdk(IMAGES_ROUTE, 502, lambda: raw(ai.images.with_raw_response.generate(model="fal/flux", prompt="a fox")))

    video = {"model": "demo/video", "prompt": "a falcon dives"}
    done, _ = await c.http("POST", VIDEOS_ROUTE, 200, body=video, key=key)
    await c.http("POST", VIDEOS_ROUTE, 400, body={**video, "duration_seconds": 5}, key=key)
    await c.http("POST", VIDEOS_ROUTE, 401, body=video, key="chk_not-a-real-key")
    await c.http("POST", VIDEOS_ROUTE, 402, body=video, key=broke)
    await c.http("POST", VIDEOS_ROUTE, 402, body=video)
    await c.http("POST", VIDEOS_ROUTE, 403, body=video, key=restricted)
    await c.http("POST", VIDEOS_ROUTE, 413, body={**video, "prompt": "x" * 200_001}, key=key)
    await c.http("POST", VIDEOS_ROUTE, 422, body={**video, "prompt": FLAGGED}, key=key)
    renders.enqueue(MediaReply(video=True, fail="content policy violation"))
    await c.http("POST", VIDEOS_ROUTE, 502, body={"model": "fal/veo3", "prompt": "a falcon"}, key=key)

    artifact = "/api/v1/media/artifacts/{name}"
    await c.http("GET", artifact, 200, path=done["results"][0]["url"])
    await c.http("GET", artifact, 404, path="/api/v1/media/artifacts/" + "A" * 32 + ".mp4")


async def account_routes(c: Client, key: str) -> None:
    await c.http("GET", "/api/v1/account", 200, key=key)
    await c.http("GET", "/api/v1/account", 401)
    await c.http("GET", "/api/v1/account/usage", 200, path="/api/v1/account/usage?limit=5", key=key)
    await c.http("GET", "/api/v1/account/usage", 400, path="/api/v1/account/usage?limit=0", key=key)
    await c.http("GET", "/api/v1/account/usage", 401)
    await c.http("GET", "/api/v1/account/usage/summary", 200, key=key)
    await c.http("GET", "/api/v1/account/usage/summary", 400, path="/api/v1/account/usage/summary?since=soon", key=key)
    await c.http("GET", "/api/v1/account/usage/summary", 401)
    register = "/api/v1/account/agents/register"
    await c.http("POST", register, 201, body={"name": "scout"}, key=key)
    await c.http("POST", register, 200, body={"name": "scout"}, key=key)
    await c.http("POST", register, 400, body={"name": ""}, key=key)
    await c.http("POST", register, 401, body={"name": "scout"})
    await c.http("GET", "/api/v1/account/agents", 200, key=key)
    await c.http("GET", "/api/v1/account/agents", 401)
    keys, one = "/api/v1/account/keys", "/api/v1/account/keys/{key_id}"
    made, _ = await c.http("POST", keys, 201, body={"name": "ci"}, key=key)
    await c.http("POST", keys, 400, body={"name": 7}, key=key)
    await c.http("POST", keys, 401, body={"name": "ci"})
    await c.http("GET", keys, 200, key=key)
    await c.http("GET", keys, 401)
    await c.http("DELETE", one, 200, path=f"{keys}/{made['id']}", key=key)
    await c.http("DELETE", one, 404, path=f"{keys}/999999", key=key)
    await c.http("DELETE", one, 400, path=f"{keys}/first", key=key)
    await c.http("DELETE", one, 401, path=f"{keys}/{made['id']}")

    purchase = "/api/v1/account/credits/purchase"
    await c.http("POST", purchase, 401, body={"usd": 5})
    await c.http("POST", purchase, 400, body={}, key=key)
    await c.http("POST", purchase, 402, body={"usd": 5}, key=key)
    async with payer_client(Account.create()) as payer:
        bought = await payer.post(f"{c.gw.url}{purchase}", json={"usd": 5}, headers={"Authorization": f"Bearer {key}"})
    c.doc.check("post", purchase, bought.status_code, bought.headers["content-type"], bought.content)
    assert bought.status_code == 200 and bought.json()["status"] == "confirmed"


async def admin_routes(c: Client, key: str) -> str:
    """-> a key restricted to demo/image, for the 403s of the chat routes."""
    admin = {"key": ADMIN_KEY}
    accounts, one = "/api/v1/admin/accounts", "/api/v1/admin/accounts/{id}"
    listed, _ = await c.http("GET", accounts, 200, **admin)
    await c.http("GET", accounts, 400, path=f"{accounts}?limit=0", **admin)
    await c.http("GET", accounts, 401)
    await c.http("GET", accounts, 403, key=key)
    made, _ = await c.http("POST", accounts, 201, body={"name": "Acme", "credits_usd": "5"}, **admin)
    await c.http("POST", accounts, 400, body={"name": ""}, **admin)
    account = made["account"]["id"]
    await c.http("GET", one, 200, path=f"{accounts}/{account}", **admin)
    await c.http("GET", one, 404, path=f"{accounts}/999999", **admin)
    await c.http("GET", one, 400, path=f"{accounts}/acme", **admin)
    credits = "/api/v1/admin/accounts/{id}/credits"
    await c.http("POST", credits, 200, path=f"{accounts}/{account}/credits", body={"usd": "2", "reason": "goodwill"},
                 **admin)
    await c.http("POST", credits, 409, path=f"{accounts}/{account}/credits", body={"usd": "-100", "reason": "oops"},
                 **admin)
    await c.http("POST", credits, 400, path=f"{accounts}/{account}/credits", body={"usd": "2"}, **admin)
    await c.http("POST", credits, 404, path=f"{accounts}/999999/credits", body={"usd": "2", "reason": "x"}, **admin)
    new_key = "/api/v1/admin/accounts/{id}/keys"
    restricted, _ = await c.http("POST", new_key, 201, path=f"{accounts}/{account}/keys",
                                 body={"name": "images only", "models": ["demo/image"],
                                       "spend_limit": {"usd": "1", "period": "day"}}, **admin)
    await c.http("POST", new_key, 400, path=f"{accounts}/{account}/keys", body={"models": ["no/such"]}, **admin)
    await c.http("POST", new_key, 404, path=f"{accounts}/999999/keys", body={}, **admin)
    await c.http("GET", "/api/v1/admin/keys", 200, path=f"/api/v1/admin/keys?account={account}", **admin)
    await c.http("GET", "/api/v1/admin/keys", 400, path="/api/v1/admin/keys?account=acme", **admin)
    revoke = "/api/v1/admin/keys/{id}/revoke"
    spare, _ = await c.http("POST", new_key, 201, path=f"{accounts}/{account}/keys", body={"name": "spare"}, **admin)
    await c.http("POST", revoke, 200, path=f"/api/v1/admin/keys/{spare['id']}/revoke", **admin)
    await c.http("POST", revoke, 404, path="/api/v1/admin/keys/999999/revoke", **admin)
    await c.http("POST", revoke, 400, path="/api/v1/admin/keys/spare/revoke", **admin)
    for route in ("/api/v1/admin/usage", "/api/v1/admin/ledger"):
        await c.http("GET", route, 200, **admin)
        _, headers = await c.http("GET", route, 200, path=f"{route}?format=csv", **admin)
        assert headers["Content-Type"].startswith("text/csv")
        await c.http("GET", route, 400, path=f"{route}?since=soon", **admin)
    await c.http("GET", "/api/v1/admin/usage/summary", 200, **admin)
    await c.http("GET", "/api/v1/admin/usage/summary", 400, path="/api/v1/admin/usage/summary?until=later", **admin)
    for method, route in ADMIN_ROUTES:             # the other refusals, the same on every admin route
        path = route.replace("{id}", str(account))
        await c.http(method.upper(), route, 401, path=path, body={} if method == "post" else None)
        await c.http(method.upper(), route, 403, path=path, key=key, body={} if method == "post" else None)
    assert listed["total"] >= 1
    return restricted["key"]


async def page_routes(c: Client) -> None:
    await c.http("GET", "/api/v1/openapi.json", 200)
    for probe in ("/healthz", "/readyz", "/metrics"):
        await c.http("GET", probe, 200)
    for page, files in (("docs", ("docs.js", "docs.css")), ("dashboard", ("app.js", "style.css"))):
        await c.http("GET", f"/{page}", 200)
        await c.http("GET", f"/{page}/", 200)
        for name in files:
            await c.http("GET", f"/{page}/assets/{{name}}", 200, path=f"/{page}/assets/{name}")
        await c.http("GET", f"/{page}/assets/{{name}}", 404, path=f"/{page}/assets/nothing.js")


async def tightest_limits(strict: Client) -> None:
    """On the strict gateway: each paid route is a 503 while moderation cannot be asked
    (fail closed), then a 429 (rpm 1 per key); the admin API is a 404 (no admin key is
    set); buying credits is a 503 (no x402 here)."""
    for route, body in ((CHAT_ROUTE, {"model": "demo/echo", "messages": HELLO}),
                        (MESSAGES_ROUTE, {"model": "demo/echo", "max_tokens": 9, "messages": HELLO}),
                        (RESPONSES_ROUTE, {"model": "demo/echo", "input": "Hi"}),
                        (IMAGES_ROUTE, {"model": "demo/image", "prompt": "a fox"}),
                        (VIDEOS_ROUTE, {"model": "demo/video", "prompt": "a falcon"})):
        key, _ = await strict.gw.key(5)
        await strict.http("POST", route, 503, body=body, key=key)
        await strict.http("POST", route, 429, body=body, key=key)
    await strict.http("GET", "/metrics", 401)                      # the strict gateway sets a metrics token
    await strict.http("GET", "/metrics", 200, key=METRICS_TOKEN)
    purchase, register = "/api/v1/account/credits/purchase", "/api/v1/account/agents/register"
    key, _ = await strict.gw.key(5)
    await strict.http("POST", purchase, 503, body={"usd": 5}, key=key)
    await strict.http("POST", purchase, 429, body={"usd": 5}, key=key)
    key, _ = await strict.gw.key(5)
    await strict.http("POST", register, 201, body={"name": "scout"}, key=key)
    await strict.http("POST", register, 429, body={"name": "scout"}, key=key)
    for method, route in ADMIN_ROUTES:
        await strict.http(method.upper(), route, 404, path=route.replace("{id}", "1"), key=ADMIN_KEY,
                          body={} if method == "post" else None)


@pytest.mark.timeout(180)
async def test_every_route_answers_as_documented(served):
    client, strict, upstream, renders = served
    key, _ = await client.gw.key(20)
    broke, _ = await client.gw.key(0)
    await listings(client)
    images_only = await admin_routes(client, key)
    await chat_routes(client, key, broke, images_only, upstream)
    await messages_route(client, key, broke, images_only, upstream)
    await responses_route(client, key, broke, images_only, upstream)
    chat_only, _ = await client.http("POST", "/api/v1/admin/accounts/{id}/keys", 201,
                                     path="/api/v1/admin/accounts/1/keys", body={"models": ["demo/echo"]},
                                     key=ADMIN_KEY)
    await media_routes(client, key, broke, chat_only["key"], renders)
    await account_routes(client, key)
    await page_routes(client)
    await tightest_limits(strict)

    documented = {(m, route, status) for m, route, op in client.doc.operations() for status in op["responses"]}
    missed = documented - client.doc.seen - set(NOT_EXERCISED)
    assert missed == set(), f"documented answers never seen: {sorted(missed)}"
    assert set(NOT_EXERCISED) <= documented, "NOT_EXERCISED names answers the document does not list"


# ---- the docs page --------------------------------------------------------------------

async def test_docs_page_and_its_assets_are_served_from_the_package(plain):
    client = plain
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{client.gw.url}/docs") as r:
            html = await r.text()
            csp = r.headers["Content-Security-Policy"]
        assert r.status == 200 and "default-src 'none'" in csp and "connect-src 'self'" in csp
        assert r.headers["X-Frame-Options"] == "DENY"
        assert "/docs/assets/docs.js" in html and "/docs/assets/docs.css" in html and "http" not in html.replace(
            'href="/api/v1/openapi.json"', "")
        for name in ("docs.js", "docs.css"):
            async with s.get(f"{client.gw.url}/docs/assets/{name}") as r:
                assert r.status == 200 and "https://" not in await r.text()
        async with s.get(f"{client.gw.url}/docs/assets/../../config/gateway.yaml") as r:
            assert r.status == 404


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
try:
    from playwright.async_api import async_playwright
except ImportError:                    # pragma: no cover - the test extra installs it
    async_playwright = None


@pytest.mark.skipif(os.environ.get("CI") != "true" and (CHROMIUM is None or async_playwright is None),
                    reason="browser tests need Chromium (apt-get install chromium) and playwright (the test extra)")
async def test_docs_page_renders_every_route_in_a_browser(plain):
    client = plain
    async with async_playwright() as p:
        chrome = await p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"])
        try:
            page = await chrome.new_page()
            errors = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            await page.goto(f"{client.gw.url}/docs")
            await page.wait_for_selector("[data-testid=operation]")
            shown = {(await op.get_attribute("data-method"), await op.get_attribute("data-path"))
                     for op in await page.query_selector_all("[data-testid=operation]")}
            assert shown == {(m, route) for m, route, _ in client.doc.operations()}
            assert await page.locator("[data-testid=toc-entry]").count() == len(shown)
            tags = [await h.inner_text() for h in await page.query_selector_all("[data-testid=tag] > h2")]
            used = {tag for _, _, op in client.doc.operations() for tag in op["tags"]}
            assert tags == [t["name"] for t in client.doc.doc["tags"] if t["name"] in used]
            assert {"Chat", "Media", "Account", "Credits", "Admin", "Pages"} <= set(tags)
            chat = page.locator("section[data-path='/api/v1/chat/completions']")
            assert "openai.CreateChatCompletionRequest" in await chat.inner_text()
            assert "billing" in await chat.inner_text() and "PAYMENT-REQUIRED" in await chat.inner_text()
            await page.fill("#filter", "purchase")
            assert await page.locator("[data-testid=operation]:visible").count() == 1
            assert errors == []
        finally:
            await chrome.close()
