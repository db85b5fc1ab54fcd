"""svc/smart: pick the model per request.

Chat (chat completions and responses; a key is required): a classifier chain rates the
request easy, medium, hard or frontier, and `router.tiers` maps the rating to a model.
1. `llm`: a configured cheap model is asked for one word, within `timeout_ms`;
2. `local`: a linear model shipped in the package (`router_model`), trained on the
   project's labelled set; it routes up when unsure (`router.heuristic: false` turns it off);
3. `fallback`: `router.fallback` (default medium) when neither could decide.
The billing block says which model answered, the difficulty and which classifier chose.

Media: `router.media.<image|video>.<operation>.<low|medium|high>` names the model for each
quality tier (default medium); settings the routed model does not offer are dropped, and
`resolution` and `video_url` are refused on svc/smart.
"""
from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import Literal

import structlog
from aiohttp import web
from pydantic import model_validator

from config.schema import Count, Section

from . import hookimpl
from .appstate import CONFIG, PROVIDERS
from .context import CallContext
from .errors import bad_request
from .router_features import RoutingInput, from_messages
from .router_model import TIERS, shipped
from .routing import route_to
from providers.types import ChatRequest, Message, TextPart, ToolResult

ROUTER = web.AppKey("router", object)
SMART = "svc/smart"
DIFFICULTIES = TIERS
QUALITIES = ("low", "medium", "high")
log = structlog.get_logger("router")

RUBRIC = ("Rate how capable a model must be to answer the user's request well. Answer with exactly one word: "
          "easy (chit-chat, one fact, a one-step edit), medium (explanations, summaries, short code, emails), "
          "hard (multi-step reasoning, non-trivial code, proofs, design), frontier (research-level or expert work "
          "with many constraints).")
@dataclass
class RouterSettings:
    tiers: dict[str, str] = field(default_factory=dict)
    fallback: str = "medium"
    classifier_model: str | None = None
    timeout: float = 1.5
    heuristic: bool = True
    media: dict = field(default_factory=dict)


Difficulty = Literal["easy", "medium", "hard", "frontier"]
Quality = Literal["low", "medium", "high"]


class ClassifierSection(Section):
    model: str | None = None             # a fast chat model asked for one word
    timeout_ms: Count = 1500


class RouterSection(Section):
    """`router:` in the YAML."""
    tiers: dict[Difficulty, str] = {}
    fallback: Difficulty = "medium"
    heuristic: bool = True
    classifier: ClassifierSection = ClassifierSection()
    media: dict[Literal["image", "video"], dict[str, dict[Quality, str]]] = {}

    @model_validator(mode="after")
    def _every_tier(self):
        if self.tiers and set(self.tiers) != set(DIFFICULTIES):
            raise ValueError(f"tiers: give a model for each of {', '.join(DIFFICULTIES)}")
        return self

    def references(self, known):
        for tier, model_id in self.tiers.items():
            yield from known.chat_model(f"tiers.{tier}", model_id)
        if self.classifier.model:
            yield from known.chat_model("classifier.model", self.classifier.model)
        for kind, operations in self.media.items():
            for operation, by_quality in operations.items():
                for quality, model_id in by_quality.items():
                    yield from known.media_model(f"media.{kind}.{operation}.{quality}", model_id, kind, operation)


@hookimpl
def gateway_register_settings(register):
    register("router", RouterSection)


@hookimpl
def gateway_configure(app, config):
    raw: RouterSection = config.settings("router")
    settings = RouterSettings(tiers=dict(raw.tiers), fallback=raw.fallback, classifier_model=raw.classifier.model,
                              timeout=raw.classifier.timeout_ms / 1000, heuristic=raw.heuristic,
                              media=dict(raw.media))
    app[ROUTER] = settings
    if settings.heuristic and settings.tiers:
        shipped()                 # load the local classifier once, at start


# ---- classifiers -------------------------------------------------------------------

async def llm(app, text: str) -> str | None:
    settings: RouterSettings = app[ROUTER]
    if not settings.classifier_model:
        return None
    model = app[CONFIG].chat_models[settings.classifier_model]
    provider = app[PROVIDERS][model.provider]
    if provider.unavailable_reason():
        return None
    req = ChatRequest(model=model.id, max_tokens=16, temperature=0.0,
                      messages=[Message("system", [TextPart(RUBRIC)]), Message("user", [TextPart(text[:4000])])])
    try:
        answer = await asyncio.wait_for(provider.complete(req, model), settings.timeout)
    except Exception as exc:      # a slow or failing classifier must never fail the call
        log.info("router_llm_unavailable", error=exc.__class__.__name__)
        return None
    word = re.search(r"easy|medium|hard|frontier", answer.text().lower())
    return word.group(0) if word else None


