"""Summarise a CONFORMANCE_REPORT file: cases, failing cases, violations by kind and by
format, and the distinct (format, schema, path, message) patterns.

    CONFORMANCE_REPORT=/tmp/c.jsonl python -m pytest tests/test_conformance.py
    python -m tests.conformance.report /tmp/c.jsonl
"""
from __future__ import annotations

import json
import re
import sys
from collections import Counter


def main(path: str) -> None:
    rows = [json.loads(line) for line in open(path)]
    refused = [[v for v in r["violations"] if not v["allowed"]] for r in rows]
    print(f"cases: {len(rows)}, failing: {sum(1 for v in refused if v)}")
    print(f"violations: {sum(len(v) for v in refused)} refused, "
          f"{sum(len(r['violations']) for r in rows) - sum(len(v) for v in refused)} allowed")
    print("by kind:", dict(Counter(v["kind"] for vs in refused for v in vs)))
    print("by format:", dict(Counter(r["case"][0] for r, vs in zip(rows, refused) for _ in vs)))
    patterns = Counter((r["case"][0], v["kind"], v["schema"], re.sub(r"\[\d+\]", "[n]", v["path"]),
                        re.sub(r"\d+", "N", v["message"])[:110]) for r, vs in zip(rows, refused) for v in vs)
    for (fmt, kind, schema, where, message), n in sorted(patterns.items()):
        print(f"{n:4} {fmt:16} {kind:10} {schema} {where}: {message}")


if __name__ == "__main__":
    main(sys.argv[1])
