"""svc/smart's local classifier: a linear model over `router_features`, shipped in the package.

The weights file is made by `gateway router-train` (which needs the `train` extra); reading
it and deciding need only the standard library, so a gateway runs offline with nothing to
download. Scores are calibrated probabilities (a temperature fitted on the validation
split). The decision routes up under uncertainty: it takes the lowest tier whose chance of
being too low is at most `route_up` (chosen on the validation split), so a request the
model is unsure about goes to the higher of the tiers in question.
"""
from __future__ import annotations

import json
import math
import sys
from array import array
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .router_features import DENSE, FEATURES, RoutingInput, features

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
    def __init__(self, meta: dict, weights: list[array]):
        if meta.get("dense") != list(DENSE) or any(len(w) != FEATURES for w in weights):
            raise ValueError("the router model does not match this version's features; retrain it")
        self.meta = meta
        self.temperature = float(meta["temperature"])
        self.route_up = float(meta["route_up"])
        self._weights = [w.tolist() for w in weights]      # list lookups are the fastest in pure Python
        self._dense = [row[FEATURES - len(DENSE):] for row in self._weights]

    # ---- file format: one JSON line, then float32 little-endian weights, class by class ----
    @classmethod
    def load(cls, path: Path = WEIGHTS) -> "LocalClassifier":
        raw = path.read_bytes()
        head, _, body = raw.partition(b"\n")
        meta = json.loads(head)
        flat = array("f")
        flat.frombytes(body)
        if sys.byteorder == "big":
            flat.byteswap()
        weights = [flat[i * FEATURES:(i + 1) * FEATURES] for i in range(len(TIERS))]
        return cls(meta, weights)

    @staticmethod
    def save(path: Path, meta: dict, weights: list[list[float]]) -> None:
        flat = array("f", [v for row in weights for v in row])
        if sys.byteorder == "big":
            flat.byteswap()
        path.write_bytes(json.dumps({**meta, "dense": list(DENSE)}).encode() + b"\n" + flat.tobytes())

    # ---- inference ------------------------------------------------------------------------
    def logits(self, inp: RoutingInput) -> list[float]:
        slots, weight, dense = features(inp)
        out = []
        for w, wd in zip(self._weights, self._dense):
            out.append(weight * sum(map(w.__getitem__, slots)) + sum(a * b for a, b in zip(wd, dense)))
        return out

    def probabilities(self, inp: RoutingInput) -> tuple[float, ...]:
        scaled = [z / self.temperature for z in self.logits(inp)]
        top = max(scaled)
        exp = [math.exp(z - top) for z in scaled]
        total = sum(exp)
        return tuple(e / total for e in exp)

    def decide(self, inp: RoutingInput) -> Decision:
        probs = self.probabilities(inp)
        chosen = pick(probs, self.route_up)
        return Decision(TIERS[chosen], probs, chosen > max(range(len(TIERS)), key=probs.__getitem__))


def pick(probs, route_up: float) -> int:
    """The lowest tier whose chance of being below the request's need is at most `route_up`."""
    above = 0.0
    for i in range(len(probs) - 1, -1, -1):
        above += probs[i]
        if above > route_up:
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
