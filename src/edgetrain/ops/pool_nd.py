"""3-D pooling and adaptive pooling with windows of unequal size, and their backward ops.

- max_pool3d / avg_pool3d: NCDHW, a window `kernel` moved by `stride` over the input padded by
  `padding` (max: -inf pads, `dilation`; avg: `count_include_pad`, `divisor_override`), as
  2-D pooling (ops/pool.py) with one more dim; taps summed / compared in (d, h, w) order.
- adaptive_max_pool2d / adaptive_avg_pool2d: the last two dims (any leading dims) cut into
  `output_size` windows as torch cuts them: output row i covers input rows
  floor(i H / oh) .. ceil((i + 1) H / oh) - 1 (windows of unequal size that may overlap).
A max pool's gradient goes to the first maximal element of each window (as PyTorch).
"""
from __future__ import annotations

import itertools

import numpy as np

from .base import SAME_SCALE_TAG, Cost, Int8Rule, OpDef, out_grad, register

_ONE3 = (1, 1, 1)
#: spatial dims of the 3-D pools (NCDHW)
SPATIAL3 = 3


# --- 3-D pooling -----------------------------------------------------------------------------------
def geo3(a):
    """(kernel, stride, padding, dilation) of a 3-D pool's attributes."""
    return tuple(a["kernel"]), tuple(a["stride"]), tuple(a["padding"]), tuple(a.get("dilation", _ONE3))


