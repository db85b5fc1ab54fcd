"""`gateway router-train`: fit svc/smart's local classifier on the labelled set.

Needs the `train` extra (numpy); the gateway itself never imports this module's numpy.
It fits a multinomial logistic regression on the train split, then on the validation split
picks the regularisation, fits a temperature so the probabilities are calibrated, and picks
the route-up threshold: the largest one that keeps under-routing at most `--max-under` on
validation. The shipped weights are then refitted on train and validation together with
those choices. The test split is never read here. Higher tiers weigh more in the loss
(CLASS_WEIGHT): sending a request too low costs quality, too high only money.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from . import hookimpl
from .router_features import BUCKETS, DENSE, FEATURES, RoutingInput, features, from_messages
from .router_model import TIERS, WEIGHTS, LocalClassifier, pick

DEFAULT_SET = Path(__file__).resolve().parent.parent / "bench" / "router_set.jsonl"
REGULARISATION = (1e-4, 3e-4, 1e-3)     # on the n-gram weights; the dense ones get DENSE_SHARE of it
DENSE_SHARE = 1 / 30
CLASS_WEIGHT = (1.0, 1.2, 1.6, 2.0)
ROUTE_UP = (0.5, 0.45, 0.4, 0.35, 0.3, 0.28, 0.26, 0.24, 0.22, 0.2, 0.19, 0.18, 0.17, 0.16, 0.15, 0.12, 0.1, 0.07, 0.05)


def routing_input(item: dict) -> RoutingInput:
    """A labelled item as the gateway would see it: {messages, tools} or the older {prompt}."""
    if "prompt" in item:
        return RoutingInput(item["prompt"])
    return from_messages([(m["role"], m["content"], False) for m in item["messages"]], len(item.get("tools", [])))


def load_set(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


class Matrix:
    """The feature rows of a split, in the shapes numpy needs."""

    def __init__(self, np, items: list[dict]):
        rows, slots, values, dense = [], [], [], []
        for r, item in enumerate(items):
            s, w, d = features(routing_input(item))
            rows += [r] * len(s)
            slots += s
            values += [w] * len(s)
            dense.append(d)
        self.n = len(items)
        self.rows, self.slots = np.array(rows, dtype=np.int64), np.array(slots, dtype=np.int64)
        self.values, self.dense = np.array(values), np.array(dense)
        self.y = np.array([TIERS.index(item["tier"]) for item in items])

    def logits(self, np, w):
        sparse = np.stack([np.bincount(self.rows, weights=w[self.slots, c] * self.values, minlength=self.n)
                           for c in range(len(TIERS))], axis=1)
        return sparse + self.dense @ w[BUCKETS:]


def softmax(np, z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def fit(np, m: Matrix, l2: float, steps: int = 500, rate: float = 0.05):
    """Full-batch Adam on the weighted cross-entropy plus an L2 penalty (not on the bias)."""
    w = np.zeros((FEATURES, len(TIERS)))
    first, second = np.zeros_like(w), np.zeros_like(w)
    onehot = np.eye(len(TIERS))[m.y]
    penalty = np.full((FEATURES, 1), 1.0)
    penalty[BUCKETS:] = DENSE_SHARE
    penalty[BUCKETS + DENSE.index("bias")] = 0.0
    sample = np.array(CLASS_WEIGHT)[m.y]
    sample /= sample.sum()
    for t in range(1, steps + 1):
        g = (softmax(np, m.logits(np, w)) - onehot) * sample[:, None]
        grad = np.zeros_like(w)
        for c in range(len(TIERS)):
            grad[:BUCKETS, c] = np.bincount(m.slots, weights=m.values * g[m.rows, c], minlength=BUCKETS)
        grad[BUCKETS:] = m.dense.T @ g
        grad += l2 * penalty * w
        first = 0.9 * first + 0.1 * grad
        second = 0.999 * second + 0.001 * grad * grad
        w -= rate * (first / (1 - 0.9 ** t)) / (np.sqrt(second / (1 - 0.999 ** t)) + 1e-8)
    return w


def nll(np, logits, y, temperature=1.0) -> float:
    p = softmax(np, logits / temperature)
    return float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean())


def choose_route_up(np, probs, y, max_under: float) -> tuple[float, dict, list]:
    """The largest threshold (fewest routed up) whose validation under-routing is within bound;
    also every threshold's (exact, under) on validation, to show the trade-off."""
    curve = []
    for alpha in ROUTE_UP:
        guess = np.array([pick(p, alpha) for p in probs])
        curve.append((alpha, round(float((guess == y).mean()), 3), round(float((guess < y).mean()), 3)))
    alpha, exact, under = next((c for c in curve if c[2] <= max_under), curve[-1])
    return alpha, {"exact": exact, "under": under}, curve


def train(data: Path, out: Path, max_under: float, steps: int = 500) -> dict:
    try:
        import numpy as np
    except ImportError:
        sys.exit("gateway: router-train needs numpy: pip install -e '.[train]'")
    items = load_set(data)
    train_items = [i for i in items if i["split"] == "train"]
    valid_items = [i for i in items if i["split"] == "validation"]
    started = time.perf_counter()
    tr, va = Matrix(np, train_items), Matrix(np, valid_items)
    fits = {l2: fit(np, tr, l2, steps) for l2 in REGULARISATION}
    l2 = min(fits, key=lambda k: nll(np, va.logits(np, fits[k]), va.y))
    z = va.logits(np, fits[l2])
    temperature = min((t / 20 for t in range(6, 61)), key=lambda t: nll(np, z, va.y, t))
    probs = softmax(np, z / temperature)
    route_up, valid, curve = choose_route_up(np, probs, va.y, max_under)
    meta = {"version": 1, "temperature": temperature, "route_up": route_up, "l2": l2,
            "trained_on": len(train_items) + len(valid_items), "validation": {"items": len(valid_items), **valid,
                                                             "likeliest_exact": float((probs.argmax(1) == va.y).mean()),
                                                             "route_up_curve": curve}}
    final = fit(np, Matrix(np, train_items + valid_items), l2, steps)
    LocalClassifier.save(out, meta, final.T.tolist())
    meta["seconds"] = round(time.perf_counter() - started, 1)
    return meta


def cmd_router_train(args) -> int:
    meta = train(Path(args.data), Path(args.out), args.max_under, args.steps)
    print(json.dumps(meta, indent=2))
    return 0


@hookimpl
def gateway_register_commands(subparsers):
    p = subparsers.add_parser("router-train", help="fit svc/smart's local classifier (needs the train extra)")
    p.add_argument("--data", default=str(DEFAULT_SET), help="labelled set, JSON lines with a split field")
    p.add_argument("--out", default=str(WEIGHTS), help="where to write the model")
    p.add_argument("--max-under", type=float, default=0.05,
                   help="the most under-routing to accept on validation when choosing the route-up threshold")
    p.add_argument("--steps", type=int, default=500, help="optimiser steps per fit")
    p.set_defaults(func=cmd_router_train)
