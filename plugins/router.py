"""svc/smart: pick the model per request.

Chat (chat completions and responses; a key is required): a classifier chain rates the
request easy, medium, hard or frontier, and `router.tiers` maps the rating to a model.
1. `llm`: a configured cheap model is asked for one word, within `timeout_ms`;
2. `heuristic`: local features (length, code, maths, multi-step and research markers,
   tools), in microseconds;
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

import structlog
from aiohttp import web

from config import ConfigError

from . import hookimpl
from .appstate import CONFIG, PROVIDERS
from .context import CallContext
from .errors import bad_request
from .routing import route_to
from providers.types import ChatRequest, Message, TextPart, ToolResult

ROUTER = web.AppKey("router", object)
SMART = "svc/smart"
DIFFICULTIES = ("easy", "medium", "hard", "frontier")
QUALITIES = ("low", "medium", "high")
log = structlog.get_logger("router")

RUBRIC = ("Rate how capable a model must be to answer the user's request well. Answer with exactly one word: "
          "easy (chit-chat, one fact, a one-step edit), medium (explanations, summaries, short code, emails), "
          "hard (multi-step reasoning, non-trivial code, proofs, design), frontier (research-level or expert work "
          "with many constraints).")
# Heuristic features. Each pattern is a marker of the work a request asks for; several
# languages are covered for the most telling verbs. Tuned on half of the labelled set
# (odd ids) and checked on the other half: see `gateway router-eval`.
TASK = re.compile(r"\b(explain|describe|difference|summari[sz]e|compare|write (a|an|me)|draft|convert|rewrite|"
                  r"outline|email|e-mail|letter|post|essay|recipe|how (do|does|can|to)|why (do|does|is)|"
                  r"use the \w+ tool|call \w+|list (the|some|\d)|give (me )?(two|three|\d))\b|"
                  r"explica|erkl[äa]r|expliqu|explique|schreib|escrib|[ée]cri|escreva|解释|説明|写一|書いて", re.I)
HARD = re.compile(r"\b(prove|proof|show that|derive|implement|algorithm|complexity|o\(n|deadlock|race condition|"
                  r"bug|debug|refactor|parser|compiler|interpreter|schedul|optimi[sz]|design (a|an|the)|"
                  r"architecture|trade-?offs?|sql|query|recursive|dynamic programming|concurren|thread|mutex|"
                  r"coroutine|cache|distributed|scal(e|able|ing)|generali[sz]e|invariant|converge|"
                  r"eigen|integral|probabilit|theorem|lemma|unit tests?|write barrier|garbage collect|"
                  r"retention|cohort|window function|join|index(es)?\b|transaction|consisten|analy[sz]e|"
                  r"walk through|diagnos|latency|calculate|estimate|workflow|pipeline|trigger|cryptograph|"
                  r"diseñ|analiz)|設計|设计|最適|优化", re.I)
PROOF = re.compile(r"\b(prove|proof|show that|demuestr|beweis|d[ée]montr|demonstr)|证明|証明|導出", re.I)
FRONTIER = re.compile(r"\b(research|novel|state[- ]of[- ]the[- ]art|formal(ly)? verif|verified|olympiad|"
                      r"open problem|conjecture|first principles|rigorous(ly)?|lower[- ]bound|upper bound|"
                      r"np-hard|undecidable|reduce from|byzantine|consensus|asymptotic|best-known|approximation "
                      r"algorithm|optimal(ity)?|minimum number|find all|determine all|all (positive )?integers|"
                      r"complete proof|full proof|characteri[sz]e|equality case|irrational|preprint|reproduce|"
                      r"calibrat|coq|isabelle|lean 4|threshold theorem|multi-region|zero-downtime|threat model|"
                      r"nation(al|wide)|hundreds of|millions of)\b|量子|百万", re.I)
CODE = re.compile(r"```|\n\s*(def|class|func|fn|int|for|if|return|SELECT)\b|[{};]\s*\n|#include|=>|::", re.I)
NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
SIMPLE = re.compile(r"^\s*(hi|hello|hey|thanks|thank you|good (morning|night)|hola|bonjour|hallo|ciao|"
                    r"what is the capital|what's the capital|how do you spell|spell|translate|define|"
                    r"what (day|time|year)|who (is|was|wrote))\b", re.I)


@dataclass
class RouterSettings:
    tiers: dict[str, str] = field(default_factory=dict)
    fallback: str = "medium"
    classifier_model: str | None = None
    timeout: float = 1.5
    heuristic: bool = True
    media: dict = field(default_factory=dict)


@hookimpl
def gateway_configure(app, config):
    raw = config.section("router")
    classifier = raw.get("classifier") or {}
    settings = RouterSettings(tiers=dict(raw.get("tiers") or {}), fallback=str(raw.get("fallback", "medium")),
                              classifier_model=classifier.get("model"),
                              timeout=float(classifier.get("timeout_ms", 1500)) / 1000,
                              heuristic=bool(raw.get("heuristic", True)), media=dict(raw.get("media") or {}))
    problems = [f"router.tiers.{t}: {m!r} is not a chat model" for t, m in settings.tiers.items()
                if m not in config.chat_models] + \
               [f"router.tiers.{t}: unknown tier (known: {', '.join(DIFFICULTIES)})" for t in settings.tiers
                if t not in DIFFICULTIES]
    if settings.tiers and set(settings.tiers) != set(DIFFICULTIES):
        problems.append(f"router.tiers: give a model for each of {', '.join(DIFFICULTIES)}")
    if settings.classifier_model and settings.classifier_model not in config.chat_models:
        problems.append(f"router.classifier.model: {settings.classifier_model!r} is not a chat model")
    if problems:
        raise ConfigError([f"{config.path}: {p}" for p in problems])
    app[ROUTER] = settings


# ---- classifiers -------------------------------------------------------------------

def heuristic(text: str, tools: bool = False) -> str | None:
    """A difficulty from local features, or None when there is nothing to judge."""
    text = text.strip()
    if not text:
        return None
    wide = sum(1 for ch in text if ord(ch) > 0x2E80)          # CJK says more per character
    length = len(text) + 2 * wide
    score = 1.0 if TASK.search(text) else 0.0
    score += min(3.0, 1.25 * len(HARD.findall(text)))
    score += 2.0 if PROOF.search(text) else 0.0
    score += min(4.0, 2.0 * len(FRONTIER.findall(text)))
    score += 0.75 if CODE.search(text) else 0.0
    numbers = len(NUMBER.findall(text))
    score += 1.25 if numbers >= 5 else 0.5 if numbers >= 3 else 0.0
    score += 0.5 if length > 250 else 0.0
    score += 0.5 if length > 900 else 0.0
    score += 0.25 if tools else 0.0
    if SIMPLE.search(text) and length < 80:
        score -= 1.0
    if score < 0.75:
        return "easy"
    if score < 2.0:
        return "medium"
    if score < 3.75:
        return "hard"
    return "frontier"


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


async def classify(app, text: str, tools: bool = False) -> tuple[str, str]:
    """-> (difficulty, which classifier decided)."""
    difficulty = await llm(app, text)
    if difficulty:
        return difficulty, "llm"
    if app[ROUTER].heuristic:
        difficulty = heuristic(text, tools)
        if difficulty:
            return difficulty, "heuristic"
    return app[ROUTER].fallback, "fallback"


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
async def gateway_select_route(ctx: CallContext):
    if ctx.model_id != SMART or not ctx.format.allows_smart:
        return None
    settings: RouterSettings = ctx.request.app[ROUTER]
    if ctx.chat is None:
        return _media_route(ctx, settings)
    if not settings.tiers:
        raise bad_request("svc/smart is not configured on this gateway", param="model")
    difficulty, how = await classify(ctx.request.app, request_text(ctx.chat), bool(ctx.chat.tools))
    route = route_to(ctx, settings.tiers[difficulty], requested=SMART)
    route.extra.update(difficulty=difficulty, classifier=how)
    route.notes.append(f"svc/smart routed to {route.model.id} ({difficulty}, by {how})")
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
    model = ctx.request.app[MEDIA].catalog.get(model_id)
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
