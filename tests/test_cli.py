"""The CLI as an operator runs it: create a key, grant credits, run, stop with SIGTERM."""
import asyncio
import os
import signal
import sqlite3
import subprocess
import time

import openai
import pytest
import yaml

from tests.gateway_process import GATEWAY, free_port


@pytest.fixture
def cfg_file(tmp_path):
    data = {"storage": f"sqlite:///{tmp_path / 'gw.db'}",
            "providers": {"demo": {"type": "demo", "stream_delay_seconds": 0.05}},
            "models": {"chat": [{"id": "demo/echo", "provider": "demo", "list_input_usd_per_mtok": 1,
                                 "list_output_usd_per_mtok": 2}]}}
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def cli(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([*GATEWAY, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_keys_create_and_credits_grant(cfg_file, tmp_path):
    out = cli("keys", "create", "--config", str(cfg_file), "--credits", "2.5", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    key = out.stdout.strip().splitlines()[-1]
    assert key.startswith("chk_") and len(key) > 40
    db = sqlite3.connect(tmp_path / "gw.db")
    assert key not in str(db.execute("SELECT * FROM api_keys").fetchall())    # only its hash is stored
    assert db.execute("SELECT balance_micro FROM accounts").fetchone() == (2_500_000,)
    granted = cli("credits", "grant", "--config", str(cfg_file), key, "0.000001", cwd=tmp_path)
    assert granted.returncode == 0 and "balance $2.500001" in granted.stdout
    by_prefix = cli("credits", "grant", "--config", str(cfg_file), key[:12], "1", cwd=tmp_path)
    assert by_prefix.returncode == 0 and "balance $3.500001" in by_prefix.stdout
    assert db.execute("SELECT SUM(amount_micro) FROM ledger").fetchone() == (3_500_001,)
    bad = cli("credits", "grant", "--config", str(cfg_file), key, "1.0000001", cwd=tmp_path)
    assert bad.returncode == 2 and "at most 6 decimals" in bad.stderr
    unknown = cli("credits", "grant", "--config", str(cfg_file), "chk_unknown_key", "1", cwd=tmp_path)
    assert unknown.returncode == 1 and "no account" in unknown.stderr


async def test_run_serves_and_sigterm_finishes_in_flight_streams(cfg_file, tmp_path):
    key = cli("keys", "create", "--config", str(cfg_file), "--credits", "1", cwd=tmp_path).stdout.split()[-1]
    port = free_port()
    proc = subprocess.Popen([*GATEWAY, "run", "--config", str(cfg_file), "--port", str(port)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/api/v1", api_key=key, max_retries=0)
        deadline = time.monotonic() + 30
        while True:                                  # ready when GET /api/v1/models answers
            try:
                assert [m.id async for m in client.models.list()] == ["demo/echo"]
                break
            except openai.APIConnectionError:
                assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
                await asyncio.sleep(0.1)
        stream = await client.chat.completions.create(model="demo/echo", stream=True,
                                                      messages=[{"role": "user", "content": "a long answer please"}])
        text, stopped = "", False
        async for chunk in stream:
            if not stopped:
                os.kill(proc.pid, signal.SIGTERM)     # stop while the answer is still streaming
                stopped = True
            for choice in chunk.choices:
                text += choice.delta.content or ""
        assert text.endswith("to get real answers.")   # the in-flight stream finished
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    db = sqlite3.connect(tmp_path / "gw.db")
    assert db.execute("SELECT COUNT(*) FROM holds WHERE status = 'open'").fetchone() == (0,)
    assert db.execute("SELECT outcome FROM usage").fetchall() == [("ok",)]
    balance, total = db.execute("SELECT balance_micro, (SELECT SUM(amount_micro) FROM ledger) FROM accounts").fetchone()
    assert 0 < balance < 1_000_000 and balance == total


def test_run_without_config_uses_the_embedded_demo(tmp_path):
    port = free_port()
    proc = subprocess.Popen([*GATEWAY, "run", "--port", str(port)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "GATEWAY_DB": str(tmp_path / "d.db"), "OPENAI_API_KEY": ""})
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/api/v1", api_key="unused", max_retries=0)
        for _ in range(300):
            try:
                ids = [m.id for m in client.models.list()]
                break
            except openai.APIConnectionError:
                time.sleep(0.1)
        assert "demo/echo" in ids and "openai/gpt-6-luna" not in ids      # no key: not listed
        assert (tmp_path / "d.db").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_start_up_log_shows_providers_without_their_secrets(tmp_path):
    data = {"storage": f"sqlite:///{tmp_path / 'gw.db'}",
            "providers": {"acme": {"type": "openai", "base_url": "https://acme.example/v1", "api_key": "sk-SECRET-123"}},
            "models": {"chat": [{"id": "acme/m", "provider": "acme", "list_input_usd_per_mtok": 1,
                                 "list_output_usd_per_mtok": 1}]}}
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(data))
    proc = subprocess.Popen([*GATEWAY, "run", "--config", str(path), "--port", str(free_port())], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        deadline = time.monotonic() + 30
        while "starting" not in line and time.monotonic() < deadline:
            line = proc.stderr.readline()
        assert "https://acme.example/v1" in line and "***" in line
        assert "sk-SECRET-123" not in line
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_output_to_a_reader_that_left_is_no_traceback(cfg_file, tmp_path):
    """`gateway check | head -1`: the reader closes the pipe; the command ends quietly."""
    proc = subprocess.Popen([*GATEWAY, "check", "--config", str(cfg_file)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and "Traceback" not in err and "BrokenPipeError" not in err, err
