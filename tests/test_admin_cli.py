"""CLI parity with the admin API, as an operator types it: admin keys, keys for an existing
account, listing and revoking keys, accounts, usage as text and CSV."""
import asyncio
import csv
import io
import subprocess
import time

import aiohttp
import pytest
import yaml

from tests.test_cli import GATEWAY, free_port
from tests.test_x402_upto_crash import start


def run(*args, cwd):
    out = subprocess.run([*GATEWAY, *args], capture_output=True, text=True, timeout=60, cwd=cwd)
    return out.returncode, out.stdout, out.stderr


@pytest.fixture
def cfg(tmp_path):
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump({
        "storage": f"sqlite:///{tmp_path / 'gw.db'}",
        "providers": {"demo": {"type": "demo"}},
        "models": {"chat": [{"id": "demo/echo", "provider": "demo", "list_input_usd_per_mtok": 1,
                             "list_output_usd_per_mtok": 2}]}}))
    return str(path)


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


async def test_keys_accounts_and_usage_from_the_cli(cfg, tmp_path):
    code, out, err = run("keys", "create", "--config", cfg, "--credits", "2", "--name", "Acme", cwd=tmp_path)
    assert code == 0, err
    first = last_line(out)
    code, out, _ = run("keys", "create", "--config", cfg, "--account", "1", "--name", "ci", cwd=tmp_path)
    second = last_line(out)
    assert code == 0 and second.startswith("chk_") and second != first
    assert run("keys", "create", "--config", cfg, "--account", "9", cwd=tmp_path)[0] == 2

    port = free_port()
    proc = await start(cfg, port, tmp_path)
    try:
        # a connection each: the CLI steps in between can outlast the server's keep-alive, and a
        # POST on a connection the server is closing fails in any client
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
            async with s.post(f"http://127.0.0.1:{port}/api/v1/chat/completions",
                              json={"model": "demo/echo", "messages": [{"role": "user", "content": "hi"}]},
                              headers={"Authorization": f"Bearer {second}"}) as r:
                assert r.status == 200
                charged = round((await r.json())["billing"]["usd"] * 1_000_000)

            code, out, _ = run("keys", "list", "--config", cfg, "--account", "1", cwd=tmp_path)
            lines = out.strip().splitlines()[1:]
            assert code == 0 and len(lines) == 2 and first[:12] in lines[0] and second[:12] in lines[1]
            assert f"{charged / 1e6:.6f}" in lines[1] and lines[1].endswith("active")

            code, out, _ = run("keys", "revoke", "--config", cfg, second[:12], cwd=tmp_path)
            assert code == 0 and "revoked" in out
            revoked_at = time.monotonic()
            while True:                                     # another process: its key cache lives a second
                async with s.post(f"http://127.0.0.1:{port}/api/v1/chat/completions",
                                  json={"model": "demo/echo", "messages": [{"role": "user", "content": "hi"}]},
                                  headers={"Authorization": f"Bearer {second}"}) as r:
                    if r.status == 401:
                        break
                assert time.monotonic() - revoked_at < 1.5, "the revoked key still worked after a second"
                await asyncio.sleep(0.1)
    finally:
        proc.kill()
        proc.wait(timeout=10)

    code, out, _ = run("accounts", "list", "--config", cfg, cwd=tmp_path)
    assert code == 0 and "Acme" in out and "1 of 1 accounts" in out
    code, out, _ = run("accounts", "show", "--config", cfg, "1", cwd=tmp_path)
    assert code == 0 and f"spend today      ${charged / 1e6:.6f}" in out and "revoked" in out
    assert run("accounts", "show", "--config", cfg, "7", cwd=tmp_path)[0] == 2
    code, out, _ = run("usage", "--config", cfg, "--account", "1", "--since", "2020-01-01", "--csv", cwd=tmp_path)
    [row] = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and row["model"] == "demo/echo" and row["usd"] == f"{charged / 1e6:.6f}"
    code, _, err = run("usage", "--config", cfg, "--since", "last tuesday", cwd=tmp_path)
    assert code == 2 and "--since" in err


async def test_admin_keys_create_turns_the_admin_api_on(cfg, tmp_path):
    port = free_port()
    proc = await start(cfg, port, tmp_path)
    try:
        # a connection each: the CLI steps in between can outlast the server's keep-alive, and a
        # POST on a connection the server is closing fails in any client
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
            url = f"http://127.0.0.1:{port}/api/v1/admin/accounts"
            async with s.get(url, headers={"Authorization": "Bearer adm_x"}) as r:
                assert r.status == 404                       # no admin credential configured yet
            code, out, _ = run("admin-keys", "create", "--config", cfg, cwd=tmp_path)
            admin = last_line(out)
            assert code == 0 and admin.startswith("adm_")
            async with s.get(url, headers={"Authorization": f"Bearer {admin}"}) as r:
                assert r.status == 200
            async with s.get(url, headers={"Authorization": "Bearer adm_wrong"}) as r:
                assert r.status == 401
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_keys_revoke_with_redis_down_still_revokes_and_warns(cfg, tmp_path):
    """The database change stands; the operator is told the other gateways may take up to the
    cache lifetime (1 s) to see it, in one line, not a traceback."""
    config = yaml.safe_load(open(cfg))
    config["redis"] = f"redis://127.0.0.1:{free_port()}/0"         # nothing listens there
    with open(cfg, "w") as f:
        yaml.safe_dump(config, f)
    code, out, _ = run("keys", "create", "--config", cfg, cwd=tmp_path)
    key = last_line(out)
    assert code == 0 and key.startswith("chk_")

    started = time.monotonic()
    code, out, err = run("keys", "revoke", "--config", cfg, key, cwd=tmp_path)
    assert code == 0 and "revoked at" in out
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith("gateway: warning:") and config["redis"] in err and "up to 1 s" in err
    assert time.monotonic() - started < 30
    code, out, _ = run("keys", "list", "--config", cfg, cwd=tmp_path)
    assert code == 0 and out.strip().splitlines()[-1].endswith("revoked")
