"""Real servers for the test suite (PostgreSQL, Redis), started by the suite itself: on
loopback, in a temporary folder, stopped when the session ends. Debian's packages provide them
(`scripts/test` installs them). Locally a missing server skips its tests with a message
saying what to install; under CI=true it fails them instead, so CI never goes green
without them."""
from __future__ import annotations

import asyncio

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unavailable(what: str, install: str) -> None:
    """Skip (locally) or fail (under CI=true): this server is needed and missing."""
    message = f"{what} is not installed: apt-get install {install} (scripts/test does it for you)"
    if IN_CI:
        pytest.fail(message + "; under CI=true these tests must run", pytrace=False)
    pytest.skip(message)


def find_binary(name: str, patterns: list[str]) -> str | None:
    for pattern in patterns:
        found = sorted(glob.glob(pattern), reverse=True)      # the newest version first
        if found:
            return found[0]
    return shutil.which(name)


def wait_for_port(port: int, seconds: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            break
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    detail = log.read_text()[-2000:] if log and log.exists() else ""
    raise RuntimeError(f"server on 127.0.0.1:{port} did not start in {seconds:.0f} s\n{detail}")


def stop_process(proc: subprocess.Popen, seconds: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(seconds)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class PostgresServer:
    """A throwaway PostgreSQL cluster; `fresh_url()` gives each test its own empty store.
    PostgreSQL refuses to run as root, so as root its binaries run as `postgres`."""

    def __init__(self, bindir: str):
        self.bindir = Path(bindir)
        self.dir = Path(tempfile.mkdtemp(prefix="gateway-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.as_user: list[str] = []
        self._count = 0

    def _run(self, *cmd: str) -> None:
        subprocess.run([*self.as_user, *cmd], check=True, capture_output=True, timeout=120)

    def start(self) -> "PostgresServer":
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                  "--no-sync", "-E", "UTF8")
        options = (f"-p {self.port} -h 127.0.0.1 -k {self.dir} -c fsync=off -c synchronous_commit=off "
                   "-c full_page_writes=off -c max_connections=400")
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-o", options, "-l",
                  str(self.dir / "server.log"), "-w", "-t", "60", "start")
        wait_for_port(self.port, 30, log=self.dir / "server.log")
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    async def fresh_url(self) -> str:
        """A URL whose tables are all new: a schema of its own, put first on the search
        path (much cheaper than a database per test, and just as isolated)."""
        import asyncpg
        self._count += 1
        schema = f"test_{os.getpid()}_{self._count}"
        conn = await asyncpg.connect(self.url())
        try:
            await conn.execute(f'CREATE SCHEMA "{schema}"')
        finally:
            await conn.close()
        return self.url() + f"?search_path={schema}"

    def stop(self) -> None:
        try:
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def _user_exists(name: str) -> bool:
    import pwd
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


async def stats_once_quiet(url: str, query: str):
    """`query`'s value on `url` once every other session of its database has ended: a session
    reports its counts (commits, index scans) when it ends, or only from time to time before."""
    import asyncpg
    conn = await asyncpg.connect(url)
    try:
        for _ in range(200):
            others = await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                         "AND pid <> pg_backend_pid()")
            if others == 0:
                break
            await asyncio.sleep(0.05)
        return await conn.fetchval(query)
    finally:
        await conn.close()


def postgres_bindir() -> str | None:
    initdb = find_binary("initdb", ["/usr/lib/postgresql/*/bin/initdb"])
    return str(Path(initdb).resolve().parent) if initdb else None


@pytest.fixture(scope="session")
def postgres_server():
    """One PostgreSQL server for the whole session (skips or fails if not installed)."""
    bindir = postgres_bindir()
    if bindir is None or (os.geteuid() == 0 and not _user_exists("postgres")):
        unavailable("PostgreSQL", "postgresql")
    server = PostgresServer(bindir).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def postgres_url(postgres_server) -> str:
    """A fresh, empty store on the session's server."""
    return await postgres_server.fresh_url()


class RedisServer:
    """redis-server with no persistence (no RDB snapshots, no AOF) in its own folder."""

    def __init__(self, folder: Path):
        binary = find_binary("redis-server", [])
        if binary is None:
            unavailable("Redis", "redis-server")
        self.port = free_port()
        log = folder / "redis.log"
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(folder), "--save", "",
             "--appendonly", "no", "--logfile", str(log)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            wait_for_port(self.port, 15, self.proc, log)
        except RuntimeError:
            self.stop()
            raise
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        stop_process(self.proc)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """One Redis for the whole session (skips or fails if not installed)."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server) -> str:
    """The session's Redis, emptied for this test."""
    import redis
    with redis.Redis.from_url(redis_server.url) as client:
        client.flushall()
    return redis_server.url
