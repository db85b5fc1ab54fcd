"""Strict fake of fal.ai's queue API (images and video).

Submit at `POST /{owner}/{app}[/{subpath}]`, then poll the URLs the submit
answer returns; like the real queue, those URLs DROP the subpath
(`/fal-ai/flux/dev` is polled at `/fal-ai/flux/requests/{id}/status`), so a
gateway that builds them itself from the endpoint id fails here as upstream.
Auth is `Authorization: Key <key>`; errors are `{"detail": ...}` bodies, and
validation failures are FastAPI's 422 lists.
"""

from __future__ import annotations

from typing import Any, Iterable

from aiohttp import web

from .media_script import (
    CANCELED,
    FAILED,
    IMAGE_SIZE,
    PENDING,
    Job,
    MediaReply,
    MediaUpstream,
    Progress,
    base_url,
    uuid_id,
)
from .script import RecordedRequest, json_response

# Endpoint ids (owner/app[/subpath]) this fake serves; pass `endpoints=` to change them.
DEFAULT_ENDPOINTS = (
    "fal-ai/flux/dev",
    "fal-ai/flux/schnell",
    "fal-ai/flux-pro/v1.1",
    "fal-ai/flux-pro/kontext",
    "fal-ai/nano-banana",
    "fal-ai/nano-banana/edit",
    "fal-ai/recraft/v3/text-to-image",
    "fal-ai/veo3",
    "fal-ai/veo3/fast",
    "fal-ai/kling-video/v2.1/master/text-to-video",
    "fal-ai/kling-video/v2.1/standard/image-to-video",
)
MAX_IMAGES = 4  # fal's num_images limit on most image models
SEED = 271828
FAILURE_TYPE = "internal_server_error"
PROGRESS_LOGS = [{"message": "Generating...", "level": "INFO", "source": "user", "timestamp": "2025-01-01T00:00:00Z"}]
FAILED_PREFIX = "FAILED:"  # MediaReply.fail starting with this reports status FAILED


class FalError(Exception):
    """A refusal; `detail` is a message string or FastAPI's list of validation errors."""

    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(str(detail))
        self.status = status
        self.detail = detail


