"""The dashboard in a real browser (headless Chromium from the system, driven by
Playwright): the operator signs in, creates an account and a key, a call is made with that
key through the openai SDK, and the page shows the call and the new balance; the account
holder signs in, sees the same, creates and revokes a key, and the next call with the
revoked key is refused. Screenshots of each view are saved (SCREENSHOTS_DIR, or the
test's own temporary folder)."""
import os
import shutil
from pathlib import Path

import aiohttp
import openai
import pytest

ADMIN_KEY = "adm_dashboard-test-admin-key"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
HELLO = [{"role": "user", "content": "Hello from the dashboard test"}]

try:
    from playwright.async_api import async_playwright
except ImportError:                    # pragma: no cover - the test extra installs it
    async_playwright = None

if os.environ.get("CI") != "true" and (CHROMIUM is None or async_playwright is None):
    pytest.skip("browser tests need Chromium (apt-get install chromium) and playwright (the test extra)",
                allow_module_level=True)


@pytest.fixture
def shots(tmp_path) -> Path:
    folder = Path(os.environ.get("SCREENSHOTS_DIR") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
async def browser():
    assert CHROMIUM, "Chromium is not installed: apt-get install chromium"
    async with async_playwright() as p:
        chrome = await p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        yield chrome
        await chrome.close()


@pytest.fixture
async def ops(start_gateway, monkeypatch):
    monkeypatch.setenv("GATEWAY_ADMIN_KEY", ADMIN_KEY)
    return await start_gateway()


async def new_page(browser, gw):
    page = await browser.new_page(viewport={"width": 1200, "height": 900})
    page.on("dialog", lambda dialog: dialog.accept())          # "Revoke this key?" -> yes
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    await page.goto(f"{gw.url}/dashboard")
    return page, errors


async def sign_in(page, key: str) -> None:
    await page.fill("#sign-in-key", key)
    await page.click("#sign-in-form button")


async def test_operator_creates_an_account_and_sees_its_call(ops, browser, shots):
    page, errors = await new_page(browser, ops)
    await sign_in(page, ADMIN_KEY)
    await page.wait_for_selector("[data-testid=accounts]")

    await page.fill("[data-testid=create-account] input[name=name]", "Acme Robotics")
    await page.fill("[data-testid=create-account] input[name=credits_usd]", "5")
    await page.click("[data-testid=create-account] button")
    await page.wait_for_selector("[data-testid=account-name]")
    assert await page.inner_text("[data-testid=balance]") == "$5.00"
    await page.fill("[data-testid=create-key] input[name=name]", "robot-1")
    await page.click("[data-testid=create-key] button")
    key = (await page.inner_text("[data-testid=new-key]")).strip()
    assert key.startswith("chk_")

    reply = await ops.openai(key).chat.completions.create(model="demo/echo", messages=HELLO)
    await page.click("[data-testid=refresh]")
    await page.wait_for_selector("[data-testid=calls] td:has-text('demo/echo')")
    balance = await page.inner_text("[data-testid=balance]")
    assert balance == f"${5 - reply.billing['usd']:.6f}".rstrip("0")
    await page.screenshot(path=str(shots / "operator-account.png"), full_page=True)
    assert "undefined" not in await page.inner_text("main")
    await page.click("text=All accounts")
    await page.wait_for_selector("[data-testid=by-model] td:has-text('demo/echo')")
    assert await page.locator("[data-testid=usage-chart] rect").count() == 1
    assert "Acme Robotics" in await page.inner_text("[data-testid=accounts]")
    await page.screenshot(path=str(shots / "operator-accounts.png"), full_page=True)
    assert errors == []


async def test_account_holder_sees_the_call_and_revokes_a_key(ops, browser, shots):
    key, account = await ops.key(3)
    await ops.openai(key).chat.completions.create(model="demo/echo", messages=HELLO)
    page, errors = await new_page(browser, ops)
    await sign_in(page, key)
    await page.wait_for_selector("[data-testid=calls] td:has-text('demo/echo')")
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{ops.url}/api/v1/account", headers={"Authorization": f"Bearer {key}"}) as r:
            balance = (await r.json())["balance_usd"]
    assert await page.inner_text("[data-testid=balance]") == f"${balance:.6f}".rstrip("0")
    assert await page.locator("[data-testid=usage-chart] rect").count() == 1

    await page.fill("[data-testid=create-key] input[name=name]", "spare")
    await page.click("[data-testid=create-key] button")
    spare = (await page.inner_text("[data-testid=new-key]")).strip()
    await ops.openai(spare).chat.completions.create(model="demo/echo", messages=HELLO)
    await page.screenshot(path=str(shots / "account.png"), full_page=True)
    assert "undefined" not in await page.inner_text("main")

    await page.click(f"[data-testid='revoke-{spare[:12]}']")
    await page.wait_for_selector("text=revoked")
    with pytest.raises(openai.AuthenticationError):
        await ops.openai(spare).chat.completions.create(model="demo/echo", messages=HELLO)
    assert errors == []


async def test_a_wrong_key_is_refused_and_nothing_is_kept(ops, browser):
    page, _ = await new_page(browser, ops)
    await sign_in(page, "chk_not-a-real-key")
    await page.wait_for_selector("#sign-in-error:has-text('not accepted')")
    assert await page.evaluate("sessionStorage.length") == 0
    assert await page.evaluate("document.cookie") == ""


async def test_the_page_is_served_with_a_strict_policy(ops):
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{ops.url}/dashboard") as r:
            csp = r.headers["Content-Security-Policy"]
            assert r.status == 200 and "default-src 'none'" in csp and "script-src 'self'" in csp
            assert "frame-ancestors 'none'" in csp and r.headers["X-Frame-Options"] == "DENY"
        async with s.get(f"{ops.url}/dashboard/assets/../../config/gateway.yaml") as r:
            assert r.status == 404
