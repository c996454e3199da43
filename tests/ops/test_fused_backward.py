"""The backward ops that work one channel at a time: the depthwise input gradient (which
may overwrite its output gradient in place) and the weight gradient fused with its
integer SGD update. Each equals the unfused ops; the fused update bit for bit when the
gradient sums are exact (integers times a power of two), as chosen here."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from edgetrain.ops import get_op
from edgetrain.ops.qconv import _dw_grad_input_ref, _grad_input_ref, _grad_weight_ref
from edgetrain.ops.qgradupdate import fuse_attrs, qconv2d_grad_weight_update_ref
from edgetrain.ops.qoptim import qsgd_ref

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, database=None)


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
    grad = _grad_weight_ref([xs, gs], gw_attrs)[0]
    want = qsgd_ref([w, grad, step, *m], up)
    got = qconv2d_grad_weight_update_ref([xs, gs, w, step, *m], fuse_attrs(gw_attrs, up))
    assert np.array_equal(got[0], want[0])
    if momentum:
        assert np.array_equal(got[1], want[1])
    assert got[-1].shape == (1,) + tuple(wshape[1:])  # one gradient row of scratch
    types = get_op("qconv2d_grad_weight_update").infer([_t(a) for a in (xs, gs, w, step, *m)],
                                                         fuse_attrs(gw_attrs, up))
    assert [t.shape for t in types] == [a.shape for a in got]
