"""How long svc/smart's local classifier takes to decide: `.venv/bin/python bench/router_decision.py`.

One decision is everything the gateway does for it: features from the request, the
linear model, the calibrated route-up rule. Requests of several sizes are timed one at a
time, up to 8 kB of text (a long pasted e-mail with a question; a long question with no
paste; a conversation with tools). Wall time is what a caller waits; CPU time (this
thread's) is the same minus the moments another process had the core, which on a shared
machine is the steadier figure. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from plugins.router_features import RoutingInput  # noqa: E402
from plugins.router_model import shipped  # noqa: E402

PASTE = ("Hi all, thanks for the patience while we sorted the venue. We start at 9:30 on Thursday because the "
         "7:45 train only gets in at 9:05; rooms are booked for one night, dinner is at 7pm, and the budget "
         "stands at 6,840 of 8,000 approved.\n\n")
REQUESTS = {
    "short question (60 B)": RoutingInput("Who proved Fermat's Last Theorem, and in which year was it?"),
    "design request (600 B)": RoutingInput(("Design a multi-region payments ledger with exactly-once transfers, "
                                            "RPO 0, RTO under 30 s, and a zero-downtime migration plan. ") * 4),
    "8 kB paste + easy question": RoutingInput((PASTE * 40)[:8000] + "\n\nWhat time do we start on Thursday?"),
    "8 kB question, no paste": RoutingInput(("Prove the bound and check every step of the argument carefully, "
                                             "because the constants matter here. ") * 80),
    "8 kB conversation with tools": RoutingInput("And now plan the rollout with the tools, step by step.",
                                                 history=(PASTE * 40)[:8000], tools=6),
}


def timed(model, inp: RoutingInput, runs: int) -> dict:
    wall, cpu = [], []
    for _ in range(runs):
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        model.decide(inp)
        cpu.append((time.thread_time_ns() - c0) / 1000)
        wall.append((time.perf_counter_ns() - w0) / 1000)
    wall.sort()
    cpu.sort()
    p99 = int(0.99 * (runs - 1))
    return {"chars": len(inp.last) + len(inp.history), "wall_median_us": round(statistics.median(wall)),
            "wall_p99_us": round(wall[p99]), "cpu_median_us": round(statistics.median(cpu)), "cpu_p99_us": round(cpu[p99])}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=2000, help="decisions timed per request kind")
    args = p.parse_args()
    model = shipped()
    if model is None:
        return 2
    for inp in REQUESTS.values():          # warm up
        model.decide(inp)
    print(json.dumps({name: timed(model, inp, args.runs) for name, inp in REQUESTS.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
