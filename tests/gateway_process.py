"""A real gateway process on loopback, for tests that need one: slow clients against the
real server loop, and crashes (kill -9) at chosen moments."""
from __future__ import annotations

import asyncio
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parent.parent
GATEWAY = [sys.executable, str(ROOT / "gateway.py")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GatewayProcess:
    """`gateway run` with a config written from a dict; `open_files` sets the soft
    open-file limit the process starts with; `env` adds environment variables."""

    def __init__(self, tmp_path: Path, config: dict, *, open_files: int | None = None, env: dict | None = None):
        self.tmp_path, self.port = tmp_path, free_port()
        self.config_path = tmp_path / "gateway.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{self.port}"
        self.open_files, self.env = open_files, env or {}
        self.proc: subprocess.Popen | None = None
        self.log = tmp_path / "gateway.log"

    def cli(self, *args: str) -> str:
        done = subprocess.run([*GATEWAY, *args, "--config", str(self.config_path)], capture_output=True, text=True,
                              timeout=60, cwd=self.tmp_path)
        assert done.returncode == 0, done.stderr
        return done.stdout

    async def start(self, timeout: float = 30) -> "GatewayProcess":
        """Start and wait until it answers (without blocking the loop: fakes in this test
        process must keep answering the gateway while it starts)."""
        limit = self.open_files

        def lower_limit():
            if limit is not None:
                hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
                resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))

        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([*GATEWAY, "run", "--config", str(self.config_path), "--port", str(self.port)],
                                         cwd=self.tmp_path, stdout=log, stderr=log, preexec_fn=lower_limit,
                                         env={**os.environ, **self.env})
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as session:
            while True:
                try:
                    async with session.get(self.url + "/api/v1/models", timeout=aiohttp.ClientTimeout(total=2)):
                        return self
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    assert self.proc.poll() is None, self.log.read_text()[-3000:]
                    assert time.monotonic() < deadline, "the gateway did not become ready"
                    await asyncio.sleep(0.05)

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill9()