class FakeFal(MediaUpstream):
    """Serves the queue (submit, status, result, cancel) and the result files."""

    def __init__(self, api_key: str = "fal-test-key", endpoints: Iterable[str] | None = None) -> None:
        super().__init__(api_key)
        self.endpoints = set(DEFAULT_ENDPOINTS if endpoints is None else endpoints)
        self.cancelled: list[str] = []  # request ids the client asked to cancel
        self.queue_host: str | None = None  # answer queue URLs on this host:port instead (another origin)
        router = self.app.router
        router.add_get("/{owner}/{app}/requests/{request_id}/status", self._status)
        router.add_put("/{owner}/{app}/requests/{request_id}/cancel", self._cancel)
        router.add_get("/{owner}/{app}/requests/{request_id}", self._result)
        router.add_post("/{endpoint:.+}", self._submit)
        router.add_route("*", "/{tail:.*}", self._unknown_route)

    # ---- handlers

    async def _submit(self, request: web.Request) -> web.Response:
        recorded = await self.record(request)
        try:
            check_auth(recorded.headers, self.api_key)
            endpoint = self.known_endpoint(request.match_info["endpoint"])
            body = checked_input(recorded, await request.read())
        except FalError as exc:
            return refuse(recorded, exc)
        reply = self.next_reply()
        if reply.error_status is not None:
            return detail_response(reply.error_status, reply.fail or "fake upstream error")
        owner, app = endpoint.split("/")[:2]
        job = self.new_job(uuid_id(), reply, body, route=f"{owner}/{app}")
        urls = job_urls(request, job, self.queue_host)
        return json_response(
            {"request_id": job.id, "status": "IN_QUEUE", "queue_position": 0, **urls},
            headers={"x-fal-request-id": job.id},
        )

    async def _status(self, request: web.Request) -> web.Response:
        recorded = await self.record(request)
        try:
            job = self.owned_job(recorded, request)
        except FalError as exc:
            return refuse(recorded, exc)
        with_logs = request.query.get("logs", "").lower() in ("1", "true")
        return json_response(status_body(request, job, job.poll(), with_logs))

    async def _result(self, request: web.Request) -> web.Response:
        recorded = await self.record(request)
        try:
            job = self.owned_job(recorded, request)
        except FalError as exc:
            return refuse(recorded, exc)
        phase = job.peek().phase
        if phase == PENDING:
            return refuse(recorded, FalError(400, "Request is still in progress"))
        if phase == CANCELED:
            return detail_response(400, "Request was cancelled")
        if phase == FAILED:
            return detail_response(500, failure_message(job.reply), {"x-fal-error-type": FAILURE_TYPE})
        return json_response(self.result_body(request, job), headers={"x-fal-request-id": job.id})

    async def _cancel(self, request: web.Request) -> web.Response:
        recorded = await self.record(request)
        try:
            job = self.owned_job(recorded, request)
        except FalError as exc:
            return refuse(recorded, exc)
        self.cancelled.append(job.id)
        if job.done:
            return json_response({"status": "ALREADY_COMPLETED"}, status=400)
        job.canceled = True
        return json_response({"status": "CANCELLATION_REQUESTED"}, status=202)

    async def _unknown_route(self, request: web.Request) -> web.Response:
        recorded = await self.record(request)
        return refuse(recorded, FalError(404, "Not Found"))

    # ---- lookups and results

    def known_endpoint(self, endpoint: str) -> str:
        endpoint = endpoint.strip("/")
        if endpoint not in self.endpoints:
            app = "/".join(endpoint.split("/")[:2])
            raise FalError(404, f"Application '{app}' not found")
        return endpoint

    def owned_job(self, recorded: RecordedRequest, request: web.Request) -> Job:
        """The job behind a queue URL; a request id polled under another app is not found.
        URLs on `queue_host` are capability URLs (like signed CDN links): no key needed."""
        if request.host != self.queue_host:
            check_auth(recorded.headers, self.api_key)
        info = request.match_info
        job = self.jobs.get(info["request_id"])
        if job is None or job.route != f"{info['owner']}/{info['app']}":
            raise FalError(404, f"Request {info['request_id']} not found")
        return job

    def result_body(self, request: web.Request, job: Job) -> dict:
        files = self.outputs(job, job.body.get("num_images", 1))
        if job.reply.video:
            media = files[0]
            return {
                "video": {
                    "url": self.file_url(request, media),
                    "content_type": media.content_type,
                    "file_name": media.name,
                    "file_size": len(media.data),
                }
            }
        return {
            "images": [
                {
                    "url": self.file_url(request, media),
                    "width": IMAGE_SIZE,
                    "height": IMAGE_SIZE,
                    "content_type": media.content_type,
                }
                for media in files
            ],
            "timings": {"inference": 0.83},
            "seed": job.body.get("seed", SEED),
            "has_nsfw_concepts": [False] * len(files),
            "prompt": job.body["prompt"],
        }


# ---------------------------------------------------------------- wire shapes


def job_urls(request: web.Request, job: Job, host: str | None = None) -> dict[str, str]:
    """Queue URLs under owner/app only: the subpath is dropped, as upstream does."""
    origin = f"{request.scheme}://{host}" if host else base_url(request)
    base = f"{origin}/{job.route}/requests/{job.id}"
    return {"response_url": base, "status_url": f"{base}/status", "cancel_url": f"{base}/cancel"}


def status_body(request: web.Request, job: Job, progress: Progress, with_logs: bool) -> dict:
    """IN_QUEUE while polls remain, IN_PROGRESS on the last pending poll, then COMPLETED
    (with `error` set when the job failed) or FAILED for a "FAILED:" script."""
    common = {"request_id": job.id, "response_url": job_urls(request, job)["response_url"]}
    if progress.phase == PENDING:
        if progress.remaining:
            return {"status": "IN_QUEUE", "queue_position": progress.remaining - 1, **common}
        return {"status": "IN_PROGRESS", "logs": PROGRESS_LOGS if with_logs else None, **common}
    error = error_type = None
    if progress.phase == CANCELED:
        error, error_type = "Request was cancelled", "request_cancelled"
    elif progress.phase == FAILED:
        error, error_type = failure_message(job.reply), FAILURE_TYPE
        if job.reply.fail.startswith(FAILED_PREFIX):
            return {"status": "FAILED", "logs": None, "error": error, "error_type": error_type, **common}
    logs = [] if with_logs else None
    return {
        "status": "COMPLETED",
        "logs": logs,
        "metrics": {"inference_time": 0.83},
        "error": error,
        "error_type": error_type,
        **common,
    }


