"""fuse_bn_activation: batch norm [+ residual add] + ReLU / clamp becomes one batch_norm_act node.
On a compiled model with conv-bn-relu, conv-bn-relu6 and a residual block every such chain is
fused, the clamp masks read the fused output, and the step computes the same values bit for bit
on the reference runtime (and in C within the float tolerance). On hand-built graphs: a clamp
mask (alone or inside a fused batch-norm backward) is pointed at the fused output; a chain is
left alone when the normalised tensor or the sum has another reader or is a graph output, when
the clamp's bounds are empty or differ from its mask's, or when an update overwrites an operand
between the batch norm and the activation; an add of two batch norms is fused once."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.backends.c.host import to_c_program
from edgetrain.ir import Graph, TensorType, new_value
from edgetrain.ops import Emitter, verify
from edgetrain.ops.bnact import BN_ACT_OP
from edgetrain.ops.bnfused import BN_BACKWARD_OP
from edgetrain.passes.fuse_bn_activation import fuse_bn_activation
from edgetrain.passes.loss import LABEL

from .graph_values import graph_values, same_outputs

N, C, H = 2, 3, 4
EPS = 1e-5
RELU6 = {"min": 0.0, "max": 6.0}


class Blocks(nn.Module):
    """conv-bn-relu, conv-bn-relu6 (clamp), a residual conv-bn + add + relu, a linear head."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.c2, self.b2 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.c3, self.b3 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        h = torch.relu(self.b1(self.c1(x)))
        h = nn.functional.relu6(self.b2(self.c2(h)))
        h = torch.relu(self.b3(self.c3(h)) + h)
        return self.fc(h.mean((2, 3)))


def _model():
    torch.manual_seed(0)
    m = Blocks()
    for bn in (m.b1, m.b2, m.b3):  # running statistics away from the defaults, so each term matters
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.data.uniform_(0.5, 1.5)
        bn.bias.data.uniform_(-0.5, 0.5)
    return m.eval()


def _feeds(g: Graph, fixed: dict) -> dict:
    return graph_values(g, fixed, spread=4.0)  # past ReLU6's top too


def _fused(g: Graph) -> list:
    return [n for n in g.nodes if n.op == BN_ACT_OP]


@pytest.fixture(scope="module")
def prog():
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    return et.compile(_model(), (x,), optimizer=et.SGD(lr=0.1, momentum=0.9)), x.numpy()


def test_model_fuses_every_chain_and_computes_the_same(prog):
    p, x = prog
    before = p.stages["fused_bn_backward"]
    after = verify(fuse_bn_activation(before))
    nodes = _fused(after)
    assert sorted((n.attrs["act"], n.attrs["residual"]) for n in nodes) == [
        ("clamp", False), ("relu", False), ("relu", True)]
    assert not {n.op for n in after.nodes} & {"batch_norm", "relu", "clamp"}
    assert len(after.nodes) == len(before.nodes) - 4  # three batch norms and one add gone
    (clamp,) = [n for n in nodes if n.attrs["act"] == "clamp"]
    masks = [n for n in after.nodes if n.op == BN_BACKWARD_OP and n.attrs["mask"] == "clamp_grad"]
    assert len(masks) == 1 and clamp.out in masks[0].inputs  # the mask reads the fused output
    feeds = _feeds(before, {**p.state, p.graph_inputs[0]: x, LABEL: np.array([1, 4])})
    same_outputs(before, after, feeds)


def test_compile_stages_the_fusion_and_c_trains_like_the_reference(prog):
    p, x = prog
    names = list(p.stages)
    assert names.index("fused_bn_backward") < names.index("fused_bn_activations") < names.index("updates")
    assert len(_fused(p.train_graph)) == 3 and len(_fused(p.grad_graph)) == 3
    y = np.array([1, 4])
    c = to_c_program(p)
    ref = et.compile(_model(), (torch.from_numpy(x),), optimizer=et.SGD(lr=0.1, momentum=0.9))
    for _ in range(3):
        lc, lr = float(c.step(x, y)), float(ref.step(x, y))
        assert abs(lc - lr) <= 1e-5 * max(1.0, abs(lr)), (lc, lr)


