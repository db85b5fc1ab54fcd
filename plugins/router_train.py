"""`gateway router-train`: fit svc/smart's local classifier on the labelled set.

Needs the `train` extra (numpy, LightGBM); the gateway itself never imports them.
The model is cumulative (see router_model) and comes in two stages. First one binary logistic
model per cut between neighbouring tiers ("needs more than easy", "... than medium", "... than
hard") over hashed keys and dense features, fitted together by full-batch Adam on their
cross-entropies. The targets are soft where the set's two labelling passes disagreed: the
settled tier weighs 1 - SOFT and the other label(s) SOFT (the set's `second_pass.jsonl` and
`settled.jsonl`, next to it in a folder of its name, when they exist), which tells the model
where the rubric itself leaves room. Keys that occur in fewer than MIN_COUNT training requests
are left out, in training and in the shipped table alike. Then one small forest of boosted
trees per cut (LightGBM, the same soft targets) over the linear scores, the dense features and
the number of keys; the scores it learns from are out of fold (each request scored by a
linear model fitted without it, FOLDS folds), so the forests see the scores as the gateway
will meet them on new requests.
Everything is first fitted on the train split; on the validation split it then fits a
temperature per cut so the chances are calibrated and picks the route-up thresholds (one per
tier below frontier): the most exact that keep validation's under-routing one standard error
below `--max-under`. Validation's figure is a sample (about 0.4 points of standard error on
3,000 requests) and the thresholds are the best of many tried on it, so thresholds chosen at
the bound itself land above it on new requests about half the time; the margin is for that.
The shipped model is refitted the same way on train and validation together, with those
choices. The test split is never read here. The folds run in parallel processes.
"""
from __future__ import annotations

import itertools
import json
import math
import multiprocessing
import os
import sys
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from collections import Counter
from pathlib import Path

from . import hookimpl
from .router_features import BUCKETS, DENSE, FEATURES, RoutingInput, from_messages, keyed_features, slot
from .router_forest import from_lightgbm
from .router_model import STACKED, TIERS, WEIGHTS, LocalClassifier, pick

DEFAULT_SET = Path(__file__).resolve().parent.parent / "bench" / "router_set.jsonl"
L2 = 3e-7                             # on the n-gram weights (the dense ones get DENSE_SHARE of it); chosen on validation
MIN_COUNT = 5                         # a key must occur in this many training requests to count
STEPS = 150                           # optimiser steps per fit: few enough to stop early (a regulariser)
DENSE_SHARE = 0.3
SOFT = 0.3                            # the other labelling pass's share where the passes disagreed
FOLDS = 5                             # out-of-fold linear scores for the forests
TREES = 150                           # per cut
FOREST = dict(objective="cross_entropy", num_leaves=15, learning_rate=0.06, min_data_in_leaf=30,
              bagging_fraction=0.8, bagging_freq=1, feature_fraction=0.8, seed=1, deterministic=True,
              force_col_wise=True, num_threads=1, verbose=-1)
TEMPERATURES = tuple(t / 20 for t in range(6, 81))
ROUTE_UP = (0.5, 0.45, 0.4, 0.35, 0.3, 0.28, 0.26, 0.24, 0.22, 0.2, 0.19, 0.18, 0.17, 0.16, 0.15, 0.14, 0.13, 0.12,
            0.11, 0.1, 0.09, 0.08, 0.07, 0.06, 0.05, 0.04, 0.03)


def routing_input(item: dict) -> RoutingInput:
    """A labelled item as the gateway would see it: {messages, tools} or the older {prompt}."""
    if "prompt" in item:
        return RoutingInput(item["prompt"])
    return from_messages([(m["role"], m["content"], False) for m in item["messages"]], len(item.get("tools", [])))


