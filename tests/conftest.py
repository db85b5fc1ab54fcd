"""Shared fixtures: a real gateway on loopback, configured from YAML written per test,
driven by the official SDKs; fake upstreams speaking each provider's real wire format."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import yaml

import config as config_mod
from gateway import create_app
from plugins.accounts import create_account
from plugins.appstate import STORE
from tests.fakes import FakeAnthropic, FakeGemini, FakeOpenAIChat, FakeOpenAIResponses
from tests.servers import postgres_server, postgres_url, redis_server, redis_url  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parent.parent
MICRO = 1_000_000


def pytest_configure(config):
    sys._called_from_test = True   # skip entry-point plugins, as datasette does


def deep_merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for k, v in top.items():
        out[k] = deep_merge(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, dict) else v
    return out


DEMO_MODELS = [
    {"id": "demo/echo", "provider": "demo", "upstream": "demo-echo",
     "list_input_usd_per_mtok": 1.0, "list_output_usd_per_mtok": 2.0, "tools": True},
]


def pytest_generate_tests(metafunc):
    """A module that sets `ENGINES = ("sqlite", "postgresql")` runs each of its gateway tests
    once per storage engine."""
    engines = getattr(metafunc.module, "ENGINES", None)
    if engines and "storage_engine" in metafunc.fixturenames:
        metafunc.parametrize("storage_engine", engines, indirect=True)


@pytest.fixture
def storage_engine(request) -> str:
    return getattr(request, "param", "sqlite")


@pytest.fixture
async def storage_url(storage_engine, tmp_path, request) -> str:
    """Where the test's gateway keeps its state: a SQLite file in tmp, or a fresh database
    on the session's PostgreSQL server."""
    if storage_engine == "postgresql":
        return await request.getfixturevalue("postgres_server").fresh_url()
    return f"sqlite:///{tmp_path / 'gateway.db'}"


@pytest.fixture
def write_config(tmp_path, storage_url):
    """Write a YAML config (defaults: demo provider, the test's storage) and load it."""
    def write(extra: dict[str, Any] | None = None, name: str = "gateway.yaml") -> config_mod.Config:
        base = {"storage": storage_url,
                "providers": {"demo": {"type": "demo"}},
                "models": {"chat": list(DEMO_MODELS)}}
        data = deep_merge(base, extra or {})
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return config_mod.load(path)
    return write


class Gateway:
    """A running gateway and helpers to act as its operator and its clients."""

    def __init__(self, server):
        self.server = server
        self.app = server.app
        self.url = str(server.make_url("")).rstrip("/")

    @property
    def store(self):
        return self.app[STORE]

    async def key(self, credits_usd: float | str = 10) -> tuple[str, int]:
        """-> (api key, account id), with that many credits."""
        micro = round(float(credits_usd) * MICRO) if not isinstance(credits_usd, int) else credits_usd * MICRO
        account_id, key = await create_account(self.store, "test", micro)
        return key, account_id

    async def balance(self, account_id: int) -> int:
        return await self.store.ledger.balance(account_id)

    async def ledger_sum(self, account_id: int) -> int:
        return await self.store.ledger.entries_sum(account_id)

    def openai(self, key: str | None = "none", **kw) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/api/v1", api_key=key, max_retries=0, **kw)

    def anthropic(self, key: str, **kw) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(base_url=f"{self.url}/api", api_key=key, max_retries=0, **kw)


@pytest.fixture
def start_gateway(aiohttp_server, write_config):
    """`await start_gateway(extra_yaml)` -> a running Gateway."""
    async def start(extra: dict[str, Any] | None = None, before_start=None, **app_kw) -> Gateway:
        cfg = write_config(extra)
        app = create_app(cfg, **app_kw)
        if before_start:
            before_start(app)          # e.g. install a clock the test controls
        server = await aiohttp_server(app)
        return Gateway(server)
    return start


@pytest.fixture
async def gw(start_gateway):
    return await start_gateway()


