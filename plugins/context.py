"""The per-call context that travels through the pipeline, and the small value types
the stages hand each other (who is calling, which model serves, what is held)."""
from __future__ import annotations

import itertools
import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from providers.types import ChatRequest, Usage

if TYPE_CHECKING:
    from aiohttp import web

    from config import ChatModel
    from providers.base import Provider

    from .formats.base import ClientFormat
    from .storage import KeyPolicy


_ID_PREFIX = secrets.token_hex(6)
_ID_COUNTER = itertools.count(1)


def new_id() -> str:
    """A unique id without a system call per request: a random per-process prefix and a
    counter (call ids key holds and usage rows, so they must not repeat across restarts)."""
    return f"{_ID_PREFIX}{next(_ID_COUNTER):012x}"


@dataclass(slots=True)
class Principal:
    """Who pays: an account reached through one API key."""
    account_id: int
    key_id: int
    key_prefix: str
    agent_id: int | None = None
    policy: "KeyPolicy | None" = None    # the operator's restrictions on this key (plugins.keypolicy)


@dataclass(slots=True)
class Route:
    """The model that serves a call and how to price it."""
    model: "ChatModel"               # the catalog entry that answers
    provider: "Provider"
    requested_model: str             # what the client sent (svc/free, an alias, ...)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)   # router facts for billing

    @property
    def is_alias(self) -> bool:
        return self.requested_model != self.model.id


@dataclass(slots=True)
class Hold:
    """Money set aside before the upstream call. `kind` says who settles it."""
    kind: str                  # "credits" | "x402" | plugin-defined
    amount_micro: int          # the reserve (the quote)
    call_id: str
    input_tokens: int          # the service's estimate of input
    output_cap: int            # max output tokens covered
    settled: bool = False
    data: dict[str, Any] = field(default_factory=dict)
    # Where the call's upstream render is recorded while it runs (`note_job(call_id, job)`),
    # so that it can be cancelled if the process dies. None means the hold row (the ledger);
    # a call paid per request has no hold row and names the payments store.
    jobs: Any = None


# How a call ended, for settlement.
OK = "ok"                        # answered in full
CLIENT_GONE = "client_gone"      # the client disconnected mid-stream: charge what was produced
FAILED = "failed"                # 4xx / 422 / 502: never charged


@dataclass(slots=True)
class CallContext:
    """One call's state, as typed fields: every stage reads and writes these, so what a
    stage depends on is visible here rather than hidden in string keys."""
    request: "web.Request"
    format: "ClientFormat"             # the endpoint's wire format (chat A/B/C, or a media endpoint)
    call_id: str
    app: "web.Application"             # the request's app (request.app costs two property calls)
    chat: ChatRequest | None = None
    media: Any = None                  # a media job (images, videos), once routed
    media_fields: Any = None           # the parsed media request fields (plugins.media.requests)
    prompt: str = ""                   # the media prompt (what moderation reads for media)
    input_images: int = 0              # images in a chat input (priced at a flat estimate)
    pricer: Any = None                 # prices this call (plugins.pricing.ChatPricer, media's)
    model_id: str = ""                 # the model the client asked for
    streaming: bool = False
    input_chars: int = 0               # what the input estimate is based on
    principal: Principal | None = None
    route: Route | None = None
    hold: Hold | None = None
    outcome: str = FAILED
    status: int = 0
    usage: Usage | None = None         # what the upstream reported (None if it never did)
    output_chars: int = 0              # produced so far, for estimates when usage is missing
    media_files: list | None = None    # media results produced (images are charged per file)
    charge_micro: int = 0              # charged (credits, or the x402 payment)
    free_micro: int = 0                # covered by the daily free allowance
    billing: dict[str, Any] = field(default_factory=dict)   # the billing block
    response_headers: dict[str, str] = field(default_factory=dict)  # e.g. x402 settlement
    error: str | None = None
    upstream_error: str | None = None  # the kind (error code) when the upstream failed the call
    started: float = field(default_factory=time.monotonic)
    upstream_started: float = 0.0      # monotonic time the upstream stage began
    upstream_seconds: float = 0.0      # from then until the answer was complete (settlement began)
    first_token_seconds: float = 0.0   # streams: from the request to the first upstream event
    created_at: int = field(default_factory=lambda: int(time.time()))   # Unix time, for response bodies
    rate_taken: Any = None             # rate-limit tokens to give back once usage is known
    usage_written: bool = False        # the usage row was written (with the settlement)
    finish_task: Any = None            # how the one settle-and-record went or goes (plugins.pipeline.finish)
    state: dict[str, Any] = field(default_factory=dict)      # free space for third-party plugins

    @property
    def endpoint(self) -> str:
        """The endpoint's short name recorded with usage ("chat.completions", "images.generations", ...)."""
        return self.format.endpoint

    def note_error(self, err) -> None:
        """The upstream stage failed with GatewayError `err`, which may have come from the upstream."""
        self.error = err.message
        if err.from_upstream:
            self.upstream_error = err.code or "upstream_error"

    @property
    def has_key(self) -> bool:
        return self.principal is not None

    def header(self, name: str) -> str | None:
        return self.request.headers.get(name)
