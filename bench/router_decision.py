"""How long svc/smart's local classifier takes to decide: `.venv/bin/python bench/router_decision.py`.

One decision is everything the gateway does for it: features from the request, the
linear model, the trees, the calibrated route-up rule. Requests of several sizes are timed
one at a time, up to 8 kB of text (a long pasted e-mail with a question; a long question
with no paste, made of distinct sentences so that its n-grams are as varied as real text; a
conversation with tools), and then every request of the labelled set's test split once each,
in several passes (real requests, after one warm-up pass; the pass with the middle p99 is
shown, with every pass's p99). Wall time is what a caller waits; CPU time (this thread's) is
the same minus the moments another process had the core, which on a shared machine is the
steadier figure. Prints one JSON object.
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
from plugins.router_train import DEFAULT_SET, load_set, routing_input  # noqa: E402

PASTE = ("Hi all, thanks for the patience while we sorted the venue. We start at 9:30 on Thursday because the "
         "7:45 train only gets in at 9:05; rooms are booked for one night, dinner is at 7pm, and the budget "
         "stands at 6,840 of 8,000 approved.\n\n")
REQUESTS = {
    "short question (60 B)": RoutingInput("Who proved Fermat's Last Theorem, and in which year was it?"),
    "design request (600 B)": RoutingInput(("Design a multi-region payments ledger with exactly-once transfers, "
                                            "RPO 0, RTO under 30 s, and a zero-downtime migration plan. ") * 4),
    "8 kB paste + easy question": RoutingInput((PASTE * 40)[:8000] + "\n\nWhat time do we start on Thursday?"),
    "8 kB question, no paste": RoutingInput(" ".join(
        f"Step {i}: check that the bound on term {i * 7 % 31} holds for every n above {i * 13 % 97}, "
        f"and say which of lemmas {chr(65 + i % 26)} and {chr(65 + (i * 5) % 26)} it rests on."
        for i in range(80))[:8000]),
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
    p.add_argument("--passes", type=int, default=3,
                   help="cold passes over the test split (the pass with the middle p99 is shown)")
    args = p.parse_args()
    model = shipped()
    if model is None:
        return 2
    for inp in REQUESTS.values():          # warm up
        model.decide(inp)
    result = {name: timed(model, inp, args.runs) for name, inp in REQUESTS.items()}
    test = [routing_input(item) for item in load_set(DEFAULT_SET) if item.get("split") == "test"]
    for inp in test:
        model.decide(inp)
    p99 = int(0.99 * (len(test) - 1))
    passes = []
    for _ in range(args.passes):          # each pass: every request once, in turn (cold, as a gateway meets them)
        spread = [timed(model, inp, 1) for inp in test]
        wall = sorted(t["wall_median_us"] for t in spread)
        cpu = sorted(t["cpu_median_us"] for t in spread)
        passes.append({"wall_median_us": wall[len(wall) // 2], "wall_p99_us": wall[p99],
                       "cpu_median_us": cpu[len(cpu) // 2], "cpu_p99_us": cpu[p99]})
    middle = sorted(passes, key=lambda row: row["cpu_p99_us"])[len(passes) // 2]
    result[f"test split ({len(test)} requests, one decision each)"] = {
        "chars_max": max(len(i.last) + len(i.history) for i in test), **middle,
        "cpu_p99_us_each_pass": [row["cpu_p99_us"] for row in passes]}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