def load_set(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def soft_labels(items: list[dict], data: Path) -> dict[str, dict[str, float]]:
    """id -> {tier: weight} for the items whose labelling passes disagreed (the first label
    from settled.jsonl, the second from second_pass.jsonl); other items are one-hot."""
    here = Path(data).parent / Path(data).stem
    if not (here / "second_pass.jsonl").exists() or not (here / "settled.jsonl").exists():
        return {}
    wanted = {item["id"]: item["tier"] for item in items}
    second = {r["id"]: r["tier"] for r in load_set(here / "second_pass.jsonl") if r["id"] in wanted}
    first = {r["id"]: r["first"] for r in load_set(here / "settled.jsonl") if r["id"] in wanted}
    soft = {}
    for item_id, tier in wanted.items():
        others = [t for t in (first.get(item_id, tier), second.get(item_id, tier)) if t != tier and t in TIERS]
        if others:
            weights = {tier: 1 - SOFT}
            for other in others:
                weights[other] = weights.get(other, 0.0) + SOFT / len(others)
            soft[item_id] = weights
    return soft


def vocabulary(items: list[dict]) -> dict[str, int]:
    """The keys that occur in at least MIN_COUNT of these requests (the model's known keys),
    commonest first, with their counts. The model file keeps that order, so the gateway's
    table holds the keys most requests look up side by side in memory (fewer cache misses)."""
    seen: Counter = Counter()
    for item in items:
        seen.update(keyed_features(routing_input(item))[0])
    common = sorted((key for key, count in seen.items() if count >= MIN_COUNT), key=lambda key: (-seen[key], key))
    return {key: seen[key] for key in common}


class Matrix:
    """The feature rows of a split, in the shapes numpy needs (only known keys count)."""

    def __init__(self, np, items: list[dict], known: dict[str, int], soft: dict | None = None):
        rows, slots, values, dense = [], [], [], []
        for r, item in enumerate(items):
            keys, w, d = keyed_features(routing_input(item))
            s = [slot(key) for key in sorted(keys) if key in known]    # sorted: the same sums every run
            rows += [r] * len(s)
            slots += s
            values += [w] * len(s)
            dense.append(d)
        self.n = len(items)
        self.rows, self.slots = np.array(rows, dtype=np.int64), np.array(slots, dtype=np.int64)
        self.values, self.dense = np.array(values), np.array(dense).reshape(self.n, len(DENSE))
        self.more = targets(np, items, soft)[1]

    def scores(self, np, w):
        """(n, columns) scores for weights w of shape (FEATURES, columns)."""
        hashed = np.stack([np.bincount(self.rows, weights=w[self.slots, t] * self.values, minlength=self.n)
                           for t in range(w.shape[1])], axis=1)
        return hashed + self.dense @ w[BUCKETS:]


def targets(np, items: list[dict], soft: dict | None = None):
    """-> (tier indexes, (n, cuts) chances of needing more than tier k: 0 or 1, soft where the
    labelling passes disagreed)."""
    y = np.array([TIERS.index(item["tier"]) for item in items], dtype=np.int64)
    target = np.eye(len(TIERS))[y]
    for r, item in enumerate(items):
        if item["id"] in (soft or {}):
            target[r] = [soft[item["id"]].get(tier, 0.0) for tier in TIERS]
    return y, target[:, ::-1].cumsum(axis=1)[:, ::-1][:, 1:]


def fit(np, m: Matrix, l2: float, steps: int = STEPS, rate: float = 0.05):
    """-> weights (FEATURES, cuts): per cut, the log-odds of needing more than that tier.
    Full-batch Adam on the cuts' binary cross-entropies (soft targets) plus an L2 penalty (not
    on the bias)."""
    k = len(TIERS) - 1
    w = np.zeros((FEATURES, k))
    penalty = np.full((FEATURES, 1), 1.0)
    penalty[BUCKETS:] = DENSE_SHARE
    penalty[BUCKETS + DENSE.index("bias")] = 0.0
    first, second = np.zeros_like(w), np.zeros_like(w)
    for t in range(1, steps + 1):
        g = (1.0 / (1.0 + np.exp(-m.scores(np, w))) - m.more) / m.n
        grad = np.empty_like(w)
        for tier in range(k):
            grad[:BUCKETS, tier] = np.bincount(m.slots, weights=m.values * g[m.rows, tier], minlength=BUCKETS)
        grad[BUCKETS:] = m.dense.T @ g
        grad += l2 * penalty * w
        first *= 0.9
        first += 0.1 * grad
        second *= 0.999
        second += 0.001 * grad * grad
        w -= rate * (first / (1 - 0.9 ** t)) / (np.sqrt(second / (1 - 0.999 ** t)) + 1e-8)
    return w


def more_chances(np, scores, temperatures):
    """(n, cuts) calibrated chances of needing more than each tier, non-increasing up the tiers."""
    more = 1.0 / (1.0 + np.exp(-scores / np.asarray(temperatures)))
    return np.minimum.accumulate(more, axis=1)


def probabilities(np, scores, temperatures):
    """(n, tiers) chances, as router_model.tier_chances gives them."""
    more = more_chances(np, scores, temperatures)
    n = len(more)
    return np.hstack([np.ones((n, 1)), more]) - np.hstack([more, np.zeros((n, 1))])


def fit_temperatures(np, scores, y) -> list[float]:
    """Per cut, the temperature that gives the validation labels the least cross-entropy."""
    chosen = []
    for k in range(scores.shape[1]):
        needs = y > k
        def loss(t):
            q = np.clip(1.0 / (1.0 + np.exp(-scores[:, k] / t)), 1e-12, 1 - 1e-12)
            return float(-np.where(needs, np.log(q), np.log(1 - q)).mean())
        chosen.append(min(TEMPERATURES, key=loss))
    return chosen


def under_bound(max_under: float, n: int) -> float:
    """The under-routing to allow on `n` validation requests so that new requests stay within
    `max_under`: one standard error of the estimate below it (none at all on a set too small
    to tell)."""
    return max(0.0, max_under - math.sqrt(max_under * (1 - max_under) / max(n, 1)))


def choose_route_up(np, probs, y, max_under: float) -> tuple[list, dict, list]:
    """One threshold per cut: of the combinations whose validation under-routing is within
    bound, the most exact (then the most within one tier). Also every single shared
    threshold's (exact, within one, under) on validation, to show the trade-off."""
    above = probs[:, ::-1].cumsum(axis=1)[:, ::-1][:, 1:]          # chance of needing more than tier k
    def rates(combo):
        over = above > np.array(combo)[None]
        guess = np.where(over.any(axis=1), over.shape[1] - over[:, ::-1].argmax(axis=1), 0)
        return float((guess == y).mean()), float((abs(guess - y) <= 1).mean()), -float((guess < y).mean())

    within = [(rates(combo), list(combo)) for combo in itertools.product(ROUTE_UP, repeat=above.shape[1])]
    within = [(score, combo) for score, combo in within if -score[2] <= max_under]
    cautious = [ROUTE_UP[-1]] * above.shape[1]        # if nothing is within bound
    best, chosen = max(within, key=lambda row: row[0]) if within else (rates(cautious), cautious)
    curve = []
    for alpha in ROUTE_UP:
        guess = np.array([pick(p, alpha) for p in probs])
        curve.append((alpha, round(float((guess == y).mean()), 3), round(float((abs(guess - y) <= 1).mean()), 3),
                      round(float((guess < y).mean()), 3)))
    return chosen, {"exact": round(best[0], 3), "within_one": round(best[1], 3), "under": round(-best[2], 3)}, curve


def _linear_job(job):
    """In a worker process: fit the linear model on `fitted` and score each set of `scored`."""
    fitted, scored, soft, steps = job
    import numpy as np
    known = vocabulary(fitted)
    w = fit(np, Matrix(np, fitted, known, soft), L2, steps)
    return [Matrix(np, items, known).scores(np, w) for items in scored], w, known


def linear_stage(np, fitted: list[dict], scored: list[list[dict]], soft: dict, steps: int):
    """-> (out-of-fold scores of `fitted`, the scores of each of `scored` by the linear model
    fitted on all of `fitted`, that model's weights and known keys). The FOLDS + 1 fits run in
    parallel processes."""
    fold = [zlib.crc32(item["id"].encode()) % FOLDS for item in fitted]
    folds = [k for k in range(FOLDS) if k in fold]
    held = [[i for i, f in enumerate(fold) if f == k] for k in folds]
    jobs = [([item for item, f in zip(fitted, fold) if f != k], [[fitted[i] for i in rows]], soft, steps)
            for k, rows in zip(folds, held)]
    jobs.append((fitted, scored, soft, steps))
    workers = min(len(jobs), os.cpu_count() or 1)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        results = list(pool.map(_linear_job, jobs))
    out_of_fold = np.zeros((len(fitted), len(TIERS) - 1))
    for rows, (scores, _, _) in zip(held, results):
        out_of_fold[rows] = scores[0]
    scores, w, known = results[-1]
    return out_of_fold, scores, w, known


def stacked(np, scores, items: list[dict]):
    """The forests' inputs, as router_model builds them: the cut scores, the dense features, the key count."""
    rows = []
    for item in items:
        keys, _, dense = keyed_features(routing_input(item))
        rows.append([*dense, float(len(keys))])
    x = np.hstack([scores, np.array(rows).reshape(len(items), STACKED - scores.shape[1])])
    assert x.shape[1] == STACKED
    return x


def fit_forests(lgb, x, more) -> list:
    """One LightGBM booster per cut on the soft chances of needing more than that tier."""
    return [lgb.train(FOREST, lgb.Dataset(x, label=more[:, k]), TREES) for k in range(more.shape[1])]


def train(data: Path, out: Path, max_under: float, steps: int = STEPS) -> dict:
    try:
        import lightgbm as lgb
        import numpy as np
    except ImportError:
        sys.exit("gateway: router-train needs numpy and lightgbm: pip install -e '.[train]'")
    items = load_set(data)
    train_items = [i for i in items if i["split"] == "train"]
    valid_items = [i for i in items if i["split"] == "validation"]
    started = time.perf_counter()
    soft = soft_labels(train_items + valid_items, data)
    # 1. Fitted on train, judged on validation: calibration and route-up thresholds.
    out_of_fold, (valid_scores,), _, _ = linear_stage(np, train_items, [valid_items], soft, steps)
    forests = fit_forests(lgb, stacked(np, out_of_fold, train_items), targets(np, train_items, soft)[1])
    valid_x = stacked(np, valid_scores, valid_items)
    margins = np.stack([f.predict(valid_x, raw_score=True) for f in forests], axis=1)
    y = targets(np, valid_items)[0]
    temperatures = fit_temperatures(np, margins, y)
    probs = probabilities(np, margins, temperatures)
    bound = under_bound(max_under, len(valid_items))
    route_up, valid, curve = choose_route_up(np, probs, y, bound)
    meta = {"temperatures": temperatures, "route_up": route_up, "route_up_bound": round(bound, 4), "l2": L2,
            "min_count": MIN_COUNT, "soft": SOFT, "soft_items": len(soft), "folds": FOLDS, "trees": TREES,
            "trained_on": len(train_items) + len(valid_items),
            "validation": {"items": len(valid_items), **valid,
                           "likeliest_exact": round(float((probs.argmax(1) == y).mean()), 3),
                           "shared_route_up_curve": curve}}
    # 2. The shipped model: the same, fitted on train and validation together.
    both = train_items + valid_items
    out_of_fold, _, w, known = linear_stage(np, both, [], soft, steps)
    forests = fit_forests(lgb, stacked(np, out_of_fold, both), targets(np, both, soft)[1])
    meta["forests"] = [from_lightgbm(f.dump_model()) for f in forests]
    w = np.hstack([np.zeros((FEATURES, 1)), w])        # the file's first column is zero (router_model)
    LocalClassifier.save(out, meta, w.reshape(-1).tolist(), known)
    _check_forests(np, LocalClassifier.load(out), forests, valid_items[:300])
    meta.pop("forests")
    meta["seconds"] = round(time.perf_counter() - started, 1)
    return meta


def _check_forests(np, model: LocalClassifier, forests, items: list[dict]) -> None:
    """The compiled forests give what LightGBM gives, on the gateway's own inputs."""
    for item in items:
        keys, weight, dense = keyed_features(routing_input(item))
        x = [*model.scores(routing_input(item))[1:], *dense, float(len(keys))]
        want = [float(f.predict(np.array([x]), raw_score=True)[0]) for f in forests]
        got = model.margins(routing_input(item))
        if any(abs(a - b) > 1e-6 for a, b in zip(want, got)):
            raise RuntimeError(f"the compiled forests disagree with LightGBM on {item['id']}: {got} != {want}")


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
                   help="the most under-routing to accept on new requests; the route-up thresholds keep "
                        "validation's one standard error below it")
    p.add_argument("--steps", type=int, default=STEPS, help="optimiser steps per fit")
    p.set_defaults(func=cmd_router_train)
