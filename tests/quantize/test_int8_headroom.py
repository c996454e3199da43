"""compile(..., quantize="int8", int8_headroom=H): the layers the update scheme trains get int8
weight scales and output ranges H times wider (quantize/headroom.py); frozen layers keep theirs,
H = 1 is the program as it was, bad values are refused where they enter, and the room lets a
trained layer reach weights beyond its pretrained range."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.quantize.headroom import MAX_HEADROOM

X = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
CALIBRATION = [np.random.default_rng(i).standard_normal((2, 3, 8, 8)).astype(np.float32) for i in range(3)]
#: trains the middle convolution's weight and bias and the classifier; the first convolution is frozen
SCHEME = et.Sparse(bias_last=1, weights={1: 1.0})


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 1), nn.ReLU(),
                         nn.Flatten(), nn.Linear(4 * 6 * 6, 5)).eval()


def _compile(**kw):
    return et.compile(_model(), (X,), quantize="int8", update=SCHEME, calibration=CALIBRATION,
                      optimizer=et.SGD(lr=0.05, momentum=0.9), **kw)


@pytest.mark.parametrize("h", [4, 2.5])
def test_only_the_trained_layers_scales_widen(h):
    base, wide = _compile(), _compile(int8_headroom=h)
    assert set(wide.trainable) == {"3.weight", "3.bias", "6.weight", "6.bias"}
    assert "headroom_widened" in wide.stages and "headroom_widened" not in base.stages
    for name, layer in base.quant_layers.items():
        got = np.asarray(wide.quant_layers[name].w_scales, dtype=np.float64)
        want = np.asarray(layer.w_scales, dtype=np.float64) * (h if name in wide.trainable else 1)
        np.testing.assert_allclose(got, want, rtol=1e-6)  # float32 scales
    ql, wl = base.quant_layers, wide.quant_layers
    assert wl["0.weight"].x == ql["0.weight"].x  # the input's scale
    assert wl["3.weight"].x == ql["3.weight"].x  # the frozen convolution's output
    assert wl["6.weight"].x.scale == pytest.approx(ql["6.weight"].x.scale * h, rel=1e-9)  # the trained one's
    assert wl["6.weight"].x.zero == ql["6.weight"].x.zero
    assert np.array_equal(wide.state["0.weight"], base.state["0.weight"])
    for k in ("3.weight", "6.weight"):  # the pretrained weights take 127 / H steps
        assert np.abs(wide.state[k]).max() <= np.ceil(127 / h) < np.abs(base.state[k]).max()


def test_headroom_1_is_the_program_as_it_was():
    a, b = _compile(), _compile(int8_headroom=1)
    assert list(a.stages) == list(b.stages)
    assert {k: str(g) for k, g in a.stages.items()} == {k: str(g) for k, g in b.stages.items()}
    assert all(np.array_equal(a.state[k], b.state[k]) for k in a.state)


def test_a_widened_program_trains_and_exports():
    prog = _compile(int8_headroom=8)
    rng = np.random.default_rng(1)
    before = {k: prog.state[k].copy() for k in prog.trainable}
    for _ in range(3):
        assert np.isfinite(prog.step(rng.standard_normal((2, 3, 8, 8)).astype(np.float32), rng.integers(0, 5, 2)))
    assert any(not np.array_equal(before[k], prog.state[k]) for k in prog.trainable)
    sd = prog.state_dict()  # float weights on the widened scales
    w = np.asarray(sd["6.weight"])
    np.testing.assert_allclose(w, prog.state["6.weight"] * np.asarray(prog.quant_layers["6.weight"].w_scales,
                                                                        dtype=np.float32)[:, None], rtol=1e-6)


@pytest.mark.parametrize("bad", [0, 0.5, -4, 128, float("nan"), float("inf"), True, "4", None])
def test_bad_headroom_is_refused_at_compile(bad):
    with pytest.raises(ValueError, match="int8_headroom must be a number from 1 to 127"):
        _compile(int8_headroom=bad)


def test_headroom_needs_int8():
    with pytest.raises(ValueError, match="needs quantize='int8'"):
        et.compile(_model(), (X,), int8_headroom=4)
    et.compile(_model(), (X,), int8_headroom=1)  # the default, said aloud, is fine


def test_headroom_lets_a_layer_learn_weights_beyond_its_pretrained_range():
    """A linear layer pretrained with |w| <= 0.1 must learn weights of up to 1 (a regression
    target): on the pretrained scales its int8 weights saturate at +-127 steps and the error stays
    near the target's variance; with 16x headroom it fits."""
    rng = np.random.default_rng(0)
    layer = nn.Linear(4, 3)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(rng.uniform(-0.1, 0.1, (3, 4)).astype(np.float32)))
        layer.bias.zero_()
    target = rng.uniform(-1, 1, (3, 4)).astype(np.float32)
    x = rng.standard_normal((64, 4)).astype(np.float32)
    y = x @ target.T
    errors = {}
    for h in (1, 16):
        prog = et.compile(layer.eval(), (torch.from_numpy(x[:1]),), loss="mse", quantize="int8",
                          optimizer=et.SGD(lr=0.05), calibration=[x[i:i + 1] for i in range(16)], int8_headroom=h)
        for _ in range(5):
            for i in range(48):
                prog.step(x[i:i + 1], y[i:i + 1])
        pred = np.concatenate([prog.predict(x[i:i + 1]) for i in range(48, 64)])
        errors[h] = float(((pred - y[48:]) ** 2).mean())
        if h == 1:
            assert np.abs(prog.state["weight"]).max() == 127  # saturated
    variance = float((y[48:] ** 2).mean())
    assert errors[1] > 0.5 * variance
    assert errors[16] < 0.05 * variance


def test_max_headroom_keeps_one_step():
    prog = _compile(int8_headroom=MAX_HEADROOM)
    for k in ("3.weight", "6.weight"):
        assert np.all(np.abs(prog.state[k]).reshape(len(prog.state[k]), -1).max(axis=1) == 1)
