"""The gateway's API document (OpenAPI 3.1), assembled from its sources:

- `spec/*.yaml`: the gateway's own part, by area (base.yaml holds info, tags, security
  schemes and the shared components; each other file adds `paths` and its components);
- `pinned/*.json`: the providers' published schemas (pinned by scripts/refresh_openapi.py,
  also what the conformance tests validate against). A source that refers to
  `#/components/schemas/openai.X` or `anthropic.X` gets that schema, and everything it
  reaches, embedded under the same prefixed names: a route in a provider's format is
  described by the provider's own schema, never by a copy written by hand.

tests/test_openapi.py keeps it true: every route of the app is in it and every path in it
is a route, and live answers of every route validate against it.
"""
from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
SPEC = HERE / "spec"
PINNED = HERE / "pinned"
PROVIDERS = ("openai", "anthropic")
LOCAL = "#/components/schemas/"
SECTIONS = ("schemas", "responses", "parameters", "headers", "pathItems", "securitySchemes")

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def nullable_as_json_schema(node: Any) -> Any:
    """OpenAPI 3.0's `nullable: true` (still used in OpenAI's 3.1 document) as JSON Schema:
    the schema, or null."""
    if isinstance(node, list):
        return [nullable_as_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: nullable_as_json_schema(v) for k, v in node.items()}
    if out.pop("nullable", False) is True:
        wrapper = {"anyOf": [out, {"type": "null"}]}
        if "default" in out:            # a null default belongs to the nullable whole
            wrapper["default"] = out.pop("default")
        return wrapper
    return out


@cache
def pinned(provider: str) -> dict[str, Any]:
    """A provider's pinned document (`x-source` and `components.schemas`), nullable rewritten."""
    return nullable_as_json_schema(json.loads((PINNED / f"{provider}.json").read_text()))


def _sources() -> list[dict[str, Any]]:
    files = [SPEC / "base.yaml"] + sorted(p for p in SPEC.glob("*.yaml") if p.name != "base.yaml")
    out = []
    for path in files:
        try:
            out.append(yaml.load(path.read_text(), Loader=_Loader) | {"x-file": path.name})
        except yaml.YAMLError as exc:
            raise ValueError(f"{path.name}: {exc}") from None
    return out


def _merge(sources: list[dict[str, Any]]) -> dict[str, Any]:
    """base.yaml, then every other file's paths and components; a name defined twice is an error."""
    doc = {k: v for k, v in sources[0].items() if k != "x-file"}
    doc.setdefault("paths", {})
    components = doc.setdefault("components", {})
    for src in sources[1:]:
        parts = [("paths", doc["paths"], src.get("paths", {}))]
        parts += [(f"components.{s}", components.setdefault(s, {}), src.get("components", {}).get(s, {}))
                  for s in SECTIONS]
        for where, into, new in parts:
            twice = sorted(set(into) & set(new))
            if twice:
                raise ValueError(f"{src['x-file']}: {where}: {', '.join(twice)} already defined")
            into.update(new)
        unknown = (set(src) - {"paths", "components", "x-file"}) | (set(src.get("components", {})) - set(SECTIONS))
        if unknown:
            raise ValueError(f"{src['x-file']}: only paths and components belong here, not {sorted(unknown)}")
    return doc


def _refs(node: Any):
    """Every local schema name a node refers to (in `$ref`s and discriminator mappings)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and value.startswith(LOCAL):
                yield value[len(LOCAL):]
            elif key == "mapping" and isinstance(value, dict):     # a discriminator's, or a property so named
                yield from (v[len(LOCAL):] for v in value.values() if isinstance(v, str) and v.startswith(LOCAL))
                yield from _refs([v for v in value.values() if not isinstance(v, str)])
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def _prefixed(node: Any, prefix: str, own: str) -> Any:
    """A provider's schema `own` with its local references renamed into our namespace, and
    what an OpenAPI 3.1 validator refuses mended: draft 2019-09's recursion
    (`$recursiveRef: "#"`) as a `$ref`, and a null `default` where the schema cannot be
    null dropped (OpenAI's document has a few)."""
    if isinstance(node, dict):
        if node.get("$recursiveRef") == "#":
            return {"$ref": LOCAL + own}
        drop = {"$recursiveAnchor"}
        if node.get("default", 0) is None and not _plainly_nullable(node):
            drop.add("default")
        return {k: _prefixed(v, prefix, own) for k, v in node.items() if k not in drop}
    if isinstance(node, list):
        return [_prefixed(v, prefix, own) for v in node]
    if isinstance(node, str) and node.startswith(LOCAL):
        return LOCAL + prefix + node[len(LOCAL):]
    return node


def _plainly_nullable(node: dict) -> bool:
    """Null is allowed by the node's own `type` or by one of its anyOf/oneOf branches."""
    kind = node.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    return any(branch == {"type": "null"} for key in ("anyOf", "oneOf") for branch in node.get(key, ()))


def _embed_provider_schemas(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    todo = [name for name in _refs(doc) if name.split(".", 1)[0] in PROVIDERS]
    while todo:
        name = todo.pop()
        if name in schemas:
            continue
        provider, inner = name.split(".", 1)
        found = pinned(provider)["components"]["schemas"].get(inner)
        if found is None:
            raise ValueError(f"{name}: {provider}'s pinned document has no schema {inner!r} "
                             "(add it to the roots in scripts/refresh_openapi.py)")
        schemas[name] = _prefixed(found, provider + ".", name)
        todo.extend(_refs(schemas[name]))
    doc["info"]["x-provider-schemas"] = {p: pinned(p)["x-source"] for p in PROVIDERS}


@cache
def _assembled() -> dict[str, Any]:
    doc = _merge(_sources())
    _embed_provider_schemas(doc)
    missing = sorted(name for name in set(_refs(doc)) if name not in doc["components"]["schemas"])
    if missing:
        raise ValueError(f"the API document refers to schemas it does not define: {', '.join(missing)}")
    return doc


def build(public_url: str) -> dict[str, Any]:
    """The whole document, served from `public_url`."""
    doc = copy.copy(_assembled())
    doc["servers"] = [{"url": public_url, "description": "this gateway"}]
    return doc
