"""The catalog and its lifecycle: the shipped files are linted (ids, providers, prices, the
SPEC counts, nothing retired as of the audit); the listings show context length, maximum
output and when a model ends; a retired model answers 410 naming its replacement, in every
format, before any hold or upstream call; `gateway run` warns at start; `gateway catalog
check` says what retires and exits 1 while a retired model is still served."""
import os
import signal
import subprocess
import time
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import aiohttp
import anthropic
import openai
import pytest
import yaml

import config
from config import ConfigError
from config.lifecycle import endings
from gateway import create_app
from plugins.appstate import CLOCK
from tests.conftest import DEMO_MODELS, UPSTREAM_PRICES
from tests.fakes import Reply
from tests.gateway_process import GATEWAY, ROOT, free_port

AUDIT_DATE = date(2026, 11, 23)     # the day the shipped catalog was last checked: move it at each refresh
SPEC_COUNTS = {"chat": 39, "image": 15, "video": 25}
HI = [{"role": "user", "content": "hi"}]
RETIRES = date(2026, 12, 11)


def at(day: date, seconds: int = 0) -> float:
    return datetime(day.year, day.month, day.day, tzinfo=timezone.utc).timestamp() + seconds


class Clock:
    """The app's clock (Unix time), moved by the test."""

    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def install(self, app) -> None:
        app[CLOCK] = self


# ---- the shipped catalog ---------------------------------------------------------------

@pytest.fixture(scope="module")
def shipped():
    cfg = config.load(env={})
    create_app(cfg)                    # every provider type exists and every section checks
    return cfg


def real_entries(cfg):
    chat = [m for m in cfg.chat_models.values() if m.provider != "demo"]
    media = [m for m in cfg.media_models.values() if m.provider != "demo"]
    return chat, [m for m in media if m.kind == "image"], [m for m in media if m.kind == "video"]


def test_shipped_ids_are_unique_and_providers_exist():
    seen: dict[str, str] = {}
    for name in ("models.yaml", "media.yaml"):
        data = yaml.safe_load((ROOT / "config" / name).read_text())
        for kind, entries in data["models"].items():
            for entry in entries:
                assert entry["id"] not in seen, f"{entry['id']} in {name} and {seen[entry['id']]}"
                seen[entry["id"]] = name
                assert entry["provider"] in data["providers"], entry["id"]
                assert entry["id"].startswith(entry["provider"] + "/"), entry["id"]


def test_shipped_prices_are_present_and_positive(shipped):
    chat, image, video = real_entries(shipped)
    for m in chat:
        assert m.list_input_micro > 0 and m.list_output_micro > 0, m.id
        assert abs(m.input_micro * 2 - m.list_input_micro) <= 1, m.id      # the shipped discount is 0.5
        assert m.context_length and m.max_output_tokens and m.max_output_tokens <= m.context_length, m.id
    for m in image:
        assert m.list_usd_per_image > 0, m.id
    for m in video:
        assert (m.list_usd_per_second or m.list_usd_per_video) > 0, m.id


def test_shipped_media_catalog_is_servable(shipped):
    from plugins.media import MEDIA
    catalog = create_app(shipped)[MEDIA].catalog
    for m in catalog.values():
        assert m.list_micro > 0 and m.service_micro * 2 in (m.list_micro, m.list_micro + 1), m.id
        assert "edit" not in m.upstream or m.max_references >= 1, m.id
        if m.kind == "video":
            assert m.duration.allows(m.duration.default), m.id


def test_nothing_shipped_is_retired_as_of_the_audit(shipped):
    retired = [e.describe() for e in endings(shipped, AUDIT_DATE) if e.retired]
    assert retired == []
    named = [*shipped.raw["free"]["models"], *shipped.raw["free"]["frontier"]["models"],
             *shipped.raw["free"]["featured"], shipped.raw["router"]["classifier"]["model"]]
    assert all(mid in shipped.chat_models for mid in named), named