def pool3d_out(dhw, k, s, p, d) -> tuple:
    out = tuple((dhw[i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(SPATIAL3))
    if min(out) < 1:
        raise ValueError(f"pool3d: input {tuple(dhw)} too small for kernel {k} (stride {s}, padding {p}, dilation {d})")
    return out


def pool3d_infer(ts, a):
    x = ts[0]
    if x.rank != 5:
        raise ValueError(f"pool3d: expected a 5-D input (N, C, D, H, W), got {x}")
    k, s, p, d = geo3(a)
    if any(p[i] > k[i] // 2 for i in range(SPATIAL3)):
        raise ValueError(f"pool3d: padding {p} must be at most half the kernel {k}")
    return [x.with_shape(x.shape[:2] + pool3d_out(x.shape[2:], k, s, p, d))]


def _pad3(x, p, value):
    return np.pad(x, ((0, 0), (0, 0)) + tuple((pi, pi) for pi in p), constant_values=value)


def _taps(k):
    """Kernel taps (i, j, l) in (d, h, w) order."""
    return itertools.product(*(range(ki) for ki in k))


def _tap3(t, s, d, out):
    """The strided window of the padded input seen by kernel tap t."""
    return (slice(None), slice(None)) + tuple(slice(t[i] * d[i], t[i] * d[i] + s[i] * (out[i] - 1) + 1, s[i])
                                              for i in range(SPATIAL3))


def _unpad3(xp, p, shape):
    return xp[(slice(None), slice(None)) + tuple(slice(p[i], p[i] + shape[2 + i]) for i in range(SPATIAL3))]


def fixed_avg3_divisor(a) -> int:
    """The divisor of a 3-D average when it is one number (divisor_override, else the kernel
    volume when padding counts); 0 when it is each window's count of real voxels."""
    if a.get("divisor_override"):
        return int(a["divisor_override"])
    k = tuple(a["kernel"])
    return int(k[0] * k[1] * k[2]) if a.get("count_include_pad", True) else 0


def _avg3_divisor(shape, a):
    k, s, p, d = geo3(a)
    if fixed_avg3_divisor(a):
        return float(fixed_avg3_divisor(a))
    out = pool3d_out(shape[2:], k, s, p, d)
    ones = _pad3(np.ones((1, 1) + tuple(shape[2:])), p, 0.0)
    return sum(ones[_tap3(t, s, d, out)] for t in _taps(k))


def _avg3_ref(xs, a):
    x = xs[0]
    k, s, p, d = geo3(a)
    out = pool3d_out(x.shape[2:], k, s, p, d)
    xp = _pad3(x, p, 0.0)
    acc = sum(xp[_tap3(t, s, d, out)] for t in _taps(k))
    return [(acc / _avg3_divisor(x.shape, a)).astype(x.dtype)]


def _avg3_grad_ref(xs, a):
    g = xs[0]
    shape = tuple(a["input_shape"])
    k, s, p, d = geo3(a)
    gs = (g / _avg3_divisor(shape, a)).astype(g.dtype)
    gxp = np.zeros(shape[:2] + tuple(shape[2 + i] + 2 * p[i] for i in range(SPATIAL3)), dtype=g.dtype)
    for t in _taps(k):
        gxp[_tap3(t, s, d, g.shape[2:])] += gs
    return [np.ascontiguousarray(_unpad3(gxp, p, shape))]


def max_pool3d_ref(xs, a):
    x = xs[0]
    k, s, p, d = geo3(a)
    out = pool3d_out(x.shape[2:], k, s, p, d)
    xp = _pad3(x, p, -np.inf)
    y = np.full(x.shape[:2] + out, -np.inf, dtype=x.dtype)
    for t in _taps(k):
        np.maximum(y, xp[_tap3(t, s, d, out)], out=y)
    return [y]


def _max3_grad_ref(xs, a):
    """Each output gradient to the first maximal tap of its window, in (d, h, w) tap order."""
    g, x = xs
    k, s, p, d = geo3(a)
    (y,) = max_pool3d_ref([x], a)
    xp = _pad3(x, p, -np.inf)
    gxp = np.zeros(xp.shape, dtype=g.dtype)
    taken = np.zeros(y.shape, dtype=bool)
    for t in _taps(k):
        tap = _tap3(t, s, d, g.shape[2:])
        hit = (xp[tap] == y) & ~taken
        gxp[tap] += np.where(hit, g, 0)
        taken |= hit
    return [np.ascontiguousarray(_unpad3(gxp, p, x.shape))]


def max3_argmax(x, a) -> np.ndarray:
    """The flat (d, h, w) index in its plane of each window's first maximal voxel (taps in (d, h, w)
    order; -1 where only padding is maximal), shape (N * C, outputs)."""
    k, s, p, d = geo3(a)
    out = pool3d_out(x.shape[2:], k, s, p, d)
    xp = _pad3(x.astype(np.float64), p, -np.inf)
    flat = _pad3(np.arange(int(np.prod(x.shape[2:]))).reshape((1, 1) + x.shape[2:]), p, -1)
    best = np.full(x.shape[:2] + out, -np.inf)
    idx = np.full(x.shape[:2] + out, -1, dtype=np.int64)
    for t in _taps(k):
        tap = _tap3(t, s, d, out)
        win = xp[tap] > best
        best = np.where(win, xp[tap], best)
        idx = np.where(win, np.broadcast_to(flat[tap], idx.shape), idx)
    return idx.reshape(x.shape[0] * x.shape[1], -1)


def max3_grad_in_output_order(g, x, a, dtype) -> np.ndarray:
    """Each output gradient added, outputs in row-major order, to its window's first maximum."""
    idx = max3_argmax(x, a)
    planes = np.arange(idx.shape[0])
    gf = g.reshape(idx.shape)
    gx = np.zeros((idx.shape[0], int(np.prod(x.shape[2:]))), dtype=dtype)
    for o in range(idx.shape[1]):
        hit = idx[:, o] >= 0
        gx[planes[hit], idx[hit, o]] += gf[hit, o]
    return gx.reshape(x.shape)


def _window_cost(volume):
    """One comparison or addition per tap of every output element of the forward op."""
    def cost(node):
        big = max(node.inputs + node.outputs, key=lambda v: v.type.numel)
        small = min(node.inputs + node.outputs, key=lambda v: v.type.numel)
        return Cost(small.type.numel * volume(node, big, small), sum(v.type.nbytes for v in node.inputs + node.outputs))
    return cost


def _kernel_volume(node, big, small):
    k = tuple(node.attrs["kernel"])
    return int(k[0] * k[1] * k[2])


def _keys(node):
    return dict(node.attrs)


register(OpDef("avg_pool3d", pool3d_infer, _avg3_ref,
               lambda e, n, g, nd: [e.emit("avg_pool3d_grad", out_grad(g), input_shape=n.inputs[0].shape, **_keys(n))],
               cost=_window_cost(_kernel_volume), num_inputs=(1, 1)))
register(OpDef("avg_pool3d_grad", lambda ts, a: [ts[0].with_shape(tuple(a["input_shape"]))], _avg3_grad_ref,
               cost=_window_cost(_kernel_volume), num_inputs=(1, 1)))
register(OpDef("max_pool3d", pool3d_infer, max_pool3d_ref,
               lambda e, n, g, nd: [e.emit("max_pool3d_grad", out_grad(g), n.inputs[0], **_keys(n))],
               cost=_window_cost(_kernel_volume), num_inputs=(1, 1), tags={SAME_SCALE_TAG},
               int8=Int8Rule("same", "qmax_pool3d")))
register(OpDef("max_pool3d_grad", lambda ts, a: [ts[1]], _max3_grad_ref, cost=_window_cost(_kernel_volume),
               num_inputs=(2, 2)))


# --- adaptive pooling over the last two dims ---------------------------------------------------------
def adaptive_windows(size: int, out: int) -> list[tuple[int, int]]:
    """torch's windows [start, end) of an adaptive pool of `size` into `out`."""
    return [((i * size) // out, -(-((i + 1) * size) // out)) for i in range(out)]


def max_adaptive_window(size: int, out: int) -> int:
    return max(e - s for s, e in adaptive_windows(size, out))


def _adaptive_infer(ts, a):
    x = ts[0]
    oh, ow = (int(v) for v in a["output_size"])
    if x.rank < 3 or oh < 1 or ow < 1:
        raise ValueError(f"adaptive pool: expected an input of rank >= 3 and an output size >= 1, got {x}, "
                         f"{a['output_size']}")
    return [x.with_shape(x.shape[:-2] + (oh, ow))]


def _windows2(shape, a):
    (oh, ow), (h, w) = a["output_size"], shape[-2:]
    return adaptive_windows(h, int(oh)), adaptive_windows(w, int(ow))


def _adaptive_avg_ref(xs, a):
    x = xs[0]
    rows, cols = _windows2(x.shape, a)
    y = np.empty(x.shape[:-2] + (len(rows), len(cols)), dtype=x.dtype)
    for i, (h0, h1) in enumerate(rows):
        for j, (w0, w1) in enumerate(cols):
            win = x[..., h0:h1, w0:w1].reshape(x.shape[:-2] + (-1,))
            acc = win[..., 0].copy()
            for t in range(1, win.shape[-1]):  # taps in (h, w) order, as the C kernel adds them
                acc += win[..., t]
            y[..., i, j] = acc / x.dtype.type((h1 - h0) * (w1 - w0))
    return [y]


def _adaptive_avg_grad_ref(xs, a):
    g = xs[0]
    shape = tuple(a["input_shape"])
    rows, cols = _windows2(shape, a)
    gx = np.zeros(shape, dtype=g.dtype)
    for i, (h0, h1) in enumerate(rows):
        for j, (w0, w1) in enumerate(cols):
            gx[..., h0:h1, w0:w1] += (g[..., i, j] / g.dtype.type((h1 - h0) * (w1 - w0)))[..., None, None]
    return [gx]


def _adaptive_max_ref(xs, a):
    x = xs[0]
    rows, cols = _windows2(x.shape, a)
    y = np.empty(x.shape[:-2] + (len(rows), len(cols)), dtype=x.dtype)
    for i, (h0, h1) in enumerate(rows):
        for j, (w0, w1) in enumerate(cols):
            y[..., i, j] = x[..., h0:h1, w0:w1].max(axis=(-2, -1))
    return [y]


def adaptive_argmax(x, a) -> np.ndarray:
    """The flat (h * W + w) index of the first maximum of each window, in (h, w) order."""
    rows, cols = _windows2(x.shape, a)
    idx = np.empty(x.shape[:-2] + (len(rows), len(cols)), dtype=np.int64)
    width = x.shape[-1]
    for i, (h0, h1) in enumerate(rows):
        for j, (w0, w1) in enumerate(cols):
            win = x[..., h0:h1, w0:w1].reshape(x.shape[:-2] + (-1,))
            k = np.argmax(win, axis=-1)  # the first maximum
            idx[..., i, j] = (h0 + k // (w1 - w0)) * width + w0 + k % (w1 - w0)
    return idx


def adaptive_max_grad(g, x, a, dtype) -> np.ndarray:
    """Each output gradient added (in output order) to its window's first maximum."""
    lead = int(np.prod(x.shape[:-2], dtype=np.int64))
    idx = adaptive_argmax(x, a).reshape(lead, -1)
    gf = g.reshape(lead, -1)
    gx = np.zeros((lead, x.shape[-2] * x.shape[-1]), dtype=dtype)
    for o in range(idx.shape[1]):
        gx[np.arange(lead), idx[:, o]] += gf[:, o]
    return gx.reshape(x.shape)


def _adaptive_max_grad_ref(xs, a):
    g, x = xs
    return [adaptive_max_grad(g, x, a, g.dtype)]


def _adaptive_volume(node, big, small):
    shape = tuple(node.attrs["input_shape"]) if "input_shape" in node.attrs else node.inputs[-1].shape
    oh, ow = node.attrs["output_size"]
    return max_adaptive_window(shape[-2], int(oh)) * max_adaptive_window(shape[-1], int(ow))


def _adaptive_attrs(node):
    return {"output_size": tuple(node.attrs["output_size"])}


register(OpDef("adaptive_avg_pool2d", _adaptive_infer, _adaptive_avg_ref,
               lambda e, n, g, nd: [e.emit("adaptive_avg_pool2d_grad", out_grad(g), input_shape=n.inputs[0].shape,
                                           **_adaptive_attrs(n))],
               cost=_window_cost(_adaptive_volume), num_inputs=(1, 1)))
register(OpDef("adaptive_avg_pool2d_grad", lambda ts, a: [ts[0].with_shape(tuple(a["input_shape"]))],
               _adaptive_avg_grad_ref, cost=_window_cost(_adaptive_volume), num_inputs=(1, 1)))
register(OpDef("adaptive_max_pool2d", _adaptive_infer, _adaptive_max_ref,
               lambda e, n, g, nd: [e.emit("adaptive_max_pool2d_grad", out_grad(g), n.inputs[0], **_adaptive_attrs(n))],
               cost=_window_cost(_adaptive_volume), num_inputs=(1, 1), tags={SAME_SCALE_TAG},
               int8=Int8Rule("same", "qadaptive_max_pool2d")))
register(OpDef("adaptive_max_pool2d_grad", lambda ts, a: [ts[1]], _adaptive_max_grad_ref,
               cost=_window_cost(_adaptive_volume), num_inputs=(2, 2)))