def routing_input(chat: ChatRequest) -> RoutingInput:
    return from_messages([(m.role, m.text(), m.role == "tool" or any(isinstance(p, ToolResult) for p in m.parts))
                          for m in chat.messages], len(chat.tools))


async def classify(app, chat: ChatRequest) -> tuple[str, str, str]:
    """-> (difficulty, which classifier decided, what to add to the billing note)."""
    difficulty = await llm(app, request_text(chat))
    if difficulty:
        return difficulty, "llm", ""
    model = shipped() if app[ROUTER].heuristic else None
    inp = routing_input(chat)
    if model is not None and inp.last.strip():
        decision = model.decide(inp)
        note = ""
        if decision.routed_up:
            p = decision.probabilities[DIFFICULTIES.index(decision.likeliest)]
            note = f"; routed up from {decision.likeliest} (unsure: p={p:.2f})"
        return decision.tier, "local", note
    return app[ROUTER].fallback, "fallback", ""


def request_text(chat: ChatRequest) -> str:
    """What to judge: the last user turn's text (a tool-result turn has none)."""
    for m in reversed(chat.messages):
        if m.role == "user":
            return "" if any(isinstance(p, ToolResult) for p in m.parts) else m.text()
        if m.role == "tool":
            return ""
    return ""


# ---- routing -----------------------------------------------------------------------

@hookimpl(tryfirst=True)
def gateway_select_route(ctx: CallContext):
    """svc/smart: a media route at once, a chat route once classified (a coroutine); else None
    without a coroutine (the hook runs on every call)."""
    if ctx.model_id != SMART or not ctx.format.allows_smart:
        return None
    settings: RouterSettings = ctx.app[ROUTER]
    if ctx.chat is None:
        return _media_route(ctx, settings)
    if not settings.tiers:
        raise bad_request("svc/smart is not configured on this gateway", param="model")
    return _chat_route(ctx, settings)


async def _chat_route(ctx: CallContext, settings: RouterSettings):
    difficulty, how, why = await classify(ctx.app, ctx.chat)
    route = route_to(ctx, settings.tiers[difficulty], requested=SMART)
    route.extra.update(difficulty=difficulty, classifier=how)
    route.notes.append(f"svc/smart routed to {route.model.id} ({difficulty}, by {how}{why})")
    return route


def _media_route(ctx: CallContext, settings: RouterSettings):
    from .media import MEDIA, media_route
    endpoint = ctx.format
    f = ctx.media_fields
    body = f.body
    for refused in ("resolution", "video_url"):
        if body.get(refused) is not None:
            raise f.fail(refused, f"{refused} is not accepted on svc/smart; name a model to choose it")
    tier = body.get("quality") or "medium"
    if tier not in QUALITIES:
        raise f.fail("quality", f"on svc/smart, quality picks the tier: one of {', '.join(QUALITIES)}")
    if endpoint.kind == "image":
        operation = "edit" if body.get("image_url") or body.get("input_images") else "generate"
    elif len(body.get("input_images") or []) >= 2:
        operation = "reference_to_video"
    else:
        operation = "image_to_video" if body.get("image_url") or body.get("input_images") else "text_to_video"
    model_id = ((settings.media.get(endpoint.kind) or {}).get(operation) or {}).get(tier)
    if not model_id:
        raise f.fail("model", f"svc/smart has no {endpoint.kind} model for {operation} at quality {tier}")
    model = ctx.app[MEDIA].catalog.get(model_id)
    _drop_unsupported(body, model, endpoint.kind)
    route = media_route(ctx, model_id, requested=SMART)
    route.notes.append(f"svc/smart routed to {model_id} ({operation}, {tier})")
    return route


def _drop_unsupported(body: dict, model, kind: str) -> None:
    """svc/smart drops what the routed model does not offer instead of refusing it."""
    if model is None:
        return
    if body.get("aspect_ratio") not in model.aspect_ratios:
        body.pop("aspect_ratio", None)
    quality = body.pop("quality", None)
    if kind == "image" and model.quality and quality in model.quality.values:
        body["quality"] = quality
    if kind == "video":
        seconds = body.get("duration_seconds", body.get("seconds"))
        try:
            fits = seconds is None or model.duration.allows(float(seconds))
        except (TypeError, ValueError):
            fits = False
        if not fits:
            body.pop("duration_seconds", None)
            body.pop("seconds", None)
        if model.audio_default is None:
            body.pop("audio", None)
