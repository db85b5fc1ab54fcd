"""Config problems in one format, `FILE: key.path: what is wrong`: pydantic's errors
translated, "did you mean" for near-miss keys, and YAML duplicate keys found by line."""
from __future__ import annotations

import difflib
import re
import typing
from typing import Any, Iterable

import yaml
from pydantic import BaseModel, ValidationError

_KEY_PREFIX = re.compile(r"^((?:[A-Za-z_]\w*|\[\d+\])(?:\.[A-Za-z_]\w*|\[\d+\])*): (.+)$", re.S)


def did_you_mean(word: str, choices: Iterable[str], cutoff: float = 0.6) -> str:
    """' (did you mean 'server'?)' when a choice is close to `word`, else ''."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=cutoff)
    return f" (did you mean {close[0]!r}?)" if close else ""


def join(path: str, key) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _kind(value) -> str:
    if isinstance(value, bool):
        return "true/false"
    return {dict: "a mapping", list: "a list", str: "text", type(None): "nothing",
            int: "a whole number", float: "a number"}.get(type(value), type(value).__name__)


def _what(err: dict) -> str:
    kind, given, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    shown = f"{given!r}" if isinstance(given, (str, int, float)) and not isinstance(given, bool) else _kind(given)
    if kind == "missing":
        return "required"
    if kind in ("int_type", "int_from_float", "int_parsing"):
        return f"expected a whole number, got {shown}"
    if kind in ("float_type", "float_parsing"):
        return f"expected a number, got {shown}"
    if kind == "string_type":
        hint = " (quote values such as \"16:9\": YAML reads 16:9 as a number)" \
            if isinstance(given, int) and not isinstance(given, bool) else ""
        return f"expected text, got {shown}{hint}"
    if kind == "bool_type":
        return f"expected true or false, got {shown}"
    if kind in ("list_type", "tuple_type"):
        return f"expected a list, got {_kind(given)}"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"expected a mapping, got {_kind(given)}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        words = {"greater_than": "more than", "greater_than_equal": "at least", "less_than": "less than",
                 "less_than_equal": "at most"}[kind]
        bound = next(iter(ctx.values()), "")
        bound = int(bound) if isinstance(bound, float) and bound.is_integer() else bound
        return f"must be {words} {bound}, got {shown}"
    if kind == "literal_error":
        return f"expected {ctx.get('expected', 'one of the listed values')}, got {shown}"
    if kind in ("string_too_short", "too_short"):
        return "must not be empty"
    if kind == "value_error":
        return str(ctx.get("error") or err["msg"])
    return err["msg"]


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The keys the schema allows at `loc` (to suggest one for an unknown key)."""
    annotation: Any = model
    for part in loc:
        annotation = _unwrap(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(part)
            if field is None:
                return []
            annotation = field.annotation
        elif typing.get_origin(annotation) in (list, dict, tuple):
            annotation = typing.get_args(annotation)[-1]
        else:
            return []
    annotation = _unwrap(annotation)
    return list(annotation.model_fields) if isinstance(annotation, type) and issubclass(annotation, BaseModel) else []


def _unwrap(annotation):
    """Optional[X] / Annotated[X, ...] -> X (the first model among union members)."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            annotation = members[0] if members else annotation
        else:
            return annotation


def translate(exc: ValidationError, model: type[BaseModel], prefix: str) -> list[str]:
    """pydantic's errors -> ['key.path: what is wrong', ...] (without the file)."""
    out: list[str] = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and ("[" in p or p in ("function-plain",))))
        path = prefix
        for part in loc:
            path = join(path, part)
        if err["type"] == "extra_forbidden":
            what = "unknown key" + did_you_mean(loc[-1], _fields_at(model, loc[:-1]))
        else:
            what = _what(err)
            m = _KEY_PREFIX.match(what) if err["type"] == "value_error" else None
            if m:                        # a model-level check naming the key it is about
                key = m.group(1)
                path, what = (path + key if key.startswith("[") else join(path, key)), m.group(2)
        line = f"{path}: {what}" if path else what
        if line not in out:
            out.append(line)
    return out


# ---- YAML: duplicate keys ------------------------------------------------------------

def duplicate_keys(node: yaml.Node, path: str = "") -> list[str]:
    """'key.path: duplicate key (line N; first at line M)' for every mapping key given twice."""
    out: list[str] = []
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key == "<<":
                continue
            where = join(path, key)
            if key is not None and key in seen:
                out.append(f"{where}: duplicate key (line {key_node.start_mark.line + 1}; first at line "
                           f"{seen[key]}): the later value would silently replace the first")
            elif key is not None:
                seen[key] = key_node.start_mark.line + 1
            out += duplicate_keys(value_node, where)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out += duplicate_keys(item, join(path, i))
    return out


def parse_yaml(text: str):
    """-> (data, duplicate-key problems). Raises yaml.YAMLError for text that is not YAML."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, []
        return loader.construct_document(node), duplicate_keys(node)
    finally:
        loader.dispose()
