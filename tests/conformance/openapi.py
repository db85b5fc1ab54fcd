"""Check gateway output against the providers' published OpenAPI schemas.

The pinned documents (plugins/openapi/pinned/*.json, refreshed by
scripts/refresh_openapi.py; the gateway's own API document embeds them too) are read once,
with OpenAPI's `nullable: true` as JSON Schema. `jsonschema` does the validating; this
module only maps each body or stream event to the component schema that describes it, and
lists the object keys the schema does not declare (strict clients drop or refuse them).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any, Iterator

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from plugins.openapi.document import PROVIDERS, pinned

DOCS = PROVIDERS


def source(doc: str) -> dict[str, Any]:
    """Where a pinned document came from (repository, commit, version)."""
    return pinned(doc)["x-source"]


@cache
def _registry() -> Registry:
    return Registry().with_resources(
        (f"urn:{doc}", Resource(contents=pinned(doc), specification=DRAFT202012)) for doc in DOCS)


@cache
def validator(doc: str, name: str) -> Draft202012Validator:
    return Draft202012Validator({"$ref": f"urn:{doc}#/components/schemas/{name}"}, registry=_registry())


@cache
def _event_types(doc: str, union: str) -> dict[str, str]:
    """Event type -> component name, from a union of event schemas (anyOf/oneOf of $refs)."""
    schemas = _registry().contents(f"urn:{doc}")["components"]["schemas"]
    out = {}
    for ref in schemas[union].get("anyOf") or schemas[union].get("oneOf"):
        name = ref["$ref"].rsplit("/", 1)[1]
        kind = schemas[name]["properties"]["type"]
        out[kind.get("const") or kind["enum"][0]] = name
    return out


def event_schema(doc: str, union: str, kind: str) -> str | None:
    return _event_types(doc, union).get(kind)


@cache
def _any() -> Draft202012Validator:
    """A validator used only to descend into subschemas with their own resolver."""
    return Draft202012Validator({}, registry=_registry())


@dataclass(frozen=True)
class Violation:
    """One difference between an instance and its schema."""
    kind: str        # "schema" (refused by the validator) or "undeclared" (a key the schema lacks)
    schema: str      # component name
    path: str        # JSON path inside the instance, e.g. $.usage.cache_read_input_tokens
    message: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.schema} {self.path}: {self.message}"


def _path(parts) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def _leaves(err: ValidationError) -> list[ValidationError]:
    """The errors worth reporting. For a failed anyOf/oneOf: the errors of the branch whose
    `type` matched (the discriminator's choice), else best_match's pick."""
    if not err.context:
        return [err]
    by_branch: dict = {}
    for sub in err.context:
        by_branch.setdefault(sub.relative_schema_path[0], []).append(sub)
    chosen = [errs for errs in by_branch.values() if not any(_wrong_kind(e) for e in errs)]
    if len(chosen) == 1:
        return [leaf for e in chosen[0] for leaf in _leaves(e)]
    return _leaves(best_match(err.context))


def _wrong_kind(err: ValidationError) -> bool:
    """The branch is for another kind of value: another JSON type, or another `type` tag."""
    if err.validator == "type" and not err.relative_path:
        return True
    return err.validator in ("const", "enum") and list(err.relative_path) == ["type"]


def check(doc: str, name: str, instance: Any) -> list[Violation]:
    """Every schema violation and every undeclared key of `instance` against component `name`."""
    found = []
    for err in validator(doc, name).iter_errors(instance):
        found += [Violation("schema", name, _path(leaf.absolute_path), leaf.message[:300]) for leaf in _leaves(err)]
    root = {"$ref": f"urn:{doc}#/components/schemas/{name}"}
    found += [Violation("undeclared", name, p, "key not declared by the schema")
              for p in _undeclared(instance, root, _registry().resolver(), [])]
    return found


def _resolve(schema: Any, resolver) -> tuple[Any, Any]:
    while isinstance(schema, dict) and "$ref" in schema:
        resolved = resolver.lookup(schema["$ref"])
        schema, resolver = resolved.contents, resolved.resolver
    return schema, resolver


def _branches(instance: Any, schema: Any, resolver) -> Iterator[tuple[dict, Any]]:
    """The subschemas that apply to `instance`: allOf members, and the anyOf/oneOf members
    it validates against."""
    schema, resolver = _resolve(schema, resolver)
    if not isinstance(schema, dict):
        return
    yield schema, resolver
    for sub in schema.get("allOf", []):
        yield from _branches(instance, sub, resolver)
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key, []):
            if _valid(instance, sub, resolver):
                yield from _branches(instance, sub, resolver)


def _valid(instance: Any, schema: Any, resolver) -> bool:
    schema, resolver = _resolve(schema, resolver)
    if schema is True or schema is False:
        return schema
    return next(_any().descend(instance, schema, resolver=resolver), None) is None


def _undeclared(instance: Any, schema: Any, resolver, path: list) -> Iterator[str]:
    branches = list(_branches(instance, schema, resolver))
    if isinstance(instance, dict):
        declared: dict[str, list] = {}
        open_map = not any("properties" in s for s, _ in branches)
        for s, r in branches:
            if s.get("additionalProperties") not in (None, False) or "patternProperties" in s:
                open_map = True
            for key, sub in s.get("properties", {}).items():
                declared.setdefault(key, []).append((sub, r))
        for key, value in instance.items():
            if key not in declared:
                if not open_map:
                    yield _path(path + [key])
                continue
            for sub, r in declared[key][:1]:
                yield from _undeclared(value, sub, r, path + [key])
    elif isinstance(instance, list):
        items = [(s["items"], r) for s, r in branches if isinstance(s.get("items"), dict)]
        for i, value in enumerate(instance):
            for sub, r in items[:1]:
                yield from _undeclared(value, sub, r, path + [i])
