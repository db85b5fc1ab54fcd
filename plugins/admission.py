"""Admission: refuse what the service will not take before any money or upstream work.

- 401 on endpoints that need a key when none was sent;
- 413 when the input is over the endpoint's character cap;
- 400 for streaming or svc/smart without a key (SPEC section 5);
- 400 for chat image URLs that lead into a private network (plugins/netguard.py).
"""
from __future__ import annotations

from . import hookimpl
from .context import CallContext
from .errors import GatewayError, bad_request
from .formats.base import check_image_hosts

SMART = "svc/smart"


@hookimpl(specname="gateway_admit")
def refuse_private_image_urls(ctx: CallContext):
    """Chat image URLs whose host resolves into a private network: 400 naming the field. A
    coroutine only for a chat with images (`input_images` counts every image part)."""
    if ctx.chat is not None and ctx.input_images:
        return check_image_hosts(ctx.chat)
    return None


@hookimpl(tryfirst=True)
def gateway_admit(ctx: CallContext):
    fmt = ctx.format
    if fmt.key_required and not ctx.has_key:
        raise GatewayError(401, f"{fmt.path} needs an API key: send Authorization: Bearer chk_... "
                                "or x-api-key: chk_...", code="missing_api_key")
    if ctx.input_chars > fmt.max_input_chars:
        raise GatewayError(413, f"input is {ctx.input_chars:,} characters; {fmt.path} takes at most "
                                f"{fmt.max_input_chars:,}", code="input_too_large")
    if not ctx.has_key:
        if ctx.streaming:
            raise bad_request("streaming needs an API key (stream: true without a key is refused)",
                              param="stream", code="key_required_for_stream")
        if ctx.model_id == SMART:
            raise bad_request("svc/smart needs an API key", param="model", code="key_required_for_smart")
