"""fuse_weight_grad_update beyond int8 convolutions: a float convolution's or linear layer's
weight gradient (conv2d_grad_weight / linear_grad_weight) or an embedding's (embedding_grad)
that only its sgd_update reads is fused with it (conv2d_grad_weight_update,
linear_grad_weight_update, embedding_grad_update), and an int8 linear layer's gradient
reshaped to its (o, k) weight too; each fused graph verifies and computes the weight (and
momentum) bit for bit as the unfused one. A channel-selected update or a gradient read
elsewhere is left alone. On compiled programs the fusion is a pipeline step of float and
int8 programs alike, and the memory report no longer holds a whole weight gradient."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.interpreter import run_graph
from edgetrain.ir import Graph, TensorType, new_value, ram_inputs
from edgetrain.ops import Emitter, verify
from edgetrain.ops import gradupdate
from edgetrain.ops.gradupdate import block_rows, conv_block, linear_block
from edgetrain.passes.fuse import fuse_weight_grad_update
from edgetrain.passes.reorder import reorder_for_memory
from edgetrain.passes.updates import STEP
from edgetrain.pipeline import plan_graph

SGD = dict(lr=0.5, dim=0, index=None)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Blocks of 36 bytes (one depthwise 3x3 row; any larger row is a block of its own): the small
    layers here span several blocks (a gradient that fits one block is left unfused:
    test_a_gradient_within_one_block_is_not_fused)."""
    monkeypatch.setattr(gradupdate, "BLOCK_BYTES", 3 * 3 * 4)


def _graph(grad_op, operands, grad_attrs, w_shape, momentum=0.9, weight_decay=0.01, index=None, extra_out=False,
           reshape_to=None, int8=False):
    """operands -> grad_op -> [reshape] -> (q)sgd_update(w, grad[, step][, m])."""
    xs = [new_value(TensorType(s, d), n) for n, (s, d) in operands.items()]
    wdt = "int8" if int8 else "float32"
    w = new_value(TensorType(w_shape, wdt), "w")
    sel_shape = w_shape if index is None else (len(index),) + tuple(w_shape[1:])
    m = [new_value(TensorType(sel_shape, "float32"), "momentum:w")] if momentum else []
    step = [new_value(TensorType((), "int32"), STEP)] if int8 else []
    e = Emitter()
    grad = e.emit(grad_op, *xs, **grad_attrs)
    applied = e.emit("reshape", grad, shape=reshape_to) if reshape_to else grad
    up = dict(SGD, momentum=momentum, weight_decay=weight_decay, index=index)
    if int8:
        up.update(scale=(1.0,) * w_shape[0], seed=3, param_id=0, qmin=-127, qmax=127)
        outs = e.emit_multi("qsgd_update", w, applied, *step, *m, names=("w", "momentum:w"), **up)
    else:
        outs = e.emit_multi("sgd_update", w, applied, *m, names=("w", "momentum:w"), **up)
    outs, names = list(outs), ["w"] + (["momentum:w"] if momentum else [])
    if extra_out:
        outs.append(grad)
        names.append("grad")
    return verify(Graph((*xs, w, *step, *m), tuple(e.nodes), tuple(outs), tuple(names)))


def _feeds(g, seed=0, high=6):
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in g.inputs:
        if v.name == STEP:
            feeds[v.name] = np.array(4, np.int32)
        elif v.dtype == "int8":
            feeds[v.name] = rng.integers(-127, 128, v.shape).astype(np.int8)
        elif v.dtype in ("int64", "int32"):
            feeds[v.name] = rng.integers(0, high, v.shape).astype(v.dtype)
        else:
            feeds[v.name] = rng.standard_normal(v.shape).astype(np.float32)
    return feeds


def _assert_fused_bit_for_bit(g, fused_op, seed=0, high=6):
    f = verify(fuse_weight_grad_update(g))
    assert [n.op for n in f.nodes] == [fused_op]
    assert f.nodes[0].outputs[:len(g.outputs)] == g.outputs  # the same values: every reader stays valid
    feeds = _feeds(g, seed, high)
    before = run_graph(g, {k: v.copy() for k, v in feeds.items()})[0]
    after = run_graph(f, {k: v.copy() for k, v in feeds.items()})[0]
    assert set(after) == set(before)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    assert not np.array_equal(after["w"], feeds["w"])  # the update did move the weight
    return f, feeds, after


