"""Agreement between the set's labels and a second, blind labelling pass.

`python bench/router_set/agreement.py SECOND.jsonl` reads {"id", "tier"} lines and prints the
agreement rate, Cohen's kappa, the confusion between the passes and every disagreement, so
each one can be settled by the rubric (docs/routing-rubric.md).

`--settled SETTLED.jsonl` compares the first pass as it was before the disagreements were
settled (each settled row gives its first label back): the agreement the two passes had.
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

TIERS = ("easy", "medium", "hard", "frontier")
SET = Path(__file__).resolve().parent.parent / "router_set.jsonl"


def main(second_path: str, settled_path: str | None = None) -> None:
    first = {r["id"]: r for r in map(json.loads, SET.read_text().splitlines())}
    if settled_path:
        for row in map(json.loads, Path(settled_path).read_text().splitlines()):
            if row["id"] in first:
                first[row["id"]] = {**first[row["id"]], "tier": row["first"]}
    second = {r["id"]: r["tier"] for r in map(json.loads, Path(second_path).read_text().splitlines()) if r.get("tier")}
    both = [i for i in first if i in second]
    agree = sum(first[i]["tier"] == second[i] for i in both)
    p_o = agree / len(both)
    a, b = Counter(first[i]["tier"] for i in both), Counter(second[i] for i in both)
    p_e = sum(a[t] * b[t] for t in TIERS) / len(both) ** 2
    within = sum(abs(TIERS.index(first[i]["tier"]) - TIERS.index(second[i])) <= 1 for i in both)
    print(json.dumps({"labelled_twice": len(both), "agreement": round(p_o, 4), "cohen_kappa": round((p_o - p_e) / (1 - p_e), 4),
                      "within_one": round(within / len(both), 4),
                      "confusion_first_x_second": {t: {u: sum(1 for i in both if first[i]["tier"] == t and second[i] == u)
                                                       for u in TIERS} for t in TIERS}}, indent=1))
    for i in both:
        if first[i]["tier"] != second[i]:
            text = first[i]["messages"][-1]["content"].replace("\n", " ")
            print(f"{i}\t{first[i]['tier']}\t{second[i]}\t{text[:140]}")


if __name__ == "__main__":
    args = sys.argv[1:]
    settled = args[args.index("--settled") + 1] if "--settled" in args else None
    main(args[0], settled)
