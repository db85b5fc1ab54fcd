"""A gateway process killed with kill -9 while streaming, beside a live one on the same
store: the live process's call is untouched (a restart on the same store included), the
dead process's hold is released once its lease expires, with a usage row saying so."""
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import yaml

from plugins.storage import CRASHED, open_storage
from tests.servers import free_port

ENGINES = ("sqlite", "postgresql")
ROOT = Path(__file__).resolve().parent.parent
GATEWAY = [sys.executable, str(ROOT / "gateway.py")]
LEASE_SECONDS = 2
LONG = [{"role": "user", "content": " ".join(["a long answer please, word by word"] * 3)}]


def start(cfg: Path, cwd: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([*GATEWAY, "run", "--config", str(cfg), "--port", str(port)], cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return proc, port


async def ready(proc: subprocess.Popen, client: openai.AsyncOpenAI) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            await client.models.list()
            return
        except openai.APIConnectionError:
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
            await asyncio.sleep(0.1)


async def test_kill_9_releases_only_the_dead_process_holds_after_their_lease(storage_url, tmp_path):
    url = storage_url + ("&" if "?" in storage_url else "?") + f"lease_seconds={LEASE_SECONDS}"
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(yaml.safe_dump({
        "storage": url, "providers": {"demo": {"type": "demo", "stream_delay_seconds": 0.25}},
        "models": {"chat": [{"id": "demo/echo", "provider": "demo", "list_input_usd_per_mtok": 1,
                             "list_output_usd_per_mtok": 2}]}}))
    made = subprocess.run([*GATEWAY, "keys", "create", "--config", str(cfg), "--credits", "1"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    key = made.stdout.split()[-1]
    procs = []
    try:
        (doomed, port_a), (live, port_b) = start(cfg, tmp_path), start(cfg, tmp_path)
        procs += [doomed, live]
        client_a, client_b = (openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/api/v1", api_key=key,
                                                 max_retries=0) for port in (port_a, port_b))
        await asyncio.gather(ready(doomed, client_a), ready(live, client_b))
        stream_a = await client_a.chat.completions.create(model="demo/echo", stream=True, messages=LONG)
        stream_b = await client_b.chat.completions.create(model="demo/echo", stream=True, messages=LONG)
        await stream_a.__anext__(), await stream_b.__anext__()         # both calls hold money now
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.wait(timeout=10)
        restarted, port_c = start(cfg, tmp_path)                       # a restart on the same store
        procs.append(restarted)
        await ready(restarted, openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port_c}/api/v1", api_key=key))

        store = await open_storage(url, [])
        try:
            text = ""
            async for chunk in stream_b:                                 # ... and the live call finishes
                text += "".join(c.delta.content or "" for c in chunk.choices)
            assert text.endswith("to get real answers.")
            deadline = time.monotonic() + 5 * LEASE_SECONDS + 10
            while await store.fetchone("SELECT 1 FROM holds WHERE status = 'open'") is not None:
                assert time.monotonic() < deadline, "the dead process's hold was never released"
                await asyncio.sleep(0.2)
            rows = await store.fetchall("SELECT outcome, usd_micro, endpoint, model FROM usage ORDER BY outcome")
            assert [(r[0], r[2], r[3]) for r in rows] == [(CRASHED, "chat.completions", "demo/echo"),
                                                          ("ok", "chat.completions", "demo/echo")]
            crashed, ok = rows[0][1], rows[1][1]
            assert crashed == 0 and ok > 0
            statuses = sorted(tuple(r) for r in await store.fetchall("SELECT status, charge_micro FROM holds"))
            assert statuses == [("released", 0), ("settled", ok)]
            account = (await store.fetchone("SELECT id FROM accounts"))[0]
            assert await store.ledger.balance(account) == 1_000_000 - ok == await store.ledger.entries_sum(account)
        finally:
            await store.close()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
