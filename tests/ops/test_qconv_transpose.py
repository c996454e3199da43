"""int8 transposed convolution (ops/qconv_transpose.py): the integer forward within one output
level of the dequantized float transposed convolution, its float_out form equal to the exact
accumulator, and the straight-through float32 backward against torch.autograd on the
dequantized layer, over the geometries conv_transpose2d supports."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from edgetrain.autodiff import build_backward
from edgetrain.interpreter import run_graph
from edgetrain.ir import Graph, TensorType, new_value
from edgetrain.ops import Emitter, verify
from edgetrain.ops.fixed_point import quantize_multiplier
from edgetrain.ops.qconv import out_scales
from edgetrain.ops.qconv_transpose import output_channel_of_weight

#: (N, C_in, H, W, C_out, kernel, stride, padding, output_padding, dilation, groups)
GEOMETRIES = [
    (2, 4, 5, 5, 6, 3, 2, 1, 1, 1, 1),
    (1, 3, 4, 6, 2, (2, 3), (2, 1), (0, 1), (1, 0), 1, 1),
    (2, 4, 3, 4, 6, 3, 2, 1, 0, 1, 2),
    (1, 4, 4, 4, 4, 3, 1, 1, 0, 2, 4),  # depthwise, dilated
    (1, 2, 3, 3, 3, 2, 2, 0, 1, (2, 1), 1),  # output padding beyond the last window row (dilation > stride)
    (1, 3, 1, 7, 2, (1, 3), (1, 2), (0, 1), (0, 1), 1, 1),  # a conv_transpose1d as 2-D
]


def _pair(v):
    return tuple(v) if isinstance(v, tuple) else (v, v)


def case(geometry, rng, float_out=False):
    """(x, w, b, attrs) of a qconv_transpose2d with random levels and per-output-channel scales."""
    n, c, h, wd, o, k, s, p, op, d, g = geometry
    kh, kw = _pair(k)
    x = rng.integers(-128, 128, (n, c, h, wd)).astype(np.int8)
    w = rng.integers(-127, 128, (c, o // g, kh, kw)).astype(np.int8)
    b = rng.integers(-3000, 3000, o).astype(np.int32)
    x_scale, x_zero, y_scale, y_zero = 0.05, int(rng.integers(-20, 20)), 0.3, int(rng.integers(-20, 20))
    w_scales = rng.uniform(0.002, 0.02, o).astype(np.float32)
    mult, shift = zip(*(quantize_multiplier(x_scale * float(v) / y_scale) for v in w_scales))
    attrs = dict(stride=_pair(s), padding=_pair(p), output_padding=_pair(op), dilation=_pair(d), groups=g,
                 x_zero=x_zero, x_scale=x_scale, w_scales=tuple(float(v) for v in w_scales), float_out=float_out,
                 y_zero=y_zero, y_scale=y_scale, mult=mult, shift=shift, qmin=-128, qmax=127)
    return x, w, b, attrs


def _torch_acc(x, w, b, a, xr=None, wi=None, bi=None):
    """The float64 transposed convolution of the real values (real = scale * level)."""
    sw = torch.tensor(a["w_scales"], dtype=torch.float64)
    oc = torch.from_numpy(output_channel_of_weight(w.shape, a["groups"]))
    xr = torch.from_numpy(a["x_scale"] * (x.astype(np.float64) - a["x_zero"])) if xr is None else xr
    wi = torch.from_numpy(w.astype(np.float64)) if wi is None else wi
    bi = torch.from_numpy(b.astype(np.float64)) if bi is None else bi
    return F.conv_transpose2d(xr, wi * sw[oc][:, :, None, None], bi * a["x_scale"] * sw, a["stride"], a["padding"],
                              a["output_padding"], a["groups"], a["dilation"])


def _run(x, w, b, a):
    ins = [new_value(TensorType(v.shape, str(v.dtype)), f"in{i}") for i, v in enumerate((x, w, b))]
    e = Emitter()
    out = e.emit("qconv_transpose2d", *ins, **a)
    g = verify(Graph(tuple(ins), tuple(e.nodes), (out,), ("y",)))
    return run_graph(g, {"in0": x, "in1": w, "in2": b})[0]["y"]


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_forward_is_within_one_level_of_the_dequantized_float_layer(geometry):
    rng = np.random.default_rng(sum(_pair(geometry[5])))
    x, w, b, a = case(geometry, rng)
    got = _run(x, w, b, a)
    real = _torch_acc(x, w, b, a).numpy()
    assert got.dtype == np.int8 and got.shape == real.shape
    want = np.clip(np.round(real / a["y_scale"]) + a["y_zero"], -128, 127)
    assert np.abs(got.astype(np.int32) - want).max() <= 1
    assert 0 < np.mean((got > -128) & (got < 127))  # not all saturated: the case tests something
    got_f = _run(x, w, b, {**a, "float_out": True})
    assert got_f.dtype == np.float32
    acc = np.rint(real / out_scales(a).astype(np.float64).reshape(1, -1, 1, 1))  # the exact integer accumulator
    np.testing.assert_allclose(got_f, acc * out_scales(a).reshape(1, -1, 1, 1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("float_out", [False, True])
def test_backward_is_the_straight_through_gradient(geometry, float_out):
    """d loss / d x_real, d loss / d w_int and d loss / d b_int against torch.autograd on the
    real-valued layer, with the saturation mask of an int8 output."""
    rng = np.random.default_rng(len(geometry) + sum(_pair(geometry[6])))
    x, w, b, a = case(geometry, rng, float_out)
    ins = [new_value(TensorType(v.shape, str(v.dtype)), f"in{i}") for i, v in enumerate((x, w, b))]
    e = Emitter()
    out = e.emit("qconv_transpose2d", *ins, **a)
    r = new_value(TensorType(out.shape, "float32"), "r")
    yf = out if float_out else e.emit("dequantize", out, scale=a["y_scale"], zero=a["y_zero"])
    loss = e.emit("sum", e.emit("mul", yf, r), dims=None)
    g = Graph(tuple(ins) + (r,), tuple(e.nodes), (loss, out), ("loss", "y"))
    bw = verify(build_backward(g, "loss", {"in0": None, "in1": None, "in2": None}))
    assert {"qconv_transpose2d_grad_input", "qconv_transpose2d_grad_weight"} <= {n.op for n in bw.nodes}
    rv = rng.normal(0, 1, out.shape).astype(np.float32)
    res = run_graph(bw, {"in0": x, "in1": w, "in2": b, "r": rv})[0]
    mask = np.ones(out.shape) if float_out else ((res["y"] > -128) & (res["y"] < 127)).astype(np.float64)
    xr = torch.tensor(a["x_scale"] * (x.astype(np.float64) - a["x_zero"]), requires_grad=True)
    wi = torch.tensor(w.astype(np.float64), requires_grad=True)
    bi = torch.tensor(b.astype(np.float64), requires_grad=True)
    acc = _torch_acc(x, w, b, a, xr, wi, bi)  # an int8 tensor's gradient is its real value's
    (acc * torch.from_numpy(mask * rv)).sum().backward()
    for name, ref in (("grad:in0", xr.grad), ("grad:in1", wi.grad), ("grad:in2", bi.grad)):
        assert res[name].shape == tuple(ref.shape) and res[name].dtype == np.float32
        np.testing.assert_allclose(res[name], ref.numpy(), rtol=1e-4, atol=1e-5 * float(ref.abs().max()))