def test_shipped_counts_are_the_spec_counts(shipped):
    """SPEC.md: about 39 chat models, 15 image and 25 video models."""
    chat, image, video = real_entries(shipped)
    assert {"chat": len(chat), "image": len(image), "video": len(video)} == SPEC_COUNTS
    assert {"openai", "anthropic", "google", "xai", "deepseek", "mistral", "together"} == {m.provider for m in chat}


def test_shipped_catalog_check_passes_as_of_the_audit():
    done = catalog_check("--date", AUDIT_DATE.isoformat())
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"as of {AUDIT_DATE}" in done.stdout and "RETIRED" not in done.stdout


# ---- lifecycle fields in the config -------------------------------------------------------

def lifecycle_config(tmp_path, **old) -> Path:
    data = {"storage": f"sqlite:///{tmp_path / 'gw.db'}", "providers": {"demo": {"type": "demo"}},
            "models": {"chat": DEMO_MODELS + [
                {"id": "demo/old", "provider": "demo", **UPSTREAM_PRICES, **old},
                {"id": "demo/new", "provider": "demo", **UPSTREAM_PRICES}]}}
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("old,expected", [
    ({"retires": RETIRES, "replacement": "demo/nwe"},
     "models.chat[1].replacement: 'demo/nwe' is not a chat model in the catalog (did you mean 'demo/new'?)"),
    ({"replacement": "demo/old"}, "models.chat[1].replacement: a model cannot replace itself"),
    ({"retires": "2026-13-01"}, "models.chat[1].retires: expected a date YYYY-MM-DD, got '2026-13-01'"),
    ({"deprecated": RETIRES, "retires": date(2026, 1, 1)}, "retires: 2026-01-01 is before deprecated (2026-12-11)"),
    ({"context_length": 0}, "models.chat[1].context_length: must be more than 0"),
])
def test_lifecycle_mistakes_name_the_key(tmp_path, old, expected):
    with pytest.raises(ConfigError) as info:
        config.load(lifecycle_config(tmp_path, **old), env={})
    assert any(expected in p for p in info.value.problems), info.value.problems


# ---- listings and calls ------------------------------------------------------------------

def upstream_with_a_retiring_model(fake) -> dict:
    return {"providers": {"up": {"type": "openai", "base_url": str(fake.server.make_url("/v1")),
                                 "api_key": "sk-test-upstream"},
                          "nokey": {"type": "openai", "base_url": "http://127.0.0.1:9/v1",
                                    "api_key": "${SURELY_UNSET_KEY_VAR:-}"}},
            "models": {"chat": DEMO_MODELS + [
                {"id": "up/old", "provider": "up", "upstream": "gpt-old", **UPSTREAM_PRICES,
                 "deprecated": date(2026, 6, 1), "retires": RETIRES, "replacement": "up/new"},
                {"id": "nokey/old", "provider": "nokey", **UPSTREAM_PRICES, "retires": RETIRES,
                 "replacement": "up/new"},
                {"id": "up/new", "provider": "up", "upstream": "gpt-new", **UPSTREAM_PRICES,
                 "context_length": 400_000, "max_output_tokens": 128_000}],
                "image": [{"id": "demo/old-image", "provider": "demo", "list_usd_per_image": 0.02,
                           "retires": RETIRES, "replacement": "demo/image"},
                          {"id": "demo/image", "provider": "demo", "list_usd_per_image": 0.02}]}}


async def get(gw, path):
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{gw.url}{path}") as r:
            assert r.status == 200
            return await r.json()


