"""The gateway's Prometheus metrics, defined once.

They live in prometheus-client's default registry, the library's own idiom and what its
multi-process mode needs (`gateway run --workers N`: each worker writes its values to
files in PROMETHEUS_MULTIPROC_DIR, and a scrape of any worker sums them; see multiproc.py).

Every label value is bounded: endpoints and statuses come from the code, models from the
catalog ("other" for anything else), providers from the config. A labelled child is bound
once and kept (`Bound`): prometheus-client's `labels()` takes a lock and checks its
arguments on every call, a dict lookup does not.

In one process, what a call counts is kept as plain numbers beside each child (`Pending`,
`PendingHistogram`) and handed to prometheus-client when /metrics is scraped (`flush`):
its `inc` and `observe` take a lock and pass through several frames each time, and a call
makes about ten of them. A scrape flushes first, so it never misses a count made before
it was asked. With workers (multi-process mode) every count goes to prometheus-client's
files at once, as a scrape of one worker cannot ask the others to flush.
"""
from __future__ import annotations

from bisect import bisect_left

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client import values as client_values

OTHER = "other"          # the model label of a model id the catalog does not know (never user input)
NONE = "none"            # no provider (refused before routing)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


# One process (prometheus-client keeps values in memory): counts wait beside their child.
BATCHED = client_values.ValueClass is client_values.MutexValue


class Pending:
    """A counter's or gauge's child with the amount counted since the last scrape."""

    __slots__ = ("child", "amount")

    def __init__(self, child):
        self.child, self.amount = child, 0

    def inc(self, amount: float = 1) -> None:
        self.amount += amount

    def dec(self, amount: float = 1) -> None:
        self.amount -= amount

    def flush(self) -> None:
        if self.amount:
            amount, self.amount = self.amount, 0
            self.child.inc(amount)


class PendingHistogram:
    """A histogram's child with the observations since the last scrape, per bucket: the
    same buckets prometheus-client counts (an observation goes to the first bound it does
    not exceed), handed over in one increment per bucket."""

    __slots__ = ("child", "bounds", "counts", "total")

    def __init__(self, child):
        self.child, self.bounds = child, child._upper_bounds
        self.counts, self.total = [0] * len(self.bounds), 0.0

    def observe(self, amount: float) -> None:
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.total += amount

    def flush(self) -> None:
        counts = self.counts
        if any(counts):
            total, self.counts, self.total = self.total, [0] * len(counts), 0.0
            self.child._sum.inc(total)
            for bucket, count in zip(self.child._buckets, counts):
                if count:
                    bucket.inc(count)


_PENDING: list[Pending | PendingHistogram] = []


def batched(child):
    """`child` itself with workers; else the child with its counts kept until a scrape."""
    if not BATCHED:
        return child
    pending = PendingHistogram(child) if isinstance(child, Histogram) else Pending(child)
    _PENDING.append(pending)
    return pending


def flush() -> None:
    """Hand every count kept since the last scrape to prometheus-client (on the event loop,
    where the counts are made)."""
    for pending in _PENDING:
        pending.flush()


class Bound:
    """A labelled metric whose children are bound once per distinct label values."""

    __slots__ = ("metric", "children")

    def __init__(self, metric):
        self.metric = metric
        self.children: dict[tuple, object] = {}

    def __call__(self, *values: str):
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = batched(self.metric.labels(*values))
        return child


REQUESTS = Bound(Counter(
    "gateway_requests", "Calls by endpoint, model, provider, HTTP status and outcome "
    "(ok, client_gone, failed, refused)", ["endpoint", "model", "provider", "status", "outcome"]))
REQUEST_SECONDS = Bound(Histogram(
    "gateway_request_duration_seconds", "Whole call, from the request to the last byte",
    ["endpoint"], buckets=LATENCY_BUCKETS))
UPSTREAM_SECONDS = Bound(Histogram(
    "gateway_upstream_duration_seconds", "The upstream work of a call, from asking the provider to its "
    "whole answer", ["provider"], buckets=LATENCY_BUCKETS))
FIRST_TOKEN_SECONDS = Bound(Histogram(
    "gateway_time_to_first_token_seconds", "Streams: from the request to the first event of the answer",
    ["provider"], buckets=LATENCY_BUCKETS))
TOKENS = Bound(Counter(
    "gateway_tokens", "Tokens billed, by model and direction (input, output)", ["model", "direction"]))
UPSTREAM_ERRORS = Bound(Counter(
    "gateway_upstream_errors", "Failed upstream calls by provider and kind (the error code: upstream_error, "
    "upstream_timeout, upstream_rate_limited, ...)", ["provider", "kind"]))

_charged = Counter("gateway_charged_usd_micro", "Money charged for calls, micro-USD, by how it was paid",
                   ["payment"])
CHARGED = {kind: batched(_charged.labels(kind)) for kind in ("credits", "allowance", "x402")}

HOLDS_OPEN = batched(Gauge("gateway_holds_open", "Credit holds of calls in flight", multiprocess_mode="livesum"))

_rate_limited = Counter("gateway_rate_limited", "Requests refused with 429 by a rate limit, by the limit "
                        "(requests, tokens)", ["limit"])
RATE_LIMITED = {kind: batched(_rate_limited.labels(kind)) for kind in ("requests", "tokens")}

_moderation = Counter("gateway_moderation_refusals", "Requests refused with 422 by moderation, by what "
                      "flagged them (rules, provider)", ["by"])
MODERATION_REFUSALS = {by: batched(_moderation.labels(by)) for by in ("rules", "provider")}

_x402 = Counter("gateway_x402_payments", "x402 payments: verified, settled, refused (before any work), "
                "settle_failed", ["result"])
X402 = {result: batched(_x402.labels(result)) for result in ("verified", "settled", "refused", "settle_failed")}
