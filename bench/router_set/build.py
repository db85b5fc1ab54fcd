"""Build bench/router_set.jsonl from the hand-written sources in src/.

Sources are plain text so that they are easy to review:
- `src/<lang>*.txt`: items separated by `@ <tier> <category> [tags]` lines. Tags: `tools=a,b`
  (the request offers those tools), `multi-turn`, `trap-easy`, `trap-hard`. An item whose
  lines start with `S:`, `U:` or `A:` is a conversation (system, user, assistant turns).
- `src/passages*.txt`: long real texts (`=== name`), each followed by questions about it
  (`--- <tier> | <category> | <lang>`). Each question becomes a request with the text pasted in.
- `src/legacy.jsonl`: the first labelled set ({id, tier, prompt}), kept with its labels.

Ids are a hash of the request, so they stay put when other items change; the split
(train / validation / test) is a hash of the id, decided once.
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TIERS = ("easy", "medium", "hard", "frontier")
FRAMES = ("{ctx}\n\n{q}", "{q}\n\n{ctx}", "{ctx}\n\n---\n{q}", "\"\"\"\n{ctx}\n\"\"\"\n{q}", "{q}\n\n```\n{ctx}\n```",
          "{ctx}\n{q}")


def digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def split_of(item_id: str) -> str:
    """70 / 15 / 15 by a hash of the id: decided once, never by content or label."""
    bucket = int(digest("split:" + item_id)[:8], 16) % 100
    return "train" if bucket < 70 else "validation" if bucket < 85 else "test"


def turns(body: str) -> list[dict]:
    if not re.match(r"^[SUA]: ", body):
        return [{"role": "user", "content": body}]
    out, role = [], None
    names = {"S": "system", "U": "user", "A": "assistant"}
    for line in body.split("\n"):
        m = re.match(r"^([SUA]): (.*)$", line)
        if m:
            role = names[m.group(1)]
            out.append({"role": role, "content": m.group(2)})
        else:
            out[-1]["content"] += "\n" + line
    return out


def item(tier, category, lang, messages, tools=(), groups=()):
    assert tier in TIERS, tier
    key = json.dumps([messages, list(tools)], ensure_ascii=False)
    item_id = "r" + digest(key)[:10]
    return {"id": item_id, "split": split_of(item_id), "tier": tier, "lang": lang, "category": category,
            "groups": sorted(set(groups)), "messages": messages, "tools": list(tools)}


def parse_items(path: Path, lang: str):
    for chunk in re.split(r"^@ ", path.read_text(), flags=re.M)[1:]:
        head, _, body = chunk.partition("\n")
        tier, category, *tags = head.split()
        tools = next((t[6:].split(",") for t in tags if t.startswith("tools=")), [])
        groups = [t for t in tags if not t.startswith("tools=")] + (["tools"] if tools else [])
        messages = turns(body.strip("\n"))
        if sum(m["role"] != "system" for m in messages) > 1:
            groups.append("multi-turn")
        text = messages[-1]["content"]
        if len(text) < 60 and tier in ("hard", "frontier"):
            groups.append("short-hard")
        yield item(tier, category, lang, messages, tools, groups)


def parse_passages(path: Path):
    for block in re.split(r"^=== ", path.read_text(), flags=re.M)[1:]:
        name, _, rest = block.partition("\n")
        parts = re.split(r"^--- (.+)$", rest, flags=re.M)
        ctx = parts[0].strip()
        for head, question in zip(parts[1::2], parts[2::2]):
            tier, category, lang = (p.strip() for p in head.split("|"))
            q = question.strip()
            frame = FRAMES[int(digest(name + q)[:4], 16) % len(FRAMES)]
            yield item(tier, category, lang, [{"role": "user", "content": frame.format(ctx=ctx, q=q)}],
                       groups=["long-context"])


def legacy(path: Path):
    for line in path.read_text().splitlines():
        row = json.loads(line)
        yield item(row["tier"], row["category"], row["lang"], [{"role": "user", "content": row["prompt"]}],
                   groups=row.get("groups", []))


def build() -> list[dict]:
    src = HERE / "src"
    items = []
    for path in sorted(src.glob("*.txt")):
        if path.name.startswith("passages"):
            items += parse_passages(path)
        else:
            items += parse_items(path, re.match(r"[a-z]+", path.stem).group(0))
    if (src / "legacy.jsonl").exists():
        items += legacy(src / "legacy.jsonl")
    seen = {}
    for it in items:
        if it["id"] in seen:
            sys.exit(f"duplicate request: {it['messages'][-1]['content'][:80]!r}")
        seen[it["id"]] = it
    return sorted(items, key=lambda it: it["id"])


def main() -> None:
    items = build()
    out = HERE.parent / "router_set.jsonl"
    out.write_text("".join(json.dumps(it, ensure_ascii=False) + "\n" for it in items))
    print(f"{len(items)} requests -> {out}")


if __name__ == "__main__":
    main()