async def test_listings_show_context_output_and_the_end(start_gateway, fake_openai):
    gw = await start_gateway(upstream_with_a_retiring_model(fake_openai))
    chat = {m["id"]: m for m in (await get(gw, "/api/v1/chat/models"))["models"]}
    assert (chat["up/new"]["context_length"], chat["up/new"]["max_output_tokens"]) == (400_000, 128_000)
    assert "deprecation_date" not in chat["up/new"] and "replacement" not in chat["up/new"]
    assert (chat["up/old"]["deprecation_date"], chat["up/old"]["replacement"]) == ("2026-12-11", "up/new")
    assert chat["up/old"]["context_length"] is None          # not documented: shown as unknown
    media = {m["id"]: m for m in (await get(gw, "/api/v1/media/models"))["models"]}
    assert (media["demo/old-image"]["deprecation_date"], media["demo/old-image"]["replacement"]) == \
        ("2026-12-11", "demo/image")


async def test_a_retired_model_answers_410_naming_its_replacement(start_gateway, fake_openai):
    clock = Clock(at(RETIRES) - 1)                 # 23:59:59 UTC the day before
    gw = await start_gateway(upstream_with_a_retiring_model(fake_openai), before_start=clock.install)
    key, account = await gw.key(1)
    client, claude = gw.openai(key), gw.anthropic(key)
    fake_openai.enqueue(Reply(text="still served"))
    last = await client.chat.completions.create(model="up/old", messages=HI)
    assert last.choices[0].message.content == "still served"

    clock.now += 1                                 # the retirement day, from its first second
    balance, ledger, seen = await gw.balance(account), await gw.ledger_sum(account), len(fake_openai.requests)
    calls = [(lambda: client.chat.completions.create(model="up/old", messages=HI), "up/new"),
             (lambda: client.chat.completions.create(model="up/old", messages=HI, stream=True), "up/new"),
             (lambda: client.responses.create(model="up/old", input="hi"), "up/new"),
             (lambda: client.images.generate(model="demo/old-image", prompt="a fox"), "demo/image"),
             (lambda: client.chat.completions.create(model="nokey/old", messages=HI), "up/new")]   # no key: still 410
    for call, replacement in calls:
        with pytest.raises(openai.APIStatusError) as info:
            await call()
        err = info.value
        assert (err.status_code, err.code, err.param) == (410, "model_retired", "model")
        assert err.message.endswith(f"was retired on 2026-12-11; use {replacement!r} instead")
    with pytest.raises(anthropic.APIStatusError) as info:
        await claude.messages.create(model="up/old", max_tokens=100, messages=HI)
    assert info.value.status_code == 410
    assert info.value.body["error"]["message"] == "model 'up/old' was retired on 2026-12-11; use 'up/new' instead"
    assert info.value.response.headers["x-should-retry"] == "false"
    assert len(fake_openai.requests) == seen       # the upstream never saw them
    assert (await gw.balance(account), await gw.ledger_sum(account)) == (balance, ledger)   # no charge, no hold
    fake_openai.enqueue(Reply(text="the replacement"))
    assert (await client.chat.completions.create(model="up/new", messages=HI)).choices[0].message.content \
        == "the replacement"


# ---- gateway run warns at start -----------------------------------------------------------

def test_gateway_run_warns_about_retired_and_retiring_models(tmp_path):
    today = datetime.now(timezone.utc).date()
    data = {"storage": f"sqlite:///{tmp_path / 'gw.db'}", "providers": {"demo": {"type": "demo"}},
            "models": {"chat": [
                {"id": "demo/gone", "provider": "demo", **UPSTREAM_PRICES, "retires": today - timedelta(days=3),
                 "replacement": "demo/current"},
                {"id": "demo/soon", "provider": "demo", **UPSTREAM_PRICES, "retires": today + timedelta(days=10)},
                {"id": "demo/later", "provider": "demo", **UPSTREAM_PRICES, "retires": today + timedelta(days=45)},
                {"id": "demo/current", "provider": "demo", **UPSTREAM_PRICES}]}}
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(data))
    log = tmp_path / "run.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([*GATEWAY, "run", "--config", str(path), "--port", str(free_port())], cwd=tmp_path,
                                stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while "model_retires_soon" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    lines = log.read_text().splitlines()
    retired = [line for line in lines if '"model_retired"' in line]
    soon = [line for line in lines if '"model_retires_soon"' in line]
    assert len(retired) == 1 and '"demo/gone"' in retired[0] and '"demo/current"' in retired[0]
    assert len(soon) == 1 and '"demo/soon"' in soon[0] and '"days_left":10' in soon[0]
    assert "demo/later" not in log.read_text()


