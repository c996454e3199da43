"""split_input_transform on small hand-built graphs: the float prefix that quantizes a data
input becomes its own graph, the rest takes the int8 tensor as its input; both verify and,
run one after the other, compute what the graph computed before. Nothing is split when the
float data is read after its quantization or nothing quantizes it."""
from __future__ import annotations

import numpy as np

from edgetrain.interpreter import run_graph
from edgetrain.ir import Graph, Role, TensorType, new_value
from edgetrain.ops import Emitter, verify
from edgetrain.passes.input_split import INT8_SUFFIX, split_input_transform

Q = dict(scale=0.05, zero=3, qmin=-128, qmax=127)
F32 = TensorType((1, 2, 3, 3), "float32")


def graph(quantizations=1, float_read_later=False, quantize=True):
    """x -> neg -> quantize (-> dequantize -> add w) ... -> output; `quantizations` quantize
    the same input with different scales, their results summed."""
    x, w = new_value(F32, "x"), new_value(F32, "w")
    e = Emitter()
    s = e.emit("neg", x)
    outs = []
    for k in range(quantizations):
        q = e.emit("quantize", s, **{**Q, "scale": Q["scale"] * (k + 1)}) if quantize else s
        d = e.emit("dequantize", q, **Q) if quantize else q
        outs.append(e.emit("add", d, w))
    y = outs[0]
    for o in outs[1:]:
        y = e.emit("add", y, o)
    if float_read_later:
        y = e.emit("add", y, x)
    return Graph((x, w), tuple(e.nodes), (y,), ("output",), (Role.DATA, Role.PARAMETER))


def _feeds(rng):
    return {name: rng.standard_normal(F32.shape).astype(np.float32) for name in ("x", "w")}


def test_the_quantizing_prefix_is_split_off():
    rng = np.random.default_rng(0)
    g = verify(graph())
    split = split_input_transform(g, ["x"])
    t, rest = verify(split.transform), verify(split.rest)
    assert [n.op for n in t.nodes] == ["neg", "quantize"]
    assert [v.name for v in t.inputs] == ["x"] and t.output_names == ("x" + INT8_SUFFIX,)
    assert [v.name for v in rest.inputs] == ["x:int8", "w"]
    assert rest.input("x:int8").type == TensorType(F32.shape, "int8")
    assert t.roles == (Role.DATA,) and rest.roles == (Role.DATA, Role.PARAMETER), "the int8 samples are data"
    assert [n.op for n in rest.nodes] == ["dequantize", "add"]
    feeds = _feeds(rng)
    q = run_graph(t, {"x": feeds["x"]})[0]
    np.testing.assert_array_equal(run_graph(rest, {**q, "w": feeds["w"]})[0]["output"],
                                  run_graph(g, feeds)[0]["output"])


def test_an_input_quantized_twice_gives_two_int8_inputs():
    rng = np.random.default_rng(1)
    g = verify(graph(quantizations=2))
    split = split_input_transform(g, ["x"])
    verify(split.transform), verify(split.rest)
    assert split.transform.output_names == ("x:int8", "x:int8:1")
    feeds = _feeds(rng)
    q = run_graph(split.transform, {"x": feeds["x"]})[0]
    np.testing.assert_array_equal(run_graph(split.rest, {**q, "w": feeds["w"]})[0]["output"],
                                  run_graph(g, feeds)[0]["output"])


def test_nothing_to_split():
    assert split_input_transform(graph(float_read_later=True), ["x"]) is None  # the float data is needed later
    assert split_input_transform(graph(quantize=False), ["x"]) is None  # nothing quantizes it
