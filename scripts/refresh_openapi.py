"""Refresh the pinned OpenAPI component schemas: the conformance tests validate against
them, and the gateway's own API document (GET /api/v1/openapi.json) embeds them where a
route speaks a provider's format.

    python scripts/refresh_openapi.py                       # the pinned commits, from GitHub
    python scripts/refresh_openapi.py --openai-commit SHA   # move OpenAI's pin
    python scripts/refresh_openapi.py --openai-file openapi.json --openai-commit SHA  # a local copy

Downloads OpenAI's `openapi.json` (openai/openai-openapi) and Anthropic's OpenAPI document
(the copy kept at tryAGI/Anthropic, src/libs/Anthropic/openapi.yaml, which is JSON text),
keeps only the schemas of the bodies the gateway takes and emits plus everything they
reference, and writes them to plugins/openapi/pinned/ (shipped in the package) with their
source repository, path and commit. Both documents are MIT-licensed. Multi-megabyte documents stay out of the repo.
"""
from __future__ import annotations

import argparse
import json
import re
import urllib.request
from pathlib import Path

import yaml

OUT = Path(__file__).resolve().parent.parent / "plugins" / "openapi" / "pinned"
SOURCES = {
    "openai": {"repo": "openai/openai-openapi", "path": "openapi.json",
               "commit": "f85dbe223d40e1a31cba812ab2d755c7e98a92a3",
               "roots": ["CreateChatCompletionResponse", "CreateChatCompletionStreamResponse", "ErrorResponse",
                         "Response", "ResponseStreamEvent", "CreateChatCompletionRequest", "CreateResponse",
                         "ListModelsResponse"]},
    "anthropic": {"repo": "tryAGI/Anthropic", "path": "src/libs/Anthropic/openapi.yaml",
                  "commit": "8b42a21e6aa7fc9b521cc0c1581f586480b5cad3",
                  "roots": ["Message", "MessageStreamEvent", "ErrorResponse", "CreateMessageParams"]},
}
REF = re.compile(r'"#/components/schemas/([^"]+)"')


def referenced(schemas: dict, roots: list[str]) -> dict:
    """The named schemas and every component they reach through $ref."""
    keep: dict = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        keep[name] = schemas[name]
        todo.extend(REF.findall(json.dumps(schemas[name])))
    return dict(sorted(keep.items()))


def load(source: dict, file: str | None) -> dict:
    """The whole document, from a local copy or GitHub at the pinned commit. JSON text (both
    are today), else YAML."""
    if file:
        text = Path(file).read_bytes()
    else:
        url = f"https://raw.githubusercontent.com/{source['repo']}/{source['commit']}/{source['path']}"
        with urllib.request.urlopen(url, timeout=60) as resp:       # noqa: S310 (fixed https URL)
            text = resp.read()
    try:
        return json.loads(text)
    except ValueError:
        return yaml.safe_load(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in SOURCES:
        parser.add_argument(f"--{name}-commit", help=f"commit of {SOURCES[name]['repo']} to pin")
        parser.add_argument(f"--{name}-file", help="read this local copy instead of downloading")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for name, source in SOURCES.items():
        source = {**source, "commit": getattr(args, f"{name}_commit") or source["commit"]}
        doc = load(source, getattr(args, f"{name}_file"))
        schemas = referenced(doc["components"]["schemas"], source["roots"])
        pinned = {"x-source": {"repository": f"https://github.com/{source['repo']}", "path": source["path"],
                               "commit": source["commit"], "openapi": doc.get("openapi"),
                               "version": doc.get("info", {}).get("version"), "license": "MIT",
                               "roots": source["roots"]},
                  "components": {"schemas": schemas}}
        target = OUT / f"{name}.json"
        target.write_text(json.dumps(pinned, indent=1, sort_keys=False) + "\n")
        print(f"{target.name}: {len(schemas)} schemas from {source['repo']}@{source['commit'][:12]}")


if __name__ == "__main__":
    main()
