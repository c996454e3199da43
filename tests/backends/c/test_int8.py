"""The int8 C kernels (backends/c/kernels/int8.py, runtime/et_int8.h) against the reference
interpreter, bit for bit: every integer tensor and every float32 gradient identical.

Per-op checks run small graphs through a one-file C harness (int8_harness.py); the model
checks train whole int8 programs through the emitted C program."""
from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import numpy as np
import pytest

from edgetrain.autodiff import ChannelSelect
from edgetrain.ops.fixed_point import multiply_by_quantized_multiplier, quantize_multiplier
from edgetrain.ops.qelementwise import qadd_attrs
from edgetrain.ops.qfused import fuse_attrs as fuse_pw_dw
from edgetrain.ops.qgradupdate import fuse_attrs as fuse_grad_update

from .int8_harness import build, emit_source, graph_of, run_c, run_ref

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler")


def _same(got: dict, want: dict, bits: bool = False):
    """Equal values (bits: float32 compared as their bits, so -0 differs from +0)."""
    assert got.keys() == want.keys()
    for k in want:
        g, w = np.asarray(got[k]), np.asarray(want[k])
        assert g.dtype == w.dtype and g.shape == w.shape, k
        if bits and g.dtype == np.float32:
            g, w = g.view(np.uint32), w.view(np.uint32)
        if not np.array_equal(g, w):
            bad = np.argwhere(g != w)[:5]
            raise AssertionError(f"{k}: {len(np.argwhere(g != w))} elements differ, first {bad.tolist()}: "
                                 f"{[g[tuple(b)] for b in bad]} vs {[w[tuple(b)] for b in bad]}")


def check(build, feeds, state=None, splits=None, steps=1, bits=False):
    state = state or {}
    g = graph_of(build, {**feeds, **state})
    per = (lambda k: feeds) if steps > 1 else None
    got_out, got_state = run_c(g, feeds, state, splits, steps=steps, per_step=per)
    want_out, want_state = run_ref(g, feeds, state, steps=steps, per_step=per)
    _same(got_out, {k: v for k, v in want_out.items() if k in got_out}, bits)  # the others are state tensors
    _same(got_state, want_state, bits)
    return got_out, got_state


def _conv_attrs(rng, o, k, s, p, groups, d=1, float_out=False):
    ws = rng.uniform(0.002, 0.02, o)
    a = dict(stride=(s, s), padding=(p, p), dilation=(d, d), groups=groups, x_zero=int(rng.integers(-20, 20)),
             x_scale=0.05, w_scales=tuple(float(v) for v in ws), y_zero=int(rng.integers(-10, 10)),
             qmin=-128, qmax=127)
    ms = [quantize_multiplier(float(0.05 * w / 0.08)) for w in ws]
    a["mult"] = tuple(m for m, _ in ms)
    a["shift"] = tuple(sh for _, sh in ms)
    if float_out:
        a["float_out"] = True
    return a


def _i8(rng, shape):
    return rng.integers(-128, 128, shape).astype(np.int8)


