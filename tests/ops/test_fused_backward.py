"""The backward ops whose kernels work one channel at a time: the depthwise input gradient
(which may then overwrite its output gradient in place) and the weight gradient fused
with its integer SGD update. The references equal the unfused ops bit for bit; so does
the channel-by-channel loop each kernel runs, modelled here (for the fused update when
the gradient sums are exact, integers times a power of two, as chosen here)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from edgetrain.ops import get_op
from edgetrain.ops.qconv import _dw_grad_input_ref, _grad_input_ref, qconv_grad_weight_ref
from edgetrain.ops.qgradupdate import fuse_attrs, qconv2d_grad_weight_update_ref
from edgetrain.ops.qoptim import _apply, row_scales, _selection, qsgd_ref, uniform_hash

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, database=None)


def qsgd_rows(w: np.ndarray, g_rows: np.ndarray, step: int, m_rows, a, lo: int, hi: int):
    """Update, in place in `w`, the rows lo..hi-1 of the gradient `qsgd_update` would take
    (positions along dim 0 of its `g`), given those rows `g_rows` (and of the momentum
    buffer, `m_rows`): elementwise the same arithmetic as `qsgd_ref`. Returns the new
    momentum rows (or None)."""
    sel = _selection(w.shape, a)
    flat_index = np.arange(w.size, dtype=np.int64).reshape(w.shape)[sel][lo:hi]
    u = uniform_hash(a["seed"], a["param_id"], int(step), flat_index)
    values, d = _apply(w[sel][lo:hi].astype(np.float32), g_rows, m_rows, u, row_scales(a, slice(lo, hi)), a)
    if a.get("index") is not None and a["dim"] == 0:
        w[np.asarray(a["index"][lo:hi], dtype=np.int64)] = values.astype(w.dtype)
    elif a.get("index") is not None:
        w[lo:hi, np.asarray(a["index"], dtype=np.int64)] = values.astype(w.dtype)
    else:
        w[lo:hi] = values.astype(w.dtype)
    return d if m_rows is not None else None


def grad_update_by_rows(xs, a):
    """The fused kernel's loop: one gradient row into the scratch, applied, the next."""
    from edgetrain.ops.qgradupdate import split_attrs

    x, g, w, step = xs[:4]
    m = xs[4] if len(xs) > 4 else None
    gw, up = split_attrs(a)
    depthwise = int(gw["groups"]) > 1
    w_new, m_new = w.copy(), None if m is None else m.copy()
    o, cg, kh, kw = gw["weight_shape"]
    for k in range(o):
        row = {**gw, "weight_shape": (1, cg, kh, kw), "scales": (gw["scales"][k],),
               **({"groups": 1} if depthwise else {})}
        grad_row = qconv_grad_weight_ref([x[:, k:k + 1] if depthwise else x, g[:, k:k + 1]], row)[0]
        d = qsgd_rows(w_new, grad_row, int(step), None if m is None else m[k:k + 1], up, k, k + 1)
        if m_new is not None:
            m_new[k:k + 1] = d
    return [w_new] + ([m_new] if m is not None else [])


def dw_grad_input_by_channels(g, w, a):
    """The depthwise input-gradient kernel's loop: channel by channel through one plane,
    written over g."""
    n, c, h, wd = a["input_shape"]
    gx = g.copy() if g.shape == (n, c, h, wd) else np.empty((n, c, h, wd), np.float32)
    one = {**a, "groups": 1, "input_shape": (n, 1, h, wd), "w_scales": (0.0,)}
    for ch in range(c):
        plane = _grad_input_ref([g[:, ch:ch + 1], w[ch:ch + 1]], {**one, "w_scales": (a["w_scales"][ch],)})[0]
        gx[:, ch:ch + 1] = plane
    return gx


def geo(k, s, p, groups):
    return dict(stride=(s, s), padding=(p, p), dilation=(1, 1), groups=groups)


@SETTINGS
@given(c=st.integers(1, 6), hw=st.integers(3, 9), k=st.sampled_from([1, 3, 5]), s=st.integers(1, 2),
       p=st.integers(0, 2), seed=st.integers(0, 2 ** 16))
