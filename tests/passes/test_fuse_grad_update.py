"""fuse_weight_grad_update on small hand-built graphs: an int8 convolution's weight gradient
that only its qsgd_update reads is fused with that update into one
qconv2d_grad_weight_update node where the update was; the graph verifies and updates the
weight (and momentum) bit for bit as before. A gradient read elsewhere, or a grouped
convolution that is neither dense nor depthwise, is left alone."""
from __future__ import annotations

import numpy as np
import pytest

from edgetrain.interpreter import run_graph
from edgetrain.ir import Graph, TensorType, new_value
from edgetrain.ops import Emitter, verify
from edgetrain.ops.qgradupdate import GRAD_UPDATE_OP
from edgetrain.passes.fuse import fuse_weight_grad_update
from edgetrain.passes.updates import STEP

C_IN, H = 4, 5


def update_graph(groups=1, c_out=4, momentum=True, grad_is_output=False, k=3):
    """x (int8), gy (float32) -> qconv2d_grad_weight -> qsgd_update(w, grad, step[, m])."""
    w_shape = (c_out, C_IN // groups, k, k)
    ho = H - k + 1
    x = new_value(TensorType((2, C_IN, H, H), "int8"), "x")
    gy = new_value(TensorType((2, c_out, ho, ho), "float32"), "gy")
    w = new_value(TensorType(w_shape, "int8"), "w")
    step = new_value(TensorType((), "int32"), STEP)
    m = [new_value(TensorType(w_shape, "float32"), "momentum:w")] if momentum else []
    e = Emitter()
    scales = tuple(0.01 * (i + 1) for i in range(c_out))
    grad = e.emit("qconv2d_grad_weight", x, gy, weight_shape=w_shape, scales=scales, x_zero=-3,
                  stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=groups)
    upd = e.emit_multi("qsgd_update", w, grad, step, *m, names=("w", "momentum:w"), lr=0.5,
                       momentum=0.9 if momentum else 0.0, weight_decay=0.0, dim=0, index=None,
                       scale=(1.0,) * c_out, seed=3, param_id=0, qmin=-127, qmax=127)
    outs, names = list(upd), ["w"] + (["momentum:w"] if momentum else [])
    if grad_is_output:
        outs.append(grad)
        names.append("grad")
    return Graph((x, gy, w, step, *m), tuple(e.nodes), tuple(outs), tuple(names))


def _feeds(g, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in g.inputs:
        if v.dtype == "int8":
            feeds[v.name] = rng.integers(-127, 128, v.shape).astype(np.int8)
        elif v.name == STEP:
            feeds[v.name] = np.array(4, np.int32)
        else:
            feeds[v.name] = (rng.standard_normal(v.shape) * 3).astype(np.float32)
    return feeds


def _run(g, feeds):
    return run_graph(g, {k: v.copy() for k, v in feeds.items()})[0]


@pytest.mark.parametrize("groups,momentum", [(1, True), (1, False), (C_IN, True)], ids=["dense", "no_momentum",
                                                                                        "depthwise"])
def test_gradient_and_update_fuse_bit_for_bit(groups, momentum):
    g = verify(update_graph(groups=groups, momentum=momentum))
    f = verify(fuse_weight_grad_update(g))
    assert [n.op for n in f.nodes] == [GRAD_UPDATE_OP]
    (n,) = f.nodes
    assert n.inputs[:4] == g.nodes[0].inputs + g.nodes[1].inputs[:1] + (g.input(STEP),)
    assert n.outputs[:len(g.outputs)] == g.outputs  # the same values: every reader stays valid
    assert len(n.outputs) == len(g.outputs) + 1  # and one output row of scratch
    feeds = _feeds(g)
    before, after = _run(g, feeds), _run(f, feeds)
    assert set(after) == set(before)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    assert not np.array_equal(after["w"], feeds["w"])  # the update did move the weight


def test_a_gradient_read_elsewhere_is_not_fused():
    g = verify(update_graph(grad_is_output=True))
    assert fuse_weight_grad_update(g) is g


def test_a_grouped_convolution_is_not_fused():
    """groups=2 over 4 channels: neither dense nor depthwise, not done row by row."""
    g = verify(update_graph(groups=2))
    assert fuse_weight_grad_update(g) is g
