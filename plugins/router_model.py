"""svc/smart's local classifier: an ordinal linear model over `router_features`, shipped in the package.

The tiers are ordered (easy < medium < hard < frontier), so the model is one score per
request and three cut points: the chance that a request needs more than tier k is
sigmoid((score - cut[k]) / temperature). One weight per feature keeps a decision to a
single pass over the request's hashed n-grams. The weights file is made by
`gateway router-train` (which needs the `train` extra); reading it and deciding need only
the standard library, so a gateway runs offline with nothing to download. The file also
lists the keys (n-grams, words) seen in training: at load each gets its slot's weight, and a
decision looks keys up in that table instead of hashing them (a key never seen in training
counts zero rather than whatever shares its slot). The temperature
is fitted on the validation split, so the chances are calibrated. The decision routes up
under uncertainty: it takes the lowest tier whose chance of being too low is at most
`route_up` - one threshold per tier below frontier, chosen on the validation split, since
sending a hard request to medium risks more than sending a medium one to easy.
"""
from __future__ import annotations

import json
import math
import sys
from array import array
from dataclasses import dataclass
from functools import cache
from itertools import repeat
from pathlib import Path

from .router_features import DENSE, FEATURES, RoutingInput, keyed_features, slot

TIERS = ("easy", "medium", "hard", "frontier")
WEIGHTS = Path(__file__).resolve().parent / "router_model.bin"


@dataclass(slots=True)
class Decision:
    tier: str
    probabilities: tuple[float, ...]   # calibrated, in TIERS order
    routed_up: bool                    # the model's single best guess was a lower tier

    @property
    def likeliest(self) -> str:
        return TIERS[max(range(len(TIERS)), key=self.probabilities.__getitem__)]


class LocalClassifier:
    def __init__(self, meta: dict, weights: array, known: list[str]):
        if meta.get("dense") != list(DENSE) or len(weights) != FEATURES or len(meta.get("cuts", ())) != len(TIERS) - 1:
            raise ValueError("the router model does not match this version's features; retrain it")
        self.meta = meta
        self.cuts = [float(c) for c in meta["cuts"]]
        self.temperature = float(meta["temperature"])
        self.route_up = tuple(float(a) for a in meta["route_up"])
        self._dense = weights[FEATURES - len(DENSE):].tolist()
        self._known = {key: weights[slot(key)] for key in known}

    # ---- file format: a JSON line; the known keys, one a line; float32 little-endian weights ----
    @classmethod
    def load(cls, path: Path = WEIGHTS) -> "LocalClassifier":
        raw = path.read_bytes()
        head, _, rest = raw.partition(b"\n")
        meta = json.loads(head)
        table = rest[:meta["known_bytes"]].decode()
        weights = array("f")
        weights.frombytes(rest[meta["known_bytes"]:])
        if sys.byteorder == "big":
            weights.byteswap()
        return cls(meta, weights, table.split("\n") if table else [])

    @staticmethod
    def save(path: Path, meta: dict, weights: list[float], known) -> None:
        if any("\n" in key for key in known):
            raise ValueError("a key holds a line break")
        table = "\n".join(sorted(set(known))).encode()
        flat = array("f", weights)
        if sys.byteorder == "big":
            flat.byteswap()
        head = json.dumps({**meta, "dense": list(DENSE), "known_bytes": len(table)}).encode()
        path.write_bytes(head + b"\n" + table + flat.tobytes())

    # ---- inference ------------------------------------------------------------------------
    def score(self, inp: RoutingInput) -> float:
        keys, weight, dense = keyed_features(inp)
        return weight * sum(map(self._known.get, keys, repeat(0.0))) + sum(map(float.__mul__, self._dense, dense))

    def probabilities(self, inp: RoutingInput) -> tuple[float, ...]:
        return tier_probabilities(self.score(inp), self.cuts, self.temperature)

    def decide(self, inp: RoutingInput) -> Decision:
        probs = self.probabilities(inp)
        chosen = pick(probs, self.route_up)
        return Decision(TIERS[chosen], probs, chosen > max(range(len(TIERS)), key=probs.__getitem__))


def tier_probabilities(score: float, cuts, temperature: float) -> tuple[float, ...]:
    """Each tier's chance, from the chances of needing more than each tier (cuts ascending)."""
    above = [1.0] + [_sigmoid((score - cut) / temperature) for cut in cuts] + [0.0]
    return tuple(max(0.0, above[k] - above[k + 1]) for k in range(len(TIERS)))


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z > -60 else 0.0


def pick(probs, route_up) -> int:
    """The lowest tier such that, for it and every tier above it, the chance that the request
    needs more is at most that tier's threshold. `route_up`: one threshold, or one per tier
    below the top."""
    limits = route_up if isinstance(route_up, (tuple, list)) else (route_up,) * (len(probs) - 1)
    above = 0.0
    for i in range(len(probs) - 1, 0, -1):
        above += probs[i]                   # the chance of needing more than tier i - 1
        if above > limits[i - 1]:
            return i
    return 0


@cache
def shipped() -> LocalClassifier | None:
    """The model in the package (None if it is missing, so svc/smart falls back)."""
    try:
        return LocalClassifier.load()
    except (OSError, ValueError) as exc:
        print(f"gateway: svc/smart's local classifier is unavailable: {exc}", file=sys.stderr)
        return None
