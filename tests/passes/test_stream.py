"""Row streaming of frozen chains: the qstream op is bit-identical to its layers run one
after the other, whatever their kernels, strides, paddings and residual adds; its ring
buffers are what the row plan says and much less than the intermediates; the pass
streams exactly the chains it may (no intermediate read elsewhere, no updated weight);
and on the paper's MobileNetV2 it lowers the forward peak without changing one bit of a
training step."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgetrain.interpreter import run_graph
from edgetrain.ir import Graph, TensorType, new_value
from edgetrain.ops import Emitter, verify
from edgetrain.ops.qelementwise import qadd_attrs
from edgetrain.ops.qstream import STREAM_OP, qstream_ref, row_plan
from edgetrain.passes import apply_updates_early
from edgetrain.passes.fuse import fuse_pointwise_depthwise
from edgetrain.passes.stream import stream_frozen_chains

from .test_fuse import (SETTINGS, _compile_mbv2, _with_update, int8, layer_arrays, needs_assets, one_step, qattrs,
                        ram_of)

KB = 1024


def chain_graph(rng, layers, x_shape, residual_at=()):
    """x -> the convs `layers` [(c_out, kernel, stride, padding, depthwise)] -> output "y",
    with a qadd of a layer's input to its output after each index in `residual_at` (when
    shapes agree). Returns (graph, arrays)."""
    x = new_value(TensorType(tuple(x_shape), "int8"), "x")
    inputs, arrays, e = [x], {"x": int8(rng, x_shape)}, Emitter()
    v = x
    for i, (c_out, k, s, p, depthwise) in enumerate(layers):
        c_in = v.shape[1]
        groups = c_in if depthwise else 1
        c_out = c_in if depthwise else c_out
        a = qattrs(rng, c_out, stride=s, padding=p, groups=groups, x_zero=int(rng.integers(-20, 20)),
                   y_zero=int(rng.integers(-20, 20)), qmin=int(rng.choice([-128, -20])))
        w, b = layer_arrays(rng, c_in, c_out, k, groups)
        wv, bv = (new_value(TensorType(t.shape, str(t.dtype)), f"{n}{i}") for t, n in ((w, "w"), (b, "b")))
        inputs += [wv, bv]
        arrays.update({wv.name: w, bv.name: b})
        y = e.emit("qconv2d", v, wv, bv, **a)
        if i in residual_at and y.type == v.type:
            y = e.emit("qadd", y, v, **qadd_attrs(0.05, 1, 0.04, -2, 0.07, 3))
        v = y
    return Graph(tuple(inputs), tuple(e.nodes), (v,), ("y",)), arrays


def stream_node_of(g: Graph):
    f = verify(stream_frozen_chains(g, {"x"}))
    return f, [n for n in f.nodes if n.op == STREAM_OP]


layer = st.tuples(st.integers(1, 5), st.sampled_from([1, 3, 5]), st.integers(1, 2), st.integers(0, 2), st.booleans())


@SETTINGS
@given(layers=st.lists(layer, min_size=2, max_size=5), h=st.integers(6, 14), wd=st.integers(3, 8),
       c=st.integers(1, 4), seed=st.integers(0, 2 ** 16), rows=st.sampled_from([1, 2, 3, 64]))
def test_qstream_is_the_chain_bit_for_bit(layers, h, wd, c, seed, rows):
    """Bands of `rows` rows per call (passes/widen_scratch.py), 64 more than any layer's."""
    rng = np.random.default_rng(seed)
    try:
        g, arrays = chain_graph(rng, layers, (1, c, h, wd), residual_at={1, 3})
    except ValueError:  # a kernel larger than its (padded) input
        return
    verify(g)
    from edgetrain.passes.stream import _body

    body = _body(g.inputs[0], g.outputs[0], list(g.nodes))
    y, scratch = qstream_ref([arrays[v.name] for v in g.inputs], {"body": body, "rows": rows})
    want = run_graph(g, arrays)[0]["y"]
    assert np.array_equal(y, want)
    plan = row_plan(body, rows)
    assert scratch.nbytes == plan.ring_bytes
    # no row computed twice; every output row computed (rows nothing reads may be skipped)
    done = [(i, r) for i, first, count in plan.steps for r in range(first, first + count)]
    assert len(set(done)) == len(done) and all(1 <= count <= rows for _, _, count in plan.steps)
    assert {r for i, r in done if i == len(body.nodes) - 1} == set(range(y.shape[2]))
    # each node's bands follow one another, each the next `rows` rows (what the C kernel computes)
    for i, n in enumerate(body.nodes):
        firsts = [(first, count) for j, first, count in plan.steps if j == i]
        assert all(f == k * rows and c == min(rows, n.out.shape[2] - f) for k, (f, c) in enumerate(firsts))
    # a ring never holds more than the whole intermediate
    for i, n in enumerate(body.nodes[:-1]):
        assert 1 <= plan.capacity[i] <= n.out.shape[2]


