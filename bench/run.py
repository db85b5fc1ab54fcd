"""The benchmark, in one command: `.venv/bin/python bench/run.py [--seconds 3] [--repeats 3]`.

Everything runs on loopback. The servers under test (the null proxy and the gateway, both up
for the whole run, each idle while the other is loaded) are pinned to core 0; the fake
upstream and the load generators share core 1. The headline is CPU time per request of the
server process, read from the kernel's process accounting over a fixed-length load. Absolute
numbers drift on shared machines by tens of percent from one minute to the next, so every
figure is a ratio to a reference measured beside it: each measurement runs in rounds, the
reference (the null proxy; for a translation lane the gateway's same-format lane) then the
subject, and the ratio reported is the median of the rounds' ratios, with their range.

Lanes: (1) chat completions, JSON, with a key; (2) the same, streamed; (3) messages
client to the OpenAI-format upstream (translation); (4) responses, streamed; (5) the 402
challenge of a keyless call. Needs Debian's `wrk` (apt-get install wrk) and `taskset`.

Scale-out stores (`--stores`): lanes 1 and 2 again with the gateway on PostgreSQL + Redis
(one process; both servers started here, on the load core, from Debian's `postgresql` and
`redis-server`; their own CPU per request is reported beside the gateway's), and with
`gateway run --workers 2` on SQLite and on PostgreSQL + Redis (the workers may use both cores,
so they compete with the load generator; their CPU is summed). Each store gets its own memory
soak. Lane 1 runs once more with `--log-level warning` to price the per-call log line.
The run ends with the issue's targets, each as a ratio to the same run's null proxy.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from lanes import BODIES, LANES, TRANSLATED   # (bench/ is the script's folder: on the path)
from report import store_table, table, targets

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PY = sys.executable
TICK = os.sysconf("SC_CLK_TCK")
SERVER_CORE, LOAD_CORE = "0", "1"
GAP_SECONDS = 0.01        # the slow upstream's pause between chunks, for the relay check



def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], core: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(["taskset", "-c", core, *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)


def wait_ready(url: str, body: bytes | None = None, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}),
                                   timeout=2)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK       # utime + stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def parse(out: str) -> dict:
    line = next(l for l in out.splitlines() if l.startswith("BENCH_JSON "))
    return json.loads(line[len("BENCH_JSON "):])


def load(url: str, body: dict, key: str, concurrency: int, seconds: float, streaming: bool) -> dict:
    if streaming:
        cmd = [PY, str(HERE / "stream_client.py"), url, json.dumps(body), key, str(concurrency), str(seconds)]
        out = subprocess.run(["taskset", "-c", LOAD_CORE, *cmd], capture_output=True, text=True, check=True).stdout
        return parse(out)
    env = {**os.environ, "BENCH_BODY": json.dumps(body), "BENCH_KEY": key}
    cmd = ["taskset", "-c", LOAD_CORE, "wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s", "--latency",
           "-s", str(HERE / "post.lua"), url]
    result = parse(subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout)
    result["rps"] = result["requests"] / (result["duration_us"] / 1e6)
    return result


def server_pids(pid: int) -> list[int]:
    """The process serving, or with --workers its children (the supervisor itself idles)."""
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        children = []
    return children or [pid]


def measured(pid: int, fn, side: dict[str, list[int]] | None = None) -> dict:
    """Run fn (one load) and add the CPU ms per request of the server, and of each side process
    (the database, Redis) under its own name."""
    pids = server_pids(pid)
    side = {name: [p for p in ps if Path(f"/proc/{p}").exists()] for name, ps in (side or {}).items()}
    before = sum(map(cpu_seconds, pids))
    side_before = {name: sum(map(cpu_seconds, ps)) for name, ps in side.items()}
    result = fn()
    n = max(1, result["requests"])
    result["cpu_ms"] = (sum(map(cpu_seconds, pids)) - before) * 1000 / n
    for name, ps in side.items():
        alive = [p for p in ps if Path(f"/proc/{p}").exists()]
        result[f"{name}_cpu_ms"] = (sum(map(cpu_seconds, alive)) - side_before[name]) * 1000 / n
    return result


def process_tree(pid: int) -> list[int]:
    """pid and every descendant (PostgreSQL forks a backend per connection)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children") if Path(f"/proc/{p}").exists() else []:
            todo.extend(int(c) for c in task.read_text().split())
    return out