def test_depthwise_input_gradient_channel_by_channel_is_the_unfused_op(c, hw, k, s, p, seed):
    rng = np.random.default_rng(seed)
    if hw + 2 * p < k:
        return
    a = dict(geo(k, s, p, c), input_shape=(1, c, hw, hw), w_scales=tuple(rng.uniform(0.01, 0.1, c)))
    ho = (hw + 2 * p - k) // s + 1
    g = rng.standard_normal((1, c, ho, ho)).astype(np.float32)
    w = rng.integers(-127, 128, (c, 1, k, k)).astype(np.int8)
    gx, plane = _dw_grad_input_ref([g, w], a)
    assert np.array_equal(gx, _grad_input_ref([g, w], a)[0])
    assert np.array_equal(gx, dw_grad_input_by_channels(g, w, a))
    assert plane.shape == (1, 1, hw, hw)
    types = get_op("qconv2d_dw_grad_input").infer([_t(g), _t(w)], a)
    assert [t.shape for t in types] == [gx.shape, plane.shape]


def _t(arr):
    from edgetrain.ir import TensorType

    return TensorType(arr.shape, str(arr.dtype))


def _update_attrs(rng, o, index=None, dim=0, momentum=0.0):
    return dict(lr=0.25, momentum=momentum, weight_decay=0.0, dim=dim, index=index, seed=3, param_id=1,
                scale=tuple(float(v) for v in 2.0 ** rng.integers(-2, 3, o)), qmin=-128, qmax=127)


@SETTINGS
@given(c_in=st.integers(1, 5), c_out=st.integers(1, 5), hw=st.integers(3, 7), k=st.sampled_from([1, 3]),
       depthwise=st.booleans(), select=st.booleans(), momentum=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_weight_gradient_fused_with_its_update_is_the_two_ops(c_in, c_out, hw, k, depthwise, select, momentum,
                                                             seed):
    rng = np.random.default_rng(seed)
    c_out = c_in if depthwise else c_out
    groups = c_in if depthwise else 1
    w = rng.integers(-128, 128, (c_out, c_in // groups, k, k)).astype(np.int8)
    index, dim = None, 0
    if select and (depthwise and c_out > 1 or not depthwise and c_in > 1):
        dim = 0 if depthwise else 1
        n = w.shape[dim]
        index = tuple(sorted(rng.choice(n, size=max(1, n // 2), replace=False).tolist()))
    x = rng.integers(-128, 128, (1, c_in, hw, hw)).astype(np.int8)
    g = (rng.integers(-8, 9, (1, c_out, hw, hw)) / 8).astype(np.float32)  # sums stay exact in float32
    xs, gs, wshape = x, g, w.shape
    if index is not None and depthwise:
        xs, gs = x[:, list(index)], g[:, list(index)]
        wshape = (len(index), 1, k, k)
    elif index is not None:
        xs = x[:, list(index)]
        wshape = (c_out, len(index), k, k)
    gw_attrs = dict(geo(k, 1, k // 2, len(index) if index is not None and depthwise else groups),
                    weight_shape=wshape, x_zero=int(rng.integers(-5, 5)),
                    scales=tuple(float(v) for v in 2.0 ** rng.integers(-3, 0, wshape[0])))
    up = _update_attrs(rng, c_out, index, dim, momentum=0.5 if momentum else 0.0)
    m = [(rng.integers(-4, 5, wshape) / 4).astype(np.float32)] if momentum else []
    step = np.array(7, dtype=np.int32)
    grad = qconv_grad_weight_ref([xs, gs], gw_attrs)[0]
    want = qsgd_ref([w, grad, step, *m], up)
    got = qconv2d_grad_weight_update_ref([xs, gs, w, step, *m], fuse_attrs(gw_attrs, up))
    model = grad_update_by_rows([xs, gs, w, step, *m], fuse_attrs(gw_attrs, up))
    assert np.array_equal(got[0], want[0]) and np.array_equal(model[0], want[0])
    if momentum:
        assert np.array_equal(got[1], want[1]) and np.array_equal(model[1], want[1])
    assert got[-1].shape == (1,) + tuple(wshape[1:])  # one gradient row of scratch
    types = get_op("qconv2d_grad_weight_update").infer([_t(a) for a in (xs, gs, w, step, *m)],
                                                         fuse_attrs(gw_attrs, up))
    assert [t.shape for t in types] == [a.shape for a in got]
