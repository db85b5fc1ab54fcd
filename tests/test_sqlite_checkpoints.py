"""SQLite's WAL checkpoints never hold up a call. On a disk whose syncs are slow (a shim
preloaded into the gateway makes every fsync take SLOW_SYNC_MS), a run of calls long enough
to checkpoint several times (and short of the writer's own checkpoint, which bounds the
WAL) has no call that waited for one, and the calls' rows still reach the database file
itself, not only its WAL."""
from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import subprocess
import threading
import time

import openai
import pytest

from tests.gateway_process import GatewayProcess

SLOW_SYNC_MS = 500     # a call takes a few ms; one that waited for a checkpoint, at least two syncs
CALLS = 150     # 300 commits, about 2,500 WAL pages: SQLite's own checkpoint (every 1,000) would run twice
SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

static void slow(void) {
    const char *ms = getenv("SLOW_SYNC_MS");
    if (ms) usleep(atoi(ms) * 1000);
}
int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    slow();
    return real(fd);
}
int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    slow();
    return real(fd);
}
"""


@pytest.fixture(scope="module")
def slow_sync_shim(tmp_path_factory) -> str:
    """A shared library that slows fsync and fdatasync, built with the system's C compiler."""
    compiler = shutil.which("cc")
    if compiler is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no C compiler: scripts/test installs gcc and libc6-dev")
        pytest.skip("needs a C compiler (Debian: apt-get install gcc libc6-dev)")
    folder = tmp_path_factory.mktemp("shim")
    (folder / "slowsync.c").write_text(SHIM)
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(folder / "slowsync.so"),
                    str(folder / "slowsync.c"), "-ldl"], check=True, capture_output=True, timeout=120)
    return str(folder / "slowsync.so")


def rows_in_database_file(db) -> int:
    """Usage rows in the database file alone: a copy without its WAL beside it."""
    copy = db.parent / "file-only.db"
    shutil.copyfile(db, copy)
    try:
        with sqlite3.connect(copy) as conn:
            return conn.execute("SELECT count(*) FROM usage").fetchone()[0]
    finally:
        copy.unlink()


async def test_no_call_waits_for_a_checkpoint_on_a_slow_disk(tmp_path, slow_sync_shim):
    db = tmp_path / "gw.db"
    gw = GatewayProcess(tmp_path, {
        "storage": f"sqlite:///{db}",
        "providers": {"demo": {"type": "demo"}},
        "models": {"chat": [{"id": "demo/echo", "provider": "demo", "list_input_usd_per_mtok": 1,
                             "list_output_usd_per_mtok": 2}]}},
        env={"LD_PRELOAD": slow_sync_shim, "SLOW_SYNC_MS": str(SLOW_SYNC_MS)})
    key = gw.cli("keys", "create", "--credits", "10").split()[-1]
    await gw.start()
    try:
        client = openai.AsyncOpenAI(base_url=gw.url + "/api/v1", api_key=key, max_retries=0)
        # The first write after start creates the WAL, whose header SQLite syncs once.
        await client.chat.completions.create(model="demo/echo", messages=[{"role": "user", "content": "hi"}])
        slowest = 0.0
        for _ in range(CALLS):
            started = time.monotonic()
            answer = await client.chat.completions.create(model="demo/echo",
                                                          messages=[{"role": "user", "content": "hello"}])
            slowest = max(slowest, time.monotonic() - started)
            assert answer.choices[0].message.content
        assert slowest < SLOW_SYNC_MS / 1000, f"a call waited {slowest:.3f} s: it waited for a sync"

        # Checkpoints ran meanwhile, on their own thread: the rows are in the database file
        # itself (all but those of the last few commits, which the next checkpoint takes).
        deadline = time.monotonic() + 10 * 2 * SLOW_SYNC_MS / 1000
        while (in_file := rows_in_database_file(db)) < CALLS - 20:
            assert time.monotonic() < deadline, f"only {in_file} of {CALLS} rows reached the database file"
            await asyncio.sleep(0.2)
    finally:
        gw.stop()
    assert gw.proc.returncode == 0, gw.log.read_text()[-3000:]


async def test_closing_the_store_stops_its_checkpoint_thread(tmp_path):
    from plugins.storage.sqlite import Engine

    engine = Engine(str(tmp_path / "t.db"))
    await engine.open([("0001_t", "CREATE TABLE t (n INTEGER)")])
    for n in range(100):                 # enough commits to wake the checkpoint thread
        await engine.transaction(lambda conn, n=n: conn.execute("INSERT INTO t VALUES (?)", (n,)))
    assert any(t.name == "sqlite-checkpoint" for t in threading.enumerate())
    await engine.close()
    assert not any(t.name == "sqlite-checkpoint" for t in threading.enumerate())
    with sqlite3.connect(tmp_path / "t.db") as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 100