def test_ring_buffers_hold_a_few_rows_of_tall_layers():
    rng = np.random.default_rng(0)
    # 3x3 conv, depthwise 3x3, pointwise: like an inverted-residual block on a 64-row image
    g, arrays = chain_graph(rng, [(8, 3, 1, 1, False), (8, 3, 1, 1, True), (4, 1, 1, 0, False)], (1, 3, 64, 16))
    f, (node,) = stream_node_of(g)
    plan = row_plan(node.attrs["body"])
    assert plan.capacity[:2] == (3, 1)  # the depthwise needs 3 rows of its input, the 1x1 conv one
    assert node.outputs[1].type.nbytes == plan.ring_bytes == (3 + 1) * 8 * 16
    intermediates = sum(n.out.type.nbytes for n in g.nodes[:-1])
    assert plan.ring_bytes * 32 == intermediates  # 4 rows held of 2 x 64
    assert np.array_equal(run_graph(f, arrays)[0]["y"], run_graph(g, arrays)[0]["y"])


def test_stride_two_needs_rows_ahead():
    rng = np.random.default_rng(1)
    g, _ = chain_graph(rng, [(4, 1, 1, 0, False), (4, 3, 2, 1, True), (4, 1, 1, 0, False)], (1, 2, 32, 8))
    _, (node,) = stream_node_of(g)
    assert row_plan(node.attrs["body"]).capacity[0] == 3  # rows 2r-1, 2r, 2r+1 of the expansion


def test_pass_leaves_a_chain_whose_intermediate_is_read_elsewhere():
    rng = np.random.default_rng(2)
    g, _ = chain_graph(rng, [(8, 3, 2, 1, False), (8, 3, 1, 1, True), (4, 1, 1, 0, False)], (1, 3, 32, 32))
    e = Emitter()
    mask = e.emit("qmask_pack", g.nodes[1].out, lo=-128, hi=127)  # as a trained layer's backward would
    h = verify(g.replace(nodes=g.nodes + tuple(e.nodes), outputs=g.outputs + (mask,),
                         output_names=g.output_names + ("m",)))
    f, streams = stream_node_of(h)
    assert all(g.nodes[1].out not in {o for n in s.attrs["body"].nodes for o in n.outputs} for s in streams)
    assert g.nodes[1].out in {o for n in f.nodes for o in n.outputs}  # still computed as a tensor


def test_pass_leaves_layers_whose_weights_are_updated():
    rng = np.random.default_rng(3)
    g, _ = chain_graph(rng, [(8, 3, 2, 1, False), (8, 3, 1, 1, True), (4, 1, 1, 0, False)], (1, 3, 32, 32))
    h = _with_update(g, "w1", after=2)
    f, streams = stream_node_of(h)
    assert all("w1" not in {v.name for v in s.inputs} for s in streams)


def test_pass_streams_only_what_lowers_the_peak():
    rng = np.random.default_rng(4)
    # large 3x3 conv then small layers: streaming the first pair removes its big output
    g, arrays = chain_graph(rng, [(16, 3, 1, 1, False), (16, 3, 2, 1, True), (4, 1, 1, 0, False),
                                  (4, 1, 1, 0, False)], (1, 3, 32, 32))
    f, streams = stream_node_of(g)
    assert len(streams) == 1 and streams[0].inputs[0] is g.inputs[0]
    assert np.array_equal(run_graph(f, arrays)[0]["y"], run_graph(g, arrays)[0]["y"])
    # a chain whose peak is its last layer's input and output gains nothing from streaming
    small, _ = chain_graph(rng, [(2, 1, 1, 0, False), (16, 1, 1, 0, False)], (1, 4, 8, 8))
    assert stream_frozen_chains(small, {"x"}) is small


@needs_assets
@pytest.mark.parametrize("scheme", [dict(bias_last=16, weights={36: 1, 39: 1, 41: 0.25, 42: 0.125, 45: 0.125,
                                                                 48: 0.125, 49: 0.125})])
def test_mbv2_streamed_step_is_bit_identical_and_lowers_the_forward_peak(scheme):
    import edgetrain as et
    from edgetrain.memory import plan_memory

    p = _compile_mbv2(et.Sparse(**scheme))
    assert any(n.op == STREAM_OP for n in p.train_graph.nodes)
    g = fuse_pointwise_depthwise(apply_updates_early(p.stages["updates"]))
    s = verify(stream_frozen_chains(g, set(p.graph_inputs)))
    (node,) = [n for n in s.nodes if n.op == STREAM_OP]
    assert node.inputs[0].name == p.graph_inputs[0]  # from the int8 image
    (oa, wa), (ob, wb) = one_step(p, g), one_step(p, s)
    assert oa["loss"] == ob["loss"] and all(np.array_equal(wa[k], wb[k]) for k in p.trainable)
    before, after = (plan_memory(h, ram_of(p), list(p.trainable)) for h in (g, s))
    first_grad = next(i for i, n in enumerate(s.nodes) if "grad" in n.op)
    assert max(after.timeline[:first_grad]) < 90 * KB < 110 * KB < max(before.timeline[:first_grad])
    assert p.memory.peak_bytes < 141 * KB  # the paper's sparse + reorder figure for this model