def failure_message(reply: MediaReply) -> str:
    return (reply.fail or "").removeprefix(FAILED_PREFIX).strip() or "fake upstream failure"


def detail_response(status: int, detail: Any, headers: dict[str, str] | None = None) -> web.Response:
    extra = {"retry-after": "1"} if status in (429, 503) else {}
    return json_response({"detail": detail}, status=status, headers={**extra, **(headers or {})})


def refuse(recorded: RecordedRequest, exc: FalError) -> web.Response:
    recorded.rejected = exc.detail if isinstance(exc.detail, str) else exc.detail[0]["msg"]
    return detail_response(exc.status, exc.detail)


# ---------------------------------------------------------------- validation


def check_auth(headers: dict[str, str], api_key: str) -> None:
    """fal wants `Key <key>`; a Bearer token is refused like any other wrong header."""
    value = headers.get("authorization", "")
    if value == f"Key {api_key}":
        return
    if not value:
        raise FalError(401, "Missing authorization header")
    if not value.startswith("Key "):
        raise FalError(401, "Invalid authorization header. Expected 'Key <key_id>:<key_secret>'.")
    raise FalError(401, "No user found for Key ID and Secret")


def field_error(loc: list, type_: str, msg: str, value: Any, ctx: dict | None = None) -> dict:
    """One entry of FastAPI/pydantic v2's 422 `detail` list."""
    error = {"type": type_, "loc": ["body", *loc], "msg": msg, "input": value}
    if ctx:
        error["ctx"] = ctx
    return error


def checked_input(recorded: RecordedRequest, raw: bytes) -> dict:
    """The model input once its common fields pass; every failure is reported at once."""
    body = recorded.body
    if body is None:
        if raw.strip().startswith(b"{"):  # an object the JSON parser refused
            raise FalError(422, [field_error([0], "json_invalid", "JSON decode error", {}, {"error": "Invalid JSON"})])
        message = "Input should be a valid dictionary or object to extract fields from"
        raise FalError(422, [field_error([], "model_attributes_type", message, None)])
    errors = prompt_errors(body) + num_images_errors(body) + url_errors(body)
    if errors:
        raise FalError(422, errors)
    return body


def prompt_errors(body: dict) -> list[dict]:
    if "prompt" not in body:
        return [field_error(["prompt"], "missing", "Field required", body)]
    prompt = body["prompt"]
    if not isinstance(prompt, str):
        return [field_error(["prompt"], "string_type", "Input should be a valid string", prompt)]
    if not prompt.strip():
        message = "String should have at least 1 character"
        return [field_error(["prompt"], "string_too_short", message, prompt, {"min_length": 1})]
    return []


def num_images_errors(body: dict) -> list[dict]:
    if "num_images" not in body:
        return []
    value = body["num_images"]
    if not isinstance(value, int) or isinstance(value, bool):
        return [field_error(["num_images"], "int_type", "Input should be a valid integer", value)]
    if value < 1:
        message = "Input should be greater than or equal to 1"
        return [field_error(["num_images"], "greater_than_equal", message, value, {"ge": 1})]
    if value > MAX_IMAGES:
        message = f"Input should be less than or equal to {MAX_IMAGES}"
        return [field_error(["num_images"], "less_than_equal", message, value, {"le": MAX_IMAGES})]
    return []


def url_errors(body: dict) -> list[dict]:
    """Every `*_url` input (image_url, video_url, mask_url...) and `*_urls` list must hold
    URLs fal can fetch: http(s), or inline data: URLs."""
    errors: list[dict] = []
    for name, value in body.items():
        if name.endswith("_urls"):
            if not isinstance(value, list):
                errors.append(field_error([name], "list_type", "Input should be a valid list", value))
                continue
            for index, item in enumerate(value):
                errors += one_url_errors([name, index], item)
        elif name.endswith("_url"):
            errors += one_url_errors([name], value)
    return errors


def one_url_errors(loc: list, value: Any) -> list[dict]:
    if not isinstance(value, str):
        return [field_error(loc, "string_type", "Input should be a valid string", value)]
    if value.startswith(("http://", "https://")) and len(value.split("/", 3)[2]) > 0:
        return []
    if value.startswith("data:") and "," in value:
        return []
    schemes = "'http' or 'https'"
    return [field_error(loc, "url_scheme", f"URL scheme should be {schemes}", value, {"expected_schemes": schemes})]
