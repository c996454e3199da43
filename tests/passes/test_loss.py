"""attach_loss on a small hand-built graph: a `label` input and a scalar `loss` output are
added; the graph verifies, computes the model output as before and the loss as numpy does."""
from __future__ import annotations

import numpy as np
import pytest

from edgetrain.interpreter import run_graph
from edgetrain.ir import Graph, Role, TensorType, new_value
from edgetrain.ops import Emitter, verify
from edgetrain.passes.loss import LABEL, attach_loss


def linear_graph(rank=2):
    """x (2, 3) -> linear(w, b) -> output (2, 4); with rank 3, x (2, 5, 3) -> output (2, 5, 4)."""
    x = new_value(TensorType((2, 3) if rank == 2 else (2, 5, 3), "float64"), "x")
    w, b = new_value(TensorType((4, 3), "float64"), "w"), new_value(TensorType((4,), "float64"), "b")
    e = Emitter()
    y = e.emit("linear", x, w, b)
    return Graph((x, w, b), tuple(e.nodes), (y,), ("output",))


def _feeds(rng, g):
    return {v.name: rng.standard_normal(v.shape) for v in g.inputs}


def test_cross_entropy():
    rng = np.random.default_rng(0)
    g = verify(linear_graph())
    feeds = _feeds(rng, g)
    before = run_graph(g, feeds)[0]["output"]
    lg = verify(attach_loss(g, "cross_entropy"))
    assert lg.inputs[:3] == g.inputs and lg.nodes[:len(g.nodes)] == g.nodes  # the model itself is unchanged
    label = lg.input(LABEL)
    assert label.type == TensorType((2,), "int64")
    assert lg.the_input(Role.LABEL) is label and lg.roles[:3] == g.roles
    assert lg.output_names == ("loss",) and lg.outputs[0].shape == ()
    y = np.array([1, 3])
    loss = run_graph(lg, {**feeds, LABEL: y})[0]["loss"]
    logp = before - np.log(np.exp(before).sum(1, keepdims=True))
    np.testing.assert_allclose(loss, -logp[np.arange(2), y].mean(), rtol=1e-12)


def test_mse_takes_targets_shaped_like_the_output():
    rng = np.random.default_rng(1)
    g = linear_graph()
    feeds = _feeds(rng, g)
    before = run_graph(g, feeds)[0]["output"]
    lg = verify(attach_loss(g, "mse"))
    assert lg.input(LABEL).type == g.output("output").type
    target = rng.standard_normal((2, 4))
    loss = run_graph(lg, {**feeds, LABEL: target})[0]["loss"]
    np.testing.assert_allclose(loss, ((before - target) ** 2).mean(), rtol=1e-12)


def test_refusals():
    with pytest.raises(ValueError, match="loss must be one of"):
        attach_loss(linear_graph(), "hinge")
    x = new_value(TensorType((2,), "float64"), "x")
    scores = Graph((x,), (), (x,), ("output",))  # one number per example: no class dim
    with pytest.raises(ValueError, match=r"cross_entropy needs model outputs of shape \(batch, classes, ...\)"):
        attach_loss(scores, "cross_entropy")


def test_cross_entropy_over_dim_1_of_a_rank_3_output():
    """(N, L, C) from a linear layer read as torch does, classes in dim 1: labels (N, C)."""
    lg = verify(attach_loss(linear_graph(rank=3), "cross_entropy"))
    assert lg.input(LABEL).type == TensorType((2, 4), "int64")
    lg = verify(attach_loss(linear_graph(rank=3), "sequence_cross_entropy"))
    assert lg.input(LABEL).type == TensorType((2, 5), "int64")