def _conv(groups, c_in=4, c_out=4, k=3, **kw):
    geo = dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=groups)
    w_shape = (c_out, c_in // groups, k, k)
    ops = {"x": ((2, c_in, 7, 8), "float32"), "gy": ((2, c_out, 4, 4), "float32")}
    return _graph("conv2d_grad_weight", ops, dict(weight_shape=w_shape, **geo), w_shape, **kw)


@pytest.mark.parametrize("groups,c_out", [(1, 4), (2, 4), (4, 4), (4, 8)], ids=["dense", "grouped", "depthwise",
                                                                               "depthwise_x2"])
@pytest.mark.parametrize("momentum,weight_decay", [(0.9, 0.01), (0.0, 0.0)], ids=["momentum_wd", "plain"])
def test_float_conv_gradient_and_update_fuse_bit_for_bit(groups, c_out, momentum, weight_decay):
    g = _conv(groups, c_out=c_out, momentum=momentum, weight_decay=weight_decay)
    f, _, after = _assert_fused_bit_for_bit(g, "conv2d_grad_weight_update")
    n = f.nodes[0]
    rows = n.outputs[2 if momentum else 1]  # a block of the gradient's rows
    assert rows.shape[1:] == g.nodes[0].out.shape[1:] and rows.shape[0] == len(block_rows(n.attrs, c_out)) < c_out


@pytest.mark.parametrize("groups", [1, 2])
def test_a_conv_gradient_over_several_blocks_fuses_bit_for_bit(groups, monkeypatch):
    monkeypatch.setattr(gradupdate, "BLOCK_BYTES", 2 * 8 * 3 * 3 * 4)  # two rows of 8 x 3 x 3 floats
    g = _conv(groups, c_in=8, c_out=8)
    f, _, _ = _assert_fused_bit_for_bit(g, "conv2d_grad_weight_update")
    n = f.nodes[0]
    rows, second = n.outputs[-2:]  # batch 2: one group, the block's gy channels; grouped, a sample's share
    assert rows.shape[0] == len(block_rows(n.attrs, 8)) == (2 if groups == 1 else 4)  # 2 rows, or a group of 4
    assert second.shape == ((2, 2, 4, 4) if groups == 1 else rows.shape)


def test_a_conv_block_is_the_largest_divisor_under_its_byte_cap(monkeypatch):
    monkeypatch.setattr(gradupdate, "BLOCK_BYTES", 1024 * 1024)
    row = 512 * 9 * 4  # ResNet-18's last convolutions: 18 KB rows
    assert conv_block((512, 512, 3, 3), 1) == 32 and 32 * row <= gradupdate.BLOCK_BYTES < 64 * row
    assert conv_block((64, 3, 7, 7), 1) == 64  # the whole (small) gradient is one block
    assert conv_block((7, 16384, 3, 3), 1) == 1  # two rows over the cap: one row at a time
    assert conv_block((96, 1, 3, 3), 96) == 96  # depthwise: all groups at once
    assert conv_block((8, 2, 3, 3), 4) == 4
    assert linear_block(16, 65536) == 4 and linear_block(7, 65536 * 4) == 1


def test_float_linear_gradient_and_update_fuse_bit_for_bit():
    ops = {"x": ((2, 3, 6), "float32"), "gy": ((2, 3, 5), "float32")}
    g = _graph("linear_grad_weight", ops, {}, (5, 6))
    f, _, _ = _assert_fused_bit_for_bit(g, "linear_grad_weight_update")
    rows, cols = f.nodes[0].outputs[-2:]  # 5 rows of 6 floats: blocks of one row, and gy's column
    assert rows.shape == (1, 6) and cols.shape == (6, 1)


def test_a_gradient_within_one_block_is_not_fused(monkeypatch):
    monkeypatch.setattr(gradupdate, "BLOCK_BYTES", 1024 * 1024)
    linear = _graph("linear_grad_weight", {"x": ((2, 6), "float32"), "gy": ((2, 5), "float32")}, {}, (5, 6))
    for g in (_conv(1), linear):
        assert fuse_weight_grad_update(g) is g  # nothing to save: the unfused kernels, as fast as before


@pytest.mark.parametrize("momentum,weight_decay,padding_idx", [(0.0, 0.0, -1), (0.0, 0.0, 2), (0.9, 0.0, 2),
                                                               (0.0, 0.01, -1), (0.9, 0.01, 0)])
def test_embedding_gradient_and_update_fuse_bit_for_bit(momentum, weight_decay, padding_idx):
    ops = {"g": ((3, 5, 4), "float32"), "idx": ((3, 5), "int64")}
    g = _graph("embedding_grad", ops, dict(num_embeddings=9, padding_idx=padding_idx), (9, 4), momentum=momentum,
               weight_decay=weight_decay)
    f, feeds, after = _assert_fused_bit_for_bit(g, "embedding_grad_update", high=6)  # rows 6..8 never touched
    row, ids = f.nodes[0].outputs[-2:]
    assert row.shape == (1, 4) and ids.shape == (15,) and ids.dtype == "int32"
    if not momentum and not weight_decay:  # untouched rows (and the padding row) are left bit for bit
        touched = set(feeds["idx"].reshape(-1).tolist()) - {padding_idx}
        for r in set(range(9)) - touched:
            np.testing.assert_array_equal(after["w"][r], feeds["w"][r])


def test_int8_linear_gradient_through_its_reshape_fuses_bit_for_bit():
    """An int8 Linear is a 1x1 qconv2d: its (o, k, 1, 1) gradient is reshaped to the (o, k) weight."""
    ops = {"x": ((3, 6, 1, 1), "int8"), "gy": ((3, 4, 1, 1), "float32")}
    attrs = dict(weight_shape=(4, 6, 1, 1), scales=(0.01, 0.02, 0.03, 0.04), x_zero=-3, stride=(1, 1),
                 padding=(0, 0), dilation=(1, 1), groups=1)
    g = _graph("qconv2d_grad_weight", ops, attrs, (4, 6), weight_decay=0.0, reshape_to=(4, 6), int8=True)
    assert [n.op for n in g.nodes] == ["qconv2d_grad_weight", "reshape", "qsgd_update"]
    _assert_fused_bit_for_bit(g, "qconv2d_grad_weight_update")


def test_a_channel_selected_update_or_a_gradient_read_elsewhere_is_not_fused():
    ops = {"x": ((2, 6), "float32"), "gy": ((2, 5), "float32")}
    selected = _graph("linear_grad_weight", {"x": ((2, 6), "float32"), "gy": ((2, 2), "float32")}, {}, (5, 6),
                      index=(1, 3))
    assert fuse_weight_grad_update(selected) is selected
    read = _graph("linear_grad_weight", ops, {}, (5, 6), extra_out=True)
    assert fuse_weight_grad_update(read) is read


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(3000, 16)
        self.conv = nn.Conv2d(16, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, t):
        h = self.emb(t).permute(0, 2, 1).reshape(t.shape[0], 16, 4, 4)
        return self.fc(torch.relu(self.conv(h)).flatten(1))


def test_a_compiled_float_program_never_holds_a_whole_weight_gradient():
    torch.manual_seed(0)
    x = torch.randint(0, 3000, (2, 16))
    prog = et.compile(SmallCNN(), (x,), optimizer=et.SGD(lr=0.1, momentum=0.9))
    ops = [n.op for n in prog.train_graph.nodes]
    assert not {"conv2d_grad_weight", "linear_grad_weight", "embedding_grad"} & set(ops)
    assert {"conv2d_grad_weight_update", "linear_grad_weight_update", "embedding_grad_update"} <= set(ops)
    names = list(prog.stages)
    unfused = prog.stages[names[names.index("fused_grad_updates") - 1]]
    unfused_arena = plan_graph(reorder_for_memory(unfused, ram_inputs(unfused)), {}, {}).arena_bytes
    dense_embedding_grad = 3000 * 16 * 4
    assert unfused_arena >= dense_embedding_grad  # the unfused step holds the whole embedding gradient
    assert prog.memory.arena_bytes < dense_embedding_grad / 4  # the fused step's whole arena: 14 KB