def gateway_config(directory: Path, upstream: int, slow: int | None = None, storage: str | None = None,
                   redis: str | None = None) -> Path:
    price = {"list_input_usd_per_mtok": 0.15, "list_output_usd_per_mtok": 0.6}
    cfg = {"storage": storage or f"sqlite:///{directory / 'bench.db'}", **({"redis": redis} if redis else {}),
           "providers": {"up": {"type": "openai", "base_url": f"http://127.0.0.1:{upstream}/v1", "api_key": "bench"},
                         "slow": {"type": "openai", "base_url": f"http://127.0.0.1:{slow or upstream}/v1",
                                  "api_key": "bench"}},
           "models": {"chat": [{"id": "bench/gpt", "provider": "up", "upstream": "gpt-4o-mini", **price},
                               {"id": "bench/slow", "provider": "slow", "upstream": "gpt-4o-mini", **price}]},
           "limits": {"per_key": {"rpm": 10 ** 9, "tpm": 10 ** 12}, "per_address": {"rpm": 10 ** 9}},
           "moderation": {"rules": [{"category": "example", "patterns": ["(?i)\\bexample banned phrase\\b"]}]},
           "payments": {"x402": {"facilitator": {"url": "http://127.0.0.1:9"}, "chains": [
               {"type": "evm", "network": "eip155:8453", "pay_to": "0x" + "ab" * 20,
                "assets": [{"symbol": "USDC", "address": "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
                            "decimals": 6, "eip712": {"name": "USD Coin", "version": "2"}}]}]}}}
    path = directory / "bench.yaml"
    path.write_text(json.dumps(cfg))          # JSON is YAML
    return path


class Server:
    """A server under test: where it listens, the pid whose CPU is read, the key its lanes send,
    and side processes (the database, Redis) whose CPU is reported beside it."""

    def __init__(self, base: str, pid: int, key: str = "", side: dict | None = None):
        self.base, self.pid, self.key, self.side = base, pid, key, side or {}

    def warm(self, lane, c: int) -> None:
        name, path, body, keyed, streaming = lane
        load(self.base + path, BODIES[body], self.key if keyed else "", c, 1.0, streaming)

    def run(self, lane, c: int, seconds: float) -> dict:
        name, path, body, keyed, streaming = lane
        pids = {k: fn() for k, fn in self.side.items()}
        r = measured(self.pid, lambda: load(self.base + path, BODIES[body], self.key if keyed else "", c, seconds,
                                            streaming), pids)
        if streaming:     # for streams, latency means time to first byte
            r.update(rps=r["requests"] / seconds, p50_us=r["ttfb_p50_ms"] * 1000, p99_us=None)
        return r


