"""backward="integer": the int8 training step with every gradient, the loss and the updates in
integers (quantize/integer_backward.py). Its losses track the float backward's, its train
graph holds no float value but the loss, the C backend computes the same integers
(bit-exact, weights trained whole or on some channels, with momentum and weight decay), it
fine-tunes as well as the float backward, and what it cannot do is refused by name."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.app.demo import normalise, pretrained_digitnet
from edgetrain.data import DataError, load_mnist
from edgetrain.quantize.integer_backward import IntegerBackwardError

NO_CC = shutil.which("cc") is None and shutil.which("gcc") is None


class ConvNet(nn.Module):
    """conv + batch norm (folded) + ReLU, a strided conv, global mean, a linear classifier."""

    def __init__(self, classes=5):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.Conv2d(8, 12, 3, stride=2, padding=1), nn.ReLU())
        self.fc = nn.Linear(12, classes)

    def forward(self, x):
        return self.fc(self.features(x).mean((2, 3)))


class Inverted(nn.Module):
    """MobileNetV2's block: expand, depthwise (stride 1, ReLU6), project, residual add."""

    def __init__(self, classes=4):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU6())
        self.block = nn.Sequential(nn.Conv2d(8, 16, 1), nn.ReLU6(), nn.Conv2d(16, 16, 3, padding=1, groups=16),
                                   nn.ReLU6(), nn.Conv2d(16, 8, 1))
        self.head = nn.Conv2d(8, classes, 1)

    def forward(self, x):
        x = self.stem(x)
        x = x + self.block(x)
        return self.head(x).mean((2, 3))


class Sensor(nn.Module):
    """A 1-D convolutional network over 6 IMU channels (BasicMotions-like)."""

    def __init__(self, classes=4):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(6, 12, 5, padding=2), nn.ReLU(), nn.Conv1d(12, 16, 3, stride=2),
                                 nn.ReLU())
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        return self.fc(self.net(x).mean(2))


class Dilated(nn.Module):
    """Dilated and strided convolutions, dense and depthwise, over rows wider than the C kernel's
    32-column chunk."""

    def __init__(self, classes=3):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=2, dilation=2), nn.ReLU(),
                                 nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=8), nn.ReLU(),
                                 nn.Conv2d(8, 6, (3, 5), stride=(1, 2), padding=(1, 1)), nn.ReLU())
        self.fc = nn.Linear(6, classes)

    def forward(self, x):
        return self.fc(self.net(x).mean((2, 3)))


def _data(shape, n, classes, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(shape).astype(np.float32), rng.integers(0, classes, shape[0]))
            for _ in range(n)]


def _compile(model_cls, shape, backward, seed=0, **kw):
    torch.manual_seed(seed)
    model = model_cls().eval()
    calib = [np.random.default_rng(1).standard_normal((16,) + shape[1:]).astype(np.float32)]
    kw.setdefault("optimizer", et.SGD(lr=0.02))
    return et.compile(model, (torch.zeros(shape),), quantize="int8", calibration=calib, backward=backward, **kw)


def test_integer_losses_track_the_float_backward_and_hold_no_float():
    shape = (2, 3, 12, 12)
    pi, pf = _compile(ConvNet, shape, "integer"), _compile(ConvNet, shape, "float")
    for x, y in _data(shape, 4, 5):
        li, lf = pi.step(x, y), pf.step(x, y)
        assert abs(li - lf) <= 1e-3 * max(1.0, lf), (li, lf)
    g = pi.compiled.train_graph
    floats = [v for n in g.nodes for v in (*n.inputs, *n.outputs) if v.dtype == "float32"]
    assert floats == [g.output("loss")] * len(floats) and floats
    assert any(v.dtype == "int16" for n in g.nodes for v in n.outputs)
    # the gradients API stays the float backward's: d loss / d w_int
    grads = pi.gradients(*_data(shape, 1, 5)[0])
    assert set(grads) == set(pi.compiled.trainable) and all(v.dtype == np.float32 for v in grads.values())


@pytest.mark.skipif(NO_CC, reason="no C compiler")
@pytest.mark.parametrize("model_cls,shape,update,opt", [
    (ConvNet, (2, 3, 12, 12), et.Full(), et.SGD(lr=0.05, momentum=0.9, weight_decay=1e-3)),
    (Inverted, (1, 3, 16, 16), et.Sparse(bias_last=3, weights={1: 0.5, 2: 0.5, 3: 1.0}), et.SGD(lr=0.05)),
    (Inverted, (1, 3, 16, 16), et.LastK(2), et.SGD(lr=0.05, momentum=0.5)),
    (Sensor, (4, 6, 40), et.Full(), et.SGD(lr=0.05)),
    (Dilated, (1, 3, 70, 70), et.Full(), et.SGD(lr=0.05)),
])
def test_the_c_backend_computes_the_same_integers(model_cls, shape, update, opt):
    kw = dict(update=update, optimizer=opt)
    pr = _compile(model_cls, shape, "integer", **kw)
    pc = _compile(model_cls, shape, "integer", backend="c", **kw)
    classes = pr.predict(np.zeros(shape, np.float32)).shape[1]
    for x, y in _data(shape, 3, classes):
        assert pr.step(x, y) == pc.step(x, y)
    sr, sc = pr.state_dict(), pc.state_dict()
    assert all(np.array_equal(np.asarray(sr[k]), np.asarray(sc[k])) for k in sr)


def test_refusals_name_what_has_no_integer_form():
    shape = (2, 3, 12, 12)
    with pytest.raises(ValueError, match="quantize='int8'"):
        et.compile(ConvNet().eval(), (torch.zeros(shape),), backward="integer")
    with pytest.raises(ValueError, match="cross-entropy"):
        _compile(ConvNet, shape, "integer", loss="mse")
    with pytest.raises(ValueError, match="backward="):
        _compile(ConvNet, shape, "sideways")

    class Pooled(ConvNet):
        def forward(self, x):
            return self.fc(nn.functional.max_pool2d(self.features(x), 6).flatten(1))

    with pytest.raises(IntegerBackwardError, match="no integer form of qmax_pool2d_grad"):
        _compile(Pooled, shape, "integer")


def test_integer_fine_tuning_is_as_good_as_the_float_backward():
    """The pretrained DigitNet on inverted digits, two epochs, SGD with momentum: accuracy rises
    by the float backward's, within 3 points."""
    try:
        xtr, ytr = load_mnist("train", 1200)
        xte, yte = load_mnist("test", 512)
    except DataError as err:
        pytest.skip(str(err))
    x, xt = normalise(255 - xtr), normalise(255 - xte)
    acc = {}
    for backward in ("float", "integer"):
        prog = et.compile(pretrained_digitnet(), (torch.from_numpy(x[:16]),), quantize="int8",
                          optimizer=et.SGD(lr=0.005, momentum=0.9), calibration=[x[:64]], backward=backward)
        before = (prog.predict(xt).argmax(1) == yte).mean()
        rng = np.random.default_rng(0)
        for _ in range(2):
            order = rng.permutation(len(x))
            for i in range(0, len(x) - 15, 16):
                prog.step(x[order[i:i + 16]], ytr[order[i:i + 16]])
        acc[backward] = (prog.predict(xt).argmax(1) == yte).mean()
        assert acc[backward] > before + 0.3, (backward, before, acc[backward])
    assert abs(acc["integer"] - acc["float"]) <= 0.03, acc
