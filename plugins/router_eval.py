"""`gateway router-eval`: how well svc/smart's classifier rates a labelled set, and what
smart routing costs against always using the frontier tier.

Cost model: each prompt's input is its token estimate; its output is what a prompt of
its TRUE difficulty typically needs (easy 150, medium 400, hard 800, frontier 1,500
tokens); prices are the configured tier models' service prices. "Under-routed" counts
prompts sent to a tier below their label: the quality risk of saving money.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import config as config_mod
from providers.types import estimate_tokens

from . import hookimpl, load_checked
from .pricing import token_cost
from .router import DIFFICULTIES, heuristic

OUTPUT_TOKENS = {"easy": 150, "medium": 400, "hard": 800, "frontier": 1500}
DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent / "bench" / "router_prompts.jsonl"


def evaluate(prompts: list[dict], tiers: dict[str, config_mod.ChatModel], *, split: bool = True) -> dict:
    confusion = {t: {p: 0 for p in DIFFICULTIES} for t in DIFFICULTIES}
    costs = {"smart": 0, "frontier": 0, "oracle": 0}
    under = 0
    for item in prompts:
        truth, guess = item["tier"], heuristic(item["prompt"]) or "medium"
        confusion[truth][guess] += 1
        under += DIFFICULTIES.index(guess) < DIFFICULTIES.index(truth)
        tokens_in, tokens_out = estimate_tokens(len(item["prompt"])), OUTPUT_TOKENS[truth]
        for name, tier in (("smart", guess), ("frontier", "frontier"), ("oracle", truth)):
            costs[name] += token_cost(tiers[tier], tokens_in, tokens_out)
    total = len(prompts)
    correct = sum(confusion[t][t] for t in DIFFICULTIES)
    holdout = [p for p in prompts if p["id"][1:].isdigit() and int(p["id"][1:]) % 2 == 0]
    return {"holdout": evaluate(holdout, tiers, split=False) if split and holdout else None, "total": total, "accuracy": correct / total, "within_one": sum(
        confusion[t][p] for t in DIFFICULTIES for p in DIFFICULTIES
        if abs(DIFFICULTIES.index(t) - DIFFICULTIES.index(p)) <= 1) / total,
        "under_routed": under / total, "confusion": confusion, "costs": costs}


def report(result: dict, tiers: dict) -> str:
    c = result["costs"]
    lines = [f"Classifier: heuristic, {result['total']} labelled prompts",
             "", "| prompts | accuracy | within one tier | under-routed |", "|---|---|---|---|",
             f"| all {result['total']} | {result['accuracy']:.1%} | {result['within_one']:.1%} | "
             f"{result['under_routed']:.1%} |",
             f"| held out ({result['holdout']['total']}, even ids; tuned on the odd) | "
             f"{result['holdout']['accuracy']:.1%} | {result['holdout']['within_one']:.1%} | "
             f"{result['holdout']['under_routed']:.1%} |",
             "", "| label \\ routed to | " + " | ".join(DIFFICULTIES) + " |", "|---" * 5 + "|"]
    for t in DIFFICULTIES:
        lines.append(f"| {t} | " + " | ".join(str(result["confusion"][t][p]) for p in DIFFICULTIES) + " |")
    lines += ["", "| routing | cost (USD) | vs always frontier |", "|---|---|---|"]
    for name, label in (("frontier", "always frontier"), ("smart", "svc/smart"), ("oracle", "perfect labels")):
        lines.append(f"| {label} | {c[name] / 1e6:.4f} | {c[name] / c['frontier']:.1%} |")
    lines += ["", "Tiers: " + ", ".join(f"{t} = {tiers[t].id}" for t in DIFFICULTIES)]
    return "\n".join(lines)


def cmd_router_eval(args) -> int:
    cfg, _ = load_checked(args.config)
    names = cfg.settings("router").tiers
    if set(names) != set(DIFFICULTIES):
        print("gateway: router.tiers must name a model for each of easy, medium, hard, frontier", file=sys.stderr)
        return 2
    prompts = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    tiers = {t: cfg.chat_models[m] for t, m in names.items()}
    print(report(evaluate(prompts, tiers), tiers))
    return 0


@hookimpl
def gateway_register_commands(subparsers):
    p = subparsers.add_parser("router-eval", help="measure svc/smart's classifier on a labelled prompt set")
    p.add_argument("--config", help="YAML config whose router.tiers to price (default: the embedded demo)")
    p.add_argument("--prompts", default=str(DEFAULT_PROMPTS), help="JSON lines {id, tier, prompt}")
    p.set_defaults(func=cmd_router_eval)
