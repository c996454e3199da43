"""The verifier rejects each kind of malformed graph, with a message naming the fault.

Each builder returns a bad graph and a fragment its error message must contain."""
import re

import pytest

from edgetrain.ir import Graph, Node, TensorType, new_value
from edgetrain.ops import VerificationError, verify

T = TensorType((2, 3), "float64")
SGD = {"lr": 0.1, "momentum": 0.0, "weight_decay": 0.0, "dim": 0, "index": None}


def inputs(*names):
    return tuple(new_value(T, name) for name in names)


def use_before_definition():
    (a,) = inputs("a")
    t, u = new_value(T), new_value(T)
    g = Graph((a,), (Node("neg", (t,), (u,)), Node("neg", (a,), (t,))), (u,), ("out",))
    return g, "node 0 (neg): uses %1 before it is defined"  # numbered as str(g) prints it


def double_assignment():
    (a,) = inputs("a")
    t = new_value(T)
    g = Graph((a,), (Node("neg", (a,), (t,)), Node("relu", (a,), (t,))), (t,), ("out",))
    return g, "node 1 (relu): assigns %1 a second time"


def wrong_output_type():
    a, b = inputs("a", "b")
    t = new_value(TensorType((3, 2), "float64"))
    g = Graph((a, b), (Node("add", (a, b), (t,)),), (t,), ("out",))
    return g, "node 0 (add): outputs ['f64[3,2]'] but the shape rule gives ['f64[2,3]']"


def unknown_op():
    (a,) = inputs("a")
    t = new_value(T)
    g = Graph((a,), (Node("frobnicate", (a,), (t,)),), (t,), ("out",))
    return g, "node 0 (frobnicate): \"unknown op 'frobnicate'\""


def read_after_in_place_update():
    w, grad = inputs("w", "g")
    w2, t = new_value(T), new_value(T)
    g = Graph((w, grad), (Node("sgd_update", (w, grad), (w2,), SGD), Node("neg", (w,), (t,))), (t,), ("out",))
    return g, "node 1 (neg): reads %0<w> after node 0 overwrote it in place"


def output_after_in_place_update():
    w, grad = inputs("w", "g")
    g = Graph((w, grad), (Node("sgd_update", (w, grad), (new_value(T),), SGD),), (w,), ("w",))
    return g, "output w = %0<w> was overwritten in place by node 0"


def duplicate_input_names():
    a, b = inputs("x", "x")
    t = new_value(T)
    g = Graph((a, b), (Node("add", (a, b), (t,)),), (t,), ("out",))
    return g, "graph input %1<x> needs a unique name"


@pytest.mark.parametrize("bad", [use_before_definition, double_assignment, wrong_output_type, unknown_op,
                                 read_after_in_place_update, output_after_in_place_update, duplicate_input_names],
                         ids=lambda f: f.__name__)
def test_verifier_rejects(bad):
    g, message = bad()
    with pytest.raises(VerificationError) as err:
        verify(g)
    assert message in str(err.value)
    for v in re.findall(r"%\d+(?:<[^>]*>)?", str(err.value)):  # the values it names read as str(g) prints them
        assert v in str(g)


def test_verifier_accepts_an_update_read_before_it():
    w, grad = inputs("w", "g")
    t, w2 = new_value(T), new_value(T)
    g = Graph((w, grad), (Node("neg", (w,), (t,)), Node("sgd_update", (w, grad), (w2,), SGD)), (t, w2), ("t", "w"))
    assert verify(g) is g