def _f32(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


# --- fixed point ---------------------------------------------------------------------------------
MBQM_SOURCE = """#include "et_int8.h"
void mbqm(const int32_t *x, int32_t *y, int32_t n, int32_t m, int32_t s) {
    for (int32_t k = 0; k < n; k++) y[k] = et_mbqm(x[k], m, s);
}
"""


def test_multiply_by_quantized_multiplier_matches_fixed_point_py():
    lib = build(MBQM_SOURCE)
    rng = np.random.default_rng(0)
    xs = np.concatenate([rng.integers(-2 ** 31, 2 ** 31, 4000), rng.integers(-300, 300, 600),
                         [0, 1, -1, 2 ** 31 - 1, -2 ** 31, 1 << 20, -(1 << 20)]]).astype(np.int32)
    for real in [1e-9, 3e-6, 0.0007, 0.3, 0.5, 0.75, 0.999999, 1.0, 1.5, 3.0, 700.0, 2.0 ** -20]:
        m, sh = quantize_multiplier(real)
        want = multiply_by_quantized_multiplier(xs.astype(np.int64), m, sh)
        got = np.empty_like(xs)
        lib.mbqm(xs.ctypes.data_as(ctypes.c_void_p), got.ctypes.data_as(ctypes.c_void_p), ctypes.c_int32(len(xs)),
                 ctypes.c_int32(m), ctypes.c_int32(sh))
        assert np.array_equal(got, want.astype(np.int32)), real


# --- forward ---------------------------------------------------------------------------------
CONV_CASES = [  # (c, o, hw, k, s, p, groups, dilation, float_out, n)
    (3, 8, 9, 3, 2, 1, 1, 1, False, 1),
    (8, 8, 7, 3, 1, 1, 8, 1, False, 2),
    (6, 6, 9, 5, 2, 2, 6, 1, False, 1),
    (8, 12, 5, 1, 1, 0, 1, 1, False, 1),
    (4, 6, 8, 3, 1, 2, 2, 2, False, 1),
    (12, 10, 1, 1, 1, 0, 1, 1, True, 2),
    (5, 7, 70, 1, 1, 0, 1, 1, False, 1),  # rows wider than one accumulator block
]


@pytest.mark.parametrize("case", CONV_CASES)
def test_qconv2d(case):
    c, o, hw, k, s, p, groups, d, float_out, n = case
    rng = np.random.default_rng(hash(case) % 2 ** 32)
    a = _conv_attrs(rng, o, k, s, p, groups, d, float_out)
    feeds = {"x": _i8(rng, (n, c, hw, hw))}
    state = {"w": _i8(rng, (o, c // groups, k, k)), "b": rng.integers(-3000, 3000, o).astype(np.int32)}
    check(lambda e, v: e.emit("qconv2d", v["x"], v["w"], v["b"], **a), feeds, state)


@pytest.mark.parametrize("depthwise", [False, True])
def test_qconv2d_reads_a_split_weight(depthwise):
    rng = np.random.default_rng(1)
    c, o = 6, (6 if depthwise else 5)
    groups = c if depthwise else 1
    a = _conv_attrs(rng, o, 3, 1, 1, groups)
    feeds = {"x": _i8(rng, (1, c, 6, 6))}
    state = {"w": _i8(rng, (o, c // groups, 3, 3)), "b": rng.integers(-300, 300, o).astype(np.int32)}
    sel = ChannelSelect(0 if depthwise else 1, (1, 4))
    check(lambda e, v: e.emit("qconv2d", v["x"], v["w"], v["b"], **a), feeds, state, splits={"w": sel})


# (input channels, expansion channels, input size, depthwise kernel, stride, batch): the
# channel groups and depthwise row blocks of pw_dw_blocking, their remainders, a stride 2
# whose rows leave the ring in pairs, a plane smaller than the window
PW_DW_CASES = [
    (4, 6, 9, 3, 2, 1),
    (5, 9, 32, 3, 1, 1),
    (3, 10, 17, 5, 2, 2),
    (6, 7, 8, 3, 1, 1),
    (4, 5, 4, 7, 1, 1),
    (2, 3, 2, 3, 2, 1),
]


@pytest.mark.parametrize("case", PW_DW_CASES)
@pytest.mark.parametrize("block", [1, 2, 64])
def test_qconv2d_pw_dw(case, block):
    """The scratch holding one channel, two, or every one (passes/widen_scratch.py)."""
    c, e, hw, k, s, n = case
    rng = np.random.default_rng(hash(case) % 2 ** 32)
    pw = _conv_attrs(rng, e, 1, 1, 0, 1)
    dw = _conv_attrs(rng, e, k, s, k // 2, e)
    feeds = {"x": _i8(rng, (n, c, hw, hw))}
    state = {"w1": _i8(rng, (e, c, 1, 1)), "b1": rng.integers(-300, 300, e).astype(np.int32),
             "w2": _i8(rng, (e, 1, k, k)), "b2": rng.integers(-300, 300, e).astype(np.int32)}
    check(lambda e_, v: e_.emit_multi("qconv2d_pw_dw", v["x"], v["w1"], v["b1"], v["w2"], v["b2"],
                                      **fuse_pw_dw(pw, dw), block=block)[0], feeds, state)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 8, 16, 33, 64])
@pytest.mark.parametrize("span,stride", [(1, 1), (3, 1), (3, 2), (5, 1), (5, 2), (7, 2)])
@pytest.mark.parametrize("block,channels", [(1, 1), (1, 16), (4, 16), (12, 48), (16, 16)])
def test_pw_dw_blocking_fits_the_scratch(rows, span, stride, block, channels):
    """g channels of a ring of cap rows fit the scratch of `block` planes, and the ring holds
    what r output rows read; a scratch of every channel's plane takes them all at once."""
    from edgetrain.backends.c.kernels.int8 import pw_dw_blocking

    rows_out = (rows - 1) // stride + 1
    g, r = pw_dw_blocking(rows, block, span, stride, rows_out, channels)
    cap = min((r - 1) * stride + min(span, rows), rows)
    assert 1 <= g <= channels and 1 <= r <= rows_out
    assert g * cap <= block * rows and cap >= min(span, rows)
    if block == channels:
        assert (g, r) == (channels, rows_out)


def _qadd(rng):
    return qadd_attrs(0.05, int(rng.integers(-5, 5)), 0.08, int(rng.integers(-5, 5)), 0.1, 3)


def test_qadd_qmean_qclamp_masks():
    rng = np.random.default_rng(3)
    a = _qadd(rng)
    feeds = {"x": _i8(rng, (2, 3, 5, 5)), "y": _i8(rng, (2, 3, 5, 5)), "g": _f32(rng, (2, 3, 5, 5))}

    def build(e, v):
        s = e.emit("qadd", v["x"], v["y"], **a)
        m = e.emit("qmean", s, dims=(2, 3), keepdim=True, zero=3)
        cl = e.emit("qclamp", s, qmin=-20, qmax=60)
        mask = e.emit("qmask_pack", cl, lo=-20, hi=60)
        return [s, m, cl, mask, e.emit("qmask_grad", v["g"], mask)]
    check(build, feeds)


def test_quantize_dequantize_index_select():
    rng = np.random.default_rng(4)
    x = (_f32(rng, (2, 5, 3)) * 4).astype(np.float32)
    x.reshape(-1)[:4] = [0.5, 1.5, -2.5, 1000.0]
    feeds = {"x": x}

    def build(e, v):
        q = e.emit("quantize", v["x"], scale=0.5, zero=2, qmin=-128, qmax=127)
        s = e.emit("index_select", q, dim=1, index=(0, 3, 4))
        return [q, e.emit("dequantize", q, scale=0.25, zero=-3), s,
                e.emit("index_select_grad", e.emit("dequantize", s, scale=0.25, zero=0), input_shape=q.shape, dim=1,
                       index=(0, 3, 4))]
    check(build, feeds)


# --- backward ---------------------------------------------------------------------------------
GRAD_CASES = [  # (c, o, hw, k, s, p, groups, n)
    (4, 6, 7, 3, 1, 1, 1, 1),
    (6, 6, 9, 3, 2, 1, 6, 2),
    (5, 5, 8, 5, 1, 2, 5, 1),
    (8, 12, 4, 1, 1, 0, 1, 2),
    (6, 4, 8, 1, 2, 0, 1, 1),
    (4, 6, 6, 3, 2, 1, 2, 1),
]


@pytest.mark.parametrize("case", GRAD_CASES)
def test_conv_gradients(case):
    c, o, hw, k, s, p, groups, n = case
    rng = np.random.default_rng(hash(case) % 2 ** 32)
    a = _conv_attrs(rng, o, k, s, p, groups)
    ho = (hw + 2 * p - k) // s + 1
    feeds = {"x": _i8(rng, (n, c, hw, hw)), "g": _f32(rng, (n, o, ho, ho))}
    state = {"w": _i8(rng, (o, c // groups, k, k))}
    geo = dict(stride=a["stride"], padding=a["padding"], dilation=a["dilation"], groups=groups)
    scales = tuple(float(np.float32(0.05 * w)) for w in a["w_scales"])
    dw = groups == c == o

    def build(e, v):
        op = "qconv2d_dw_grad_input" if dw else "qconv2d_grad_input"
        gx = e.emit_multi(op, v["g"], v["w"], input_shape=(n, c, hw, hw), w_scales=a["w_scales"], **geo)[0]
        gw = e.emit("qconv2d_grad_weight", v["x"], v["g"], weight_shape=(o, c // groups, k, k), scales=scales,
                    x_zero=a["x_zero"], **geo)
        gb = e.emit("qconv2d_grad_bias", v["g"], scales=scales)
        return [gx, gw, gb]
    check(build, feeds, state)


@pytest.mark.parametrize("groups", [1, 6])
def test_the_backward_of_a_layer_reuses_its_forward_parameter_struct(groups):
    """The input and weight gradients of a layer whose forward is in the graph declare the
    forward's et_qconv_p (the same literal, kept once by the constant pool), and compute the
    reference's values with it."""
    from edgetrain.ops.qconv import out_scales

    rng = np.random.default_rng(12)
    c = o = 6
    a = _conv_attrs(rng, o, 3, 1, 1, groups)
    feeds = {"x": _i8(rng, (1, c, 6, 6)), "b": rng.integers(-50, 50, o).astype(np.int32),
             "g": _f32(rng, (1, o, 6, 6))}
    w = _i8(rng, (o, c // groups, 3, 3))
    geo = dict(stride=a["stride"], padding=a["padding"], dilation=a["dilation"], groups=groups)

    def build(e, v):
        y = e.emit("qconv2d", v["x"], v["w"], v["b"], **a)
        op = "qconv2d_dw_grad_input" if groups == c else "qconv2d_grad_input"
        gx = e.emit_multi(op, v["g"], v["w"], input_shape=(1, c, 6, 6), w_scales=a["w_scales"], **geo)[0]
        gw = e.emit("qconv2d_grad_weight", v["x"], v["g"], weight_shape=w.shape,
                    scales=tuple(float(s) for s in out_scales(a)), x_zero=a["x_zero"], **geo)
        return [y, gx, gw]
    src = emit_source(graph_of(build, {**feeds, "w": w}), {"w": w}, {})[0]
    structs = [ln.strip() for ln in src.splitlines() if "static const et_qconv_p" in ln]
    assert len(structs) == 3 and len(set(structs)) == 1, structs
    check(build, feeds, {"w": w})


def _update_attrs(rng, rows, index=None, dim=0, momentum=0.0, wd=0.0, qmin=-128, qmax=127, lr=0.5):
    return dict(lr=lr, momentum=momentum, weight_decay=wd, dim=dim, index=index, seed=11, param_id=3,
                scale=tuple(float(v) for v in rng.uniform(0.5, 4.0, rows)), qmin=qmin, qmax=qmax)


@pytest.mark.parametrize("mode", ["plain", "dim1", "dim0", "split1", "split0", "bias"])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_qsgd_update(mode, momentum):
    rng = np.random.default_rng(5)
    o, c = 4, 6
    if mode == "bias":
        w = rng.integers(-5000, 5000, o).astype(np.int32)
        up = _update_attrs(rng, o, momentum=momentum, wd=0.01, qmin=-2 ** 31, qmax=2 ** 31 - 1, lr=40.0)
        gshape = w.shape
    else:
        w = _i8(rng, (o, c, 3, 3))
        dim = 0 if mode.endswith("0") else 1
        index = None if mode == "plain" else (0, 2, 5)[:2 if dim == 0 else 3]
        up = _update_attrs(rng, o, index, dim, momentum=momentum)
        gshape = list(w.shape)
        if index is not None:
            gshape[dim] = len(index)
    splits = {"w": ChannelSelect(up["dim"], up["index"])} if mode.startswith("split") else {}
    feeds = {"g": (_f32(rng, tuple(gshape)) * 2).astype(np.float32)}
    state = {"w": w, **({"m": _f32(rng, tuple(gshape))} if momentum else {})}
    feeds["step"] = np.array(0, np.int32)

    def build(e, v):
        ins = [v["w"], v["g"], v["step"]] + ([v["m"]] if momentum else [])
        return list(e.emit_multi("qsgd_update", *ins, **up))
    check(build, feeds, state, splits, steps=3)


def test_a_convolution_beyond_the_int16_parameter_fields_is_refused():
    from edgetrain.backends.c.kernels.int8_params import conv_params
    from edgetrain.backends.c.layout import CBackendError

    a = _conv_attrs(np.random.default_rng(0), 2, 1, 1, 0, 1)
    assert conv_params(None, "P", (1, 3, 8, 8), (2, 3, 1, 1), (1, 2, 8, 8), a)[-1].startswith("static const et_qconv_p P")
    with pytest.raises(CBackendError, match="int16"):
        conv_params(None, "P", (1, 3, 40000, 1), (2, 3, 1, 1), (1, 2, 40000, 1), a)


@pytest.mark.parametrize("mode, kernel", [("plain", "et_qsgd_rows_i8"), ("split0", "et_qsgd_rows_i8"),
                                          ("bias", "et_qsgd_rows_i32"), ("dim0", "et_qsgd_row(")])
def test_qsgd_update_common_rows(mode, kernel):
    """Updates without momentum or weight decay within passes/updates.py's bounds (int8 +-127,
    int32 +-2^24) go through et_qsgd_rows_i8 / _i32, all rows in one call; a selection of rows
    of a weight stored whole through et_qsgd_row: each bit for bit as the reference."""
    rng = np.random.default_rng(8)
    o, c = 5, 6
    if mode == "bias":
        w = rng.integers(-2 ** 24, 2 ** 24, o).astype(np.int32)
        w[:2] = (2 ** 24 - 3, -2 ** 24 + 3)  # at the bounds: the update clamps them
        up = _update_attrs(rng, o, qmin=-2 ** 24, qmax=2 ** 24, lr=40.0)
    else:
        w = rng.integers(-127, 128, (o, c, 3, 3)).astype(np.int8)
        up = _update_attrs(rng, o, None if mode == "plain" else (0, 2, 3), 0, qmin=-127, qmax=127, lr=2.0)
    gshape = (len(up["index"]),) + w.shape[1:] if up["index"] else w.shape
    splits = {"w": ChannelSelect(0, up["index"])} if mode == "split0" else {}
    feeds = {"g": (_f32(rng, gshape) * 20).astype(np.float32), "step": np.array(0, np.int32)}
    build = lambda e, v: list(e.emit_multi("qsgd_update", v["w"], v["g"], v["step"], **up))  # noqa: E731
    g = graph_of(build, {**feeds, "w": w})
    assert kernel in emit_source(g, {"w": w}, splits)[0]
    check(build, feeds, {"w": w}, splits, steps=3)


@pytest.mark.parametrize("rows", [1, 2, 4])
@pytest.mark.parametrize("case", ["dense", "dw", "dense_sel", "dw_sel", "split_sel"])
def test_qconv2d_grad_weight_update(case, rows):
    """The gradient rows one at a time, or a block of 2 or 4 (passes/widen_scratch.py; a
    depthwise layer's blocks run row by row): the weights and momentum bit for bit."""
    rng = np.random.default_rng(6)
    c, o, hw = (6, 6, 6) if case.startswith("dw") else (5, 4, 5)
    dw = case.startswith("dw")
    groups = c if dw else 1
    w = _i8(rng, (o, c // groups, 3, 3))
    index = (1, 3, 4) if "sel" in case else None
    dim = 0 if dw else 1
    x = _i8(rng, (1, c, hw, hw))
    g = _f32(rng, (1, o, hw, hw))
    wshape = w.shape
    xs, gs = x, g
    if index is not None and dw:
        xs, gs, wshape = x[:, list(index)], g[:, list(index)], (len(index), 1, 3, 3)
    elif index is not None:
        xs, wshape = x[:, list(index)], (o, len(index), 3, 3)
    geo = dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=len(index) if index and dw else groups)
    gw = dict(geo, weight_shape=wshape, x_zero=7, scales=tuple(float(v) for v in rng.uniform(0.001, 0.01, wshape[0])))
    up = _update_attrs(rng, o, index, dim, momentum=0.9, lr=1.0)
    feeds = {"x": xs, "g": gs, "step": np.array(0, np.int32)}
    state = {"w": w, "m": np.zeros(wshape, np.float32)}
    splits = {"w": ChannelSelect(dim, index)} if case == "split_sel" else {}
    check(lambda e, v: list(e.emit_multi("qconv2d_grad_weight_update", v["x"], v["g"], v["w"], v["step"], v["m"],
                                         **fuse_grad_update(gw, up), rows=rows)[:2]), feeds, state, splits,
          steps=3)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("case", ["dense", "split_dw_sel"])
def test_qconv2d_grad_weight_update_common_rows(case, rows):
    """The fused weight gradient and update without momentum, int8 +-127: each row's gradient
    then et_qsgd_rows_i8 on that row, bit for bit as the reference."""
    rng = np.random.default_rng(9)
    c = o = 6
    dw = case != "dense"
    w = rng.integers(-127, 128, (o, 1 if dw else c, 3, 3)).astype(np.int8)
    index = (1, 3, 4) if dw else None
    x, g = _i8(rng, (1, c, 5, 5)), _f32(rng, (1, o, 5, 5))
    if dw:
        x, g = x[:, list(index)], g[:, list(index)]
    wshape = (len(index), 1, 3, 3) if dw else w.shape
    geo = dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=len(index) if dw else 1)
    gw = dict(geo, weight_shape=wshape, x_zero=-3, scales=tuple(float(v) for v in rng.uniform(0.01, 0.1, wshape[0])))
    up = _update_attrs(rng, o, index, 0, qmin=-127, qmax=127, lr=3.0)
    feeds = {"x": x, "g": g, "step": np.array(0, np.int32)}
    splits = {"w": ChannelSelect(0, index)} if dw else {}
    build = lambda e, v: [e.emit_multi("qconv2d_grad_weight_update", v["x"], v["g"], v["w"], v["step"],  # noqa: E731
                                       **fuse_grad_update(gw, up), rows=rows)[0]]
    assert "et_qsgd_rows_i8" in emit_source(graph_of(build, {**feeds, "w": w}), {"w": w}, splits)[0]
    check(build, feeds, {"w": w}, splits, steps=3)


@pytest.mark.parametrize("rows", [1, 2, 5, 12])
def test_qstream_rows_through_ring_buffers(rows):
    """A streamed chain (3x3 conv, strided depthwise, pointwise, depthwise, residual add) in
    bands of `rows` rows per call: the output and the ring buffers' bytes equal the reference's."""
    from edgetrain.ir import Graph, TensorType, new_value
    from edgetrain.ops.base import Emitter

    rng = np.random.default_rng(7)
    specs = [(4, 8, 3, 1, 1, 1), (8, 8, 3, 2, 1, 8), (8, 6, 1, 1, 0, 1), (6, 6, 3, 1, 1, 6)]  # c, o, k, s, p, groups
    state = {}
    for i, (c, o, k, s, p, groups) in enumerate(specs):
        state[f"w{i}"] = _i8(rng, (o, c // groups, k, k))
        state[f"b{i}"] = rng.integers(-500, 500, o).astype(np.int32)
    feeds = {"x": _i8(rng, (1, 4, 12, 12))}
    names = ["x"] + [f"{p}{i}" for i in range(len(specs)) for p in ("w", "b")]
    arrays = {**feeds, **state}
    body_in = [new_value(TensorType(arrays[k].shape, str(arrays[k].dtype)), k) for k in names]
    env = dict(zip(names, body_in))
    e = Emitter()
    h = env["x"]
    outs = []
    for i, (c, o, k, s, p, groups) in enumerate(specs):
        h = e.emit("qconv2d", h, env[f"w{i}"], env[f"b{i}"], **_conv_attrs(rng, o, k, s, p, groups))
        outs.append(h)
    y = e.emit("qadd", outs[2], outs[3], **_qadd(rng))
    body = Graph(tuple(body_in), tuple(e.nodes), (y,), ("y",))

    def build_graph(e2, v):
        return list(e2.emit_multi("qstream", *[v[k] for k in names], body=body, rows=rows))
    out, _ = check(build_graph, feeds, state)
    assert out["out0"].shape == (1, 6, 6, 6) and out["out1"].size > 0


# --- whole programs ---------------------------------------------------------------------------
def train_both(prog, batches):
    """Train the reference program and its C twin on `batches`; every state tensor (ints and
    float momentum) must stay identical. (The loss value itself is A's float kernel, double
    log-sum-exp in C against float32 numpy: equal to 1e-6.)"""
    from edgetrain.backends.c.host import to_c_program

    cprog = to_c_program(prog)
    for i, (x, y) in enumerate(batches):
        want, got = prog.step(x, y), cprog.step(x, y)
        assert np.isclose(got, want, rtol=1e-6, atol=0), f"step {i}: loss {got} != {want}"
        for k in prog.state:
            assert np.array_equal(prog.state[k], cprog.state[k]), f"step {i}: {k} differs"
    assert cprog.runner.check_guards()
    return cprog


@pytest.mark.parametrize("headroom", [1, 16])  # 16: the trained layers' scales and output ranges widened
def test_digitnet_int8_trains_bit_exact(headroom, momentum=0.0):
    import torch

    import edgetrain as et
    from edgetrain.app.demo import pretrained_digitnet

    rng = np.random.default_rng(0)
    update = et.Full() if headroom == 1 else et.LastK(2)  # with headroom: frozen and widened layers together
    prog = et.compile(pretrained_digitnet(), (torch.zeros(2, 1, 28, 28),), quantize="int8", update=update,
                      optimizer=et.SGD(lr=0.05, momentum=momentum), int8_headroom=headroom)
    batches = [(rng.standard_normal((2, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, 2)) for _ in range(6)]
    before = {k: v.copy() for k, v in prog.state.items()}
    train_both(prog, batches)
    assert sum(not np.array_equal(before[k], prog.state[k]) for k in prog.trainable) >= len(prog.trainable) - 1


TINY_TRAINING = Path(__file__).resolve().parents[3].parent / "shared" / "assets" / "tiny-training"


@pytest.mark.skipif(not (TINY_TRAINING / "mbv2-w0.35.pkl").exists(), reason="the paper's model files are missing")
def test_paper_mbv2_sparse_int8_trains_bit_exact():
    """The paper's mbv2-w0.35 at 64x64 with its 49 KB sparse scheme and momentum: split
    weights (dim 1 and a depthwise dim 0), a row-streamed prefix, fused expansion+depthwise
    layers, fused weight-gradient updates; 3 steps, every tensor identical."""
    import json

    import torch

    import edgetrain as et

    s = json.loads((TINY_TRAINING / "schemes.json").read_text())["schemes"]["mbv2-w0.35"]["49kb"]
    scheme = et.Sparse(bias_last=s["bias_last"], weights={int(k): v for k, v in s["weights"].items() if v})
    model = et.models.from_tiny_training(TINY_TRAINING / "mbv2-w0.35.pkl", num_classes=10)
    prog = et.compile(model, (torch.zeros(1, 3, 64, 64),), update=scheme, quantize="int8",
                      optimizer=et.SGD(lr=0.01, momentum=0.9))
    ops = {n.op for n in prog.train_graph.nodes}
    assert {"qstream", "qconv2d_pw_dw", "qconv2d_grad_weight_update", "index_select"} <= ops
    assert {sel.dim for sel in prog.trainable.values() if sel is not None} == {0, 1}
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((1, 3, 64, 64)).astype(np.float32), rng.integers(0, 10, 1)) for _ in range(3)]
    before = {k: v.copy() for k, v in prog.state.items()}
    train_both(prog, batches)
    moved = [k for k, sel in prog.trainable.items() if sel is not None and not np.array_equal(before[k], prog.state[k])]
    assert moved  # split weights were updated (and stayed identical)
