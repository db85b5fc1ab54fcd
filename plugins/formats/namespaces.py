"""Responses `namespace` tool groups (the Codex CLI sends its sub-agent functions that way).

A group's function tools reach every upstream under one flat, valid name, NAMESPACE__NAME;
their calls come back to the client with its own `name` and `namespace`.
"""
from __future__ import annotations

from typing import Any

from plugins.context import CallContext

NAMESPACE_SEP = "__"     # a namespace's function reaches upstreams as NAMESPACE__NAME (a flat, valid name)


def flat_name(namespace: str | None, name: str) -> str:
    return f"{namespace}{NAMESPACE_SEP}{name}" if namespace else name


def in_namespace(item: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
    """A function call to a tool the client sent inside a namespace group goes back with
    the client's own name and its `namespace`."""
    if item.get("type") == "function_call":
        for tool in ctx.chat.tools:
            if tool.namespace and tool.name == item["name"]:
                item["name"] = item["name"][len(tool.namespace) + len(NAMESPACE_SEP):]
                item["namespace"] = tool.namespace
                break
    return item
