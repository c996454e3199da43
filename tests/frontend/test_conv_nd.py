"""Convolutions other than the 2-d one through capture, autodiff and the backends: conv1d (as
conv2d on a (N, C, 1, L) view, so int8 lowers it to qconv2d), conv_transpose1d / 2d and conv3d,
float64 gradients against torch.autograd; an int8 1-d CNN bit-exact on the C backend; an int8
program keeping a transposed convolution in float32; a transposed 3-d convolution refused."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import torch.nn as nn

import edgetrain as et
from edgetrain.frontend.errors import UnsupportedOpError
from tests.helpers import check_gradients

F64 = torch.float64


def _grads_match(model, shape, classes, batch=2):
    torch.manual_seed(0)
    model = model.to(F64)
    x = torch.randn((batch,) + shape, dtype=F64)
    y = torch.arange(batch) % classes
    prog = et.compile(model, (x,), loss="cross_entropy")
    check_gradients(prog, model, x, y, F64)
    return prog


def _ops(prog):
    return {n.op for n in prog.train_graph.nodes}


@pytest.mark.parametrize("conv", [
    nn.Conv1d(4, 6, 3, stride=2, padding=1, dilation=2, groups=2),
    nn.Conv1d(4, 4, 5, padding=2, groups=4, bias=False),  # depthwise
    nn.Conv1d(4, 3, 1),  # pointwise
], ids=["grouped-strided-dilated", "depthwise-no-bias", "pointwise"])
def test_conv1d_gradients_match_autograd(conv):
    model = nn.Sequential(conv, nn.Tanh(), nn.Flatten(), nn.LazyLinear(3))
    model(torch.zeros(1, 4, 11))  # materialises the lazy linear
    prog = _grads_match(model, (4, 11), 3)
    assert "conv2d" in _ops(prog)


@pytest.mark.parametrize("conv,shape", [
    (nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2), (4, 3, 4)),
    (nn.ConvTranspose2d(3, 2, (2, 3), stride=(1, 2), dilation=(2, 1), output_padding=(1, 0)), (3, 3, 3)),
    (nn.ConvTranspose2d(3, 3, 3, stride=2, groups=3, bias=False), (3, 2, 3)),
    (nn.ConvTranspose1d(4, 2, 4, stride=3, padding=1, output_padding=2), (4, 5)),
], ids=["grouped-output-padding", "dilated", "depthwise", "1d"])
def test_transposed_conv_gradients_match_autograd(conv, shape):
    model = nn.Sequential(conv, nn.Tanh(), nn.Flatten(), nn.LazyLinear(3))
    model(torch.zeros((1,) + shape))
    prog = _grads_match(model, shape, 3)
    assert "conv_transpose2d" in _ops(prog)


@pytest.mark.parametrize("conv", [
    nn.Conv3d(2, 4, 3, stride=(1, 2, 2), padding=1, dilation=(2, 1, 1)),
    nn.Conv3d(4, 4, (1, 3, 2), groups=2, bias=False),
], ids=["strided-dilated", "grouped"])
def test_conv3d_gradients_match_autograd(conv):
    shape = (conv.in_channels, 4, 5, 4)
    c = conv.in_channels  # a pointwise conv3d first: the drawn one also takes its input gradient
    model = nn.Sequential(nn.Conv3d(c, c, 1), conv, nn.ReLU(), nn.Flatten(), nn.LazyLinear(3))
    model(torch.zeros((1,) + shape))
    prog = _grads_match(model, shape, 3)
    assert {"conv3d", "conv3d_grad_input", "conv3d_grad_weight"} <= _ops(prog)


@pytest.mark.parametrize("first,second,shape", [
    (nn.Conv1d(3, 4, 3), nn.Conv1d(4, 4, 3, groups=4), (3, 9)),
    (nn.ConvTranspose2d(3, 4, 2, stride=2), nn.ConvTranspose2d(4, 4, 3, groups=4), (3, 3, 3)),
    (nn.Conv3d(3, 4, 2), nn.Conv3d(4, 4, 2, groups=4), (3, 4, 4, 3)),
], ids=["conv1d", "conv_transpose2d", "conv3d"])
def test_sparse_update_trains_the_selected_channels(first, second, shape):
    """The layers count for update schemes (a conv1d's weight is a view of its parameter): a
    dense layer trains a share of its weight's dim 1, a depthwise one of its dim 0; gradients
    equal torch's on the selected channels and are zero elsewhere."""
    torch.manual_seed(0)
    model = nn.Sequential(first, nn.Tanh(), second, nn.Tanh(), nn.Flatten(), nn.LazyLinear(3))
    model(torch.zeros((1,) + shape))
    model = model.to(F64)
    x = torch.randn((2,) + shape, dtype=F64)
    prog = et.compile(model, (x,), update=et.Sparse(bias_last=2, weights={0: 0.5, 1: 0.5}))
    assert {k: (s.dim, len(s.index)) for k, s in prog.trainable.items() if s is not None} == \
        {"0.weight": (1, 2), "2.weight": (0, 2)}
    check_gradients(prog, model, x, torch.tensor([0, 2]), F64)


#: float32 C gradients against the float32 reference: relative to the largest of each gradient
C_TOL = 1e-5


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
@pytest.mark.parametrize("conv", [
    nn.ConvTranspose2d(3, 4, 1, dilation=2, output_padding=1),  # a pointwise conv2d's geometry, cut
    nn.ConvTranspose2d(3, 4, 3, dilation=(2, 1), output_padding=(1, 0), groups=1),
], ids=["1-tap", "3-tap"])
def test_output_padding_past_the_last_window(conv):
    """Output padding at least the stride (allowed below the dilation) adds rows no window of
    the equivalent conv2d reaches: float64 gradients equal torch's, and the C backend's equal
    the reference's."""
    from edgetrain.backends.c.host import to_c_program

    model = nn.Sequential(nn.Conv2d(2, 3, 1), nn.Tanh(), conv, nn.Tanh(), nn.Flatten(), nn.LazyLinear(3))
    model(torch.zeros(1, 2, 4, 5))
    _grads_match(model, (2, 4, 5), 3)
    model = model.float()
    x, y = np.random.default_rng(0).standard_normal((2, 2, 4, 5)).astype(np.float32), np.array([0, 2])
    prog = et.compile(model, (torch.from_numpy(x),))
    want, got = prog.gradients(x, y), to_c_program(prog).gradients(x, y)
    for k in want:
        assert np.abs(got[k] - want[k]).max() <= C_TOL * np.abs(want[k]).max(), k


def test_transposed_3d_convolution_is_refused_with_the_op_named():
    model = nn.Sequential(nn.ConvTranspose3d(2, 2, 2))
    with pytest.raises(UnsupportedOpError, match=r"aten.convolution \(transposed 3-d\)"):
        et.compile(model, (torch.zeros(1, 2, 3, 3, 3),), loss="mse")


def sensor_cnn():
    """A small 1-d CNN over (N, 3, 32) windows: a dense conv1d with a batch norm (running
    statistics set: folding it changes the weights), a strided depthwise and a pointwise conv1d."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(3, 8, 5, padding=2, bias=False), nn.BatchNorm1d(8), nn.ReLU(), nn.MaxPool1d(2),
                          nn.Conv1d(8, 8, 3, stride=2, padding=1, groups=8), nn.ReLU(), nn.Conv1d(8, 12, 1), nn.ReLU(),
                          nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(12, 4))
    bn = model[1]
    bn.running_mean.uniform_(-0.5, 0.5)
    bn.running_var.uniform_(0.5, 2.0)
    bn.weight.data.uniform_(0.5, 1.5)
    bn.bias.data.uniform_(-0.5, 0.5)
    return model.eval()


def int8_sensor_program(update=None, momentum=0.0):
    """The int8 program of sensor_cnn calibrated on random windows, and a few training batches."""
    rng = np.random.default_rng(0)
    calib = [torch.from_numpy(rng.standard_normal((1, 3, 32)).astype(np.float32)) for _ in range(4)]
    prog = et.compile(sensor_cnn(), (calib[0],), quantize="int8", calibration=calib, update=update or et.Full(),
                      optimizer=et.SGD(lr=0.05, momentum=momentum))
    batches = [(rng.standard_normal((1, 3, 32)).astype(np.float32), np.array([i % 4])) for i in range(3)]
    return prog, batches


def test_int8_conv1d_lowers_to_qconv2d():
    prog, _ = int8_sensor_program()
    fwd = [n for n in prog.train_graph.nodes if n.op == "qconv2d"]
    assert len(fwd) == 4  # the three conv1d layers and the classifier
    # the batch norm is folded into its conv1d; the max pooling runs on the int8 data
    assert not {"conv2d", "batch_norm", "max_pool2d"} & _ops(prog) and "qmax_pool2d" in _ops(prog)
    # the trained weights keep the model's shapes: the state loads into the original module
    model = sensor_cnn()
    model.load_state_dict(prog.state_dict())


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
@pytest.mark.parametrize("update,momentum", [(et.Full(), 0.0), (et.Sparse(bias_last=2, weights={0: 0.5, 1: 0.5}), 0.9)],
                         ids=["full", "sparse-momentum"])
def test_int8_conv1d_trains_bit_exact_on_the_c_backend(update, momentum):
    """Every state tensor identical to the reference's after each step; a sparse scheme trains
    a share of the dense conv1d's dim 1 and of the depthwise one's dim 0 (split weights)."""
    from tests.backends.c.test_int8 import train_both

    prog, batches = int8_sensor_program(update, momentum)
    if isinstance(update, et.Sparse):
        assert {k: s.dim for k, s in prog.trainable.items() if s is not None} == {"0.weight": 1, "4.weight": 0}
    before = {k: v.copy() for k, v in prog.state.items()}
    train_both(prog, batches)
    assert all(not np.array_equal(before[k], prog.state[k]) for k in prog.trainable)


def test_int8_program_keeps_a_transposed_convolution_int8_and_trains():
    """(It stayed float32 between int8 layers before ops/qconv_transpose.py.)"""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.ConvTranspose2d(4, 4, 2, stride=2), nn.ReLU(),
                          nn.Flatten(), nn.Linear(4 * 8 * 8, 3))
    rng = np.random.default_rng(0)
    calib = [torch.from_numpy(rng.standard_normal((1, 2, 4, 4)).astype(np.float32)) for _ in range(3)]
    prog = et.compile(model, (calib[0],), quantize="int8", calibration=calib, optimizer=et.SGD(lr=0.05))
    ops = _ops(prog)
    assert {"qconv2d", "qconv_transpose2d"} <= ops and "conv_transpose2d" not in ops
    w = "2.weight"
    before = prog.state[w].copy()
    losses = [prog.step(rng.standard_normal((1, 2, 4, 4)).astype(np.float32), np.array([i % 3])) for i in range(3)]
    assert np.isfinite(losses).all() and prog.state[w].dtype == np.int8
    assert not np.array_equal(before, prog.state[w])