@pytest.fixture(params=["memory", "redis"])
def shared_state(request) -> dict:
    """Config for where rate limits and key changes live: in process, or in a real Redis."""
    if request.param == "memory":
        return {}
    return {"redis": request.getfixturevalue("redis_url")}


@pytest.fixture
async def fake_openai(aiohttp_server):
    fake = FakeOpenAIChat()
    fake.server = await aiohttp_server(fake.app)
    return fake


@pytest.fixture
async def fake_anthropic(aiohttp_server):
    fake = FakeAnthropic()
    fake.server = await aiohttp_server(fake.app)
    return fake


# Prices chosen so every charge is a whole, hand-checkable number of micro-USD:
# service price = list x 0.5 -> 1.00 / 4.00 USD per million tokens.
UPSTREAM_PRICES = {"list_input_usd_per_mtok": 2.0, "list_output_usd_per_mtok": 8.0}


def upstream_cost(input_tokens: int, output_tokens: int) -> int:
    """What a call to an UPSTREAM_PRICES model costs: 1.00 in, 4.00 out USD per million
    tokens, rounded up once, in micro-USD."""
    return -(-(input_tokens * 1_000_000 + output_tokens * 4_000_000) // 1_000_000)


def openai_upstream(fake: FakeOpenAIChat, **provider) -> dict:
    """Config that serves `up/gpt` (OpenAI wire) and `up/reasoner` from the fake."""
    return {"providers": {"up-openai": {"type": "openai", "base_url": str(fake.server.make_url("/v1")),
                                        "api_key": "sk-test-upstream", **provider}},
            "models": {"chat": DEMO_MODELS + [
                {"id": "up/gpt", "provider": "up-openai", "upstream": "gpt-4o-mini", "tools": True,
                 **UPSTREAM_PRICES},
                {"id": "up/reasoner", "provider": "up-openai", "upstream": "gpt-5-mini", **UPSTREAM_PRICES}]}}


def anthropic_upstream(fake: FakeAnthropic, **provider) -> dict:
    """Config that serves `up/claude` (Anthropic wire) from the fake."""
    return {"providers": {"up-anthropic": {"type": "anthropic", "base_url": str(fake.server.make_url("")),
                                           "api_key": "sk-ant-test-upstream", **provider}},
            "models": {"chat": DEMO_MODELS + [
                {"id": "up/claude", "provider": "up-anthropic", "upstream": "claude-sonnet-4-5", "tools": True,
                 **UPSTREAM_PRICES}]}}


# Every remote chat upstream kind: name -> (fake class, provider settings from the fake's URL, upstream model id)
UPSTREAMS = {
    "openai": (FakeOpenAIChat, lambda u: {"type": "openai", "base_url": f"{u}/v1", "api_key": "sk-test-upstream"},
               "gpt-4o-mini"),
    "anthropic": (FakeAnthropic, lambda u: {"type": "anthropic", "base_url": u, "api_key": "sk-ant-test-upstream"},
                  "claude-sonnet-4-5"),
    "gemini": (FakeGemini, lambda u: {"type": "gemini", "base_url": u, "api_key": "gemini-test-key"},
               "gemini-2.5-flash"),
    "openai_responses": (FakeOpenAIResponses, lambda u: {"type": "openai_responses", "base_url": f"{u}/v1",
                                                         "api_key": "sk-test-upstream"}, "gpt-5-mini"),
}


async def gateway_over(kind: str, aiohttp_server, start_gateway):
    """A gateway whose `up/model` is served by a fresh fake of upstream `kind` -> (fake, gateway)."""
    fake_class, settings, upstream_id = UPSTREAMS[kind]
    fake = fake_class()
    server = await aiohttp_server(fake.app)
    gw = await start_gateway({"providers": {"up": settings(str(server.make_url("")).rstrip("/"))},
                              "models": {"chat": DEMO_MODELS + [{"id": "up/model", "provider": "up",
                                                                 "upstream": upstream_id, **UPSTREAM_PRICES}]}})
    return fake, gw