def summarise(pairs: list[tuple[dict, dict]]) -> dict:
    """Rounds of (subject, reference) measured back to back -> the subject's median round (by CPU),
    the reference's, and the median of the per-round ratios with their range. A ratio taken within
    a round cancels the machine's drift between rounds, which moves both sides alike."""
    def middle(runs: list[dict]) -> dict:
        return sorted(runs, key=lambda r: r["cpu_ms"])[len(runs) // 2]
    cpu = sorted(s["cpu_ms"] / r["cpu_ms"] for s, r in pairs)
    return {"subject": middle([s for s, _ in pairs]), "reference": middle([r for _, r in pairs]),
            "cpu_ratio": statistics.median(cpu), "cpu_range": (cpu[0], cpu[-1]),
            "rps_ratio": statistics.median(s["rps"] / r["rps"] for s, r in pairs),
            "p50_added_us": statistics.median(s["p50_us"] - r["p50_us"] for s, r in pairs)}


def paired(subject: Server, lane, reference: Server, reference_lane, c: int, seconds: float, repeats: int) -> dict:
    """`repeats` rounds of the reference and the subject back to back, each warmed once (see
    summarise). The order alternates (reference first, then subject first, ...) so that a drift
    within a round favours neither side."""
    reference.warm(reference_lane, c)
    subject.warm(lane, c)
    pairs = []
    for round_ in range(repeats):
        if round_ % 2 == 0:
            r = reference.run(reference_lane, c, seconds)
            s = subject.run(lane, c, seconds)
        else:
            s = subject.run(lane, c, seconds)
            r = reference.run(reference_lane, c, seconds)
        pairs.append((s, r))
    out = summarise(pairs)
    print(f"  {lane[0]} c={c}: x{out['cpu_ratio']:.2f} CPU (rounds {out['cpu_range'][0]:.2f}-"
          f"{out['cpu_range'][1]:.2f}) {out['subject']}", file=sys.stderr)
    return out


def soak(base: str, pid: int, key: str, total: int) -> tuple[float, float, int]:
    """RSS of the serving processes (summed over workers) before and after `total` calls."""
    load(base + "/api/v1/chat/completions", BODIES["chat"], key, 50, 3, False)      # warm-up
    pids = server_pids(pid)
    before, done = sum(map(rss_mb, pids)), 0
    while done < total:
        done += load(base + "/api/v1/chat/completions", BODIES["chat"], key, 50, 10, False)["requests"]
    return before, sum(map(rss_mb, pids)), done


def start_gateway(work: Path, cfg: Path, core: str, *extra: str) -> tuple[subprocess.Popen, str, str]:
    """-> (process, base URL, a key with plenty of credits)."""
    key = subprocess.run([PY, str(ROOT / "gateway.py"), "keys", "create", "--config", str(cfg),
                          "--credits", "1000000"], capture_output=True, text=True, check=True).stdout.split()[-1]
    port = free_port()
    proc = start([PY, str(ROOT / "gateway.py"), "run", "--config", str(cfg), "--port", str(port), *extra], core, cwd=work)
    wait_ready(f"http://127.0.0.1:{port}/api/v1/models")
    time.sleep(1.0)                                  # every worker listening
    return proc, f"http://127.0.0.1:{port}", key


def scale_out(stores: list[str], up: int, null: Server, levels, seconds: float, repeats: int,
              soak_total: int) -> tuple[dict, dict]:
    """Lanes 1 and 2 on each scale-out store, each paired with the null proxy:
    ({store: results}, {store: soak})."""
    sys.path.insert(0, str(ROOT))
    from tests.servers import PostgresServer, RedisServer, postgres_bindir
    out: dict[str, dict] = {}
    soaks: dict[str, tuple] = {}
    for store in stores:
        work = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
        servers, extra, core, storage, redis, side = [], [], SERVER_CORE, None, None, {}
        parts = store.removesuffix("-workers2").split("+")   # e.g. postgresql+redis, sqlite+redis, sqlite-workers2
        if "postgresql" in parts:
            pg = PostgresServer(postgres_bindir()).start()
            servers.append(pg)
            storage = pg.url()
            pin(_pg_pid(pg))                         # the databases share the load generator's core
            side["postgresql"] = lambda pg=pg: process_tree(_pg_pid(pg))
        if "redis" in parts:
            rs = RedisServer(work)
            servers.append(rs)
            redis = rs.url
            pin(rs.proc.pid)
            side["redis"] = lambda rs=rs: [rs.proc.pid]
        if store.endswith("-workers2"):
            extra, core = ["--workers", "2"], f"{SERVER_CORE},{LOAD_CORE}"
        print(f"gateway on {store}", file=sys.stderr)
        proc = None
        try:
            proc, base, key = start_gateway(work, gateway_config(work, up, storage=storage, redis=redis), core, *extra)
            gateway = Server(base, proc.pid, key, side)
            out[store] = {(lane[0], c): paired(gateway, lane, null, lane, c, seconds, repeats)
                          for lane in LANES[:2] for c in levels}
            if soak_total:
                soaks[store] = soak(base, proc.pid, key, soak_total)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(60)
            for server in servers:
                server.stop()
    return out, soaks


def pin(pid: int) -> None:
    subprocess.run(["taskset", "-a", "-p", "-c", LOAD_CORE, str(pid)], capture_output=True)


def _pg_pid(pg) -> int:
    """The postmaster's pid (backends it forks later inherit its core)."""
    return int((pg.data / "postmaster.pid").read_text().split()[0])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=3, help="length of each measured run")
    p.add_argument("--repeats", type=int, default=3, help="rounds of each measurement beside its reference")
    p.add_argument("--levels", default="1,50,200", help="concurrency levels")
    p.add_argument("--soak", type=int, default=100_000, help="requests for the memory soak (0 to skip)")
    p.add_argument("--lanes", default="1,2,3,4,5", help="which lanes to run")
    p.add_argument("--stores", default="postgresql+redis,postgresql+redis-workers2,sqlite-workers2",
                   help="scale-out stores for lanes 1 and 2 ('' to skip): postgresql+redis, sqlite-workers2, "
                        "postgresql+redis-workers2, sqlite+redis, postgresql")
    args = p.parse_args()
    if not shutil.which("wrk") or not shutil.which("taskset"):
        print("bench: needs wrk and taskset (Debian: apt-get install wrk util-linux)", file=sys.stderr)
        return 2
    levels = [int(x) for x in args.levels.split(",")]
    chosen = [lane for lane in LANES if lane[0].split()[0] in args.lanes.split(",")]
    if any(name in TRANSLATED for name, *_ in chosen):      # a translated lane is measured beside its base
        chosen = [lane for lane in LANES if lane in chosen or lane[0] in
                  {TRANSLATED[name] for name, *_ in chosen if name in TRANSLATED}]
    procs: list[subprocess.Popen] = []
    try:
        up, slow = free_port(), free_port()
        procs.append(start([PY, str(HERE / "fake_upstream.py"), "--port", str(up), "--chunks", "20"], LOAD_CORE))
        procs.append(start([PY, str(HERE / "fake_upstream.py"), "--port", str(slow), "--chunks", "10",
                            "--delay", str(GAP_SECONDS)], LOAD_CORE))
        wait_ready(f"http://127.0.0.1:{up}/v1/chat/completions", b"{}")
        wait_ready(f"http://127.0.0.1:{slow}/v1/chat/completions", b"{}")

        # The null proxy stays up for the whole run (idle between its rounds) on the gateway's core.
        np_port = free_port()
        null_proc = start([PY, str(HERE / "null_proxy.py"), "--port", str(np_port),
                           "--upstream", f"http://127.0.0.1:{up}/v1/chat/completions"], SERVER_CORE)
        procs.append(null_proc)
        wait_ready(f"http://127.0.0.1:{np_port}/api/v1/chat/completions", b"{}")
        null = Server(f"http://127.0.0.1:{np_port}", null_proc.pid)

        print("gateway, each lane in rounds beside its reference", file=sys.stderr)
        work = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
        cfg = gateway_config(work, up, slow)
        gw_proc, gw_base, key = start_gateway(work, cfg, SERVER_CORE)
        procs.append(gw_proc)
        gateway = Server(gw_base, gw_proc.pid, key)
        by_name = {lane[0]: lane for lane in LANES}
        gw = {}
        for lane in chosen:
            for c in levels:
                if lane[0] in TRANSLATED:
                    gw[(lane[0], c)] = paired(gateway, lane, gateway, by_name[TRANSLATED[lane[0]]], c, args.seconds,
                                              args.repeats)
                else:
                    gw[(lane[0], c)] = paired(gateway, lane, null, LANES[1] if lane[4] else LANES[0], c, args.seconds,
                                              args.repeats)
        relay = load(f"{gw_base}/api/v1/chat/completions",
                     {**BODIES["chat_stream"], "model": "bench/slow"}, key, 1, 3, True)

        log_line = None
        if LANES[0] in chosen:
            print("gateway with the per-call line, in rounds beside one at --log-level warning", file=sys.stderr)
            quiet_proc, quiet_base, quiet_key = start_gateway(work, cfg, SERVER_CORE, "--log-level", "warning")
            procs.append(quiet_proc)
            log_line = paired(gateway, LANES[0], Server(quiet_base, quiet_proc.pid, quiet_key), LANES[0], levels[-1],
                              args.seconds, args.repeats)
            quiet_proc.terminate()
        soaked = soak(gw_base, gw_proc.pid, key, args.soak) if args.soak else (1, 1, 0)
        gw_proc.terminate()
        gw_proc.wait(60)
        more, soaks = scale_out([x for x in args.stores.split(",") if x], up, null, levels, args.seconds,
                                args.repeats, args.soak)
    finally:
        for proc in procs:
            proc.terminate()
    print(table(gw, levels, soaked))
    if more:
        print()
        print(store_table(more, levels, soaks))
    print()
    print(targets(gw, log_line, more, soaked, soaks, levels))
    print(f"Chunk relay: upstream sends a chunk every {GAP_SECONDS * 1000:.0f} ms; the client saw a median gap of "
          f"{relay['gap_p50_ms']:.1f} ms between reads (buffering would show ~0 ms gaps and a late first byte: "
          f"first byte at {relay['ttfb_p50_ms']:.1f} ms, whole stream at {relay['total_p50_ms']:.1f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
