"""`gateway run --workers N` as an operator runs it: N processes on one port, stopped
together and gracefully by SIGTERM to the parent, never outliving it."""
import asyncio
import signal
import subprocess
import time

from tests.cluster import GATEWAY, Cluster


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[1].split()[0] == "Z"      # a zombie has exited
    except OSError:
        return True


async def test_sigterm_to_the_parent_stops_every_worker_after_in_flight_streams(tmp_path):
    c = await Cluster(tmp_path, redis_url=None, mode="workers", count=2).start()
    children = c.serving_pids()
    assert len(children) == 2
    key, account = await c.key(1_000_000)
    client = c.clients(key, count=1)[0]
    try:
        stream = await client.chat.completions.create(model="demo/echo", stream=True,
                                                      messages=[{"role": "user", "content": "a long answer please"}])
        text = ""
        async for chunk in stream:
            if not text:
                c.procs[0].send_signal(signal.SIGTERM)                 # stop while the answer streams
            for choice in chunk.choices:
                text += choice.delta.content or ""
    finally:
        await c.stop()
    assert text.endswith("to get real answers.")                       # the in-flight stream finished
    assert await asyncio.to_thread(c.procs[0].wait, 40) == 0
    assert all(gone(pid) for pid in children)
    assert await c.scalar("SELECT COUNT(*) FROM holds WHERE status = 'open'") == 0
    balance, ledger = await c.money(account)
    await c.stop()                                                     # closes the checks' connection
    assert 0 < balance < 1_000_000 and balance == ledger


async def test_workers_never_outlive_a_killed_parent(tmp_path):
    c = await Cluster(tmp_path, redis_url=None, mode="workers", count=2).start()
    children = c.serving_pids()
    c.kill9(c.procs[0].pid)
    deadline = time.monotonic() + 5
    while not all(gone(pid) for pid in children):
        assert time.monotonic() < deadline, f"workers {children} outlived their parent"
        await asyncio.sleep(0.05)


async def test_a_dead_worker_is_replaced(tmp_path):
    c = await Cluster(tmp_path, redis_url=None, mode="workers", count=2).start()
    try:
        first = c.serving_pids()
        c.kill9(first[0])
        deadline = time.monotonic() + 15
        while not (len(now := c.serving_pids()) == 2 and first[0] not in now):
            assert time.monotonic() < deadline, c.logs()
            await asyncio.sleep(0.1)
        await c.ready(c.ports[0])
    finally:
        await c.stop()


async def test_the_kernel_spreads_connections_over_the_workers(tmp_path):
    c = await Cluster(tmp_path, redis_url=None, mode="workers", count=2).start()
    try:
        key, account = await c.key(1_000_000)
        for client in c.clients(key, count=20):                         # 20 connections, one after another
            await client.chat.completions.create(model="demo/echo", max_tokens=5,
                                                 messages=[{"role": "user", "content": "hi"}])
        # call ids start with a random per-process prefix
        assert await c.scalar("SELECT COUNT(DISTINCT substr(call_id, 1, 12)) FROM usage WHERE account_id = ?",
                        (account,)) == 2
    finally:
        await c.stop()


def test_workers_must_be_a_positive_number(tmp_path):
    out = subprocess.run([*GATEWAY, "run", "--workers", "0"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2 and "--workers: expected a whole number of at least 1" in out.stderr
