"""fuse_batchnorm_backward: each batch norm's backward (gradient mask, input, weight and bias
gradients) becomes one batch_norm_backward_fused node. On a compiled conv-bn-relu / relu6 model
every batch norm is fused, the graph verifies and computes the same gradients bit for bit on the
reference runtime, and the step compile() stages runs it. On hand-built graphs: a group is found
with or without its mask, per batch norm when two read one gradient; it is left alone when it
has no weight or bias gradient, when an operand only exists after its first node, or when an
update overwrites an operand between its nodes. The planner writes the input gradient over the
incoming one (the op's in-place effect)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.ir import Graph, TensorType, new_value
from edgetrain.memory.liveness import inplace_merges, lifetimes
from edgetrain.ops import Emitter, verify
from edgetrain.ops.bnfused import BN_BACKWARD_OP
from edgetrain.passes.fuse_batchnorm_backward import fuse_batchnorm_backward
from edgetrain.passes.loss import LABEL

from .graph_values import graph_values, same_outputs

N, C, H = 2, 3, 4
EPS = 1e-5


class ConvBnAct(nn.Module):
    """conv-bn-relu, conv-bn-relu6 (clamp), a bias-free conv into a frozen-free linear head."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.c2, self.b2 = nn.Conv2d(4, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6)
        self.fc = nn.Linear(6, 5)

    def forward(self, x):
        h = torch.relu(self.b1(self.c1(x)))
        h = nn.functional.relu6(self.b2(self.c2(h)))
        return self.fc(h.mean((2, 3)))


def _model():
    torch.manual_seed(0)
    m = ConvBnAct()
    for bn in (m.b1, m.b2):  # running statistics away from the defaults, so each term matters
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    return m.eval()


def _fused(g: Graph) -> list:
    return [n for n in g.nodes if n.op == BN_BACKWARD_OP]


@pytest.fixture(scope="module")
def prog():
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    return et.compile(_model(), (x,), optimizer=et.SGD(lr=0.1, momentum=0.9)), x.numpy()


def test_conv_bn_act_model_fuses_every_batch_norm_with_its_mask(prog):
    p, x = prog
    pruned = p.stages["pruned"]
    fused = verify(fuse_batchnorm_backward(pruned))
    nodes = _fused(fused)
    assert sorted(n.attrs["mask"] for n in nodes) == ["clamp_grad", "relu_grad"]
    assert all(n.attrs["affine"] and n.attrs["grad_weight"] and n.attrs["grad_bias"] for n in nodes)
    left = {n.op for n in fused.nodes}
    assert not left & {"batch_norm_grad_input", "batch_norm_grad_weight", "relu_grad", "clamp_grad"}
    assert len(fused.nodes) == len(pruned.nodes) - 3 * len(nodes)  # four nodes each became one
    feeds = graph_values(pruned, {**p.state, p.graph_inputs[0]: x, LABEL: np.array([1, 4])})
    same_outputs(pruned, fused, feeds)


def test_compile_stages_the_fusion_and_trains_with_it(prog):
    p, x = prog
    names = list(p.stages)
    assert names.index("pruned") < names.index("fused_bn_backward") < names.index("reordered")
    assert len(_fused(p.stages["fused_bn_backward"])) == 2
    assert len(_fused(p.grad_graph)) == 2 and len(_fused(p.train_graph)) == 2


# --- hand-built graphs -------------------------------------------------------------------------
def _v(shape, name, dtype="float32"):
    return new_value(TensorType(tuple(shape), dtype), name)


def bn_backward(mask="relu_grad", weight=True, bias=True, extra_reader=False, grad_output=False, eps_w=EPS,
                update_between=False, late_weight=False):
    """g -> [mask] -> gm -> channel sum, batch_norm_grad_input, batch_norm_grad_weight, as autodiff
    emits them. update_between: the input gradient reads w through a view, after an update
    of w by the weight gradient (the verifier allows it: the view is another value)."""
    g, saved, x = _v((N, C, H, H), "g"), _v((N, C, H, H), "saved"), _v((N, C, H, H), "x")
    mean, var, w = _v((C,), "mean"), _v((C,), "var"), _v((C,), "w")
    e = Emitter()
    w_view = e.emit("reshape", w, shape=(C,)) if update_between else w
    gm = e.emit(mask, g, saved, **({"min": 0.0, "max": 6.0} if mask == "clamp_grad" else {})) if mask else g
    outs, names = [], []
    if bias:
        outs.append(e.emit("sum", gm, dims=(0, 2, 3)))
        names.append("gb")
    if weight:
        outs.append(e.emit("batch_norm_grad_weight", gm, x, mean, var, eps=eps_w))
        names.append("gw")
    if update_between:
        e.emit_multi("sgd_update", w, outs[-1], lr=0.1, momentum=0.0, weight_decay=0.0, dim=0, index=None)
    w_in = e.emit("neg", w) if late_weight else w_view  # late: an operand made after the group's first node
    outs.append(e.emit("batch_norm_grad_input", gm, var, w_in, eps=EPS))
    names.append("gx")
    if extra_reader:
        outs.append(e.emit("neg", gm))
        names.append("other")
    if grad_output and mask:
        outs.append(gm)
        names.append("gm")
    return verify(Graph((g, saved, x, mean, var, w), tuple(e.nodes), tuple(outs), tuple(names)))


