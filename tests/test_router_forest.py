"""svc/smart's boosted trees: compiled from plain numbers, the same sums as walking the trees."""
import random

import pytest

from plugins.router_forest import compile_forests, from_lightgbm

# x[0] <= 0.5 ? (x[1] <= 2.0 ? 1.0 : -1.0) : 3.0, as LightGBM dumps it
DUMP = {"tree_info": [
    {"tree_structure": {"split_feature": 0, "threshold": 0.5, "decision_type": "<=",
                        "left_child": {"split_feature": 1, "threshold": 2.0, "decision_type": "<=",
                                       "left_child": {"leaf_value": 1.0}, "right_child": {"leaf_value": -1.0}},
                        "right_child": {"leaf_value": 3.0}}},
    {"tree_structure": {"leaf_value": 0.25}},          # a tree without a split
]}


def walk(tree, x):
    features, thresholds, left, right, values = tree
    if not features:
        return values[0]
    node = 0
    while node >= 0:
        node = left[node] if x[features[node]] <= thresholds[node] else right[node]
    return values[~node]


def test_a_dumped_forest_sums_its_trees():
    margins = compile_forests([from_lightgbm(DUMP)], width=2)
    assert margins([0.5, 2.0]) == (1.25,)        # equal to a threshold goes left, as in LightGBM
    assert margins([0.0, 2.5]) == (-0.75,)
    assert margins([0.7, 0.0]) == (3.25,)


def test_compiled_trees_agree_with_walking_them():
    rng = random.Random(7)

    def grow(depth, features, thresholds, left, right, values):
        if depth == 0 or rng.random() < 0.2:
            values.append(rng.uniform(-1, 1))
            return ~(len(values) - 1)
        at = len(features)
        features.append(rng.randrange(5))
        thresholds.append(rng.uniform(-2, 2))
        left.append(0)
        right.append(0)
        left[at] = grow(depth - 1, features, thresholds, left, right, values)
        right[at] = grow(depth - 1, features, thresholds, left, right, values)
        return at

    forests = []
    for _ in range(3):
        forest = []
        for _ in range(40):
            tree = ([], [], [], [], [])
            grow(6, *tree)
            forest.append(tree)
        forests.append(forest)
    margins = compile_forests(forests, width=5)
    for _ in range(500):
        x = [rng.uniform(-2.5, 2.5) for _ in range(5)]
        want = [sum(walk(tree, x) for tree in forest) for forest in forests]
        assert margins(x) == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("tree", [
    ([0], ["__import__('os')"], [-1], [-2], [1.0, 2.0]),        # not a number
    ([0], [float("nan")], [-1], [-2], [1.0, 2.0]),               # not finite
    ([9], [0.5], [-1], [-2], [1.0, 2.0]),                        # a feature the model does not have
])
def test_a_malformed_forest_is_refused(tree):
    with pytest.raises(ValueError):
        compile_forests([[tree]], width=2)
