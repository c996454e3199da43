"""The int8 ops: integer forward against float references, STE backward against
torch.autograd, QAS and stochastic rounding of the integer update against their formulas."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from edgetrain.autodiff import build_backward
from edgetrain.interpreter import run_graph
from edgetrain.ir import Graph, TensorType, new_value
from edgetrain.ops import Emitter, verify
from edgetrain.ops.fixed_point import multiply_by_quantized_multiplier, quantize_multiplier
from edgetrain.ops.qconv import out_scales
from edgetrain.ops.qelementwise import qadd_attrs
from edgetrain.ops.qoptim import uniform_hash
from edgetrain.ops.qpool import is_copy, qcat_attrs
from edgetrain.quantize import QParams, quantize_weight

#: ops covered here (test_ops.test_every_op_is_tested counts them as tested)
QUANTIZED_OPS_TESTED = {"quantize", "dequantize", "qmask_grad", "qmask_pack", "qconv2d", "qconv2d_grad_input",
                        "qconv2d_grad_weight", "qconv2d_grad_bias", "qadd", "qmean", "qclamp", "qsgd_update",
                        "qconv2d_pw_dw",  # the fused op: tests/passes/test_fuse.py
                        "qstream",  # tests/passes/test_stream.py
                        "qconv2d_dw_grad_input", "qconv2d_grad_weight_update",  # tests/ops/test_fused_backward.py
                        "qmax_pool2d", "qmax_pool2d_grad", "qavg_pool2d", "qavg_pool2d_grad", "qcat", "qcat_grad",
                        "qleaky_relu", "qleaky_relu_grad",  # tests/backends/c/test_int8_leaky.py
                        "qupsample", "qupsample_grad", "qadaptive_max_pool2d",  # tests/backends/c/test_int8_resample.py
                        "qadaptive_max_pool2d_grad", "qmax_pool3d", "qmax_pool3d_grad",
                        # tests/ops/test_qconv_transpose.py, tests/backends/c/test_int8_transposed.py
                        "qconv_transpose2d", "qconv_transpose2d_grad_input", "qconv_transpose2d_grad_weight"}
SETTINGS = settings(max_examples=25, deadline=None)


# --- fixed point ---------------------------------------------------------------------------
@SETTINGS
@given(real=st.floats(1e-6, 50.0), xs=st.lists(st.integers(-(2 ** 31) + 1, 2 ** 31 - 1), min_size=1, max_size=20))
def test_fixed_point_multiply_is_rounded_product(real, xs):
    m, shift = quantize_multiplier(real)
    assert abs(Fraction(m) * Fraction(2) ** (shift - 31) - Fraction(real)) <= Fraction(real) * Fraction(1, 2 ** 30)
    got = multiply_by_quantized_multiplier(np.array(xs, dtype=np.int64), m, shift)
    for x, y in zip(xs, got):
        exact = Fraction(max(min(x * 2 ** max(shift, 0), 2 ** 31 - 1), -(2 ** 31))) * m / 2 ** 31 / 2 ** max(-shift, 0)
        # the two roundings (high multiply, then shift) each round half away from zero
        assert abs(Fraction(int(y)) - exact) <= 1


# --- helpers ---------------------------------------------------------------------------------
def _graph(op, args, attrs):
    """inputs -> op -> outputs, plus a scalar loss sum(dequantize-or-float(out) * r)."""
    ins = [new_value(TensorType(a.shape, str(a.dtype)), f"in{i}") for i, a in enumerate(args)]
    e = Emitter()
    out = e.emit(op, *ins, **attrs)
    return ins, e, out


def _qconv_case(rng, groups=1, float_out=False, stride=1):
    n, c, h, w, k = 2, 4, 6, 6, 3
    o = c if groups > 1 else 5
    x = rng.integers(-128, 128, (n, c, h, w)).astype(np.int8)
    wq = rng.integers(-127, 128, (o, c // groups, k, k)).astype(np.int8)
    b = rng.integers(-3000, 3000, o).astype(np.int32)
    xq, yq = QParams(0.05, int(rng.integers(-20, 20))), QParams(0.2, int(rng.integers(-20, 20)))
    w_scales = rng.uniform(0.002, 0.02, o).astype(np.float32)
    mult, shift = zip(*(quantize_multiplier(xq.scale * float(s) / yq.scale) for s in w_scales))
    attrs = dict(stride=(stride, stride), padding=(1, 1), dilation=(1, 1), groups=groups, x_zero=xq.zero,
                 x_scale=xq.scale, w_scales=tuple(float(s) for s in w_scales), float_out=float_out, y_zero=yq.zero,
                 y_scale=yq.scale, mult=mult, shift=shift, qmin=-128, qmax=127)
    return x, wq, b, attrs


def _formula(x, w, b, a):
    """The published float semantics: clamp(round((conv(x - zx, w) + b) * sx * sw / sy) + zy)."""
    acc = F.conv2d(torch.from_numpy(x.astype(np.float64) - a["x_zero"]), torch.from_numpy(w.astype(np.float64)),
                   torch.from_numpy(b.astype(np.float64)), a["stride"], a["padding"], a["dilation"], a["groups"])
    scale = torch.tensor(a["x_scale"] * np.array(a["w_scales"], dtype=np.float64) / a["y_scale"]).view(1, -1, 1, 1)
    exact = (acc * scale).numpy()
    return np.clip(np.round(exact) + a["y_zero"], -128, 127), acc.numpy(), exact


@pytest.mark.parametrize("groups", [1, 4])
def test_qconv2d_matches_the_float_formula(groups):
    rng = np.random.default_rng(groups)
    x, w, b, a = _qconv_case(rng, groups)
    ins, e, out = _graph("qconv2d", [x, w, b], a)
    g = verify(Graph(tuple(ins), tuple(e.nodes), (out,), ("y",)))
    got = run_graph(g, {"in0": x, "in1": w, "in2": b})[0]["y"]
    want, acc, exact = _formula(x, w, b, a)
    assert got.dtype == np.int8
    diff = np.abs(got.astype(np.int32) - want)
    # TFLite rounds twice (high multiply, then shift): only values within 1/100 of a tie
    # may land on the other side
    near_tie = np.abs(np.abs(exact - np.trunc(exact)) - 0.5) < 0.01
    assert diff.max() <= 1 and not (diff > 0)[~near_tie].any()
    a_f = {**a, "float_out": True}
    ins, e, out = _graph("qconv2d", [x, w, b], a_f)
    real = run_graph(Graph(tuple(ins), tuple(e.nodes), (out,), ("y",)), {"in0": x, "in1": w, "in2": b})[0]["y"]
    np.testing.assert_allclose(real, acc * out_scales(a).reshape(1, -1, 1, 1), rtol=1e-6, atol=1e-6)


def test_qconv2d_is_within_quantization_error_of_the_float_conv():
    rng = np.random.default_rng(7)
    xr = rng.normal(0, 1, (2, 3, 8, 8)).astype(np.float32)
    wr = rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)
    xq = QParams.from_range(xr.min(), xr.max())
    wq, w_scales = quantize_weight(wr)
    ref = F.conv2d(torch.from_numpy(xr), torch.from_numpy(wr), padding=1).numpy()
    yq = QParams.from_range(ref.min(), ref.max())
    mult, shift = zip(*(quantize_multiplier(xq.scale * float(s) / yq.scale) for s in w_scales))
    a = dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1, x_zero=xq.zero, x_scale=xq.scale,
             w_scales=tuple(float(s) for s in w_scales), float_out=False, y_zero=yq.zero, y_scale=yq.scale,
             mult=mult, shift=shift, qmin=-128, qmax=127)
    e = Emitter()
    xin = new_value(TensorType(xr.shape, "float32"), "x")
    w_in, b_in = new_value(TensorType(wq.shape, "int8"), "w"), new_value(TensorType((4,), "int32"), "b")
    q = e.emit("quantize", xin, scale=xq.scale, zero=xq.zero, qmin=-128, qmax=127)
    y = e.emit("dequantize", e.emit("qconv2d", q, w_in, b_in, **a), scale=yq.scale, zero=yq.zero)
    got = run_graph(Graph((xin, w_in, b_in), tuple(e.nodes), (y,), ("y",)),
                    {"x": xr, "w": wq, "b": np.zeros(4, np.int32)})[0]["y"]
    # error budget: input rounding (sx/2 per tap), weight rounding (sw/2 per tap), output rounding (sy/2)
    taps = np.abs(xr).max() * 27 * w_scales.max() / 2 + np.abs(wr).max() * 27 * xq.scale / 2
    assert np.abs(got - ref).max() <= taps + yq.scale / 2 + 1e-6


def test_qconv2d_backward_is_the_straight_through_gradient():
    """d loss / d x_real, d loss / d w_int and d loss / d b_int against torch.autograd on
    the real-valued surrogate, with the saturation mask of the int8 output."""
    rng = np.random.default_rng(3)
    x, w, b, a = _qconv_case(rng, stride=2)
    ins, e, out = _graph("qconv2d", [x, w, b], a)
    r = new_value(TensorType(out.shape, "float32"), "r")
    yf = e.emit("dequantize", out, scale=a["y_scale"], zero=a["y_zero"])
    loss = e.emit("sum", e.emit("mul", yf, r), dims=None)
    g = Graph(tuple(ins) + (r,), tuple(e.nodes), (loss, out), ("loss", "y"))
    bw = verify(build_backward(g, "loss", {"in0": None, "in1": None, "in2": None}))
    rv = rng.normal(0, 1, out.shape).astype(np.float32)
    res = run_graph(bw, {"in0": x, "in1": w, "in2": b, "r": rv})[0]
    mask = torch.from_numpy(((res["y"] > -128) & (res["y"] < 127)).astype(np.float64))
    sx, sw = a["x_scale"], torch.tensor(a["w_scales"], dtype=torch.float64)
    xr = torch.tensor(sx * (x.astype(np.float64) - a["x_zero"]), requires_grad=True)
    wi = torch.tensor(w.astype(np.float64), requires_grad=True)
    bi = torch.tensor(b.astype(np.float64), requires_grad=True)
    acc = F.conv2d(xr, wi * sw.view(-1, 1, 1, 1), bi * sx * sw, a["stride"], a["padding"])
    (acc * mask * torch.from_numpy(rv.astype(np.float64))).sum().backward()
    for name, ref in (("grad:in0", xr.grad), ("grad:in1", wi.grad), ("grad:in2", bi.grad)):
        np.testing.assert_allclose(res[name], ref.numpy(), rtol=1e-4, atol=1e-5 * float(ref.abs().max()))


def test_qadd_and_qmean_match_their_float_formulas():
    rng = np.random.default_rng(5)
    a, b = (rng.integers(-128, 128, (2, 3, 4, 4)).astype(np.int8) for _ in range(2))
    attrs = qadd_attrs(0.07, 3, 0.11, -5, 0.13, 2)
    ins, e, out = _graph("qadd", [a, b], attrs)
    got = run_graph(Graph(tuple(ins), tuple(e.nodes), (out,), ("y",)), {"in0": a, "in1": b})[0]["y"]
    want = np.clip(np.round(((a - 3.0) * 0.07 + (b + 5.0) * 0.11) / 0.13) + 2, -128, 127)
    diff = np.abs(got - want)
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01
    ins, e, out = _graph("qmean", [a], dict(dims=(2, 3), keepdim=False, zero=3))
    got = run_graph(Graph(tuple(ins), tuple(e.nodes), (out,), ("y",)), {"in0": a})[0]["y"]
    exact = (a.astype(np.float64) - 3).mean(axis=(2, 3))
    np.testing.assert_array_equal(got, np.sign(exact) * np.floor(np.abs(exact) + 0.5) + 3)


def test_quantize_round_trip_and_clamp():
    q = QParams.from_range(-1.0, 3.0)
    x = np.linspace(-2, 4, 101, dtype=np.float32)
    ins, e, out = _graph("quantize", [x], dict(scale=q.scale, zero=q.zero, qmin=-128, qmax=127))
    y = e.emit("dequantize", out, scale=q.scale, zero=q.zero)
    z = e.emit("qclamp", out, qmin=q.quantize(0.0), qmax=127)
    res = run_graph(Graph(tuple(ins), tuple(e.nodes), (y, z), ("y", "z")), {"in0": x})[0]
    inside = (x >= -1) & (x <= 3)
    assert np.abs(res["y"][inside] - x[inside]).max() <= q.scale / 2 + 1e-6
    np.testing.assert_allclose(res["y"][x > 3.1], q.real_range[1], rtol=1e-6)
    assert res["z"].min() == q.quantize(0.0)  # ReLU: a clamp at the zero point


# --- the integer SGD update -------------------------------------------------------------------
def _update(w, g, step, **kw):
    attrs = dict(lr=0.1, momentum=0.0, weight_decay=0.0, scale=(1.0,) * w.shape[0], dim=0, index=None, seed=0,
                 param_id=0, qmin=-127, qmax=127)
    attrs.update(kw)
    ins, e, _ = _graph("qsgd_update", [w, g, np.array(step, dtype=np.int32)], attrs)
    gr = Graph(tuple(ins), tuple(e.nodes), tuple(e.nodes[0].outputs), ("w",))
    w = w.copy()
    run_graph(gr, {"in0": w, "in1": g, "in2": np.array(step, dtype=np.int32)})
    return w


def test_qsgd_update_applies_the_qas_scaled_step_with_stochastic_rounding():
    rng = np.random.default_rng(0)
    w = rng.integers(-100, 100, (3, 4)).astype(np.int8)
    g = rng.normal(0, 1, (3, 4)).astype(np.float32)
    scale = (4.0, 9.0, 0.25)
    got = _update(w, g, 5, scale=scale, lr=0.3)
    v = w.astype(np.float32) - np.float32(0.3) * (g * np.array(scale, np.float32)[:, None])
    u = uniform_hash(0, 0, 5, np.arange(12).reshape(3, 4))
    np.testing.assert_array_equal(got, np.clip(np.floor(v + u), -127, 127))
    np.testing.assert_array_equal(got, _update(w, g, 5, scale=scale, lr=0.3))  # deterministic
    half = np.full((32, 32), 5.0, np.float32)  # half a step: each element moves with probability 1/2
    zeros = np.zeros((32, 32), np.int8)
    assert not np.array_equal(_update(zeros, half, 5), _update(zeros, half, 6))  # keyed by step


def test_small_updates_are_not_lost():
    """A step of a tenth of an integer moves weights by a tenth on average."""
    w = np.zeros((64, 64), np.int8)
    g = np.ones((64, 64), np.float32)
    moved = _update(w, g, 1, lr=0.1).astype(np.float64)
    assert abs(moved.mean() + 0.1) < 0.02 and set(np.unique(moved)) <= {-1.0, 0.0}
    sat = _update(np.full((2, 2), 126, np.int8), -np.ones((2, 2), np.float32), 1, lr=5.0)
    assert (sat == 127).all()


def test_uniform_hash_is_uniform():
    u = uniform_hash(3, 1, 7, np.arange(100_000))
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.005
    assert np.histogram(u, bins=10, range=(0, 1))[0].min() > 9_500


# --- saturation masks saved as bits ------------------------------------------------------------
@SETTINGS
@given(shape=st.lists(st.integers(1, 7), min_size=1, max_size=4), lo=st.integers(-128, 0), hi=st.integers(0, 127),
       seed=st.integers(0, 2**16))
def test_packed_mask_gradient_equals_the_mask_of_the_output(shape, lo, hi, seed):
    from edgetrain.ops import get_op
    from edgetrain.ops.qelementwise import mask_bytes

    rng = np.random.default_rng(seed)
    y = rng.integers(-128, 128, shape).astype(np.int8)
    g = rng.standard_normal(shape).astype(np.float32)
    (m,) = get_op("qmask_pack").ref([y], {"lo": lo, "hi": hi})
    assert m.dtype == np.int8 and m.shape == (mask_bytes(y.size),)  # one bit per element
    (out,) = get_op("qmask_grad").ref([g, m], {})
    np.testing.assert_array_equal(out, g * ((y > lo) & (y < hi)))


# --- pooling and concatenation (ops/qpool.py) ---------------------------------------------------
def _backward(op, args, attrs, scale, zero, rv, wrt):
    """{grad:inK} of sum(dequantize(op(args)) * rv) (the int8 output on scale, zero), and the output."""
    ins, e, out = _graph(op, args, attrs)
    r = new_value(TensorType(out.shape, "float32"), "r")
    loss = e.emit("sum", e.emit("mul", e.emit("dequantize", out, scale=scale, zero=zero), r), dims=None)
    g = Graph(tuple(ins) + (r,), tuple(e.nodes), (loss, out), ("loss", "y"))
    bw = verify(build_backward(g, "loss", {f"in{i}": None for i in wrt}))
    return run_graph(bw, {**{f"in{i}": a for i, a in enumerate(args)}, "r": rv})[0]


POOL_GEOMETRIES = [  # (hw, kernel, stride, padding, dilation)
    (8, 2, 2, 0, 1), (9, 3, 2, 1, 1), (7, 3, 1, 1, 1), (8, 3, 1, 1, 2), (6, 5, 2, 2, 1)]


@pytest.mark.parametrize("geo", POOL_GEOMETRIES)
def test_qmax_pool2d_is_the_float_max_and_routes_the_gradient_to_the_first_max(geo):
    hw, k, s, p, d = geo
    rng = np.random.default_rng(hw * k + s)
    x = rng.integers(-128, 128, (2, 3, hw, hw)).astype(np.int8)
    x[:, 1] = rng.integers(-2, 2, (2, hw, hw))  # many ties
    a = dict(kernel=(k, k), stride=(s, s), padding=(p, p), dilation=(d, d))
    scale, zero = 0.04, 7
    xr = torch.tensor(scale * (x.astype(np.float64) - zero), requires_grad=True)
    yr = F.max_pool2d(xr, k, s, p, d)
    rv = rng.standard_normal(tuple(yr.shape)).astype(np.float32)
    res = _backward("qmax_pool2d", [x], a, scale, zero, rv, [0])
    assert res["y"].dtype == np.int8
    np.testing.assert_array_equal(res["y"], np.rint(yr.detach().numpy() / scale + zero))  # exact
    (yr * torch.from_numpy(rv.astype(np.float64))).sum().backward()  # torch: first max of the window
    np.testing.assert_allclose(res["grad:in0"], xr.grad.numpy(), rtol=1e-6, atol=1e-6)


AVG_CASES = [  # (hw, kernel, stride, padding, count_include_pad, divisor_override)
    (8, 2, 2, 0, True, 0), (9, 3, 2, 1, True, 0), (9, 3, 2, 1, False, 0), (7, 3, 1, 1, False, 0),
    (8, 2, 2, 0, True, 2), (6, 3, 3, 0, True, 11)]


@pytest.mark.parametrize("case", AVG_CASES)
def test_qavg_pool2d_rounds_the_centred_mean_half_away_from_zero(case):
    hw, k, s, p, cip, div = case
    rng = np.random.default_rng(hw + 10 * k + div)
    x = rng.integers(-128, 128, (2, 3, hw, hw)).astype(np.int8)
    scale, zero = 0.03, int(rng.integers(-30, 30))
    geo = dict(kernel=(k, k), stride=(s, s), padding=(p, p), count_include_pad=cip, divisor_override=div)
    xr = torch.tensor(scale * (x.astype(np.float64) - zero), requires_grad=True)
    yr = F.avg_pool2d(xr, k, s, p, count_include_pad=cip, divisor_override=div or None)
    rv = rng.standard_normal(tuple(yr.shape)).astype(np.float32)
    res = _backward("qavg_pool2d", [x], dict(geo, zero=zero), scale, zero, rv, [0])
    # the exact mean of (x - zero) in levels, rounded half away from zero, plus zero
    centred = F.avg_pool2d(torch.from_numpy(x.astype(np.float64) - zero), k, s, p, count_include_pad=cip,
                           divisor_override=div or None).numpy()
    want = np.clip(np.sign(centred) * np.floor(np.abs(centred) + 0.5 + 1e-9) + zero, -128, 127)
    np.testing.assert_array_equal(res["y"], want)
    assert np.abs(res["y"] - (yr.detach().numpy() / scale + zero)).max() <= 0.5 + 1e-9 or div
    keep = torch.from_numpy(((res["y"] > -128) & (res["y"] < 127)) | (not div or div >= k * k))
    (yr * keep * torch.from_numpy(rv.astype(np.float64))).sum().backward()
    np.testing.assert_allclose(res["grad:in0"], xr.grad.numpy(), rtol=1e-6, atol=1e-6)
    if div and div < k * k:
        assert not keep.all()  # the override saturated some means, and their gradient stopped


@pytest.mark.parametrize("dim", [1, 3])
def test_qcat_copies_or_requantizes_as_tflite(dim):
    rng = np.random.default_rng(dim)
    shapes = [[2, 3, 4, 4] for _ in range(3)]
    for sh, extra in zip(shapes, (2, 3, 1)):
        sh[dim] = extra
    xs = [rng.integers(-128, 128, sh).astype(np.int8) for sh in shapes]
    scales, zeros, y_scale, y_zero = (0.05, 0.13, 0.02), (-3, 9, 3), 0.05, -3
    a = qcat_attrs(dim, scales, zeros, y_scale, y_zero)
    assert is_copy(a, 0) and not is_copy(a, 1) and not is_copy(a, 2)
    out_shape = list(shapes[0])
    out_shape[dim] = 6
    rv = rng.standard_normal(out_shape).astype(np.float32)
    res = _backward("qcat", xs, a, y_scale, y_zero, rv, [0, 1, 2])
    y = res["y"].astype(np.int64)
    exact = np.concatenate([(x.astype(np.int64) - z) * (s / y_scale) for x, s, z in zip(xs, scales, zeros)],
                           axis=dim) + y_zero
    want = np.clip(np.round(exact), -128, 127)
    diff = np.abs(y - want)
    # TFLite's requantization rounds twice (the high multiply, then a right shift): one
    # level at most; an input whose multiplier needs no right shift is rounded once
    assert diff.max() <= 1 and a["shift"][1] >= 0 and a["shift"][2] < 0
    np.testing.assert_array_equal(np.take(diff, range(5), axis=dim), 0)
    np.testing.assert_array_equal(np.take(res["y"], range(2), axis=dim), xs[0])  # copied exactly
    assert (y == 127).any() and (y == -128).any()  # input 1's wider scale saturates
    # the gradient: each input's slice of the output gradient, stopped where the output saturated
    masked = rv * ((y > -128) & (y < 127))
    for i, (lo, hi) in enumerate(((0, 2), (2, 5), (5, 6))):
        np.testing.assert_array_equal(res[f"grad:in{i}"], np.take(masked, range(lo, hi), axis=dim))
