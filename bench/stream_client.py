"""An asyncio client for streaming lanes: C concurrent clients each make requests for a
fixed time; reports time to first byte, total time, and the gaps between chunks (which
show whether chunks are relayed as they arrive or buffered)."""
from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time

import aiohttp


async def one(session, url, body, headers, stats):
    start = time.perf_counter()
    first = None
    arrivals = []
    async with session.post(url, data=body, headers=headers) as resp:
        if resp.status != 200:
            stats["errors"] += 1
            await resp.read()
            return
        async for _ in resp.content.iter_any():
            now = time.perf_counter()
            if first is None:
                first = now - start
            arrivals.append(now)
    stats["ttfb"].append(first or 0)
    stats["total"].append(time.perf_counter() - start)
    stats["gaps"].extend(b - a for a, b in zip(arrivals, arrivals[1:]))


async def run(url, body, key, concurrency, seconds):
    headers = {"Content-Type": "application/json"}
    if key:
        headers.update({"Authorization": f"Bearer {key}", "x-api-key": key})
    stats = {"ttfb": [], "total": [], "gaps": [], "errors": 0}
    deadline = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def worker():
            while time.perf_counter() < deadline:
                await one(session, url, body, headers, stats)
        await asyncio.gather(*[worker() for _ in range(concurrency)])
    pct = lambda xs, q: statistics.quantiles(xs, n=100)[q - 1] if len(xs) > 1 else (xs[0] if xs else 0)
    return {"requests": len(stats["total"]), "errors": stats["errors"],
            "ttfb_p50_ms": pct(stats["ttfb"], 50) * 1000, "total_p50_ms": pct(stats["total"], 50) * 1000,
            "gap_p50_ms": pct(stats["gaps"], 50) * 1000 if stats["gaps"] else 0}


if __name__ == "__main__":
    url, body, key, concurrency, seconds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
    print("BENCH_JSON " + json.dumps(asyncio.run(run(url, body, key, concurrency, seconds))))
