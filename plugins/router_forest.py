"""Boosted decision trees for svc/smart, evaluated with the standard library only.

The linear model (router_model) scores a request's n-grams well but can only add its
evidence up; whether a "needs more than medium" score of +0.4 means much depends on how many
of the request's keys the model knows, how long the question is, whether tools or pasted text
come with it. A small forest of trees per cut, fitted on the linear scores (out of fold) and
the dense features, reads those interactions (router_train fits it with LightGBM).

A forest is stored as plain numbers and compiled at load time into one Python function of
nested conditional expressions: a tree costs a handful of comparisons, with no loop and no
call per node. Only numbers ever reach the generated source (each is checked and written by
`repr`), so a model file cannot smuggle code in.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

# A tree: (features, thresholds, left, right, leaf values). Internal nodes are numbered from 0
# (the root); a child >= 0 is an internal node, a child < 0 is leaf ~child. A tree with no
# split has no internal nodes and one leaf.
Tree = tuple[list[int], list[float], list[int], list[int], list[float]]


def _number(value) -> str:
    value = float(value)
    if not math.isfinite(value):
        raise ValueError("the router model holds a number that is not finite")
    return repr(value)


def _expression(tree: Tree, node: int, width: int) -> str:
    features, thresholds, left, right, values = tree

    def child(at) -> str:
        at = int(at)
        return _number(values[~at]) if at < 0 else _expression(tree, at, width)

    feature = int(features[node])
    if not 0 <= feature < width:
        raise ValueError("the router model's tree reads a feature it does not have")
    return f"({child(left[node])} if x{feature} <= {_number(thresholds[node])} else {child(right[node])})"


def compile_forests(forests: Sequence[Sequence[Tree]], width: int) -> Callable[[Sequence[float]], tuple[float, ...]]:
    """-> a function of a feature vector (`width` numbers) giving each forest's sum of leaves."""
    # The features are unpacked into locals once: a local is cheaper to read than an item of `x`.
    lines = ["def margins(x):", f"    {''.join(f'x{i}, ' for i in range(width))}= x"]
    for k, forest in enumerate(forests):
        lines.append(f"    m{k} = 0.0")
        for tree in forest:
            term = _number(tree[4][0]) if not tree[0] else _expression(tree, 0, width)
            lines.append(f"    m{k} += {term}")
    lines.append(f"    return ({''.join(f'm{k}, ' for k in range(len(forests)))})")
    namespace: dict = {}
    exec(compile("\n".join(lines), "<router forest>", "exec"), namespace)     # numbers only, see above
    return namespace["margins"]


def from_lightgbm(dump: dict) -> list[Tree]:
    """A LightGBM booster's `dump_model()` as this module's trees (numerical splits only)."""
    trees = []
    for info in dump["tree_info"]:
        features, thresholds, left, right, values = [], [], [], [], []

        def walk(node) -> int:
            if "leaf_value" in node:
                values.append(float(node["leaf_value"]))
                return ~(len(values) - 1)
            if node.get("decision_type", "<=") != "<=":
                raise ValueError("only numerical splits are supported")
            at = len(features)
            features.append(int(node["split_feature"]))
            thresholds.append(float(node["threshold"]))
            left.append(0)
            right.append(0)
            left[at] = walk(node["left_child"])
            right[at] = walk(node["right_child"])
            return at

        walk(info["tree_structure"])
        trees.append((features, thresholds, left, right, values))
    return trees
