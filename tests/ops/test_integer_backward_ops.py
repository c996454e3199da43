"""The integer-only backward's ops (ops/igrad.py, ops/icross_entropy.py, ops/igrad_fixed.py)
against what they stand for: the float backward's ops and torch's loss, within the
resolution of their fixed-point formats; the updates against their formula in exact Python
integers."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from edgetrain.ops import get_op
from edgetrain.ops.igrad_fixed import (INT16_MAX, Q16, exp_q16, float_of_q16, log2_q16, mantissa_shift,
                                       rshift_round, uniform16)
from edgetrain.ops.qoptim import UNIFORM_BITS, uniform_hash

#: ops covered here (test_ops.test_every_op_is_tested counts them as tested)
INTEGER_BACKWARD_OPS_TESTED = {"icross_entropy", "igrad_scale", "igrad_add", "iconv_grad_input",
                               "iconv_grad_weight_update", "iconv_bias_update"}
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None)


def ref(op, *xs, **attrs):
    return get_op(op).ref(list(xs), attrs)


# --- fixed point ---------------------------------------------------------------------------
@SETTINGS
@given(v=st.integers(-(2 ** 40), 2 ** 40), s=st.integers(-8, 30))
def test_rshift_round_is_floor_of_half_up(v, s):
    got = int(rshift_round(np.int64(v), s))
    want = math.floor(Fraction(v, 2 ** s) + Fraction(1, 2)) if s > 0 else v * 2 ** -s
    assert got == want


def test_exp_and_log_in_q16_are_within_their_resolution():
    d = -np.arange(0, 24 << Q16, 997, dtype=np.int64)
    err = np.abs(exp_q16(d) - np.exp(d / 2 ** Q16) * 2 ** Q16)
    assert err.max() <= 2  # Q16 units
    s = np.unique(np.geomspace(1, 2 ** 40, 5000).astype(np.int64))
    assert np.abs(log2_q16(s) - np.log2(s) * 2 ** Q16).max() <= 4  # the mantissa truncated to 16 bits, the table


@SETTINGS
@given(real=st.floats(1e-16, 1e6), extra=st.integers(-20, 20))
def test_mantissa_shift_is_within_one_part_in_2_to_the_14(real, extra):
    m, s = mantissa_shift(real, extra)
    if m == 0:  # past the largest shift: a zero multiplier
        assert s == 0 and real * 2.0 ** extra < 2.0 ** (15 - 62)
        return
    assert 2 ** 14 <= m < 2 ** 15
    assert abs(Fraction(m) / Fraction(2) ** s - Fraction(real) * Fraction(2) ** extra) <= \
        Fraction(real) * Fraction(2) ** extra / 2 ** 14


def test_the_rounding_bits_are_the_float_updates_top_16():
    idx = np.arange(1000)
    u24 = (uniform_hash(3, 7, 11, idx).astype(np.float64) * 2 ** UNIFORM_BITS).astype(np.int64)
    assert np.array_equal(uniform16(3, 7, 11, idx), u24 >> 8)


def test_float_of_q16_is_exact():
    q = np.array([0, 1, 65535, 65536, 123456789 % (2 ** 24), 2 ** 24 - 1])
    assert [Fraction(float(f)) for f in float_of_q16(q)] == [Fraction(int(v), 2 ** 16) for v in q]


# --- the loss --------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,ignore", [((4, 10), False), ((3, 7, 5), True), ((1, 1000), False)])
def test_icross_entropy_matches_torch(shape, ignore):
    rng = np.random.default_rng(len(shape))
    k = shape[1]
    acc = rng.integers(-40000, 40000, shape).astype(np.int32)
    scales = rng.uniform(1e-4, 3e-4, k)
    ms = [mantissa_shift(float(s), 16) for s in scales]
    label = rng.integers(0, k, (shape[0],) + shape[2:]).astype(np.int64)
    if ignore:
        label.reshape(-1)[::3] = -100
    count = int((label != -100).sum())
    grad_shift = max(0, math.ceil(math.log2(label.size)) - 3)  # quantize/integer_backward.py's choice
    loss, grad = ref("icross_entropy", acc, label, mult=tuple(m for m, _ in ms), shift=tuple(s for _, s in ms),
                     grad_shift=grad_shift, class_dim=1, ignore_index=-100)
    logits = torch.tensor(acc * scales.reshape((1, -1) + (1,) * (len(shape) - 2)), requires_grad=True)
    want = F.cross_entropy(logits, torch.from_numpy(label), ignore_index=-100)
    want.backward()
    assert loss.dtype == np.float32 and abs(float(loss) - want.item()) < 2e-4 * max(1.0, want.item())
    real_grad = grad.astype(np.float64) * 2.0 ** (-15 - grad_shift)
    assert np.abs(real_grad - logits.grad.numpy()).max() < 4 * 2.0 ** (-15 - grad_shift) * k / count + 1e-4 / count
    assert grad.dtype == np.int16


# --- gradients -------------------------------------------------------------------------------
def test_igrad_scale_and_add_round_half_up_and_saturate():
    g = np.array([3, -3, 25000, -25000, 1], np.int16)
    assert list(ref("igrad_scale", g, mult=(3 << 13,), shift=(14,))[0]) == [5, -4, INT16_MAX, -32768, 2]
    a, b = np.array([5, -5, 30000], np.int16), np.array([2, 2, 30000], np.int16)
    assert list(ref("igrad_add", a, b, shift_a=1, shift_b=-1)[0]) == [3 + 4, -2 + 4, INT16_MAX]


GEOMETRIES = [  # (c, o, groups, k, stride, padding, dilation)
    (4, 6, 1, 3, 1, 1, 1), (5, 3, 1, 3, 2, 1, 1), (6, 6, 6, 3, 1, 1, 1), (6, 6, 6, 5, 2, 2, 1),
    (4, 4, 2, 3, 1, 2, 2), (8, 5, 1, 1, 1, 0, 1)]


@pytest.mark.parametrize("c,o,groups,k,s,p,d", GEOMETRIES)
def test_iconv_grad_input_is_the_float_gradient_at_its_exponent(c, o, groups, k, s, p, d):
    rng = np.random.default_rng(c * o + k)
    n, h = 2, 7
    w = rng.integers(-127, 128, (o, c // groups, k, k)).astype(np.int8)
    w_scales = rng.uniform(0.002, 0.02, o)
    geo = dict(stride=(s, s), padding=(p, p), dilation=(d, d), groups=groups)
    ho = (h + 2 * p - d * (k - 1) - 1) // s + 1
    g = rng.integers(-3000, 3000, (n, o, ho, ho)).astype(np.int16)
    e_g, e_x = -20, -12
    _, fm = mantissa_shift(max(w_scales))
    mult = tuple(int(round(v * 2.0 ** fm)) for v in w_scales)
    (gx,) = ref("iconv_grad_input", g, w, input_shape=(n, c, h, h), mult=mult, shift=e_x + fm - e_g, **geo)
    (want,) = ref("qconv2d_grad_input", (g * 2.0 ** e_g).astype(np.float32), w, input_shape=(n, c, h, h),
                  w_scales=tuple(w_scales), **geo)
    real = gx.astype(np.float64) * 2.0 ** e_x
    assert np.abs(real - want).max() <= 2.0 ** e_x + np.abs(want).max() * 2 ** -13


# --- updates: the formula in exact integers ------------------------------------------------------
def _exact_update(w, acc, mult, shift, u, momentum=None, mom_q16=0, decay=(0, 0), qmin=-127, qmax=127):
    """[(w', m')] element by element in Python integers (round half up = floor(x + 1/2))."""
    def rnd(v, s):
        return math.floor(Fraction(v, 2 ** s) + Fraction(1, 2)) if s > 0 else v * 2 ** -s
    d = rnd(max(min(acc, 2 ** 47), -(2 ** 47)) * mult, shift)
    if decay[0]:
        d += rnd(w * decay[0], decay[1])
    m = None
    if momentum is not None:
        m = max(min(rnd(momentum * mom_q16, 16) + d, 2 ** 31 - 1), -(2 ** 31))
        d = m
    return max(min(math.floor(Fraction(w * 2 ** 16 - d + u, 2 ** 16)), qmax), qmin), m


@pytest.mark.parametrize("select", [None, (0, (1, 3)), (1, (0, 2))])
@pytest.mark.parametrize("momentum", [False, True])
def test_iconv_grad_weight_update_follows_its_formula(select, momentum):
    rng = np.random.default_rng(5)
    n, c, o, k, h = 2, 4, 5, 3, 6
    depthwise = select is not None and select[0] == 0
    if depthwise:
        c = o
    x = rng.integers(-128, 128, (n, c, h, h)).astype(np.int8)
    w = rng.integers(-127, 128, (o, 1 if depthwise else c, k, k)).astype(np.int8)
    rows, cols = o, w.shape[1]
    dim, index = (None, None) if select is None else select
    if dim == 0:
        rows = len(index)
        x = x[:, list(index)]
    elif dim == 1:
        cols = len(index)
        x = x[:, list(index)]
    g = rng.integers(-2000, 2000, (n, rows, h, h)).astype(np.int16)
    ms = [mantissa_shift(float(v), 16 - 22) for v in rng.uniform(1e-3, 1e-1, rows)]
    a = dict(weight_shape=(rows, cols, k, k), x_zero=-3, stride=(1, 1), padding=(1, 1), dilation=(1, 1),
             groups=rows if depthwise else 1, mult=tuple(m for m, _ in ms), shift=tuple(s for _, s in ms),
             qmin=-127, qmax=127, seed=1, param_id=2, dim=dim or 0, index=index, momentum_q16=58982 if momentum else 0,
             decay_mult=0, decay_shift=0)
    step = np.array(4, np.int32)
    m0 = rng.integers(-200000, 200000, (rows, cols, k, k)).astype(np.int32) if momentum else None
    outs = ref("iconv_grad_weight_update", x, g, w, step, *([m0] if momentum else []), **a)
    xp = np.pad(x.astype(np.int64) + 3, ((0, 0), (0, 0), (1, 1), (1, 1)))
    for r in range(rows):
        for cc in range(cols):
            for i in range(k):
                for j in range(k):
                    xc = r if depthwise else cc
                    acc = int((g[:, r].astype(np.int64) * xp[:, xc, i:i + h, j:j + h]).sum())
                    row = index[r] if dim == 0 else r
                    col = index[cc] if dim == 1 else cc
                    at = ((row * w.shape[1] + col) * k + i) * k + j
                    u = int(uniform16(1, 2, 4, np.array([at]))[0])
                    want, m = _exact_update(int(w[row, col, i, j]), acc, ms[r][0], ms[r][1], u,
                                            int(m0[r, cc, i, j]) if momentum else None, 58982)
                    assert int(outs[0][row, col, i, j]) == want
                    if momentum:
                        assert int(outs[1][r, cc, i, j]) == m
    untouched = np.ones(w.shape, bool)
    if dim == 0:
        untouched[list(index)] = False
    elif dim == 1:
        untouched[:, list(index)] = False
    else:
        untouched[:] = False
    assert np.array_equal(outs[0][untouched], w[untouched])


def test_iconv_bias_update_with_weight_decay_follows_its_formula():
    rng = np.random.default_rng(9)
    b = rng.integers(-2 ** 20, 2 ** 20, 6).astype(np.int32)
    g = rng.integers(-3000, 3000, (3, 6, 4, 4)).astype(np.int16)
    ms = [mantissa_shift(float(v), -4) for v in rng.uniform(0.5, 2, 6)]
    decay = mantissa_shift(1e-3, 16)
    a = dict(mult=tuple(m for m, _ in ms), shift=tuple(s for _, s in ms), qmin=-(2 ** 24), qmax=2 ** 24, seed=0,
             param_id=5, dim=0, index=None, momentum_q16=0, decay_mult=decay[0], decay_shift=decay[1])
    (out,) = ref("iconv_bias_update", b, g, np.array(2, np.int32), **a)
    for r in range(6):
        u = int(uniform16(0, 5, 2, np.array([r]))[0])
        want, _ = _exact_update(int(b[r]), int(g[:, r].astype(np.int64).sum()), ms[r][0], ms[r][1], u, decay=decay,
                                qmin=-(2 ** 24), qmax=2 ** 24)
        assert int(out[r]) == want
