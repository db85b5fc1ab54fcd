"""Several real gateway processes on one database and one Redis, as an operator scales out:
`workers` mode is one `gateway run --workers N` (N processes on one port, SO_REUSEPORT);
`processes` mode is N separate `gateway run`, each on its own port, as on N machines.
Tests drive them over HTTP with the official SDKs and read the database to check money."""
from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import yaml

from plugins import get_plugin_manager
from plugins.accounts import create_account
from plugins.storage import collect_migrations, open_storage
from tests.servers import free_port, stop_process

ROOT = Path(__file__).resolve().parent.parent
GATEWAY = [sys.executable, str(ROOT / "gateway.py")]
MICRO = 1_000_000
FLAT_MICRO = 2000                       # demo/flat: what a call holds is what it costs
MODELS = [
    {"id": "demo/echo", "provider": "demo", "upstream": "demo-echo",
     "list_input_usd_per_mtok": 1.0, "list_output_usd_per_mtok": 2.0},
    {"id": "demo/flat", "provider": "demo", "upstream": "demo-echo", "pricing": "per_request",
     "usd_per_request": FLAT_MICRO / MICRO},
]


class Cluster:
    def __init__(self, folder: Path, *, redis_url: str | None, mode: str, storage: str | None = None, count: int = 4,
                 extra: dict | None = None, lease_seconds: int = 30):
        self.folder, self.mode, self.count = folder, mode, count
        storage = storage or f"sqlite:///{folder / 'gateway.db'}"
        self.storage_url = f"{storage}{'&' if '?' in storage else '?'}lease_seconds={lease_seconds}"
        self._storage = None
        config = {"storage": self.storage_url,
                  "providers": {"demo": {"type": "demo", "stream_delay_seconds": 0.05}},
                  "models": {"chat": MODELS}, **({"redis": redis_url} if redis_url else {}), **(extra or {})}
        self.config = folder / "gateway.yaml"
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))
        self.procs: list[subprocess.Popen | None] = []
        self.ports: list[int] = []
        self._clients: list[openai.AsyncOpenAI] = []

    # ---- life cycle ----------------------------------------------------------------

    def _spawn(self, port: int, *extra: str) -> subprocess.Popen:
        log = open(self.folder / f"gateway-{port}-{len(self.procs)}.log", "ab")
        return subprocess.Popen([*GATEWAY, "run", "--config", str(self.config), "--port", str(port), *extra],
                                cwd=self.folder, stdout=log, stderr=subprocess.STDOUT)

    async def start(self) -> "Cluster":
        if self.mode == "workers":
            self.ports = [free_port()]
            self.procs = [self._spawn(self.ports[0], "--workers", str(self.count))]
        else:
            self.ports = [free_port() for _ in range(self.count)]
            self.procs = [self._spawn(port) for port in self.ports]
        await asyncio.gather(*[self.ready(port) for port in self.ports])
        if self.mode == "workers":
            await self._all_workers_listening()
        return self

    async def ready(self, port: int, timeout: float = 30.0) -> None:
        """Until GET /api/v1/models answers on `port`."""
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient() as http:
            while True:
                try:
                    if (await http.get(f"http://127.0.0.1:{port}/api/v1/models")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                dead = [p for p in self.procs if p is not None and p.poll() is not None]
                assert not dead and time.monotonic() < deadline, self.logs()
                await asyncio.sleep(0.05)

    async def _all_workers_listening(self) -> None:
        deadline = time.monotonic() + 30
        while len(self.serving_pids()) < self.count or not self._listening(self.count):
            assert time.monotonic() < deadline, self.logs()
            await asyncio.sleep(0.05)

    def _listening(self, count: int) -> bool:
        out = subprocess.run(["ss", "-Hltn", f"sport = :{self.ports[0]}"], capture_output=True, text=True).stdout
        return len(out.strip().splitlines()) >= count

    def serving_pids(self) -> list[int]:
        """The processes that serve calls (in workers mode, the supervisor's children)."""
        if self.mode != "workers":
            return [p.pid for p in self.procs if p is not None and p.poll() is None]
        parent = self.procs[0].pid
        try:
            return [int(pid) for pid in Path(f"/proc/{parent}/task/{parent}/children").read_text().split()]
        except OSError:
            return []

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
                         for p in sorted(self.folder.glob("gateway-*.log")))

    async def stop(self) -> None:
        for client in self._clients:
            await client.close()
        if self._storage is not None:
            await self._storage.close()
            self._storage = None          # a check after the stop opens it again
        for proc in self.procs:
            if proc is not None:
                await asyncio.to_thread(stop_process, proc, 45.0)

    # ---- operator ------------------------------------------------------------------

    async def storage(self):
        """The shared database, opened in the test process as the operator's tools open it."""
        if self._storage is None:
            self._storage = await open_storage(self.storage_url, collect_migrations(get_plugin_manager()))
        return self._storage

    async def key(self, credits_micro: int) -> tuple[str, int]:
        """A new account with that many micro-USD of credits -> (key, account id)."""
        account_id, key = await create_account(await self.storage(), "test", credits_micro)
        return key, account_id

    async def scalar(self, sql: str, params: tuple = ()):
        """One value from the shared database (`?` placeholders on every engine)."""
        row = await (await self.storage()).fetchone(sql, params)
        return row[0] if row is not None else None

    async def money(self, account_id: int) -> tuple[int, int]:
        """-> (balance, sum of the ledger) of an account, micro-USD."""
        return (await self.scalar("SELECT balance_micro FROM accounts WHERE id = ?", (account_id,)),
                await self.scalar("SELECT COALESCE(SUM(amount_micro), 0) FROM ledger WHERE account_id = ?",
                                  (account_id,)))

    async def open_holds_by_pid(self) -> dict[int, set[str]]:
        """Open holds (call ids) by the pid of the process that owns them (owner: host:pid:random)."""
        rows = await (await self.storage()).fetchall("SELECT owner, call_id FROM holds WHERE status = 'open'")
        out: dict[int, set[str]] = {}
        for owner, call_id in rows:
            out.setdefault(int(owner.split(":")[-2]), set()).add(call_id)
        return out

    # ---- clients -------------------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    def spread(self, n: int) -> list[str]:
        """`n` base URLs spread evenly over the processes (in workers mode the kernel spreads
        each connection over the workers of the one port)."""
        return list(itertools.islice(itertools.cycle(self.urls), n))

    def clients(self, key: str, count: int = 40) -> list[openai.AsyncOpenAI]:
        """`count` openai clients spread over the processes, each with its own small connection
        pool (one big pool costs the client more CPU than the gateways spend serving)."""
        made = []
        for url in self.spread(count):
            http = httpx.AsyncClient(limits=httpx.Limits(max_connections=25), timeout=60)
            made.append(openai.AsyncOpenAI(base_url=f"{url}/api/v1", api_key=key, max_retries=0, http_client=http))
        self._clients += made
        return made

    def kill9(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)
        for i, proc in enumerate(self.procs):
            if proc is not None and proc.pid == pid:
                proc.wait()
                self.procs[i] = None

    async def restart(self, pid: int) -> None:
        """Start again the process `pid` was (in workers mode the supervisor does it)."""
        if self.mode == "workers":
            deadline = time.monotonic() + 30
            while len(self.serving_pids()) < self.count:
                assert time.monotonic() < deadline, self.logs()
                await asyncio.sleep(0.05)
            return
        slot = self.procs.index(None)
        self.procs[slot] = self._spawn(self.ports[slot])
        await self.ready(self.ports[slot])