# ---- gateway catalog check ----------------------------------------------------------------

def catalog_check(*args, env=None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([*GATEWAY, "catalog", "check", *args], capture_output=True, text=True, timeout=60,
                          cwd=cwd, env={**os.environ, **(env or {})})


def priced_config(tmp_path) -> Path:
    """Models of a provider whose URL genai-prices knows: one at its list price, one not."""
    data = {"providers": {"openai": {"type": "openai", "base_url": "https://api.openai.com/v1", "api_key": ""}},
            "models": {"chat": [
                {"id": "openai/gpt-4o-mini", "provider": "openai", "upstream": "gpt-4o-mini",
                 "list_input_usd_per_mtok": 0.15, "list_output_usd_per_mtok": 0.60},
                {"id": "openai/gpt-4o", "provider": "openai", "upstream": "gpt-4o",
                 "list_input_usd_per_mtok": 3.00, "list_output_usd_per_mtok": 10.00,
                 "retires": date(2027, 1, 14), "replacement": "openai/gpt-4o-mini"},
                {"id": "openai/in-house", "provider": "openai", "upstream": "in-house-model",
                 "list_input_usd_per_mtok": 1, "list_output_usd_per_mtok": 1}]}}
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_catalog_check_exits_1_while_a_retired_model_is_served(tmp_path):
    path = priced_config(tmp_path)
    before = catalog_check("--config", str(path), "--date", "2026-12-20")
    assert before.returncode == 0, before.stderr
    assert "retires soon: chat model openai/gpt-4o retires on 2027-01-14 (in 25 days); use 'openai/gpt-4o-mini' " \
           "instead" in before.stdout
    far = catalog_check("--config", str(path), "--date", "2026-11-01")
    assert far.returncode == 0 and "none retired or retiring within 30 days" in far.stdout
    after = catalog_check("--config", str(path), "--date", "2027-01-14")
    assert after.returncode == 1
    assert "RETIRED: chat model openai/gpt-4o retired on 2027-01-14; use 'openai/gpt-4o-mini' instead" in after.stdout
    assert "1 retired model(s) still served" in after.stdout
    bad = catalog_check("--config", str(path), "--date", "next week")
    assert bad.returncode == 2 and "expected a date YYYY-MM-DD" in bad.stderr


def test_catalog_check_compares_list_prices_with_genai_prices(tmp_path):
    done = catalog_check("--config", str(priced_config(tmp_path)), "--date", "2026-11-23")
    assert done.returncode == 0, done.stderr
    differs = [line for line in done.stdout.splitlines() if line.startswith("price differs")]
    assert len(differs) == 1 and "openai/gpt-4o (gpt-4o): list 3.00/10.00, genai-prices" in differs[0]
    assert "2.50/10.00 USD per million tokens in/out" in differs[0]
    assert ": 2 chat models (1 not in its data)" in done.stdout


def test_catalog_check_without_genai_prices_says_so(tmp_path):
    hidden = tmp_path / "no-genai-prices"
    hidden.mkdir()
    (hidden / "genai_prices.py").write_text("raise ImportError('not installed')\n")
    done = catalog_check("--config", str(priced_config(tmp_path)), "--date", "2026-11-23",
                         env={"PYTHONPATH": os.pathsep.join([str(hidden), str(ROOT)])})
    assert done.returncode == 0, done.stderr
    assert "list prices not compared: install the optional genai-prices package" in done.stdout
    assert "price differs" not in done.stdout
