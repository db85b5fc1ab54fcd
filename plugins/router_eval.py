"""`gateway router-eval`: how well svc/smart's local classifier rates a labelled set, and what
smart routing costs against always using the frontier tier and against perfect labels.

It reads the test split of the labelled set by default (the model never saw it, and
nothing was tuned on it); a file without splits is read whole. Cost model: each request's
input is its token estimate; its output is what a request of its TRUE tier typically needs
(easy 150, medium 400, hard 800, frontier 1,500 tokens); prices are the configured tier
models' prices. "Under-routed" counts requests sent below their label: the quality risk.
`--readme FILE` rewrites the block between the router-eval markers in FILE with the tables
(all but the timing, which varies from run to run; bench/router_decision.py measures it).
"""
from __future__ import annotations

import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from providers.types import estimate_tokens

from . import hookimpl, load_checked
from .pricing import token_cost
from .router_model import TIERS, shipped
from .router_train import DEFAULT_SET, load_set, routing_input

OUTPUT_TOKENS = {"easy": 150, "medium": 400, "hard": 800, "frontier": 1500}
BEGIN, END = "<!-- router-eval:begin -->", "<!-- router-eval:end -->"


def _rate(rows: list[tuple[int, int]]) -> dict:
    n = len(rows)
    return {"n": n, "exact": sum(t == g for t, g in rows) / n, "within_one": sum(abs(t - g) <= 1 for t, g in rows) / n,
            "under": sum(g < t for t, g in rows) / n, "over": sum(g > t for t, g in rows) / n}


def evaluate(items: list[dict], tiers: dict, model) -> dict:
    rows, likeliest, times, routed_up = [], [], [], 0
    by = {"lang": defaultdict(list), "category": defaultdict(list), "group": defaultdict(list)}
    costs = {"smart": 0, "frontier": 0, "oracle": 0}
    for item in items:
        inp = routing_input(item)
        started = time.perf_counter_ns()
        decision = model.decide(inp)
        times.append((time.perf_counter_ns() - started) / 1000)
        truth, guess = TIERS.index(item["tier"]), TIERS.index(decision.tier)
        routed_up += decision.routed_up
        rows.append((truth, guess))
        likeliest.append((truth, TIERS.index(decision.likeliest)))
        for key in ("lang", "category"):
            by[key][item.get(key, "?")].append((truth, guess))
        for group in item.get("groups", []):
            by["group"][group].append((truth, guess))
        chars = len(inp.last) + len(inp.history)
        for name, tier in (("smart", decision.tier), ("frontier", "frontier"), ("oracle", item["tier"])):
            costs[name] += token_cost(tiers[tier], estimate_tokens(chars), OUTPUT_TOKENS[item["tier"]])
    confusion = [[sum(1 for t, g in rows if t == i and g == j) for j in range(len(TIERS))] for i in range(len(TIERS))]
    times.sort()
    return {**_rate(rows), "confusion": confusion, "routed_up": routed_up, "costs": costs, "likeliest": _rate(likeliest),
            "by": {k: {name: _rate(r) for name, r in sorted(v.items())} for k, v in by.items()},
            "micros": {"median": statistics.median(times), "p99": times[int(0.99 * (len(times) - 1))],
                       "max": times[-1]}}


def _pct(x: float) -> str:
    return f"{x:.1%}"


