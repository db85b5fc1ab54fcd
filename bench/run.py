"""The benchmark, in one command: `.venv/bin/python bench/run.py [--seconds 5]`.

Everything runs on loopback. The server under test (the null proxy, then the gateway) is
pinned to core 0; the fake upstream and the load generators share core 1. Every figure
is reported next to the null proxy's, measured in the same run, because absolute numbers
drift on shared machines. The headline is CPU time per request of the server process,
read from the kernel's process accounting over a fixed-length load.

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
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PY = sys.executable
TICK = os.sysconf("SC_CLK_TCK")
SERVER_CORE, LOAD_CORE = "0", "1"
GAP_SECONDS = 0.01        # the slow upstream's pause between chunks, for the relay check

MESSAGES = [{"role": "user", "content": "Say hello to the benchmark in one short sentence."}]
BODIES = {
    "chat": {"model": "bench/gpt", "max_tokens": 64, "messages": MESSAGES},
    "chat_stream": {"model": "bench/gpt", "max_tokens": 64, "messages": MESSAGES, "stream": True},
    "messages": {"model": "bench/gpt", "max_tokens": 64, "messages": MESSAGES},
    "responses_stream": {"model": "bench/gpt", "max_output_tokens": 64, "input": MESSAGES[0]["content"],
                         "stream": True},
}
LANES = [  # name, path, body, keyed, streaming
    ("1 chat JSON, key", "/api/v1/chat/completions", "chat", True, False),
    ("2 chat stream, key", "/api/v1/chat/completions", "chat_stream", True, True),
    ("3 messages -> OpenAI upstream", "/api/v1/messages", "messages", True, False),
    ("4 responses stream", "/api/v1/responses", "responses_stream", True, True),
    ("5 x402 402 challenge", "/api/v1/chat/completions", "chat", False, False),
]


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


def run_lanes(base: str, pid: int, key: str, lanes, levels, seconds: float, side=None) -> dict:
    """side: {name: callable returning pids} of helper servers whose CPU is reported too."""
    results = {}
    for name, path, body, keyed, streaming in lanes:
        for c in levels:
            load(base + path, BODIES[body], key if keyed else "", c, min(1.0, seconds), streaming)   # warm-up
            pids = {k: fn() for k, fn in (side or {}).items()}
            r = measured(pid, lambda: load(base + path, BODIES[body], key if keyed else "", c, seconds, streaming),
                         pids)
            if streaming:     # for streams, latency means time to first byte
                r.update(rps=r["requests"] / seconds, p50_us=r["ttfb_p50_ms"] * 1000, p99_us=None)
            results[(name, c)] = r
            print(f"  {name} c={c}: {results[(name, c)]}", file=sys.stderr)
    return results


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


def scale_out(stores: list[str], up: int, levels, seconds: float, soak_total: int) -> tuple[dict, dict]:
    """Lanes 1 and 2 on each scale-out store: ({store: results}, {store: soak})."""
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
            out[store] = run_lanes(base, proc.pid, key, LANES[:2], levels, seconds, side)
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


def store_table(null: dict, sqlite: dict, more: dict[str, dict], levels, soaks: dict) -> str:
    """CPU per request of each store against the same run's null proxy (lanes 1 and 2), with the
    database's and Redis's own CPU per request beside the gateway's."""
    out = ["| store | lane | c | req/s | ÷ null | gateway CPU ms/req | ÷ null | PostgreSQL CPU ms/req | "
           "Redis CPU ms/req | p50 ms (streams: first byte) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    side = lambda g, k: f"{g[k]:.3f}" if k in g else "-"
    for store, results in [("sqlite", sqlite), *more.items()]:
        for name, *_ in LANES[:2]:
            for c in levels:
                g, n = results.get((name, c)), null.get((name, c))
                if g and n:
                    out.append(f"| {store} | {name} | {c} | {g['rps']:.0f} | {g['rps'] / n['rps']:.2f} | "
                               f"{g['cpu_ms']:.3f} | {g['cpu_ms'] / n['cpu_ms']:.2f} | {side(g, 'postgresql_cpu_ms')} | "
                               f"{side(g, 'redis_cpu_ms')} | {g['p50_us'] / 1000:.2f} |")
    for store, (before, after, done) in soaks.items():
        out.append("")
        out.append(f"RSS on {store} over {done:,} requests: {before:.1f} MB -> {after:.1f} MB "
                   f"({(after - before) / before:+.1%})")
    return "\n".join(out)


def targets(null: dict, gw: dict, quiet: dict, more: dict, soaked, soaks: dict, levels) -> str:
    """The performance issue's targets, each as a ratio to the same run's null proxy."""
    top, one = max(levels), min(levels)
    l1, l2, l3, l4 = (lane[0] for lane in LANES[:4])
    lines = ["Targets (ratios to the null proxy in this run):"]

    def check(label: str, value: float | None, limit: float, higher_is_better: bool = False, unit: str = "x"):
        if value is None:
            lines.append(f"- {label}: not measured")
            return
        ok = value >= limit if higher_is_better else value <= limit
        sign = ">=" if higher_is_better else "<="
        lines.append(f"- {label}: {value:.2f}{unit} (target {sign} {limit}{unit}) {'MET' if ok else 'NOT MET'}")

    ratio = lambda res, lane, key, c=top: (res[(lane, c)][key] / null[(lane, c)][key]
                                         if (lane, c) in res and (lane, c) in null else None)
    check(f"SQLite lane 1 CPU per call, c={top}", ratio(gw, l1, "cpu_ms"), 1.5)
    check(f"SQLite lane 1 throughput, c={top}", ratio(gw, l1, "rps"), 0.65, higher_is_better=True)
    if (l1, one) in gw and (l1, one) in null:
        check(f"SQLite lane 1 added p50, c={one}", (gw[(l1, one)]["p50_us"] - null[(l1, one)]["p50_us"]) / 1000, 0.3,
              unit=" ms")
    pg = more.get("postgresql+redis", {})
    check(f"PostgreSQL + Redis lane 1 gateway CPU per call, c={top}", ratio(pg, l1, "cpu_ms"), 2.0)
    check(f"Streams CPU per stream, c={top}", ratio(gw, l2, "cpu_ms"), 1.3)
    if (l2, one) in gw and (l2, one) in null:
        check(f"Streams added time to first byte, c={one}",
              (gw[(l2, one)]["p50_us"] - null[(l2, one)]["p50_us"]) / 1000, 0.5, unit=" ms")
    for lane, same in ((l3, l1), (l4, l2)):
        if (lane, top) in gw and (same, top) in gw:
            check(f"{lane} CPU vs {same}, c={top}", gw[(lane, top)]["cpu_ms"] / gw[(same, top)]["cpu_ms"], 1.2)
    if (l1, top) in quiet and (l1, top) in gw:
        on, off = gw[(l1, top)]["cpu_ms"], quiet[(l1, top)]["cpu_ms"]
        if on < off:          # the run without the line used more CPU: the difference is noise
            lines.append(f"- Per-call log line share of a call's CPU, c={top}: below this run's noise "
                         f"({on:.3f} ms with it, {off:.3f} ms without)")
        else:
            check(f"Per-call log line share of a call's CPU, c={top}", 100 * (on - off) / on, 5, unit="%")
    for store, (before, after, done) in [("sqlite", soaked), *soaks.items()]:
        if done:
            check(f"RSS growth on {store} over {done:,} calls", 100 * (after - before) / before, 5, unit="%")
    return "\n".join(lines)


def table(null: dict, gw: dict, levels, soaked) -> str:
    out = ["| lane | c | gateway req/s | ÷ null | gateway CPU ms/req | ÷ null | p50 ms (streams: first byte) | "
           "+p50 vs null ms | p99 ms |",
           "|---|---|---|---|---|---|---|---|---|"]
    for name, _, _, _, streaming in LANES:
        for c in levels:
            g = gw.get((name, c))
            if not g:
                continue
            base_name = LANES[1][0] if streaming else LANES[0][0]
            n = null.get((base_name, c))
            ratio = lambda a, b: f"{a / b:.2f}" if b else "-"
            p99 = f"{g['p99_us'] / 1000:.2f}" if g["p99_us"] is not None else "-"
            if n:
                out.append(f"| {name} | {c} | {g['rps']:.0f} | {ratio(g['rps'], n['rps'])} | {g['cpu_ms']:.3f} | "
                           f"{ratio(g['cpu_ms'], n['cpu_ms'])} | {g['p50_us'] / 1000:.2f} | "
                           f"{(g['p50_us'] - n['p50_us']) / 1000:+.2f} | {p99} |")
            else:
                out.append(f"| {name} | {c} | {g['rps']:.0f} | - | {g['cpu_ms']:.3f} | - | "
                           f"{g['p50_us'] / 1000:.2f} | - | {p99} |")
    before, after, done = soaked
    out.append("")
    out.append(f"RSS over {done:,} requests (lane 1, c=50, after warm-up): {before:.1f} MB -> {after:.1f} MB "
               f"({(after - before) / before:+.1%})")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=5, help="length of each measured run")
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
    # streaming lanes measure each request from the stream client's side; keep `seconds` for rates
    procs: list[subprocess.Popen] = []
    try:
        up, slow = free_port(), free_port()
        procs.append(start([PY, str(HERE / "fake_upstream.py"), "--port", str(up), "--chunks", "20"], LOAD_CORE))
        procs.append(start([PY, str(HERE / "fake_upstream.py"), "--port", str(slow), "--chunks", "10",
                            "--delay", str(GAP_SECONDS)], LOAD_CORE))
        wait_ready(f"http://127.0.0.1:{up}/v1/chat/completions", b"{}")
        wait_ready(f"http://127.0.0.1:{slow}/v1/chat/completions", b"{}")

        print("null proxy", file=sys.stderr)
        np_port = free_port()
        null_proc = start([PY, str(HERE / "null_proxy.py"), "--port", str(np_port),
                           "--upstream", f"http://127.0.0.1:{up}/v1/chat/completions"], SERVER_CORE)
        procs.append(null_proc)
        wait_ready(f"http://127.0.0.1:{np_port}/api/v1/chat/completions", b"{}")
        null = run_lanes(f"http://127.0.0.1:{np_port}", null_proc.pid, "", LANES[:2], levels, args.seconds)
        null_proc.terminate()

        print("gateway", file=sys.stderr)
        work = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
        cfg = gateway_config(work, up, slow)
        gw_proc, gw_base, key = start_gateway(work, cfg, SERVER_CORE)
        procs.append(gw_proc)
        gw = run_lanes(gw_base, gw_proc.pid, key, chosen, levels, args.seconds)
        relay = load(f"{gw_base}/api/v1/chat/completions",
                     {**BODIES["chat_stream"], "model": "bench/slow"}, key, 1, 3, True)
        soaked = soak(gw_base, gw_proc.pid, key, args.soak) if args.soak else (1, 1, 0)
        gw_proc.terminate()
        gw_proc.wait(60)

        print("gateway, --log-level warning (no per-call line)", file=sys.stderr)
        quiet_proc, quiet_base, quiet_key = start_gateway(work, cfg, SERVER_CORE, "--log-level", "warning")
        procs.append(quiet_proc)
        quiet = run_lanes(quiet_base, quiet_proc.pid, quiet_key, LANES[:1], levels[-1:], args.seconds)
        quiet_proc.terminate()
        more, soaks = scale_out([x for x in args.stores.split(",") if x], up, levels, args.seconds, args.soak)
    finally:
        for proc in procs:
            proc.terminate()
    print(table(null, gw, levels, soaked))
    if more:
        print()
        print(store_table(null, gw, more, levels, soaks))
    print()
    print(targets(null, gw, quiet, more, soaked, soaks, levels))
    print(f"Chunk relay: upstream sends a chunk every {GAP_SECONDS * 1000:.0f} ms; the client saw a median gap of "
          f"{relay['gap_p50_ms']:.1f} ms between reads (buffering would show ~0 ms gaps and a late first byte: "
          f"first byte at {relay['ttfb_p50_ms']:.1f} ms, whole stream at {relay['total_p50_ms']:.1f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
