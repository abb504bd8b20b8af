"""The walks over fx graphs in normaudit.vocabulary.graph: reach (every node reached forward, each once),
forward_walk (the first value a step ends the walk with) and strip_through (back along first arguments)."""
import doctest

import torch
from torch import fx

from normaudit.vocabulary import graph
from normaudit.vocabulary.graph import FOLLOW, forward_walk, reach, strip_neutral, strip_through


def _diamond(x):
    a = torch.relu(x)
    b = torch.sigmoid(x)
    c = a + b
    d = c.float().neg()
    return d * x


def _nodes():
    gm = fx.symbolic_trace(_diamond)
    return {n.name: n for n in gm.graph.nodes}


def test_reach_visits_breadth_first_each_node_once():
    n = _nodes()
    got = [u.name for u in reach(n["x"], lambda user, node: True)]
    assert got == ["relu", "sigmoid", "mul", "add", "output", "float_1", "neg"]


def test_reach_depth_bounds_the_levels():
    n = _nodes()
    assert [u.name for u in reach(n["x"], lambda user, node: True, depth=1)] == ["relu", "sigmoid", "mul"]
    assert [u.name for u in reach(n["x"], lambda user, node: True, depth=2)] == \
        ["relu", "sigmoid", "mul", "add", "output"]
    assert reach(n["x"], lambda user, node: True, depth=0) == []


def test_reach_asks_follow_once_per_unreached_user_and_a_refused_user_can_be_reached_later():
    n = _nodes()
    asked = []

    def follow(user, node):
        asked.append((user.name, node.name))
        return not (user.name == "add" and node.name == "relu")

    got = [u.name for u in reach(n["x"], follow)]
    assert got == ["relu", "sigmoid", "mul", "add", "output", "float_1", "neg"]
    assert asked == [("relu", "x"), ("sigmoid", "x"), ("mul", "x"), ("add", "relu"), ("add", "sigmoid"),
                     ("output", "mul"), ("float_1", "add"), ("neg", "float_1")]


def test_reach_refusing_a_user_cuts_what_lies_only_behind_it():
    n = _nodes()
    got = [u.name for u in reach(n["x"], lambda user, node: user.name != "add")]
    assert got == ["relu", "sigmoid", "mul", "output"]
    assert reach(n["output"], lambda user, node: True) == []


def test_forward_walk_ends_with_the_first_value_a_step_returns():
    n = _nodes()

    def step(user, node):
        return user.name if user.name in ("add", "neg") else FOLLOW

    assert forward_walk(n["x"], step) == "add"
    assert forward_walk(n["x"], lambda user, node: FOLLOW if user.name != "output" else None) is None
    assert forward_walk(n["x"], step, depth=1) is None


def test_strip_through_follows_first_arguments_through_the_named_ops_only():
    n = _nodes()
    assert strip_through(n["neg"], ("neg", "to"), 16) is n["add"]
    assert strip_through(n["neg"], ("neg", "to"), 1) is n["float_1"]
    assert strip_through(n["neg"], ("to",), 16) is n["neg"]
    assert strip_neutral(n["float_1"]) is n["add"]
    assert strip_through(3.0, ("to",), 16) == 3.0


def test_graph_doctests():
    assert doctest.testmod(graph).failed == 0
