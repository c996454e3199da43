"""The int8 backward kernels of runtime/et_int8_grad.h against the reference, bit for bit, on
the shapes their fast paths split on: the 1x1 input gradient's blocks of 4 channels x 4
pixels, its channel and pixel tails, its weight chunks (ET_GI_OCHUNK = 192 output
channels) and its tiles of 64 pixels; gradients that are mostly zero (a clamp's mask), whose
zero products the 1x1 input gradient and the weight gradient skip, checked bit for bit
(the sign of a zero too); the depthwise input gradient's 4-channel interleaved form, its one-channel form
(planes over 64 pixels) and its scatter form (a side over 64); the weight gradient's
4-channel sums and tails; kernel sizes 1/3/5/7, strides 1/2, dilation 2, odd channel
counts, planes down to 1x1, batches, split weights (trained on some channels: read through
the channel map)."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from edgetrain.autodiff import ChannelSelect

from .test_int8 import _conv_attrs, _f32, _i8, check

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler")


def _out(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _masked(rng, g, keep):
    """g where a clamp's mask keeps it (a fraction `keep` of the elements), else zero with g's
    sign (g * 0, as et_qmask_grad writes it: +0 and -0); a third of the output channels zero
    in every image, and in one image a further third"""
    mask = rng.random(g.shape) < keep
    mask[:, rng.random(g.shape[1]) < 1 / 3] = False
    mask[0, rng.random(g.shape[1]) < 1 / 3] = False
    return np.where(mask, g, g * np.float32(0)).astype(np.float32)


def _backward(c, o, h, w, k, s, p, d, groups, n, split=None, seed=0, keep=None):
    """qconv2d's input gradient (the depthwise op too for a depthwise geometry), weight
    gradient and bias gradient of one geometry, compared with the reference; keep: the
    gradient masked (_masked), and the float results compared bit for bit."""
    rng = np.random.default_rng(seed)
    a = _conv_attrs(rng, o, k, s, p, groups, d)
    ho, wo = _out(h, k, s, p, d), _out(w, k, s, p, d)
    g = _f32(rng, (n, o, ho, wo))
    feeds = {"x": _i8(rng, (n, c, h, w)), "g": g if keep is None else _masked(rng, g, keep)}
    state = {"w": _i8(rng, (o, c // groups, k, k))}
    geo = dict(stride=a["stride"], padding=a["padding"], dilation=a["dilation"], groups=groups)
    scales = tuple(float(np.float32(0.05 * v)) for v in a["w_scales"])
    depthwise = groups == c == o

    def build(e, v):
        outs = [e.emit_multi("qconv2d_grad_input", v["g"], v["w"], input_shape=(n, c, h, w),
                             w_scales=a["w_scales"], **geo)[0]]
        if depthwise:
            outs.append(e.emit_multi("qconv2d_dw_grad_input", v["g"], v["w"], input_shape=(n, c, h, w),
                                     w_scales=a["w_scales"], **geo)[0])
        outs.append(e.emit("qconv2d_grad_weight", v["x"], v["g"], weight_shape=(o, c // groups, k, k),
                           scales=scales, x_zero=a["x_zero"], **geo))
        outs.append(e.emit("qconv2d_grad_bias", v["g"], scales=scales))
        return outs
    check(build, feeds, state, splits={"w": split} if split else None, bits=keep is not None)


POINTWISE = [  # (c, o, h, w, s, groups, n)
    (9, 140, 4, 4, 1, 1, 1),  # channel tail of 1
    (5, 400, 2, 3, 1, 1, 1),  # output channels over three weight chunks (192 each), a pixel tail
    (7, 33, 5, 5, 1, 1, 2),  # 25 pixels: a pixel tail; two images
    (6, 8, 7, 7, 2, 1, 1),  # stride 2: rows of 4 into every other input pixel
    (10, 6, 3, 5, 1, 2, 1),  # two groups of 5 channels, a 3x5 plane
    (6, 40, 1, 1, 1, 1, 3),  # 1x1 planes (a classifier)
    (5, 5, 4, 4, 1, 5, 1),  # depthwise 1x1
    (3, 2, 2, 9, 2, 1, 2),
]


@pytest.mark.parametrize("case", POINTWISE)
def test_pointwise_backward(case):
    c, o, h, w, s, groups, n = case
    _backward(c, o, h, w, 1, s, 0, 1, groups, n, seed=hash(case) % 2 ** 32)


DEPTHWISE = [  # (c, h, w, k, s, p, d, n)
    (9, 4, 4, 3, 1, 1, 1, 1),  # two 4-channel blocks and one channel
    (6, 4, 4, 7, 1, 3, 1, 1),  # 7x7 over a 4x4 plane: every tap row partly outside
    (5, 8, 8, 5, 1, 2, 1, 2),
    (8, 8, 8, 7, 2, 3, 1, 1),  # stride 2: the valid taps go every other row and column
    (4, 9, 9, 3, 2, 1, 1, 1),  # 81 pixels: one channel at a time
    (3, 7, 7, 3, 1, 2, 2, 1),  # dilation 2
    (5, 1, 1, 3, 1, 1, 1, 1),  # a 1x1 plane: only the centre tap
    (4, 2, 66, 3, 1, 1, 1, 1),  # a side over 64: the scatter form
    (7, 5, 3, 5, 2, 2, 1, 3),
]


@pytest.mark.parametrize("case", DEPTHWISE)
def test_depthwise_backward(case):
    c, h, w, k, s, p, d, n = case
    _backward(c, c, h, w, k, s, p, d, c, n, seed=hash(case) % 2 ** 32)


DENSE = [  # (c, o, h, w, k, s, p, groups, n): the kxk dense and grouped weight gradient
    (6, 4, 5, 5, 3, 1, 1, 1, 1),
    (9, 3, 6, 6, 5, 2, 2, 1, 2),
    (8, 4, 6, 7, 3, 2, 1, 2, 3),
    (5, 2, 4, 4, 7, 1, 3, 1, 1),
]


@pytest.mark.parametrize("case", DENSE)
def test_dense_backward(case):
    c, o, h, w, k, s, p, groups, n = case
    _backward(c, o, h, w, k, s, p, 1, groups, n, seed=hash(case) % 2 ** 32)


@pytest.mark.parametrize("sel", [ChannelSelect(1, (0, 3, 4, 9)), ChannelSelect(0, (1, 2, 33))])
def test_pointwise_input_gradient_reads_a_split_weight(sel):
    _backward(11, 36, 4, 4, 1, 1, 0, 1, 1, 1, split=sel, seed=3)


def test_depthwise_input_gradient_reads_a_split_weight():
    _backward(9, 9, 4, 4, 3, 1, 1, 1, 9, 1, split=ChannelSelect(0, (1, 4, 8)), seed=4)


SPARSE = [  # (c, o, h, w, k, s, p, groups, n, keep): gradients after a clamp's mask
    (9, 200, 10, 10, 1, 1, 0, 1, 1, 0.3),  # 100 pixels: tiles of 64 and 36; two weight chunks
    (6, 37, 4, 4, 1, 1, 0, 1, 2, 0.5),  # two images, rows zero in one of them only
    (7, 24, 8, 8, 1, 1, 0, 1, 1, 0.05),  # nearly every group of 4 pixels zero
    (8, 30, 5, 5, 1, 1, 0, 1, 1, 0.9),  # few zeros: the dense loop, some rows skipped
    (6, 12, 4, 4, 1, 1, 0, 2, 1, 0.3),  # two groups: one weight-gradient row at a time
    (6, 8, 7, 7, 1, 2, 0, 1, 1, 0.3),  # stride 2: the 1x1 input gradient's rows, no masks
    (6, 9, 5, 5, 3, 1, 1, 1, 2, 0.4),  # a 3x3 weight gradient's rows skipped
]


@pytest.mark.parametrize("case", SPARSE)
def test_masked_gradients(case):
    c, o, h, w, k, s, p, groups, n, keep = case
    _backward(c, o, h, w, k, s, p, 1, groups, n, seed=hash(case) % 2 ** 32, keep=keep)
