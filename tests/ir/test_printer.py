"""The printer numbers values per graph: the same model prints the same text whatever was
compiled before it, and messages name values as the printed graph does."""
import re
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

import edgetrain as et
from edgetrain.ir import Graph, Node, TensorType, new_value
from edgetrain.ir.printer import format_graph, format_node, number_values

T = TensorType((2, 3), "float32")


def _small():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))


X = torch.randn(2, 3, 8, 8)


def _texts(prog):
    return {name: str(g) for name, g in prog.stages.items()} | {"train": str(prog.train_graph)}


def test_values_are_numbered_in_order_of_appearance():
    a, b = new_value(T, "a"), new_value(T, "b")
    t, u = new_value(T), new_value(T)
    g = Graph((a, b), (Node("add", (a, b), (t,)), Node("relu", (t,), (u,))), (u,), ("out",))
    assert number_values(g) == {a: 0, b: 1, t: 2, u: 3}
    assert format_graph(g) == "\n".join([
        "graph(",
        "    %0<a> : f32[2,3],  # data",
        "    %1<b> : f32[2,3],  # data",
        ") {",
        "     0: %2 : f32[2,3] = add(%0<a>, %1<b>)",
        "     1: %3 : f32[2,3] = relu(%2)",
        "  return out=%3",
        "}"])
    assert str(g) == format_graph(g)
    assert format_node(g.nodes[1], number_values(g)) == "%3 : f32[2,3] = relu(%2)"
    assert format_node(g.nodes[1]) == "%1 : f32[2,3] = relu(%0)"  # numbered on its own


def test_a_value_outside_a_graph_reads_its_name_and_type():
    assert str(new_value(T, "features.0.weight")) == "%?<features.0.weight> : f32[2,3]"
    assert str(new_value(TensorType((4,), "int8"))) == "%? : i8[4]"


def test_same_model_prints_the_same_whatever_was_compiled_before():
    first = _texts(et.compile(_small(), (X,)))
    et.compile(nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 7)), (X,), update=et.BiasOnly())  # more ids used
    again = _texts(et.compile(_small(), (X,)))
    assert again == first
    assert re.search(r"^    %0<[^>]+> : ", first["captured"], re.M)
    assert not re.search(r"%\d{3,}", first["train"]), "numbers are per graph, not process-wide ids"


def test_same_text_in_a_fresh_process():
    code = ("import torch, edgetrain as et; from tests.ir.test_printer import _small, X; "
            "print(et.compile(_small(), (X,)).train_graph)")
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           cwd=Path(__file__).resolve().parents[2]).stdout
    et.compile(_small(), (X,))  # this process has compiled other models before
    assert fresh.rstrip("\n") == str(et.compile(_small(), (X,)).train_graph)