# --- hand-built graphs -------------------------------------------------------------------------
def _v(shape, name, dtype="float32"):
    return new_value(TensorType(tuple(shape), dtype), name)


def bn_act(act="clamp", residual=False, mask="clamp_grad", extra_reader=False, y_output=False,
           mask_bounds=RELU6, bounds=RELU6, update_between=False, two_bns=False):
    """x -> batch_norm [-> add r] -> act, with the activation's backward mask as autodiff emits
    it (mask "clamp_grad", "fused": a fused batch-norm backward holding it, "" none)."""
    x, r0, g = _v((N, C, H, H), "x"), _v((N, C, H, H), "r"), _v((N, C, H, H), "g")
    mean, var, w, b = _v((C,), "mean"), _v((C,), "var"), _v((C,), "w"), _v((C,), "b")
    e = Emitter()
    y = e.emit("batch_norm", x, mean, var, w, b, eps=EPS)
    r = e.emit("batch_norm", r0, mean, var, eps=EPS) if two_bns else r0
    if update_between:
        e.emit_multi("sgd_update", w, mean, lr=0.1, momentum=0.0, weight_decay=0.0, dim=0, index=None)
    t = e.emit("add", r, y) if residual else y
    z = e.emit(act, t, **(bounds if act == "clamp" else {}))
    outs, names = [e.emit("neg", z)], ["z"]
    if mask == "clamp_grad":
        outs.append(e.emit("clamp_grad", g, t, **mask_bounds))
        names.append("gt")
    elif mask == "fused":
        outs += e.emit_multi(BN_BACKWARD_OP, g, var, w, t, mask="clamp_grad", eps=EPS, affine=True,
                             grad_weight=False, grad_bias=True, **mask_bounds)
        names += ["gx", "gb"]
    if extra_reader:
        outs.append(e.emit("neg", y))
        names.append("other")
    if y_output:
        outs.append(t)
        names.append("t")
    return verify(Graph((x, r0, g, mean, var, w, b), tuple(e.nodes), tuple(outs), tuple(names)))


@pytest.mark.parametrize("act,mask", [("clamp", "clamp_grad"), ("clamp", "fused"), ("clamp", ""), ("relu", "")])
@pytest.mark.parametrize("residual", [False, True])
def test_chain_is_one_node_and_masks_read_its_output(act, mask, residual):
    g = bn_act(act, residual, mask)
    f = verify(fuse_bn_activation(g))
    (node,) = _fused(f)
    assert (node.attrs["act"], node.attrs["residual"], node.attrs["affine"]) == (act, residual, True)
    assert not {n.op for n in f.nodes} & {"batch_norm", "add", act}
    for m in f.nodes:
        if m.op in ("clamp_grad", BN_BACKWARD_OP):
            assert node.out in m.inputs
    same_outputs(g, f, _feeds(g, {}))


def test_add_of_two_batch_norms_is_fused_once():
    g = bn_act("relu", residual=True, mask="", two_bns=True)
    f = verify(fuse_bn_activation(g))
    assert [n.op for n in f.nodes].count(BN_ACT_OP) == 1 and [n.op for n in f.nodes].count("batch_norm") == 1
    same_outputs(g, f, _feeds(g, {}))


@pytest.mark.parametrize("why", ["extra_reader", "y_output", "other_bounds", "empty_clamp", "update_between",
                                 "relu_input_read"])
def test_chain_left_alone(why):
    kw = {"extra_reader": dict(extra_reader=True), "y_output": dict(y_output=True),
          "other_bounds": dict(mask_bounds={"min": 0.0}),
          "empty_clamp": dict(bounds={"min": 1.0, "max": 1.0}, mask_bounds={"min": 1.0, "max": 1.0}),
          "update_between": dict(update_between=True),
          "relu_input_read": dict(act="relu", mask="clamp_grad", mask_bounds={"min": 0.0})}[why]
    g = bn_act(**kw)
    assert fuse_bn_activation(g) is g
