"""Instructions per call: a measure of CPU cost that does not drift with the machine's load.

`.venv/bin/python bench/instructions.py [--calls 1000] [--concurrency 20] [--lanes 1,2] [--log-level warning] [--chunk-delay 0.01]`

CPU time per call (bench/run.py) is what users feel, but on a shared machine it moves by
tens of percent from one run to the next, which hides a change worth 3%. Here the server
under test runs under valgrind's callgrind, which counts the instructions it executes; the
count for a fixed number of calls repeats to within a fraction of a percent, so a small
change can be measured before and after, even while other work runs. It does not see cache
misses, system-call time or waiting, so confirm a change that matters with bench/run.py.

For each lane the null proxy (the floor) and the gateway each serve `--calls` calls after a
warm-up; the count starts after the warm-up. `--log-level warning` runs the gateway without
its per-call log line: the difference to a run at the default level is what that line costs.
Needs Debian's `valgrind`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from run import BODIES, LANES, PY, ROOT, free_port, gateway_config, wait_ready  # noqa: E402

WARM_UP = 100


async def drive(url: str, body: dict, key: str, calls: int, concurrency: int) -> int:
    """Send `calls` requests, `concurrency` at a time; -> how many came back 200."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    data = json.dumps(body).encode()
    queue = iter(range(calls))
    ok = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal ok
        for _ in queue:
            async with session.post(url, data=data, headers=headers) as resp:
                await resp.read()
                ok += resp.status == 200

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return ok


def counted(cmd: list[str], ready: str, url: str, body: dict, key: str, calls: int, concurrency: int,
            work: Path) -> float:
    """Start `cmd` under callgrind with counting off, warm it up, count `calls` calls:
    -> instructions per call."""
    out = work / f"callgrind.{time.monotonic_ns()}"
    proc = subprocess.Popen(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
                             *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=work)
    try:
        wait_ready(ready, b"{}", seconds=300)
        asyncio.run(drive(url, body, key, WARM_UP, concurrency))
        subprocess.run(["callgrind_control", "--zero", str(proc.pid)], capture_output=True, check=True)
        subprocess.run(["callgrind_control", "--instr=on", str(proc.pid)], capture_output=True, check=True)
        ok = asyncio.run(drive(url, body, key, calls, concurrency))
        subprocess.run(["callgrind_control", "--dump", str(proc.pid)], capture_output=True, check=True)
        if ok != calls:
            raise RuntimeError(f"{ok} of {calls} calls succeeded")
    finally:
        proc.terminate()
        proc.wait(120)
    dumps = sorted(work.glob(out.name + "*"), key=lambda p: p.stat().st_mtime)
    totals = [line for line in dumps[0].read_text().splitlines() if line.startswith(("summary:", "totals:"))]
    return int(totals[0].split()[1]) / calls


def gateway_command(cfg: Path, port: int, log_level: str) -> list[str]:
    """`gateway run` as counted: the bench's config, a port and the log level."""
    return [PY, str(ROOT / "gateway.py"), "run", "--config", str(cfg), "--port", str(port), "--log-level", log_level]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=1000, help="counted calls per lane")
    p.add_argument("--concurrency", type=int, default=20)
    p.add_argument("--lanes", default="1,2", help="lanes of bench/run.py to count (1-4)")
    p.add_argument("--storage", default="", help="gateway storage URL (default: SQLite in a temporary folder)")
    p.add_argument("--redis", default="", help="gateway Redis URL (default: none)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                   help="the gateway's --log-level (warning: no per-call log line)")
    p.add_argument("--chunk-delay", type=float, default=0.0,
                   help="seconds the fake upstream waits between stream chunks (0: a stream's chunks are written "
                        "at once and arrive in about one read; 0.01 with a low --concurrency: one chunk a read, "
                        "as a model sends them while it generates)")
    return p.parse_args(argv)


def main() -> int:
    args = parse_args()
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        print("instructions: needs valgrind (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="gateway-instructions-"))
    up = free_port()
    upstream = subprocess.Popen([PY, str(HERE / "fake_upstream.py"), "--port", str(up), "--chunks", "20",
                                 "--delay", str(args.chunk_delay)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    try:
        wait_ready(f"http://127.0.0.1:{up}/v1/chat/completions", b"{}")
        cfg = gateway_config(work, up, storage=args.storage or None, redis=args.redis or None)
        key = subprocess.run([PY, str(ROOT / "gateway.py"), "keys", "create", "--config", str(cfg), "--credits",
                              "1000000"], capture_output=True, text=True, check=True).stdout.split()[-1]
        for name, path, body, keyed, _ in [lane for lane in LANES if lane[0].split()[0] in args.lanes.split(",")]:
            floor = None
            if body in ("chat", "chat_stream"):
                port = free_port()
                floor = counted([PY, str(HERE / "null_proxy.py"), "--port", str(port), "--upstream",
                                 f"http://127.0.0.1:{up}/v1/chat/completions"],
                                f"http://127.0.0.1:{port}/api/v1/chat/completions", f"http://127.0.0.1:{port}{path}",
                                BODIES[body], "", args.calls, args.concurrency, work)
            port = free_port()
            gateway = counted(gateway_command(cfg, port, args.log_level),
                              f"http://127.0.0.1:{port}/api/v1/models", f"http://127.0.0.1:{port}{path}",
                              BODIES[body], key if keyed else "", args.calls, args.concurrency, work)
            rows.append((name, floor, gateway))
            print(f"  {name}: null {floor and round(floor)}, gateway {round(gateway)}", file=sys.stderr)
    finally:
        upstream.terminate()
        shutil.rmtree(work, ignore_errors=True)
    print(f"| lane | null proxy instructions/call | gateway instructions/call | ÷ null |  "
          f"({args.calls} calls, concurrency {args.concurrency}, log level {args.log_level}"
          f"{f', {args.chunk_delay} s between stream chunks' if args.chunk_delay else ''})")
    print("|---|---|---|---|")
    for name, floor, gateway in rows:
        print(f"| {name} | {f'{floor:,.0f}' if floor else '-'} | {gateway:,.0f} | "
              f"{f'{gateway / floor:.2f}x' if floor else '-'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
