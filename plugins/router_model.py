"""svc/smart's local classifier: a cumulative linear model over `router_features`, then small
forests of boosted trees over its scores (router_forest), shipped in the package.

Tiers are ordered, and routing asks one question per step between neighbouring tiers: is this
request too much for easy, for medium, for hard? The linear model answers each with one
weight per key and cut (its scores cost one lookup per key of the request and two sums, see
`LocalClassifier.__init__`). Its three scores, the dense features and how many keys the
request has then go through one forest of trees per cut, fitted on scores the linear model
gave requests it was not trained on, which reads what a sum cannot (a score means more when
the model knows more of the request's keys); each forest's output is scaled by a temperature
per cut fitted on the validation split so the chances are calibrated. A tier's chance is the
difference between the chances of needing more than the tier below and more than itself
(made monotone first). The weights file is made by `gateway router-train` (which needs the
`train` extra); reading it and deciding need only the standard library, so a gateway runs
offline with nothing to download. The file lists the keys (n-grams, words) that occur in
enough training requests (router_train.MIN_COUNT), and training reads only those keys, so the
gateway's table and the trained model give the same scores (a key never seen in training
counts zero). The decision routes up under uncertainty: it takes the lowest tier whose chance
of being too low is at most `route_up` - one threshold per tier below frontier, chosen on the
validation split, since sending a hard request to medium risks more than sending a medium
one to easy.
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

from .router_features import DENSE, FEATURES, NGRAMS, RoutingInput, keyed_features, slot
from .router_forest import compile_forests

TIERS = ("easy", "medium", "hard", "frontier")
VERSION = 6                        # the file format and model kind; an older file is refused
STACKED = 3 + len(DENSE) + 1       # what the forests read: the cut scores, the dense features, the key count
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
        if (meta.get("dense") != list(DENSE) or meta.get("ngrams") != list(NGRAMS) or meta.get("version") != VERSION
                or len(weights) != FEATURES * len(TIERS)):
            raise ValueError("the router model does not match this version's features; retrain it")
        self.meta = meta
        self.temperatures = tuple(float(t) for t in meta["temperatures"])
        self.route_up = tuple(float(a) for a in meta["route_up"])
        # The cut scores are the three columns after the first, which training leaves at zero
        # (they are taken relative to it all the same). Each known key's three are packed, in
        # fixed point, into one integer (digits of base 2**64, signed), so a decision is one
        # dict lookup per key and one C-level sum; packing is linear, so the sum unpacks into
        # the three sums.
        n = len(TIERS)
        dense_at = (FEATURES - len(DENSE)) * n
        dense = [weights[dense_at + t::n].tolist() for t in range(n)]
        self._dense = [[w - base for w, base in zip(dense[t], dense[0])] for t in range(1, n)]
        self._packed = {key: _pack(weights, slot(key) * n) for key in known}
        try:
            if len(meta["forests"]) != n - 1:
                raise ValueError("one forest per cut")
            self._forests = compile_forests(meta["forests"], STACKED)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise ValueError(f"the router model's forests are malformed: {exc}") from exc

    # ---- file format: a JSON line; the known keys, one a line; float32 little-endian weights,
    # slot-major (slot * 4 + tier), the dense features' slots after the hashed ones. Column t
    # (t >= 1) scores the chance of needing more than tier t - 1; column 0 is zero ----
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
        """`known`: the known keys in the order the table should hold them (router-train gives
        the commonest first: the gateway's dict is built in file order, and keys built together
        sit together in memory)."""
        if any("\n" in key for key in known):
            raise ValueError("a key holds a line break")
        table = "\n".join(dict.fromkeys(known)).encode()
        flat = array("f", weights)
        if sys.byteorder == "big":
            flat.byteswap()
        head = json.dumps({**meta, "version": VERSION, "dense": list(DENSE), "ngrams": list(NGRAMS),
                           "known_bytes": len(table)}).encode()
        path.write_bytes(head + b"\n" + table + flat.tobytes())

    # ---- inference ------------------------------------------------------------------------
    def scores(self, inp: RoutingInput) -> list[float]:
        """The linear model's [0, then per cut the score of needing more than easy, more than
        medium, more than hard]: the weights' columns relative to the first (zero) one."""
        return self._linear(*keyed_features(inp))

    def margins(self, inp: RoutingInput) -> tuple[float, ...]:
        """Per cut, the forests' log-odds (before the temperature) of needing more than that tier."""
        keys, weight, dense = keyed_features(inp)
        return self._forests([*self._linear(keys, weight, dense)[1:], *dense, float(len(keys))])

    def _linear(self, keys, weight: float, dense: list[float]) -> list[float]:
        total = sum(map(self._packed.get, keys, repeat(0)))
        sums = []
        for _ in range(len(TIERS) - 1):
            digit = (total + _HALF) % _BASE - _HALF
            sums.append(digit)
            total = (total - digit) // _BASE
        scale = weight / _SCALE
        return [0.0] + [s * scale + sum(map(float.__mul__, w, dense)) for s, w in zip(sums, self._dense)]

    def probabilities(self, inp: RoutingInput) -> tuple[float, ...]:
        return tier_chances(self.margins(inp), self.temperatures)

    def decide(self, inp: RoutingInput) -> Decision:
        probs = self.probabilities(inp)
        chosen = pick(probs, self.route_up)
        return Decision(TIERS[chosen], probs, chosen > max(range(len(TIERS)), key=probs.__getitem__))


_SCALE = 1 << 24                   # fixed point for the packed weights: steps of 6e-8
_BASE = 1 << 64                    # room for the sum of ten thousand keys' weights, either sign
_HALF = _BASE >> 1


def _pack(weights, at: int) -> int:
    """The key's three weights relative to the first tier's, as signed base-2**64 digits."""
    first = weights[at]
    return sum(round((weights[at + t] - first) * _SCALE) * _BASE ** (t - 1) for t in range(1, len(TIERS)))


def tier_chances(cuts, temperatures) -> tuple[float, ...]:
    """Per tier, from each cut's log-odds of needing more than that tier: the chances of needing
    more, made non-increasing up the tiers, and their differences."""
    more, above = [], 1.0
    for score, temperature in zip(cuts, temperatures):
        z = score / temperature
        chance = 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))
        above = min(above, chance)
        more.append(above)
    lower = [1.0] + more
    return tuple(lower[t] - (more[t] if t < len(more) else 0.0) for t in range(len(lower)))


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
