"""`gateway run --workers N`: N gateway processes serving one port.

The parent only supervises. Each child is a whole gateway (`gateway run` again) that binds
the same host and port with SO_REUSEPORT, so the kernel spreads connections over them,
and shares the configured stores (SQLite in WAL mode on one machine; PostgreSQL and
Redis anywhere).

- SIGTERM or SIGINT to the parent: every child gets one SIGTERM and stops gracefully
  (in-flight calls finish, holds settle), then the parent exits.
- Children never outlive the parent: the kernel sends them SIGTERM if it dies
  (PR_SET_PDEATHSIG), and each child also watches its parent and stops when it is gone.
- Metrics: the children share one prometheus-client multi-process folder, so a scrape of
  any of them answers for all (plugins/metrics/multiproc.py).
- A child that dies is started again. One that fails `MAX_QUICK_FAILURES` times in a row
  within `SETTLE_SECONDS` of its start (an unreachable database, say) stops the whole
  group with its exit code.
"""
from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

import structlog

from .metrics import multiproc

WORKER_OF = "GATEWAY_WORKER_OF"      # set in each child: the supervisor's pid
SETTLE_SECONDS = 5.0                  # a child that dies sooner than this after its start failed to start
MAX_QUICK_FAILURES = 3
STOP_SECONDS = 40.0                   # > the children's own 30 s graceful shutdown
PR_SET_PDEATHSIG = 1

log = structlog.get_logger("workers")


def is_worker() -> bool:
    return WORKER_OF in os.environ


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass                          # elsewhere the child's own parent watch covers it


def reserve_port(host: str, port: int) -> tuple[socket.socket, int]:
    """Hold the port (bound, not listening, SO_REUSEPORT) so port 0 becomes one real port
    that the children share and nobody else takes meanwhile."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock, sock.getsockname()[1]


class Supervisor:
    def __init__(self, argv: list[str], count: int):
        self.argv = argv              # `gateway run ...` for one child, with the real port
        self.count = count
        self.children: dict[int, tuple[subprocess.Popen, float]] = {}
        self.stopping = False
        self.exit_code = 0

    def _start(self, slot: int) -> None:
        env = {**os.environ, WORKER_OF: str(os.getpid()), "GATEWAY_WORKER_SLOT": str(slot)}
        proc = subprocess.Popen([sys.executable, "-c", "import sys, gateway; sys.exit(gateway.main())", *self.argv],
                                env=env, start_new_session=True, preexec_fn=_die_with_parent)
        self.children[slot] = (proc, time.monotonic())
        log.info("worker_started", slot=slot, pid=proc.pid)

    def _stop(self, signum=None, frame=None) -> None:
        if not self.stopping:
            self.stopping = True
            for proc, _ in self.children.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        for slot in range(self.count):
            self._start(slot)
        quick_failures = dict.fromkeys(range(self.count), 0)
        while not self.stopping:
            time.sleep(0.1)
            for slot, (proc, started) in list(self.children.items()):
                code = proc.poll()
                if code is None or self.stopping:
                    continue
                multiproc.worker_gone(proc.pid)
                quick = time.monotonic() - started < SETTLE_SECONDS
                quick_failures[slot] = quick_failures[slot] + 1 if quick else 0
                if quick_failures[slot] >= MAX_QUICK_FAILURES:
                    log.error("worker_keeps_failing", slot=slot, code=code)
                    self.exit_code = code or 1
                    self._stop()
                else:
                    log.warning("worker_died", slot=slot, pid=proc.pid, code=code)
                    time.sleep(0.5 * quick_failures[slot])
                    self._start(slot)
        deadline = time.monotonic() + STOP_SECONDS
        for proc, _ in self.children.values():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("worker_killed", pid=proc.pid)
                proc.kill()
                proc.wait()
        return self.exit_code


def supervise(argv: list[str], count: int, host: str, port: int) -> int:
    """Run `count` children of `gateway <argv> --host H --port P` until told to stop."""
    held, port = reserve_port(host, port)
    try:
        log.info("workers", count=count, host=host, port=port)
        with multiproc.shared_folder():
            return Supervisor([*argv, "--host", host, "--port", str(port)], count).run()
    finally:
        held.close()


async def _watch_parent(interval: float = 0.5) -> None:
    parent = int(os.environ[WORKER_OF])
    while os.getppid() == parent:
        await asyncio.sleep(interval)
    log.warning("supervisor_gone")
    os.kill(os.getpid(), signal.SIGTERM)


async def parent_watch(app):
    """Cleanup context for a child: stop gracefully (as on SIGTERM) once the supervisor is gone."""
    task = asyncio.get_running_loop().create_task(_watch_parent())
    yield
    task.cancel()