@pytest.mark.parametrize("mask", ["relu_grad", "clamp_grad", ""])
@pytest.mark.parametrize("weight,bias", [(True, True), (True, False), (False, True)])
def test_group_with_its_mask_is_one_node(mask, weight, bias):
    g = bn_backward(mask, weight, bias)
    f = verify(fuse_batchnorm_backward(g))
    (node,) = _fused(f)
    assert len(f.nodes) == 1 and node.attrs["mask"] == mask
    assert (node.attrs["grad_weight"], node.attrs["grad_bias"]) == (weight, bias)
    same_outputs(g, f, graph_values(g, {}))


@pytest.mark.parametrize("case", ["extra_reader", "grad_output"])
def test_mask_read_elsewhere_stays_its_own_node(case):
    g = bn_backward(**{case: True})
    f = verify(fuse_batchnorm_backward(g))
    (node,) = _fused(f)
    assert node.attrs["mask"] == "" and [n.op for n in f.nodes].count("relu_grad") == 1
    same_outputs(g, f, graph_values(g, {}))


def test_two_batch_norms_reading_one_gradient_are_fused_each():
    """A residual block's gradient feeds the main branch's and the shortcut's batch norm."""
    g, x1, x2 = _v((N, C, H, H), "g"), _v((N, C, H, H), "x1"), _v((N, C, H, H), "x2")
    stats = [_v((C,), n) for n in ("mean1", "var1", "w1", "mean2", "var2", "w2")]
    e = Emitter()
    outs = []
    for x, (mean, var, w) in ((x1, stats[:3]), (x2, stats[3:])):
        outs += [e.emit("batch_norm_grad_input", g, var, w, eps=EPS),
                 e.emit("batch_norm_grad_weight", g, x, mean, var, eps=EPS), e.emit("sum", g, dims=(0, 2, 3))]
    gr = verify(Graph((g, x1, x2, *stats), tuple(e.nodes), tuple(outs), tuple(f"o{i}" for i in range(6))))
    f = verify(fuse_batchnorm_backward(gr))
    assert [n.op for n in f.nodes] == [BN_BACKWARD_OP] * 2
    same_outputs(gr, f, graph_values(gr, {}))


@pytest.mark.parametrize("why", ["frozen", "late_operand", "update_between"])
def test_group_left_alone(why):
    kw = {"frozen": dict(weight=False, bias=False), "late_operand": dict(late_weight=True),
          "update_between": dict(update_between=True)}[why]
    g = bn_backward(**kw)
    assert fuse_batchnorm_backward(g) is g


def test_weight_gradient_of_another_eps_is_not_taken():
    g = bn_backward(eps_w=1e-3)
    f = verify(fuse_batchnorm_backward(g))
    (node,) = _fused(f)
    assert not node.attrs["grad_weight"] and node.attrs["grad_bias"] and node.attrs["mask"] == ""
    assert [n.op for n in f.nodes].count("batch_norm_grad_weight") == 1
    same_outputs(g, f, graph_values(g, {}))


def test_input_gradient_is_planned_over_the_incoming_gradient():
    """The fused op's memory effect (OpDef.inplace): the arena planner writes gx over g when
    nothing reads g afterwards, as it wrote the unfused relu_grad's output over g."""
    g0, saved, x = _v((N, C, H, H), "g0"), _v((N, C, H, H), "saved"), _v((N, C, H, H), "x")
    mean, var, w = _v((C,), "mean"), _v((C,), "var"), _v((C,), "w")
    e = Emitter()
    g = e.emit("neg", g0)  # an arena value (a graph input is never written over)
    gm = e.emit("relu_grad", g, saved)
    outs = (e.emit("batch_norm_grad_input", gm, var, w, eps=EPS), e.emit("sum", gm, dims=(0, 2, 3)))
    f = verify(fuse_batchnorm_backward(Graph((g0, saved, x, mean, var, w), tuple(e.nodes), outs, ("gx", "gb"))))
    (node,) = _fused(f)
    merges = inplace_merges(f, lifetimes(f, {"g0", "saved"}))
    assert (g, node.outputs[0]) in merges