def tables(result: dict, tiers: dict, label: str) -> str:
    """The split's figures without the timing: the same model, set and prices always give the
    same text, so the README's copy can be checked against a fresh run."""
    r, c = result, result["costs"]
    lines = [f"svc/smart local classifier on {label}: {r['n']} requests", "",
             "| exact | within one tier | under-routed | over-routed | routed up when unsure |", "|---|---|---|---|---|",
             f"| {_pct(r['exact'])} | {_pct(r['within_one'])} | {_pct(r['under'])} | {_pct(r['over'])} | "
             f"{r['routed_up']} |", "",
             f"Without routing up (the likeliest tier alone): {_pct(r['likeliest']['exact'])} exact, "
             f"{_pct(r['likeliest']['within_one'])} within one tier, {_pct(r['likeliest']['under'])} under-routed.", "",
             "| label \\ routed to | " + " | ".join(TIERS) + " |", "|---" * 5 + "|"]
    lines += [f"| {tier} | " + " | ".join(map(str, row)) + " |" for tier, row in zip(TIERS, r["confusion"])]
    for key, title in (("lang", "language"), ("category", "category"), ("group", "hard group")):
        lines += ["", f"| {title} | requests | exact | within one | under-routed |", "|---|---|---|---|---|"]
        lines += [f"| {name} | {s['n']} | {_pct(s['exact'])} | {_pct(s['within_one'])} | {_pct(s['under'])} |"
                  for name, s in r["by"][key].items()]
    lines += ["", "| routing | cost (USD) | vs always frontier |", "|---|---|---|"]
    for name, text in (("frontier", "always frontier"), ("smart", "svc/smart (local)"), ("oracle", "perfect labels")):
        lines.append(f"| {text} | {c[name] / 1e6:.4f} | {c[name] / c['frontier']:.1%} |")
    lines += ["", "Tiers priced: " + ", ".join(f"{tier} = {tiers[tier].id}" for tier in TIERS)]
    return "\n".join(lines)


def report(result: dict, tiers: dict, label: str, model) -> str:
    t, v = result["micros"], model.meta["validation"]
    return (tables(result, tiers, label) + "\n\nChosen on the validation split "
            f"({v['items']} requests, model fitted on train only): route up when the chance of easy, medium, hard "
            f"being too low is above {', '.join(map(str, model.route_up))}; there it scored {_pct(v['exact'])} exact, {_pct(v['within_one'])} within one "
            f"tier, {_pct(v['under'])} under-routed ({_pct(v['likeliest_exact'])} exact for the likeliest tier alone)."
            f"\n\nDecision time in this run (features and model, one request at a time): median {t['median']:.0f} µs, "
            f"p99 {t['p99']:.0f} µs.")


def write_readme(path: Path, text: str) -> None:
    readme = path.read_text()
    if BEGIN not in readme or END not in readme:
        sys.exit(f"gateway: {path} has no {BEGIN} ... {END} block to fill")
    block = f"{BEGIN}\n{text}\n{END}"
    path.write_text(re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, readme, flags=re.S))


def cmd_router_eval(args) -> int:
    cfg, _ = load_checked(args.config)
    names = cfg.settings("router").tiers
    if set(names) != set(TIERS):
        print("gateway: router.tiers must name a model for each of easy, medium, hard, frontier", file=sys.stderr)
        return 2
    model = shipped()
    if model is None:
        return 2
    items = load_set(Path(args.prompts))
    if any("split" in item for item in items) and args.split != "all":
        items = [item for item in items if item.get("split") == args.split]
        label = f"the {args.split} split of {Path(args.prompts).name}"
        if args.split != "test":
            label += " (the shipped model was fitted on it: these figures flatter it)"
    else:
        label = Path(args.prompts).name
    if not items:
        print("gateway: no labelled requests to evaluate", file=sys.stderr)
        return 2
    tiers = {t: cfg.chat_models[m] for t, m in names.items()}
    result = evaluate(items, tiers, model)
    print(report(result, tiers, label, model))
    if args.readme:
        write_readme(Path(args.readme), tables(result, tiers, label))
    return 0


@hookimpl
def gateway_register_commands(subparsers):
    p = subparsers.add_parser("router-eval", help="measure svc/smart's local classifier on a labelled set")
    p.add_argument("--config", help="YAML config whose router.tiers to price (default: the embedded demo)")
    p.add_argument("--prompts", default=str(DEFAULT_SET),
                   help="JSON lines {id, tier, messages, tools, split, lang, category} or {id, tier, prompt}")
    p.add_argument("--split", default="test", choices=("test", "validation", "train", "all"),
                   help="which split to read when the file has splits (default: test)")
    p.add_argument("--readme", help="also write the tables (not the timing) into this file's router-eval block")
    p.set_defaults(func=cmd_router_eval)
