"""Strict fake of Replicate's predictions API for official models (images and video).

`POST /v1/models/{owner}/{name}/predictions` creates a prediction that moves
starting -> processing -> succeeded | failed | canceled as the client polls
`urls.get`. Errors are RFC 7807 problem bodies, as upstream sends them; input
validation failures are 422 with `invalid_fields`.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from typing import Any, Iterable

from aiohttp import web

from .media_script import (
    CANCELED,
    FAILED,
    PENDING,
    SUCCEEDED,
    Job,
    MediaUpstream,
    Progress,
    base32_id,
    base_url,
)
from .script import RecordedRequest, json_response

# Official models this fake serves; pass `models=` to change them.
DEFAULT_MODELS = (
    "black-forest-labs/flux-schnell",
    "black-forest-labs/flux-dev",
    "black-forest-labs/flux-1.1-pro",
    "black-forest-labs/flux-kontext-pro",
    "google/imagen-4",
    "ideogram-ai/ideogram-v3-turbo",
    "google/veo-3",
    "google/veo-3-fast",
    "kwaivgi/kling-v2.1",
    "minimax/hailuo-02",
)
TOP_LEVEL_KEYS = ("input", "webhook", "webhook_events_filter", "stream")
WEBHOOK_EVENTS = ("start", "output", "logs", "completed")
PROBLEM_TYPE = "about:blank"  # RFC 7807's default: the title says what went wrong
TITLES = {
    400: "Bad request",
    401: "Unauthenticated",
    402: "Insufficient credit",
    403: "Forbidden",
    404: "Not found",
    422: "Input validation failed",
    429: "Request was throttled",
    500: "Internal server error",
    503: "Service unavailable",
}
PREFER_WAIT = re.compile(r"^\s*wait(?:\s*=\s*(\d+))?\s*$")


class Problem(Exception):
    """A refusal rendered as an RFC 7807 body; `invalid_fields` only for 422s."""

    def __init__(self, status: int, detail: str, invalid_fields: list[dict] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.invalid_fields = invalid_fields


class FakeReplicate(MediaUpstream):
    """Serves create, get and cancel for predictions, and the output files."""

    def __init__(self, api_key: str = "r8_test", models: Iterable[str] | None = None) -> None:
        super().__init__(api_key)
        self.models = set(DEFAULT_MODELS if models is None else models)
        self.times: dict[tuple[str, str], str] = {}  # (prediction id, event) -> timestamp, fixed once seen
        router = self.app.router
        router.add_post("/v1/models/{owner}/{name}/predictions", self._create)
        router.add_get("/v1/predictions/{id}", self._get)
        router.add_post("/v1/predictions/{id}/cancel", self._cancel)
        router.add_route("*", "/{tail:.*}", self._unknown_route)

    # ---- handlers

    async def _create(self, request: web.Request) -> web.Response:
        recorded = await self.record(request)
        try:
            check_auth(recorded.headers, self.api_key)
            model = f"{request.match_info['owner']}/{request.match_info['name']}"
            if model not in self.models:
                raise Problem(404, "The requested resource could not be found.")
            body = checked_body(recorded)
        except Problem as exc:
            return refuse(recorded, exc)
        reply = self.next_reply()
        if reply.error_status is not None:
            return problem_response(Problem(reply.error_status, reply.fail or "fake upstream error"))
        job = self.new_job(base32_id(), reply, body, route=model)
        self.stamp(job, "created_at")
        finished = waits(recorded.headers) and reply.polls_before_done == 0 and not reply.hang
        progress = job.peek() if finished else Progress(PENDING, 1)
        return json_response(self.prediction(request, job, progress), status=201)

    async def _get(self, request: web.Request) -> web.Response:
        recorded = await self.record(request)
        try:
            job = self.known_job(recorded, request)
        except Problem as exc:
            return refuse(recorded, exc)
        return json_response(self.prediction(request, job, job.poll()))

    async def _cancel(self, request: web.Request) -> web.Response:
        recorded = await self.record(request)
        try:
            job = self.known_job(recorded, request)
        except Problem as exc:
            return refuse(recorded, exc)
        if not job.done:
            job.canceled = True
        return json_response(self.prediction(request, job, job.peek()))

    async def _unknown_route(self, request: web.Request) -> web.Response:
        recorded = await self.record(request)
        return refuse(recorded, Problem(404, "The requested resource could not be found."))

    # ---- lookups and rendering

    def known_job(self, recorded: RecordedRequest, request: web.Request) -> Job:
        check_auth(recorded.headers, self.api_key)
        job = self.jobs.get(request.match_info["id"])
        if job is None:
            raise Problem(404, "The requested resource could not be found.")
        return job

    def prediction(self, request: web.Request, job: Job, progress: Progress) -> dict:
        """The prediction object as it stands at `progress`."""
        base = f"{base_url(request)}/v1/predictions/{job.id}"
        status, logs = prediction_status(progress), ""
        body: dict[str, Any] = {
            "id": job.id,
            "model": job.route,
            "version": "hidden",
            "input": job.body["input"],
            "logs": "",
            "output": None,
            "data_removed": False,
            "error": None,
            "source": "api",
            "status": status,
            "created_at": self.stamp(job, "created_at"),
            "urls": {
                "get": base,
                "cancel": f"{base}/cancel",
                "stream": f"{base}/stream",
                "web": f"{base_url(request)}/p/{job.id}",
            },
        }
        if status != "starting":
            body["started_at"] = self.stamp(job, "started_at")
            logs = "Using seed: 271828\n"
        if progress.phase != PENDING:
            body["completed_at"] = self.stamp(job, "completed_at")
            body["metrics"] = {"predict_time": 1.18}
        if progress.phase == SUCCEEDED:
            body["output"] = self.output(request, job)
            logs += "Generated output\n"
            if not job.reply.video:
                body["metrics"]["image_count"] = len(body["output"])
        elif progress.phase == FAILED:
            body["error"] = job.reply.fail or "fake upstream failure"
        body["logs"] = logs
        return body

    def stamp(self, job: Job, event: str) -> str:
        """When `event` first happened: later reads of the prediction repeat the same time."""
        return self.times.setdefault((job.id, event), iso_now())

    def output(self, request: web.Request, job: Job) -> str | list[str]:
        """Video models answer one URL string; image models a list of URLs."""
        requested = job.body["input"].get("num_outputs", 1)
        files = self.outputs(job, requested if isinstance(requested, int) and requested > 0 else 1)
        urls = [self.file_url(request, media) for media in files]
        return urls[0] if job.reply.video else urls


def prediction_status(progress: Progress) -> str:
    """Pending polls say "starting" while more remain and "processing" on the last one."""
    if progress.phase == PENDING:
        return "starting" if progress.remaining else "processing"
    return {SUCCEEDED: "succeeded", FAILED: "failed", CANCELED: "canceled"}[progress.phase]


def iso_now() -> str:
    now = datetime.fromtimestamp(time.time(), tz=timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def waits(headers: dict[str, str]) -> bool:
    """`Prefer: wait` or `Prefer: wait=N` asks for a synchronous answer."""
    return bool(PREFER_WAIT.match(headers.get("prefer", "")))


# ---------------------------------------------------------------- errors


def problem_response(exc: Problem) -> web.Response:
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE,
        "title": TITLES.get(exc.status, "Error"),
        "status": exc.status,
        "detail": exc.detail,
    }
    if exc.invalid_fields is not None:
        body["invalid_fields"] = exc.invalid_fields
    headers = {"retry-after": "1"} if exc.status == 429 else {}
    return web.json_response(body, status=exc.status, headers=headers, content_type="application/problem+json")


def refuse(recorded: RecordedRequest, exc: Problem) -> web.Response:
    recorded.rejected = exc.detail
    return problem_response(exc)


# ---------------------------------------------------------------- validation


def check_auth(headers: dict[str, str], api_key: str) -> None:
    """`Bearer <key>`, or the legacy `Token <key>`."""
    value = headers.get("authorization", "")
    if value in (f"Bearer {api_key}", f"Token {api_key}"):
        return
    if not value:
        raise Problem(401, "You did not pass an authentication token")
    raise Problem(401, "You did not pass a valid authentication token")


def invalid(field: str, type_: str, description: str) -> dict:
    return {"type": type_, "field": field, "description": description}


def checked_body(recorded: RecordedRequest) -> dict:
    """Top-level keys are checked strictly (upstream refuses typos like `inptu`), then the
    input fields every image and video model requires."""
    body = recorded.body
    if body is None:
        raise Problem(400, "The request body is not valid JSON.")
    fields = [
        invalid("", "additional_property_not_allowed", f"Additional property {name} is not allowed")
        for name in body
        if name not in TOP_LEVEL_KEYS
    ]
    fields += input_fields(body) + webhook_fields(body)
    if fields:
        detail = "".join(f"- {item['field'] or '(root)'}: {item['description']}\n" for item in fields)
        raise Problem(422, detail, fields)
    return body


def input_fields(body: dict) -> list[dict]:
    if "input" not in body:
        return [invalid("", "required", "input is required")]
    data = body["input"]
    if not isinstance(data, dict):
        return [invalid("input", "invalid_type", "Invalid type. Expected: object, given: " + json_type(data))]
    prompt = data.get("prompt")
    if prompt is None:
        return [invalid("input", "required", "prompt is required")]
    if not isinstance(prompt, str):
        return [invalid("input.prompt", "invalid_type", "Invalid type. Expected: string, given: " + json_type(prompt))]
    if not prompt.strip():
        return [invalid("input.prompt", "string_gte", "String length must be greater than or equal to 1")]
    return []


def webhook_fields(body: dict) -> list[dict]:
    fields: list[dict] = []
    hook = body.get("webhook")
    if hook is not None and not (isinstance(hook, str) and hook.startswith(("http://", "https://"))):
        fields.append(invalid("webhook", "format", "Does not match format 'uri'"))
    events = body.get("webhook_events_filter")
    if events is not None:
        if not isinstance(events, list) or not all(event in WEBHOOK_EVENTS for event in events):
            allowed = ", ".join(WEBHOOK_EVENTS)
            fields.append(invalid("webhook_events_filter", "enum", f"Must be a list of: {allowed}"))
    return fields


def json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "null" if value is None else "object"
