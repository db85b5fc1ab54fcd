"""Real servers the suite starts itself (Redis, PostgreSQL): on loopback, on a free port, in
a temporary folder, stopped after. What every such server shares lives here once: finding
its binary (skip locally with what to install; never skip under CI=true), a free port,
waiting until it accepts connections, and stopping it."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest


def require_binary(name: str, package: str, search: tuple[str, ...] = ()) -> str:
    """The path of `name`, or skip the test saying which Debian package to install (under
    CI=true, fail instead: these tests must run there)."""
    found = shutil.which(name) or next((str(Path(d) / name) for d in search if (Path(d) / name).exists()), None)
    if found:
        return found
    message = f"{name} is not installed: sudo apt-get install {package}"
    if os.environ.get("CI") == "true":
        pytest.fail(message + " (CI=true: this test must run)")
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 15.0) -> None:
    """Until something accepts on 127.0.0.1:port; fails with the server's log if it died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{_tail(log)}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    stop(proc)
    raise RuntimeError(f"server did not listen on {port} within {timeout} s:\n{_tail(log)}")


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"


def stop(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class RedisServer:
    """redis-server (Debian package `redis-server`) with no persistence, in `folder`."""

    def __init__(self, folder: Path):
        binary = require_binary("redis-server", "redis-server")
        self.port = free_port()
        self.log = folder / "redis.log"
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(folder), "--save", "",
             "--appendonly", "no", "--protected-mode", "yes", "--logfile", str(self.log)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_for_port(self.port, self.proc, self.log)
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        stop(self.proc)
