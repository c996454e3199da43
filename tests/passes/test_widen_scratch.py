"""Widening the fused expansion's scratch (passes/widen_scratch.py): the planned peak never
grows, the block is the largest rung of its ladder the peak has room for, the values are
bit for bit the same (tests/backends/c/test_int8.py runs the C kernel on wider scratches)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgetrain.interpreter import run_graph
from edgetrain.ir import Graph, TensorType, new_value
from edgetrain.memory import plan_memory
from edgetrain.ops import Emitter, verify
from edgetrain.ops.qfused import BLOCK, PW_DW_OP, block_of
from edgetrain.passes.fuse import fuse_pointwise_depthwise
from edgetrain.passes.widen_scratch import _ladder, widen_scratch, with_setting

from .test_fuse import int8, layer_arrays, qattrs

SETTINGS = settings(max_examples=20, deadline=None, derandomize=True, database=None)


def peak(g: Graph) -> int:
    return plan_memory(g, {"x"}, ()).peak_bytes


def chain(c: int, wide: int, seed: int = 0):
    """x (1x4x6x6) -> expansion to c channels -> depthwise 3x3 -> a 1x1 to `wide` channels ->
    output: with a large `wide` the step peaks at the last conv, away from the fused pair."""
    rng = np.random.default_rng(seed)
    pw, dw = qattrs(rng, c, y_zero=3), qattrs(rng, c, padding=1, groups=c, x_zero=3)
    last = qattrs(rng, wide)
    (w1, b1), (w2, b2), (w3, b3) = (layer_arrays(rng, 4, c, 1), layer_arrays(rng, c, c, 3, groups=c),
                                    layer_arrays(rng, c, wide, 1))
    arrays = dict(x=int8(rng, (1, 4, 6, 6)), w1=w1, b1=b1, w2=w2, b2=b2, w3=w3, b3=b3)
    ins = [new_value(TensorType(v.shape, str(v.dtype)), k) for k, v in arrays.items()]
    e = Emitter()
    t = e.emit("qconv2d", *ins[:3], **pw)
    y = e.emit("qconv2d", t, *ins[3:5], **dw)
    z = e.emit("qconv2d", y, *ins[5:], **last)
    g = fuse_pointwise_depthwise(verify(Graph(tuple(ins), tuple(e.nodes), (z,), ("z",))))
    assert [n.op for n in g.nodes][0] == PW_DW_OP
    return g, arrays


def fused_block(g: Graph) -> int:
    (n,) = [n for n in g.nodes if n.op == PW_DW_OP]
    assert n.outputs[1].shape[1] == block_of(n.attrs, n.inputs[1].shape[0])
    return block_of(n.attrs, n.inputs[1].shape[0])


def test_a_pair_away_from_the_peak_holds_every_channel():
    g, arrays = chain(c=8, wide=64)
    w = verify(widen_scratch(g, peak, {"x"}))
    assert fused_block(g) == 1 and fused_block(w) == 8
    (node,) = [n for n in w.nodes if n.op == PW_DW_OP]
    assert node.attrs[BLOCK] == 8 and node.outputs[1].type == TensorType((1, 8, 6, 6), "int8")
    assert peak(w) == peak(g)
    assert np.array_equal(run_graph(w, arrays)[0]["z"], run_graph(g, arrays)[0]["z"])


def test_a_pair_at_the_peak_keeps_one_channel():
    g, _ = chain(c=8, wide=1)
    assert fused_block(widen_scratch(g, peak, {"x"})) == 1


@SETTINGS
@given(c=st.integers(2, 24), wide=st.integers(1, 96), seed=st.integers(0, 2 ** 16))
def test_the_block_is_the_largest_rung_the_peak_has_room_for(c, wide, seed):
    g, arrays = chain(c, wide, seed)
    w = verify(widen_scratch(g, peak, {"x"}))
    b = fused_block(w)
    assert peak(w) <= peak(g)
    assert b == 1 or b in _ladder(c)
    (i, node), = [(i, n) for i, n in enumerate(w.nodes) if n.op == PW_DW_OP]
    for larger in (r for r in _ladder(c) if r > b):  # every larger rung passes the peak
        trial = w.replace(nodes=w.nodes[:i] + (with_setting(node, BLOCK, larger),) + w.nodes[i + 1:])
        assert peak(trial) > peak(g)
    assert np.array_equal(run_graph(w, arrays)[0]["z"], run_graph(g, arrays)[0]["z"])


def test_ladder():
    assert _ladder(48) == [48, 24, 12, 6, 3] and _ladder(1) == [] and _ladder(2) == [2]


def test_the_compile_step_keeps_the_peak_widens_streams_and_dense_gradient_rows_not_depthwise_ones():
    """In a compiled int8 program (a frozen inverted-residual block streamed behind a strided stem,
    a second block trained, momentum on): the stream computes bands of rows, the dense layers'
    gradient rows go in blocks, the depthwise layer's one by one, the updates keep their
    momentum outputs, and the planned peak is the reordered graph's."""
    import torch
    from torch import nn

    import edgetrain as et
    from edgetrain.ops.qgradupdate import GRAD_UPDATE_OP, rows_of, split_attrs
    from edgetrain.ops.qstream import STREAM_OP
    from edgetrain.ops.qstream import rows_of as stream_rows
    from edgetrain.pipeline import plan_graph

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU6(), nn.Conv2d(8, 24, 1), nn.ReLU6(),
                          nn.Conv2d(24, 24, 3, 1, 1, groups=24), nn.ReLU6(), nn.Conv2d(24, 8, 1),
                          nn.Conv2d(8, 16, 1), nn.ReLU6(), nn.Conv2d(16, 16, 3, 1, 1, groups=16), nn.ReLU6(),
                          nn.Conv2d(16, 8, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5)).eval()
    prog = et.compile(model, (torch.randn(1, 3, 16, 16),), quantize="int8", update=et.LastK(4),
                      optimizer=et.SGD(0.01, momentum=0.9))
    before, after = prog.stages["reordered"], prog.stages["widened_scratch"]
    assert after is prog.train_graph
    assert prog.memory.peak_bytes == plan_graph(before, prog.trainable, prog.initial_state).peak_bytes
    (stream,) = [n for n in after.nodes if n.op == STREAM_OP]
    assert stream_rows(stream.attrs) > 1
    held = {}
    for n in (n for n in after.nodes if n.op == GRAD_UPDATE_OP):
        gw, _ = split_attrs(n.attrs)
        rows = rows_of(n.attrs, gw["weight_shape"][0])
        assert n.outputs[-1].shape[0] == rows and len(n.outputs) == 3  # w', m', scratch
        held.setdefault("depthwise" if int(gw["groups"]) > 1 else "dense", []).append(rows)
    assert held["depthwise"] == [1] and len(held["dense"]) == 3 and min(held["dense"]) > 1


def test_a_scratch_setting_below_one_is_refused():
    from edgetrain.ops import qgradupdate, qstream

    with pytest.raises(ValueError, match="qconv2d_pw_dw: block must be at least 1, got 0"):
        block_of({BLOCK: 0}, 4)
    with pytest.raises(ValueError, match="qstream: rows must be at least 1, got 0"):
        qstream.rows_of({qstream.ROWS: 0})
    with pytest.raises(ValueError, match="qconv2d_grad_weight_update: rows must be at least 1, got -1"):
        qgradupdate.rows_of({qgradupdate.ROWS: -1}, 4)
